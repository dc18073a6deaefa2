"""Run an emitted stack: `up --wait` and `down` through python-on-whales, with clear failures."""

from __future__ import annotations

from pathlib import Path

import yaml
from python_on_whales import DockerClient
from python_on_whales.exceptions import DockerException

from builder.compose import SERVICE, check_port_free
from builder.docker_client import describe, docker
from builder.errors import StackError


def _client(compose_file: Path) -> DockerClient:
    if not compose_file.is_file():
        raise StackError(f"compose file {compose_file} does not exist; emit one with `moe-stack compose`")
    docker()  # fail early and clearly when there is no daemon
    return DockerClient(compose_files=[compose_file])


def published_ports(compose_file: Path) -> list[tuple[str, int]]:
    """(host address, port) pairs the stack publishes."""
    document = yaml.safe_load(compose_file.read_text())
    pairs = []
    for service in (document.get("services") or {}).values():
        for port in service.get("ports") or []:
            if isinstance(port, dict) and port.get("published"):
                pairs.append((port.get("host_ip") or "0.0.0.0", int(port["published"])))
    return pairs


def up(compose_file: Path, timeout_s: int) -> None:
    """Start the stack and wait until it is healthy; on failure say why, with the engine's last log."""
    client = _client(compose_file)
    if not client.compose.ps():
        for bind, port in published_ports(compose_file):
            check_port_free(bind, port)
    try:
        client.compose.up(detach=True, wait=True, wait_timeout=timeout_s, quiet=True)
    except DockerException as err:
        log_tail = _service_log_tail(client)
        raise StackError(f"the stack did not become healthy ({describe(err)}); engine log: {log_tail}") from None


def down(compose_file: Path) -> None:
    client = _client(compose_file)
    try:
        client.compose.down(remove_orphans=True, volumes=True, timeout=10)
    except DockerException as err:
        raise StackError(f"docker compose down failed: {describe(err)}") from None


def _service_log_tail(client: DockerClient) -> str:
    try:
        text = client.compose.logs(services=[SERVICE], tail="20", no_log_prefix=True)
    except DockerException:
        return "unavailable"
    lines = [line for line in str(text).splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or ["(empty)"])[-1].strip()
