"""The README's maintainer yardstick, run: a new llama.cpp fork is its adapter (a module and its line in
the registry), its pins line and its matrix row; nothing else by hand. In a copy of the repository,
the fork then renders, joins the matrix and is emitted as a stack."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from builder.models.synth_moe import MoeShape, write_moe_gguf
from builder.stackfile.host_checks import free_local_port
from tests.repo_copy import tracked_copy, unit_suite

FORK = '''"""A llama.cpp fork (the yardstick test's)."""

from __future__ import annotations

from builder.engines.llama_cpp import LlamaCpp


class ForkCpp(LlamaCpp):
    name = "fork.cpp"
    slug = "fork-cpp"
    upstream_url = "https://example.invalid/fork.cpp.git"
'''


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1))


def _moe_stack(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(repo), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "builder", *args],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def _forked(tmp_path: Path) -> Path:
    """A copy of the repository with a llama.cpp fork added as a maintainer adds one: its adapter module
    and registry line, its pins line, its matrix row."""
    repo = tracked_copy(tmp_path / "repo")
    (repo / "builder/engines/fork_cpp.py").write_text(FORK)
    registry = repo / "builder/engines/__init__.py"
    _edit(
        registry,
        "from builder.engines.llama_cpp import LlamaCpp\n",
        "from builder.engines.fork_cpp import ForkCpp\nfrom builder.engines.llama_cpp import LlamaCpp\n",
    )
    _edit(registry, "KTransformersLegacy())", "KTransformersLegacy(), ForkCpp())")
    pins = repo / "dockerfiles/pins.yaml"
    pins.write_text(pins.read_text() + "fork.cpp:\n  ref: 0c1e57098\n  track: frozen\n")
    _edit(
        repo / "dockerfiles/matrix.yaml", "engines:\n", "engines:\n  fork.cpp:\n    extra_cpu_targets: []\n"
    )
    return repo


@pytest.mark.cli
def test_a_new_llama_cpp_fork_is_its_adapter_pins_line_and_matrix_row(tmp_path: Path) -> None:
    repo = _forked(tmp_path)
    rendered = _moe_stack(
        repo, "render", "--engine", "fork.cpp", "--cpu", "avx2", "--out", str(tmp_path / "ctx")
    )
    assert rendered.returncode == 0, rendered.stderr
    assert "fork.cpp.git" in (tmp_path / "ctx/Dockerfile").read_text()
    matrix = _moe_stack(repo, "matrix", "--json")
    assert matrix.returncode == 0, matrix.stderr
    tags = [row["tag"] for row in json.loads(matrix.stdout)["include"]]
    assert "ghcr.io/moe-stack/fork-cpp:0c1e57098-cpu-avx2" in tags
    model = write_moe_gguf(tmp_path / "models" / "m.gguf", MoeShape(layers=2))
    out = tmp_path / "c.yaml"
    composed = _moe_stack(
        repo,
        "compose",
        "--engine",
        "fork.cpp",
        "--model",
        str(model),
        "--skip-image-checks",
        "--port",
        str(free_local_port()),  # not 8080, which the user's demo may hold
        "-o",
        str(out),
    )
    assert composed.returncode == 0, composed.stderr
    assert "image: ghcr.io/moe-stack/fork-cpp:0c1e57098-cpu-avx2" in out.read_text()


@pytest.mark.lint  # slow: the unit suite again, in the copy
def test_a_fork_keeps_the_unit_suite_green(tmp_path: Path) -> None:
    """With the fork added and its golden renders written (the one step a maintainer runs:
    MOE_STACK_UPDATE_GOLDEN=1 pytest tests/unit/test_golden.py), the whole unit suite passes in the copy:
    no test counts engines from a list of its own."""
    repo = _forked(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(repo), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    golden = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "tests/unit/test_golden.py", "-p", "no:cacheprovider"],
        cwd=repo,
        env={**env, "MOE_STACK_UPDATE_GOLDEN": "1"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert golden.returncode == 0, golden.stdout[-2000:]
    suite = unit_suite(repo, env)
    assert suite.returncode == 0, suite.stdout[-3000:]
