"""Every stack in compose/ passes `docker compose config` (the GPU device request included)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from python_on_whales import DockerClient

pytestmark = pytest.mark.integration

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "compose").glob("*.*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_passes_compose_config(docker_client: DockerClient, path: Path) -> None:
    result = subprocess.run(["docker", "compose", "-f", str(path), "config", "--format", "json"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    service = json.loads(result.stdout)["services"]["engine"]
    device = service["deploy"]["resources"]["reservations"]["devices"][0]
    assert device["capabilities"] == ["gpu"] and device["driver"] == "nvidia"
    assert service["cap_add"] == ["SYS_NICE"] and service["cap_drop"] == ["ALL"]
    assert service["ports"][0]["host_ip"] == "127.0.0.1"
