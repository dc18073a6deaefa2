"""A failing build shows the failing step's tail and where the full log is; nothing is tagged."""

from __future__ import annotations

from pathlib import Path

import pytest
from python_on_whales import DockerClient

from tests.cli import run_cli
from tests.integration.conftest import broken_tree

pytestmark = pytest.mark.integration


def test_build_failure_is_reported(docker_client: DockerClient, base_image: str, tmp_path: Path) -> None:
    tree = broken_tree(tmp_path / "llama.cpp")
    log = tmp_path / "build.log"
    result = run_cli(
        "build",
        "--source",
        str(tree),
        "--ref",
        "broken",
        "--base-image",
        base_image,
        "--namespace",
        "moe-stack-test",
        "--log",
        str(log),
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("moe-stack: error: image build failed") and f"(full log: {log})" in last
    assert "deliberate configure failure" in result.stderr  # the failing step's tail is shown
    assert "deliberate configure failure" in log.read_text()
    assert not docker_client.image.exists("ghcr.io/moe-stack-test/llama-cpp:broken-cpu-avx2")
