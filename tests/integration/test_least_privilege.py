"""Least privilege in what actually runs: every test image's user, history and environment, and a
running stack's container as Docker holds it (no privilege, no capability it didn't ask for,
read-only root and model, loopback port, the API key only as a secret file)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from python_on_whales import DockerClient

from tests.integration.conftest import StackFactory, build_engine_image
from tests.integration.starts import run_in

pytestmark = pytest.mark.integration

SECRET_WORDS = re.compile(r"(?i)(token|secret|passw|api[_-]?key|credential)")
TEST_IMAGES = [
    ("llama.cpp", "avx2"),
    ("llama.cpp", "sapphirerapids"),
    ("ik_llama.cpp", "avx2"),
    pytest.param("llama.cpp", "zen4", marks=pytest.mark.slow),  # built for the slow tier only
    pytest.param("ik_llama.cpp", "zen4", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("engine", "cpu"), TEST_IMAGES)
def test_image_user_history_and_environment(
    engine: str, cpu: str, base_image: str, docker_client: DockerClient
) -> None:
    image = docker_client.image.inspect(build_engine_image(engine, cpu, base_image).tag)
    assert image.config.user == "10001:10001"
    for variable in image.config.env or []:
        assert not SECRET_WORDS.search(variable.split("=", 1)[0]), variable
    for label in image.config.labels or {}:
        assert not SECRET_WORDS.search(label), label
    history = subprocess.run(
        ["docker", "history", "--no-trunc", "--format", "{{.CreatedBy}}", image.id],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert history.count("\n") > 5
    for step in history.splitlines():
        assert not SECRET_WORDS.search(step), step


def test_running_container_holds_no_more_than_asked(
    base_image: str, moe_model: Path, start_stack: StackFactory, tmp_path: Path
) -> None:
    key = tmp_path / "api-key"
    key.write_text("k3y-that-must-not-leak\n")
    key.chmod(0o644)
    stack = start_stack(build_engine_image("llama.cpp", "avx2", base_image), moe_model, api_key_file=key)
    container = stack.client.compose.ps()[0]
    host = container.host_config
    assert host.privileged is False and not host.cap_add and host.cap_drop == ["ALL"]
    assert host.readonly_rootfs is True and "no-new-privileges:true" in (host.security_opt or [])
    assert [b.host_ip for b in host.port_bindings["8080/tcp"]] == ["127.0.0.1"]
    models = [m for m in container.mounts if m.destination == "/models"]
    assert len(models) == 1 and models[0].rw is False
    assert run_in(container, ["id", "-u"]).strip() == "10001"
    seen = " ".join(
        [
            *(container.config.env or []),
            *(container.config.cmd or []),
            *(f"{k}={v}" for k, v in (container.config.labels or {}).items()),
        ]
    )
    assert "k3y-that-must-not-leak" not in seen, "the API key leaked into the container's config"
    assert run_in(container, ["cat", "/run/secrets/moe-stack-api-key"]).strip() == "k3y-that-must-not-leak"
