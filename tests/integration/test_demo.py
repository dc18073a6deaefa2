"""The README's first command: `moe-stack demo` builds the CPU image, serves the demo model, answers."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest
import yaml

from builder.files import cache_dir
from builder.running.run import down
from tests.cli import run_cli
from tests.integration.conftest import free_port

pytestmark = pytest.mark.integration


def test_demo_serves_the_small_model(base_image: str) -> None:
    """On a project of its own: the user's demo (the README's first command) keeps running beside it."""
    port, project = free_port(), f"moe-stack-demo-test-{uuid.uuid4().hex[:8]}"
    compose_file = cache_dir() / "demo" / project / "compose.yaml"
    try:
        result = run_cli("demo", "--port", str(port), "--project", project)
        assert result.returncode == 0, result.stderr[-2000:]
        assert "Paris is the capital of France" in " ".join(result.stdout.split())
        assert f"http://127.0.0.1:{port}" in result.stdout
        assert (
            f"published: '{port}'" in compose_file.read_text()
            and "host_ip: 127.0.0.1" in compose_file.read_text()
        )
        command = yaml.safe_load(compose_file.read_text())["services"]["engine"]["command"]
        assert command[command.index("--alias") + 1] == "gemma-3-270m-q4_k_m"  # a clean served name
    finally:
        if Path(compose_file).is_file():
            down(compose_file)
        shutil.rmtree(compose_file.parent, ignore_errors=True)  # the test's own stack, not the user's
