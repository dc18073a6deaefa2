"""`moe-stack smoke FILE`: does the user's own stack do what its file says? Each check is a value
(name, passed, what was seen), so the CLI prints a table or JSON and exits non-zero on any failure."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from python_on_whales import Container
from python_on_whales.exceptions import DockerException

from builder.container_start import start_container
from builder.contract import NUMA_ENV
from builder.errors import MoeStackError
from builder.running.api import EngineApi
from builder.running.client_checks import CLIENT_ERRORS, ClientCheck, Clients, client_checks, clients_for
from builder.running.run import published_ports, running_container, stack_api_key, up
from builder.stackfile.record import Record, Served
from builder.stackfile.service_parts import SERVICE, engine_service_name
from builder.stackfile.stack_file import Service, StackFile


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    seen: str


@dataclass(frozen=True)
class StackUnderTest:
    """What the file says, and how to reach what runs."""

    stack_file: StackFile
    name: str
    service: Service
    api: EngineApi
    container: Container | None

    @property
    def record(self) -> Record:
        return self.stack_file.record

    @property
    def served(self) -> Served | None:
        """What the file records the service serves (threads, metrics, tool calls)."""
        return self.record.serves.get(self.name)

    @cached_property
    def clients(self) -> Clients:
        """The official clients, pointed at the stack as an agent would point them."""
        served = self.served
        tool_calls, images = (served.tool_calls, served.images) if served is not None else (False, False)
        return clients_for(self.api, _model(self), tool_calls, images)


StackCheck = Callable[[StackUnderTest], tuple[bool, str]]
# What a check may raise: said as its failure, the other checks still run.
_CHECK_ERRORS = (MoeStackError, DockerException, *CLIENT_ERRORS, KeyError, IndexError, TypeError, ValueError)


def smoke(compose_file: Path, profile: str | None = None, start_timeout_s: int = 1800) -> list[Check]:
    """Bring the stack up (a running one is checked as it is), then check it from outside and inside."""
    try:
        up(compose_file, start_timeout_s, profile)
    except MoeStackError as err:
        return [Check("healthy", False, str(err))]
    stack = _under_test(compose_file, profile)
    return [
        Check("healthy", True, "the engine's healthcheck passed"),
        *_run_checks(stack, _api_checks(stack) + _CONTAINER_CHECKS),
    ]


def api_checks(compose_file: Path, api: EngineApi) -> list[Check]:
    """The checks a client can make, against the stack's engine served at `api` by something other
    than Docker (bench/device/kt.py: the GPU machine runs the image's Python packages natively)."""
    stack_file = StackFile.read(compose_file)
    service = stack_file.service(SERVICE)
    stack = StackUnderTest(stack_file=stack_file, name=SERVICE, service=service, api=api, container=None)
    return _run_checks(stack, _api_checks(stack))


def _run_checks(stack: StackUnderTest, checks: list[tuple[str, StackCheck]]) -> list[Check]:
    out = []
    for name, check in checks:
        try:
            out.append(Check(name, *check(stack)))
        except _CHECK_ERRORS as err:
            out.append(Check(name, False, f"{type(err).__name__}: {err}"))
    return out


def _under_test(compose_file: Path, profile: str | None) -> StackUnderTest:
    stack_file = StackFile.read(compose_file)
    name = engine_service_name(profile)
    service = stack_file.service(name)
    (bind, port), *_ = published_ports(compose_file, stack_file)
    api = EngineApi(
        port, "127.0.0.1" if bind == "0.0.0.0" else bind, stack_api_key(compose_file), timeout_s=300
    )
    container = running_container(compose_file, name, profile)
    return StackUnderTest(stack_file=stack_file, name=name, service=service, api=api, container=container)


def _served_name(stack: StackUnderTest) -> tuple[bool, str]:
    wanted = stack.record.served_name
    listed = [str(model.get("id")) for model in _json(stack.api.get("/v1/models")).get("data", [])]
    return (
        wanted in listed if wanted else bool(listed)
    ), f"/v1/models lists {listed}; the file says {wanted}"


def _completion(stack: StackUnderTest) -> tuple[bool, str]:
    reply = stack.api.post(
        "/v1/completions",
        {"model": _model(stack), "prompt": "Paris is the capital of", "max_tokens": 8, "temperature": 0},
    )
    text, tokens = str(reply["choices"][0].get("text") or ""), reply["usage"]["completion_tokens"]
    return bool(tokens), f"{tokens} tokens: {text!r}"


def _flags(stack: StackUnderTest) -> tuple[bool, str]:
    if stack.container is None:
        return False, "no running container of the service"
    running = list(stack.container.config.cmd or [])
    same = running == stack.service.args
    return same, "the container runs the file's command" if same else f"it runs {running}"


def _placement(stack: StackUnderTest) -> tuple[bool, str]:
    """Threads, cpuset and NUMA policy as the engine's process sees them."""
    if stack.container is None:
        return False, "no running container of the service"
    status = _run(stack.container, ["cat", "/proc/1/status"])
    allowed = _cpus(re.search(r"^Cpus_allowed_list:\s*(\S+)", status, re.MULTILINE))
    seen = [f"{len(allowed)} CPUs allowed"]
    ok = True
    if stack.service.cpuset:
        wanted = _cpus_of(stack.service.cpuset)
        ok &= allowed == wanted
        seen.append(f"cpuset {stack.service.cpuset} {'holds' if allowed == wanted else 'differs'}")
    if stack.served is not None:
        ok &= stack.served.threads <= len(allowed)
        seen.append(f"{stack.served.threads} threads")
    policy = stack.service.env.get(NUMA_ENV, "none")
    if policy != "none":
        maps = _run(stack.container, ["sh", "-c", "head -n 50 /proc/1/numa_maps"])
        kind = {"interleave": "interleave", "membind": "bind"}.get(policy.partition(":")[0], "")
        ok &= not kind or kind in maps
        seen.append(
            f"NUMA {policy}: {'seen in' if not kind or kind in maps else 'missing from'} /proc/1/numa_maps"
        )
    return ok, ", ".join(seen)


def _gpu(stack: StackUnderTest) -> tuple[bool, str]:
    """The GPU in the container and the engine's own log saying it placed weights there (where the log
    says neither, the driver's figure of the GPU's memory in use): a stack whose engine fell back to
    the CPU (no driver in the container, -ngl 0, a CPU build) fails."""
    if not stack.service.wants_gpu:
        return True, "not asked: a CPU-only stack"
    if stack.container is None:
        return False, "no running container of the service"
    nodes = _run(stack.container, ["sh", "-c", "ls /dev/nvidia[0-9]* 2>/dev/null || true"]).split()
    if not nodes:
        return False, "no GPU device nodes in the container"
    placed, seen = stack.record.engine.gpu_use(str(stack.container.logs()))
    if placed is None:  # the log says neither: ask the driver what the GPU holds
        used = _run(stack.container, ["sh", "-c", _GPU_MEMORY]).split()
        placed = any(mib.isdigit() and int(mib) > _IDLE_GPU_MIB for mib in used)
        seen += f"; nvidia-smi in the container: {' + '.join(used) or 'no answer'} MiB in use"
    return placed, f"{seen} ({' '.join(nodes)})"


# More than an idle GPU's few MiB: a CUDA context alone is some 500 MiB.
_IDLE_GPU_MIB = 256
_GPU_MEMORY = "nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null || true"


def _metrics(stack: StackUnderTest) -> tuple[bool, str]:
    if stack.served is None or not stack.served.metrics:
        return True, "not asked: the stack has no metrics endpoint"
    lines = [line for line in stack.api.get("/metrics").splitlines() if line and not line.startswith("#")]
    return bool(lines), f"/metrics holds {len(lines)} samples"


def _run(container: Container, command: list[str]) -> str:
    """What `command` prints inside the container (as the image's user)."""
    output = start_container(lambda: container.execute(command), f"{command[0]} in {container.name}")
    return output if isinstance(output, str) else ""


def _model(stack: StackUnderTest) -> str:
    return stack.record.served_name or "model"


def _json(text: str) -> dict[str, Any]:
    loaded = json.loads(text)
    return loaded if isinstance(loaded, dict) else {}


def _cpus(match: re.Match[str] | None) -> set[int]:
    return _cpus_of(match[1]) if match else set()


def _cpus_of(cpulist: str) -> set[int]:
    cpus: set[int] = set()
    for part in cpulist.split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def _api_checks(stack: StackUnderTest) -> list[tuple[str, StackCheck]]:
    """What a client sees (no Docker needed: `api_checks` runs them where the engine runs without it): the
    served name and a completion, each API the engine serves through its official client, metrics."""
    through_clients = [(name, _through_clients(check)) for name, check in client_checks(stack.record.engine)]
    return [
        ("served-name", _served_name),
        ("completion", _completion),
        *through_clients,
        ("metrics", _metrics),
    ]


def _through_clients(check: ClientCheck) -> StackCheck:
    return lambda stack: check(stack.clients)


def _model_file(stack: StackUnderTest) -> tuple[bool, str]:
    """The model is still on the host: a running server keeps reading the copy it opened, but the stack's
    next start (a restart, a reboot) would fail loading it."""
    model = stack.record.model
    if model.exists():
        return True, f"{model} is here"
    return False, f"{model} is gone from this host: the server reads what it opened, and its next start fails"


# What only the running container shows.
_CONTAINER_CHECKS: list[tuple[str, StackCheck]] = [
    ("model-file", _model_file),
    ("flags", _flags),
    ("placement", _placement),
    ("gpu", _gpu),
]
