"""The code's own checks, with no findings: ruff (its pinned default rule set and the 110-column limit)
over everything Python here, its formatter changing nothing, and mypy (pyproject's [tool.mypy]:
builder/ and bench/, every function typed)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.tools import dependency_command

ROOT = Path(__file__).resolve().parents[2]
# Python the images run, named without .py as commands (the KT images' key launcher, prompt helper, kernel
# check and GPU kernels' placer).
IMAGE_PYTHON = (
    "dockerfiles/ktransformers/moe-stack-sglang-with-key",
    "dockerfiles/ktransformers/moe-stack-prompts",
    "dockerfiles/ktransformers/moe-stack-kt-check",
    "dockerfiles/ktransformers/moe-stack-kt-gpu-libs",
)


@pytest.mark.lint
def test_ruff_finds_nothing() -> None:
    result = subprocess.run(
        [
            dependency_command("ruff"),
            "check",
            "--no-cache",
            "builder",
            "tests",
            "bench",
            "scripts",
            *IMAGE_PYTHON,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.lint
def test_ruff_format_changes_nothing() -> None:
    result = subprocess.run(
        [
            dependency_command("ruff"),
            "format",
            "--check",
            "--no-cache",
            "builder",
            "tests",
            "bench",
            "scripts",
            *IMAGE_PYTHON,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.lint
def test_mypy_finds_nothing() -> None:
    result = subprocess.run(
        [dependency_command("mypy")], capture_output=True, text=True, cwd=ROOT, timeout=600, check=False
    )
    assert result.returncode == 0 and "Success: no issues found" in result.stdout, (
        result.stdout + result.stderr
    )
