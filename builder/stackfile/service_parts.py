"""The shape every service of a stack shares and the names its parts go by: the services' and profiles'
names, the hardening, the healthcheck, the logs' bound, a published port, the model's mounts, the host
placement, and the whole file made of services (`stack_document`). `compose` (stacks/document.py), the
features and `load`'s rebuild of a bundle's stack all make their services and file of these."""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

from builder.contract import (
    API_KEY_FILE_ENV,
    API_KEY_PATH,
    API_KEY_SECRET,
    CONFIG_DIR,
    MODEL_DIR,
)
from builder.engines.base import Engine
from builder.stackfile.record import Record
from builder.stackfile.stack_file import (
    Deploy,
    Device,
    Healthcheck,
    Logging,
    Mount,
    Port,
    Reservations,
    Resources,
    Secret,
    Service,
    StackFile,
    Ulimit,
    Volume,
)

SERVICE = "engine"
CPU_SERVICE = "engine-cpu"  # the CPU-only service of a stack with gpu/cpu profiles
GPU_PROFILE, CPU_PROFILE = "gpu", "cpu"
HEALTHCHECK = ("CMD", "/usr/local/bin/moe-stack-health")
# A server that logs every request must not fill the disk: at most 3 × 50 MB per service.
LOGGING = Logging(driver="json-file", options={"max-size": "50m", "max-file": "3"})


# What every service of a stack runs with: a read-only root (/tmp a tmpfs), no capabilities, no
# privilege gain.
class Hardening(TypedDict):
    read_only: bool
    tmpfs: tuple[str, ...]
    cap_drop: tuple[str, ...]
    security_opt: tuple[str, ...]


HARDENED: Hardening = {
    "read_only": True,
    "tmpfs": ("/tmp",),
    "cap_drop": ("ALL",),
    "security_opt": ("no-new-privileges:true",),
}


def engine_service_name(profile: str | None) -> str:
    """The name of a stack file's engine service (its CPU-only one for `profile` cpu)."""
    return CPU_SERVICE if profile == "cpu" else SERVICE


def published(target: int, port: int, bind: str) -> Port:
    """A container port published on `bind`:`port` of the host."""
    return Port(target=target, published=str(port), host_ip=bind, protocol="tcp")


def directory_mount(model: Path) -> Mount:
    """The model's directory at /models, read-only."""
    return Mount(type="bind", source=str(model.parent), target=MODEL_DIR, read_only=True)


def file_mount(source: Path, name: str) -> Mount:
    """One file of the model at /models/`name`, read-only (the engine sees it and nothing beside it)."""
    return Mount(type="bind", source=str(source), target=f"{MODEL_DIR}/{name}", read_only=True)


def api_key_environment(engine: Engine, keeps_prompts: bool) -> dict[str, str]:
    """The key file's variable in a keyed stack's service, for whoever reads it from there: an engine that
    takes no key file flag (its image's launcher), and the prompt helper's own requests."""
    return {API_KEY_FILE_ENV: API_KEY_PATH} if engine.key_file_from_env or keeps_prompts else {}


def service_of(
    image: str,
    command: list[str],
    port: Port,
    volumes: tuple[Mount, ...],
    shm_size: str,
    start_period_s: int,
    placed: Placed,
    api_key: bool,
) -> Service:
    """An engine service: these values in moe-stack's one shape (`moe-stack load` rebuilds a bundle's
    stack through it too)."""
    return Service(
        image=image,
        command=tuple(command),
        ports=(port,),
        volumes=volumes,
        # The engine writes nothing but its logs.
        **HARDENED,
        shm_size=shm_size,
        healthcheck=Healthcheck(
            test=HEALTHCHECK,
            interval="10s",
            timeout="5s",
            retries=3,
            start_period=f"{start_period_s}s",
            start_interval="2s",
        ),
        restart="unless-stopped",
        logging=LOGGING,
        **placed,
        secrets=(API_KEY_SECRET,) if api_key else None,
    )


def config_mount(config_dir: Path) -> Mount:
    return Mount(type="bind", source=str(config_dir), target=CONFIG_DIR, read_only=True)


class Placed(TypedDict, total=False):
    """A service's host-facing keys (`placement`), as Service takes them."""

    environment: dict[str, str]
    ulimits: dict[str, Ulimit]
    cap_add: tuple[str, ...]
    cpuset: str
    deploy: Deploy


def placement(
    environment: dict[str, str], caps: list[str], cpuset: str | None, device: Device | None
) -> Placed:
    """The host-facing parts: the entrypoint's environment (NUMA policy, hugetlbfs staging) and the
    capabilities it needs, locked memory (unlimited memlock with IPC_LOCK), cpuset, GPU passthrough."""
    extra: Placed = {}
    if environment:
        extra["environment"] = environment
    if "IPC_LOCK" in caps:
        extra["ulimits"] = {"memlock": Ulimit(soft=-1, hard=-1)}
    if caps:
        extra["cap_add"] = tuple(caps)
    if cpuset:
        extra["cpuset"] = cpuset
    if device is not None:
        extra["deploy"] = Deploy(resources=Resources(reservations=Reservations(devices=(device,))))
    return extra


def gpu_device(gpu: str, gpu_ids: tuple[int, ...]) -> Device | None:
    """The GPU reservation: through the nvidia runtime or CDI, these GPUs (none given: all)."""
    if gpu == "none":
        return None
    ids = tuple(str(i) for i in gpu_ids)
    if gpu == "nvidia":
        return Device(
            driver="nvidia", device_ids=ids or None, count=None if ids else "all", capabilities=("gpu",)
        )
    return Device(
        driver="cdi", device_ids=tuple(f"nvidia.com/gpu={i}" for i in ids or ["all"]), capabilities=("gpu",)
    )


def stack_document(
    project: str,
    record: Record,
    services: dict[str, Service],
    configured: dict[str, Volume],
    api_key: Path | None,
) -> StackFile:
    """The whole file: `services` with the volumes and secret they use, `record` as x-moe-stack with
    the services' lint exceptions (`load` rebuilds a bundle's through it too). A named volume a service
    mounts is declared (a feature's, by its mount): as `configured` has it (hugetlbfs' page size), else
    plain."""
    named = sorted({m.source for s in services.values() for m in s.volumes or () if m.type == "volume"})
    volumes = {name: configured.get(name, Volume()) for name in named}
    return StackFile(
        name=project,
        record=record.model_copy(update={"lint_exceptions": lint_exceptions(services)}),
        services=services,
        volumes=volumes or None,
        secrets=api_key_secret(api_key) if api_key is not None else None,
    )


def api_key_secret(path: Path) -> dict[str, Secret]:
    """The top-level secret holding the API key file's first line."""
    return {API_KEY_SECRET: Secret(file=str(path))}


def lint_exceptions(services: dict[str, Service]) -> dict[str, str]:
    """Why this stack departs from a compose security linter's defaults (compose-lint rule IDs): each
    departure a feature asked for, with its reason, so a review (or `compose-lint`) can check them."""
    caps = {cap for service in services.values() for cap in service.cap_add or ()}
    reasons = {
        "SYS_NICE": "SYS_NICE: numactl applies the stack's NUMA policy, or KTransformers binds its CPU "
        "thread "
        "pools' memory to their NUMA nodes (mbind/set_mempolicy, which Docker's seccomp profile "
        "allows only with it); nothing in the image sets real-time priorities",
        "IPC_LOCK": "IPC_LOCK: --mlock keeps the model's pages resident (asked for with --mlock)",
    }
    exceptions = {}
    if caps:
        exceptions["CL-0029"] = "; ".join(reasons[cap] for cap in sorted(caps))
    exceptions["CL-0026"] = (
        "no memory limit: the mmapped weights are page cache charged to the container, and a "
        "limit below the model evicts them; CPUs are bounded by cpuset/threads instead"
    )
    if any("@sha256:" not in service.image for service in services.values()):
        exceptions["CL-0019"] = (
            "image by tag: it has no registry digest yet (built here, or not checked with "
            "--skip-image-checks); stacks made from a pushed or pulled image pin the digest"
        )
    return exceptions
