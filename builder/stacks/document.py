"""StackSpec → the stack file (stackfile/stack_file.py), built without touching the host (host_checks.py
checks and resolves the files first)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from builder.contract import (
    CONTAINER_PORT,
    NUMA_ENV,
    ROUTER_PRESET_ENV,
)
from builder.engines.base import StackSpec
from builder.errors import StackError
from builder.features import refuse
from builder.features.all import FEATURES
from builder.features.hugepages import hugetlbfs_volume, staging_environment
from builder.host.placement import numa_env
from builder.images.image_facts import ImageFacts
from builder.platform.flags import check_args
from builder.spec import EngineOptions
from builder.stackfile.record import OptionValue, Record, Served
from builder.stackfile.service_parts import (
    CPU_PROFILE,
    CPU_SERVICE,
    GPU_PROFILE,
    SERVICE,
    api_key_environment,
    config_mount,
    gpu_device,
    placement,
    published,
    service_of,
    stack_document,
)
from builder.stackfile.stack_file import (
    Service,
    StackFile,
    StackFiles,
)

# Load rate assumed when sizing the healthcheck's start period: a cold page cache from NVMe
# streams a few hundred MB/s through mmap; slower disks should raise --start-period.
_LOAD_BYTES_PER_S = 250 * 1024**2
_MIN_START_PERIOD_S = 60


def project_name_for(model: Path) -> str:
    """A compose project name from the model's file name (lower case, [a-z0-9_-]) and a short hash of
    its directory: same-named models in two directories are two projects (`up` of one must not
    replace the other, nor `down -v` remove both)."""
    slug = re.sub(r"[^a-z0-9_-]+", "-", model.stem.lower()).strip("-_")
    where = hashlib.sha256(str(model.parent).encode()).hexdigest()[:6]
    return f"{f'moe-stack-{slug}'[:53].rstrip('-_')}-{where}"


def start_period_for(model_bytes: int) -> int:
    """Seconds the engine gets to load before failed healthchecks count."""
    return max(_MIN_START_PERIOD_S, 30 + model_bytes // _LOAD_BYTES_PER_S)


def compose_document(
    stack: StackSpec,
    generated_by: str,
    files: StackFiles,
    facts: ImageFacts | None = None,
    cpu_profile: tuple[StackSpec, ImageFacts | None] | None = None,
    routed: tuple[StackSpec, ...] = (),
) -> StackFile:
    """The stack file for `stack` with its `files` as mounted; `generated_by` records the command
    that made it.

    With the image's `facts`, every engine flag is checked against its flag contract and neutral
    options are written in that engine version's syntax. With `cpu_profile` (a CPU-only stack and its
    image's facts), the file holds two services behind the compose profiles `gpu` and `cpu`. With
    `routed` (each model's stack), one server switches between those models: `stack` gives the
    service (image, port, placement) and each routed stack that model's own flags.
    """
    service = _service(stack, facts, files)
    if routed:
        if cpu_profile is not None:
            raise StackError("a stack of several models has one service: drop --cpu-image")
        refuse(FEATURES, stack, "router")
        command, preset = _router_command(stack, routed, facts)
        service = service.model_copy(
            update={"command": tuple(command), "environment": {**service.env, ROUTER_PRESET_ENV: preset}}
        )
    services = {SERVICE: service}
    if cpu_profile is not None:
        cpu_stack, cpu_facts = cpu_profile
        services[SERVICE] = service.model_copy(update={"profiles": (GPU_PROFILE,)})
        cpu_service = _service(cpu_stack, cpu_facts, files)
        services[CPU_SERVICE] = cpu_service.model_copy(update={"profiles": (CPU_PROFILE,)})
    engines = list(services)
    for feature in FEATURES:
        services |= feature.services(stack, engines)
    record = Record(
        generated_by=generated_by,
        engine=stack.engine,
        image=stack.image_ref,
        model=files.model,
        served_name=stack.served_name,
        engine_options=engine_options(stack),
        derived=stack.derived,
        flags_checked=facts is not None,
        serves={
            SERVICE: serves(stack, services[SERVICE].args),
            **({CPU_SERVICE: serves(cpu_profile[0], services[CPU_SERVICE].args)} if cpu_profile else {}),
        },
        models=tuple(str(model.served_name) for model in routed),
        cpu_weights="pinned" if engine_pins(stack) else None,
        profiles=(GPU_PROFILE, CPU_PROFILE) if cpu_profile is not None else (),
    )
    page_size = None if stack.hugetlbfs == "off" else stack.hugetlbfs
    return stack_document(stack.project_name, record, services, hugetlbfs_volume(page_size), files.api_key)


def serves(stack: StackSpec, args: list[str]) -> Served:
    """What an engine service serves, for the readers of the file (smoke, tune, bench) that must not
    parse an engine's flags: its CPU threads, GPU layers, and whether /metrics, tool calls and images
    are on."""
    engine = stack.engine
    return Served(
        threads=stack.cpu_threads,
        gpu_layers=stack.gpu_layers,
        metrics=engine.metrics_flag is not None and engine.metrics_flag in args,
        tool_calls=engine.tool_calls_flag is not None and engine.tool_calls_flag in args,
        images=stack.mmproj is not None,
    )


def _router_command(
    stack: StackSpec, routed: tuple[StackSpec, ...], facts: ImageFacts | None
) -> tuple[list[str], str]:
    """The router's command and preset file; with the image's facts, every model's flags are checked."""
    engine = stack.engine
    names = [model.served_name for model in routed]
    if len(set(names)) != len(names):
        raise StackError(
            f"two models would be served as the same name ({', '.join(map(str, names))}); give each "
            "its own --preset or file name"
        )
    flags = facts.server_flags if facts else None
    command, preset = engine.router_command(stack, routed, flags)
    if facts is not None:
        check_args(command, facts.server_flags, facts.who)
    for model in routed:
        engine_command(model, facts)  # each model's own flags: no clash with the stack's, all in the contract
    return command, preset


def engine_options(stack: StackSpec) -> dict[str, OptionValue]:
    """The stack's neutral engine options that are set (preset or command line), as recorded."""
    dumped = stack.model_dump(mode="json", include=set(EngineOptions.model_fields))  # a path as text
    return {name: value for name, value in dumped.items() if value is not None}


def engine_pins(stack: StackSpec) -> bool:
    """Whether the engine keeps the stack's CPU weights in page-locked memory (see stacks/pinned_memory)."""
    return stack.gpu != "none" and stack.engine.pins_cpu_weights(stack.mmap, gpu=True)


# A GPU layout's engine options, which a stack without a GPU leaves at the engine's defaults: its layer
# count, GPU offload and split, and --no-mmap (which pays off through the GPU's pinned host memory).
GPU_LAYOUT = ("gpu_layers", "moe_offload_batch", "split_mode_graph", "mmap")


def cpu_only(stack: StackSpec, image: str) -> StackSpec:
    """`stack` without its GPU: for the `cpu` profile (no GPU_LAYOUT options, GPU buffer rules or split)."""
    update = {"image_ref": image, "gpu": "none", "override_tensors": (), "tensor_split": ()}
    return stack.model_copy(update=update | dict.fromkeys(GPU_LAYOUT))


def engine_command(stack: StackSpec, facts: ImageFacts | None) -> list[str]:
    """The engine's arguments for `stack`, in the syntax of the image's engine version and checked
    against its flag contract when `facts` are known; the same for every output format."""
    engine = stack.engine
    if facts is not None and facts.engine is not engine:
        raise StackError(
            f"image {facts.image} holds {facts.engine}, not {engine.name}; pick the matching --engine"
        )
    command = engine.server_args(stack, facts.server_flags if facts else None)
    if facts is not None and not facts.server_flags:
        raise StackError(
            f"image {facts.image} has no server (an empty flag contract: KTransformers' CPU-only kernel "
            f"image); use a CUDA image of {engine.name}"
        )
    if facts is not None:
        check_args(command, facts.server_flags, facts.who)
    # An extra argument in any spelling of a flag the adapter writes would set what a moe-stack option
    # sets (`--port=9000` is `--port 9000`: the flag part of every `--flag=value` counts too); a flag whose
    # repeats merge (Engine.merged_flags) adds to the stack's instead.
    reserved = set().union(*engine.flag_spellings) - engine.merged_flags
    clashing = sorted(
        reserved.intersection(arg.split("=", 1)[0] for arg in stack.extra_args if arg.startswith("-"))
    )
    if clashing:
        raise StackError(
            f"extra engine args repeat flags the stack sets itself ({', '.join(clashing)}); "
            "use the matching moe-stack option instead"
        )
    return command


def pinned_image(stack: StackSpec, facts: ImageFacts | None) -> str:
    """The image, pinned to the registry's digest when it came from (or went to) one: a moved tag
    can't change what the stack runs."""
    return (
        f"{stack.image_ref}@{facts.repo_digest}"
        if facts is not None and facts.repo_digest
        else stack.image_ref
    )


def _service(stack: StackSpec, facts: ImageFacts | None, files: StackFiles) -> Service:
    """The engine's service: its image, command, port, the model's mounts and placement, then each
    feature's part."""
    volumes = (*files.mounts, *([config_mount(stack.config_dir)] if stack.config_dir is not None else []))
    image = pinned_image(stack, facts)
    environment, caps = entrypoint_environment(stack)
    service = service_of(
        image,
        engine_command(stack, facts),
        published(CONTAINER_PORT, stack.port, stack.bind),
        volumes,
        stack.shm_size,
        stack.start_period_s,
        placement(environment, caps, stack.cpuset, gpu_device(stack.gpu, stack.gpu_ids)),
        stack.api_key_file is not None,
    )
    for feature in FEATURES:
        service = feature.service_part(stack, service, image, files)
    return service


def entrypoint_environment(stack: StackSpec) -> tuple[dict[str, str], list[str]]:
    """What the image's entrypoint reads (NUMA policy, hugetlbfs staging) and the capabilities the
    stack needs: SYS_NICE for a NUMA policy (Docker's seccomp profile wants it for mbind and
    set_mempolicy), also for an engine that binds its own memory; IPC_LOCK for --mlock."""
    environment: dict[str, str] = {}
    caps: list[str] = []
    policy = numa_env(stack.numa_policy, stack.bind_nodes)
    if policy:
        environment[NUMA_ENV] = policy
    if policy or stack.engine.binds_numa_memory:
        caps.append("SYS_NICE")
    environment |= staging_environment(stack)
    if stack.mlock:
        caps.append("IPC_LOCK")
    if stack.api_key_file is not None:
        environment |= api_key_environment(stack.engine, stack.keep_prompts)
    return environment, caps
