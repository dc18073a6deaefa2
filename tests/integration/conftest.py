"""Container harness: real base image, real engine images built from real sources, real models.

Everything a test creates has a unique name and is removed by a yield fixture, also on failure.
Without a Docker daemon the integration tests are skipped, except under CI, where that fails them.
"""

from __future__ import annotations

import contextlib
import os
import re
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from pytest_docker.plugin import get_docker_services
from python_on_whales import DockerClient

from builder.container_start import RUNTIME_LOST_INIT
from builder.docker_client import docker
from builder.engines import Engine, get_engine
from builder.engines.base import StackSpec
from builder.engines.ktransformers import PYTHON_CPU_BASE
from builder.errors import DockerUnavailable
from builder.images.baseimage import ensure_base
from builder.images.build import build_image
from builder.images.image_facts import read_image_facts
from builder.images.mirror import mirrored, verified_tree
from builder.images.naming import image_spec, short_ref
from builder.images.source import resolve_local
from builder.models.model_files import fetch_demo_model
from builder.models.synth_catalog import TINY
from builder.models.synth_moe import MoeShape, write_moe_gguf
from builder.platform.pins import pinned_ref
from builder.running.run import down
from builder.spec import BaseImages
from builder.stackfile.host_checks import free_local_port
from builder.stacks.compose import compose_stack, write_stack
from tests.integration.wheelhouse import make_kt_wheelhouse
from tests.sources import source_mirror

ENGINES = ["llama.cpp", "ik_llama.cpp"]


@dataclass(frozen=True)
class BuiltImage:
    engine: str
    tag: str
    ref: str
    cpu: str
    source: str = ""  # what it was built from (mirror:TARBALL, pypi:SDIST), said in the suite's summary


@dataclass(frozen=True)
class RunningStack:
    compose_file: Path
    port: int
    client: DockerClient

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture(scope="session")
def docker_client() -> DockerClient:
    try:
        return docker()
    except DockerUnavailable as err:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs a Docker daemon: {err}")
        pytest.skip(str(err))


@pytest.fixture(scope="session")
def base_image(docker_client: DockerClient) -> str:
    """debian:trixie-slim where it can be pulled, else one made here with `moe-stack base`."""
    return ensure_base()


_built: dict[tuple[str, str, bool], BuiltImage] = {}


def suite_tree(engine: Engine) -> tuple[Path, str, str]:
    """The tree the suite builds `engine` from, its ref and what it is (mirror:TARBALL or pypi:SDIST): the
    pinned ref's from the source mirror (MOE_STACK_SOURCES, else ../shared/sources), each file held to
    its manifest; else the tree of the PyPI sdist that vendors the engine (the pin's only where the sdist
    vendors it)."""
    mirror = source_mirror()
    found = mirrored(mirror, engine, pinned_ref(engine.name)) if mirror is not None else None
    if found is not None:
        return verified_tree(found), found.ref, f"mirror:{found.name}"
    assert engine.sdist is not None and engine.sdist_ref is not None, engine.name
    return resolve_local(engine, f"pypi:{engine.sdist}"), engine.sdist_ref, f"pypi:{engine.sdist}"


def build_engine_image(engine_name: str, cpu: str, base: str, tools: bool = False) -> BuiltImage:
    """An engine's CPU-only image for `cpu` (or its tools image), built once per session from its suite
    tree (suite_tree)."""
    if (engine_name, cpu, tools) not in _built:
        engine = get_engine(engine_name)
        tree, ref, what = suite_tree(engine)
        spec = image_spec(
            engine,
            cpu,
            tree=tree,
            ref=ref,
            base=BaseImages(build=base, runtime=base),
            registry="localhost",
            namespace="moe-stack-test",
            tools=tools,
        )
        tag = build_image(spec, tree, show=lambda line: None)
        _built[(engine_name, cpu, tools)] = BuiltImage(engine.name, tag, ref, cpu, what)
    return _built[(engine_name, cpu, tools)]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Which tree each engine image of the session was built from, and whether that was the pin's."""
    for image in _built.values():
        pin = pinned_ref(image.engine)
        which = "the pin" if image.ref == pin else f"not the pin {short_ref(pin)}: no source mirror holds it"
        terminalreporter.write_line(f"built {image.tag} from {image.source} ({which})")


@pytest.fixture(scope="session", params=ENGINES)
def engine_image(request: pytest.FixtureRequest, base_image: str) -> BuiltImage:
    """Each engine's avx2 image: the one every x86-64-v3 host runs."""
    return build_engine_image(request.param, "avx2", base_image)


# The zen4 builds (mainline's 5 min cold on 2 cores, ik_llama.cpp's 12.5) serve no default stack: they
# prove the AVX-512 path only, so they run in the slow tier (nightly). Every run proves it on mainline's
# sapphirerapids build, which the guard's tests need anyway (this host, CI's too, lacks AMX).
@pytest.fixture(
    scope="session",
    params=[
        pytest.param("llama.cpp", marks=pytest.mark.slow),
        pytest.param("ik_llama.cpp", marks=pytest.mark.slow),
    ],
)
def zen4_image(request: pytest.FixtureRequest, base_image: str) -> BuiltImage:
    return build_engine_image(request.param, "zen4", base_image)


@pytest.fixture(scope="session")
def amx_image(base_image: str) -> BuiltImage:
    """llama.cpp for Sapphire Rapids: needs AMX, which AMD hosts (this one, CI's) lack."""
    return build_engine_image("llama.cpp", "sapphirerapids", base_image)


@pytest.fixture(scope="session")
def bookworm_base(docker_client: DockerClient) -> str:
    """KTransformers' CPU base (CPython 3.11, which kt-kernel has wheels for)."""
    return ensure_base(PYTHON_CPU_BASE, "moe-stack/debian:bookworm", "bookworm")


@pytest.fixture(scope="session")
def kt_wheelhouse() -> Path:
    """An offline wheelhouse for KTransformers' CPU kernel image: kt-kernel from PyPI, torch's CPU build
    (PyPI's x86-64 torch is a CUDA build; the CPU wheel lies on this kind of host) and the rest of
    what kt-kernel's loader imports, all for CPython 3.11 on manylinux."""
    return make_kt_wheelhouse()


@pytest.fixture(scope="session")
def gemma_model() -> Path:
    return fetch_demo_model()


@pytest.fixture(scope="session")
def moe_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("moe")
    directory.chmod(0o755)  # the engine runs as uid 10001, not as the file's owner
    model = write_moe_gguf(directory / "tiny-qwen3moe-q8_0.gguf", MoeShape())
    model.chmod(0o644)
    return model


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny model of each architecture synth-moe writes, readable by the engine's user (uid 10001)."""
    directory = tmp_path_factory.mktemp("tiny-models")
    directory.chmod(0o755)
    models = {}
    for arch, shape in TINY.items():
        models[arch] = write_moe_gguf(directory / f"tiny-{arch}.gguf", shape)
        models[arch].chmod(0o644)
    return models


free_port = free_local_port


def broken_tree(tree: Path) -> Path:
    """A llama.cpp-shaped tree whose configure step fails on purpose ("deliberate configure failure")."""
    for rel in ("ggml", "tools/server"):
        (tree / rel).mkdir(parents=True)
    (tree / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.14)\nproject(broken C)\n"
        'message(FATAL_ERROR "moe-stack-test: deliberate configure failure")\n'
    )
    return tree


def image_with_program(
    docker_client: DockerClient, base: str, directory: Path, program: str, script: str, tag: str
) -> str:
    """`base` with `script` (a shell script's text) installed as /usr/local/bin/`program`, built as `tag`
    from a context in `directory`: a stand-in for the program an image of moe-stack's ships."""
    directory.mkdir()
    (directory / "tool").write_text(script)
    (directory / "Dockerfile").write_text(f"FROM {base}\nCOPY --chmod=0755 tool /usr/local/bin/{program}\n")
    docker_client.buildx.build(directory, tags=[tag], load=True, progress=False)
    return tag


StackFactory = Callable[..., RunningStack]


def emit_stack(directory: Path, image: BuiltImage, model: Path, **options: object) -> tuple[Path, int]:
    """A stack as `moe-stack compose` writes it (checked against the image's flag contract), on a free
    port and under a unique project name; (its compose file, its port)."""
    port = free_local_port()
    project = f"mst-{get_engine(image.engine).slug}-{uuid.uuid4().hex[:8]}"
    stack = StackSpec.model_validate(
        {
            "project_name": project,
            "engine": image.engine,
            "image_ref": image.tag,
            "model": model,
            "port": port,
            "cpu_threads": 2,
            **options,
        }
    )
    document = compose_stack(stack, generated_by="pytest", facts=read_image_facts(image.tag))
    return write_stack(document, directory / project / "compose.yaml"), port


def need_root(what: str) -> None:
    """Skip, saying why, where the test can't `what` without root; CI runs as root, so there it fails."""
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail(f"CI runs as root and must {what}")
        pytest.skip(f"{what} needs root")


def answers_health(port: int) -> bool:
    """Whether the engine on `port` answers /health with 200."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture
def start_stack(tmp_path: Path) -> Iterator[StackFactory]:
    """Emit a stack for (image, model, options) and bring it up with pytest-docker (`docker compose up
    --wait`, then `wait_until_responsive` on its health endpoint); every stack is removed after."""
    with contextlib.ExitStack() as running:

        def _start(image: BuiltImage, model: Path, wait_s: int = 180, **options: object) -> RunningStack:
            compose_file, port = emit_stack(tmp_path, image, model, **options)
            return serve_stack(running, compose_file, port, wait_s)

        yield _start


def serve_stack(running: contextlib.ExitStack, compose_file: Path, port: int, wait_s: int) -> RunningStack:
    """Bring a written stack up with pytest-docker (`up --wait`, then its health endpoint), removed when
    `running` closes; a failed `up` is cleaned before it is reported."""
    project = str(yaml.safe_load(compose_file.read_text())["name"])
    for attempt in (1, 2):
        try:
            services = running.enter_context(
                get_docker_services(
                    "docker compose",
                    str(compose_file),
                    project,
                    [f"up --wait --wait-timeout {wait_s}"],
                    ["down --volumes --remove-orphans --timeout 10"],
                )
            )
            break
        except Exception as err:  # a failed `up` leaves its containers: remove them before reporting
            down(compose_file)
            if attempt == 2 or RUNTIME_LOST_INIT not in str(err):  # the host's hiccup `up` retries too
                raise
    services.wait_until_responsive(check=lambda: answers_health(port), timeout=wait_s, pause=1)
    return RunningStack(
        compose_file=compose_file, port=port, client=DockerClient(compose_files=[compose_file])
    )


def budget_minutes(refusal: str) -> int:
    """The budget `tune` asks for when it refuses one as too small ("give --budget 3m or more"): what one
    dimension needs at this host's trial times, which a busy host stretches."""
    match = re.search(r"give --budget (\d+)m or more", refusal)
    assert match, refusal
    return int(match.group(1))


def check_kv_as_planned(stack: StackSpec, logs: str) -> None:
    """The KV cache the engine logged (its KV and recurrent-state buffers: mainline logs the state apart,
    RS, a sliding-window model's windowed layers apart, and DeepSeek-V4's four caches and three compressor
    states each apart; ik_llama.cpp DeepSeek-V4's compressed caches and states in one total beside its
    K) against the plan's for the engine's layout, within 10 %."""
    planned = stack.kv_bytes()
    buffers = re.findall(
        r"CPU (?:KV|RS|DSV4 \w+ state) buffer size =\s+([\d.]+) MiB"
        r"|DSV4 cache: .* total=\s*([\d.]+) MiB",
        logs,
    )
    logged = sum(float(mib or total) for mib, total in buffers) * 1024**2
    assert logged, logs[-2000:]
    assert abs(planned - logged) <= 0.10 * logged, (planned, logged)
