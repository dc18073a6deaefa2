"""`moe-stack smoke` on a stack `moe-stack compose` emitted, brought up by pytest-docker (the container
test harness: `docker_compose_file`, `docker_services`, `wait_until_responsive`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from pytest_docker.plugin import Services

from builder.contract import CONTAINER_PORT
from builder.running.client_checks import fits_reply_schema
from builder.stackfile.host_checks import free_local_port
from builder.stackfile.service_parts import SERVICE
from tests.cli import run_cli
from tests.integration.conftest import answers_health, build_engine_image

pytestmark = pytest.mark.integration
CHECKS = {
    "healthy", "served-name", "completion", "chat", "chat-stream", "tool-call", "structured-output", "image",
    "responses", "messages", "messages-stream", "messages-tool-use", "messages-image", "count-tokens",
    "model-file", "flags", "placement", "gpu", "metrics",
}  # fmt: skip
# A random-weight model writes prose where a tool call is asked for, in either API.
TOOL_CHECKS = ["messages-tool-use", "tool-call"]


@pytest.fixture(scope="session")
def docker_compose_file(tmp_path_factory: pytest.TempPathFactory, base_image: str, moe_model: Path) -> str:
    """A stack emitted the way a user emits one: the CLI, mainline's CPU image, the synthetic MoE (no
    chat template, so the Jinja path and a tools request are exercised), two threads."""
    image = build_engine_image("llama.cpp", "avx2", base_image)
    compose_file = tmp_path_factory.mktemp("smoke") / "compose.yaml"
    result = run_cli(
        "compose",
        "--model",
        str(moe_model),
        "--image",
        image.tag,
        "--served-name",
        "tiny-moe",
        "--threads",
        "2",
        "--port",
        str(free_local_port()),
        "--out",
        str(compose_file),
    )
    assert result.returncode == 0, result.stderr
    return str(compose_file)


@pytest.fixture(scope="session")
def docker_compose_project_name(docker_compose_file: str) -> str:
    """The file's own project name, so `moe-stack smoke` finds the stack pytest-docker started."""
    return str(yaml.safe_load(Path(docker_compose_file).read_text())["name"])


def test_smoke_passes_on_an_emitted_stack_but_the_random_model_makes_no_tool_call(
    docker_services: Services, docker_compose_file: str
) -> None:
    port = docker_services.port_for(SERVICE, CONTAINER_PORT)
    docker_services.wait_until_responsive(check=lambda: answers_health(port), timeout=120, pause=1)
    result = run_cli("smoke", docker_compose_file, "--json")
    checks = {check["name"]: check for check in json.loads(result.stdout)}
    assert set(checks) == CHECKS
    # The tools requests are rendered (Jinja) and answered, but random weights write prose, not a call:
    # the checks fail, as they must for any stack whose model can't call tools, and smoke exits 1.
    assert result.returncode == 1 and not any(checks[name]["passed"] for name in TOOL_CHECKS)
    assert checks["tool-call"]["seen"].startswith("no call of get_weather in the reply (0 tool calls)")
    assert checks["messages-tool-use"]["seen"].startswith("no tool_use of get_weather in the reply (0 tool")
    assert all(check["passed"] for name, check in checks.items() if name not in TOOL_CHECKS), result.stdout
    # Each API through its official client, with what it answered.
    assert int(checks["count-tokens"]["seen"].split()[0]) > 0
    assert checks["messages"]["seen"].split(",")[0].endswith("tokens")
    assert "['tiny-moe']" in checks["served-name"]["seen"]
    assert checks["placement"]["seen"].endswith("2 threads")
    assert checks["gpu"]["seen"].startswith("not asked")
    # A response_format schema holds even random weights to it: one of the six objects it admits.
    assert fits_reply_schema(json.loads(checks["structured-output"]["seen"])), checks["structured-output"]
    # From what the file records it serves, not from the engine's flags.
    assert checks["metrics"]["seen"].startswith("/metrics holds")


def test_smoke_names_what_differs(
    docker_services: Services, docker_compose_file: str, tmp_path: Path
) -> None:
    """The same running stack, checked against a file that names the model otherwise: that check fails
    (beside the tool calls, which the random weights never make)."""
    document = yaml.safe_load(Path(docker_compose_file).read_text())
    document["x-moe-stack"]["served-name"] = "another-name"
    edited = tmp_path / "compose.yaml"
    edited.write_text(yaml.safe_dump(document, sort_keys=False))
    result = run_cli("smoke", str(edited))
    assert result.returncode == 1
    failed = [line for line in result.stdout.splitlines() if "FAIL" in line]
    assert sorted(line.split()[0] for line in failed) == sorted(["served-name", *TOOL_CHECKS]), result.stdout
