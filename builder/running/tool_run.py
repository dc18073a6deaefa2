"""Run a tools-image program in a container shaped like a stack's engine: the stack's own service
(mounts, cpuset, NUMA policy, GPU, capabilities, memlock, hugepages, read-only root, non-root user)
with the tools image and the tool's command, and without ports, healthcheck or restarts. It runs as
`docker compose run` of a derived file written beside the stack's (its relative paths stay valid),
under a project of its own, removed afterwards."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from python_on_whales import Container, DockerClient
from python_on_whales.exceptions import DockerException

from builder.container_start import start_container
from builder.docker_client import describe, docker
from builder.engines import Engine, bench_engine
from builder.errors import StackError
from builder.images.image_facts import read_image_facts
from builder.images.naming import tools_image_of
from builder.platform.flags import parse_help
from builder.running.tool_bench import BenchRow, ToolOutput, last_error, parse, program, tool_args
from builder.stackfile.escaping import literal
from builder.stackfile.service_parts import engine_service_name
from builder.stackfile.stack_file import Healthcheck, StackFile, to_yaml


def tool_document(stack: StackFile, service_name: str, image: str, command: list[str]) -> dict[str, object]:
    """The stack's file reduced to its engine service running `command` from `image`, with the
    volumes and secret it names (the hugetlbfs volume, the API key); no record: moe-stack's readers
    never see it."""
    service = stack.service(service_name).model_copy(
        update={
            "image": image,
            "command": tuple(command),
            "ports": None,
            "profiles": None,
            "restart": None,
            "healthcheck": Healthcheck(disable=True),
        }
    )
    derived = stack.model_copy(update={"name": f"{stack.name}-tool", "services": {service_name: service}})
    return literal(derived.model_dump(mode="json", by_alias=True, exclude={"record"}))


@dataclass(frozen=True)
class ContainerRunner:
    """Runs programs of `image` (a tools image) as the stack in `compose_file` runs its engine."""

    compose_file: Path
    image: str
    profile: str | None = None
    say: Callable[[str], None] | None = None  # the caller's progress line (a start tried again is said there)

    def check_stopped(self) -> None:
        """A running stack holds the model's memory and the cores the tool would measure."""
        docker()
        if DockerClient(compose_files=[self.compose_file], compose_profiles=["*"]).compose.ps():
            raise StackError(
                f"the stack of {self.compose_file} is running: it holds the memory and cores the tool "
                f"would measure; stop it first (`moe-stack down {self.compose_file}`)"
            )

    def check_image(self) -> None:
        client = docker()
        if not client.image.exists(self.image):
            raise StackError(
                f"no tools image {self.image} here: build it with `moe-stack build --tools` (same "
                "engine, --cpu and --cuda as the stack's image), or pass --tools-image"
            )

    def _run(self, command: list[str], env: dict[str, str] | None = None) -> ToolOutput:
        name = engine_service_name(self.profile)
        derived = to_yaml(tool_document(StackFile.read(self.compose_file), name, self.image, command))
        fd, path = tempfile.mkstemp(prefix=".moe-stack-tool-", suffix=".yaml", dir=self.compose_file.parent)
        with os.fdopen(fd, "w") as handle:
            handle.write(derived)
        client = DockerClient(compose_files=[Path(path)])
        printed: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
        try:
            lines = client.compose.run(
                name, remove=True, tty=False, dependencies=False, stream=True, envs=env or {}
            )
            if isinstance(lines, (str, Container)):  # stream=True yields (source, line) pairs
                raise StackError(f"docker compose run returned {type(lines).__name__}, not the tool's output")
            for source, line in lines:
                printed[source].append(line)
            stdout, stderr = (
                b"".join(printed[source]).decode(errors="replace") for source in ("stdout", "stderr")
            )
            return ToolOutput(stdout, stderr)
        finally:
            try:
                client.compose.down(volumes=True, timeout=5, quiet=True)
            except DockerException:
                pass
            Path(path).unlink(missing_ok=True)

    def run(self, program: str, args: list[str], env: dict[str, str] | None = None) -> ToolOutput:
        try:
            return start_container(
                lambda: self._run([program, *args], env), f"{program} in {self.image}", self.say
            )
        except DockerException as err:
            said = last_error(err.stderr or "") if err.stderr else describe(err)
            raise StackError(f"{program} failed in {self.image}: {said}") from None

    def help(self, program: str) -> str:
        try:
            output = start_container(
                lambda: self._run([program, "--help"]), f"{program} in {self.image}", self.say
            )
            return output.stdout + output.stderr
        except DockerException as err:  # a usage text with a non-zero exit is still the usage
            return (err.stdout or "") + (err.stderr or "")


@dataclass(frozen=True)
class ToolBench:
    """A tool run for a stack: what ran and what it measured."""

    image: str
    program: str
    args: list[str]
    left_out: list[str]
    rows: list[BenchRow]


def stack_server_args(
    stack: StackFile, compose_file: Path, profile: str | None
) -> tuple[Engine, str, list[str]]:
    """(engine, image, server arguments) of a one-model stack file."""
    service = stack.service(engine_service_name(profile))
    record = stack.record
    args = service.args
    if record.models:
        raise StackError(
            f"{compose_file} routes several models; benchmark one model's stack (emit it with one --model)"
        )
    return record.engine, service.image, args


def bench_with_tool(
    compose_file: Path,
    tool: str,
    tools_image: str | None,
    prompt_tokens: int,
    generate: int,
    repetitions: int,
    profile: str | None = None,
    starting: Callable[[str], None] = lambda line: None,
) -> ToolBench:
    """Run `tool` from the tools image beside the stack's image, with the stack's flags; `starting`
    hears one line once everything is checked and the run begins."""
    served_by, image, server_args = stack_server_args(StackFile.read(compose_file), compose_file, profile)
    engine = bench_engine(served_by)
    name = program(engine, tool)
    runner = ContainerRunner(compose_file, tools_image or tools_image_of(image), profile, starting)
    runner.check_image()
    runner.check_stopped()
    # llama-bench parses its own flags; sweep-bench shares the server's parser (the image's contract).
    flags = (
        read_image_facts(runner.image).server_flags
        if tool == "sweep-bench"
        else parse_help(runner.help(name))
    )
    planned = tool_args(engine, tool, server_args, flags, prompt_tokens, generate, repetitions)
    starting(f"running {name} from {runner.image} with the stack's flags (the model loads first)")
    rows = parse(tool, runner.run(name, planned.args))
    return ToolBench(
        image=runner.image, program=name, args=planned.args, left_out=planned.left_out, rows=rows
    )
