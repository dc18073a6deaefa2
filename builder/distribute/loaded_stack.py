"""The stack `moe-stack load` writes: rebuilt from what moe-stack itself emits, never the bundle's text.

A bundle's compose.yaml is read for a few values only, each parsed into the type moe-stack would have
written (a port number, a page size, a cpuset, GPU indices, the engine's arguments); the services are
then made again through the same builders `moe-stack compose` uses (stacks/document.py). What reaches
the host is set by `load` and the user, not by the bundle: the model's mounts (its files, where `load`
put or found them), the published address (loopback unless the user binds elsewhere), the config
directory and the API key file (only from the user's options), and the compose project, named as
`moe-stack compose` names it, from the model's file and where it is on this host (a bundle's own name
could be another stack's: `up` would recreate that one, `down -v` remove its volumes). Anything else in
a service is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from builder.contract import (
    CONFIG_DIR,
    CONTAINER_PORT,
    HUGETLBFS_DIR,
    HUGETLBFS_ENV,
    MODEL_DIR,
    NUMA_ENV,
    PROMETHEUS_DATA,
    ROUTER_PRESET_ENV,
    prometheus_image,
)
from builder.engines import engine_names
from builder.errors import MoeStackError
from builder.platform.toolchain import CPU_BASE_SUITE
from builder.stacks.document import (
    CPU_PROFILE,
    CPU_SERVICE,
    GPU_PROFILE,
    HUGETLBFS_MOUNT,
    HUGETLBFS_VOLUME,
    MONITORING_SERVICE,
    MONITORING_VOLUME,
    SERVICE,
    config_mount,
    gpu_device,
    monitoring_service,
    placement,
    project_name_for,
    published,
    service_of,
    stack_document,
)
from builder.stacks.escaping import meant, unliteral
from builder.stacks.record import Served, StackRecord

# The capabilities a moe-stack stack may add: SYS_NICE (NUMA policy), IPC_LOCK (--mlock).
ALLOWED_CAPS = ("SYS_NICE", "IPC_LOCK")
# The keys of an engine service `moe-stack compose` writes; the constant ones are written again as
# moe-stack writes them whatever the bundle says (a loosened read_only, cap_drop or logging is undone).
_ENGINE_KEYS = frozenset(
    {
        "image",
        "command",
        "ports",
        "volumes",
        "read_only",
        "tmpfs",
        "shm_size",
        "cap_drop",
        "security_opt",
        "healthcheck",
        "restart",
        "environment",
        "cap_add",
        "ulimits",
        "cpuset",
        "deploy",
        "secrets",
        "profiles",
        "logging",
    }
)
_TOP_KEYS = frozenset({"name", "x-moe-stack", "services", "volumes", "secrets"})
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_NUMA = re.compile(r"interleave(:[0-9]+(,[0-9]+)*)?|(membind|cpunodebind):[0-9]+(,[0-9]+)*")
_CPUSET = re.compile(r"[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*")
_SIZE = re.compile(r"[1-9][0-9]*[kmg]?")
_SECONDS = re.compile(r"([1-9][0-9]{0,5})s")
_PAGE_SIZE = re.compile(r"pagesize=(2M|1G),.*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class UntrustedBundle(MoeStackError):
    """The bundle asks for more than a stack moe-stack emitted would."""


@dataclass(frozen=True)
class LoadChoices:
    """What the user (and `load`) decide about the loaded stack's host side."""

    model_files: tuple[Path, ...]  # the model's files on this host, checked against the manifest
    bind: str = "127.0.0.1"
    config_dir: Path | None = None
    api_key_file: Path | None = None
    loaded_from: str = ""  # the bundle's file name and how it was verified, for the record


def rebuild_stack(document: object, listed_images: dict[str, str], choices: LoadChoices) -> dict[str, object]:
    """The compose document for a bundle's stack, made by moe-stack from the few values read out of
    `document`; UntrustedBundle (one line) for anything moe-stack would not have written."""
    if (
        not isinstance(document, dict)
        or not isinstance(document.get("services"), dict)
        or not isinstance(document.get("x-moe-stack"), dict)
        or SERVICE not in document["services"]
    ):
        raise UntrustedBundle(
            "its compose.yaml was not written by `moe-stack compose` (no engine service or "
            "x-moe-stack record)"
        )
    extra_top = sorted(set(document) - _TOP_KEYS)
    if extra_top:
        raise UntrustedBundle(
            f"its compose.yaml has top-level {', '.join(extra_top)}, which moe-stack never writes"
        )
    given = document["services"]
    unknown = sorted(set(given) - {SERVICE, CPU_SERVICE, MONITORING_SERVICE})
    if unknown:
        raise UntrustedBundle(f"its compose.yaml has the service {unknown[0]}, which moe-stack never writes")
    engines = [name for name in (SERVICE, CPU_SERVICE) if name in given]
    services: dict[str, dict[str, object]] = {}
    for name in engines:
        services[name] = _engine_service(name, given[name], listed_images, choices, len(engines) > 1)
    if MONITORING_SERVICE in given:
        services[MONITORING_SERVICE] = _monitoring(given[MONITORING_SERVICE], engines, choices)
    ran = {_image_name(service["image"]) for service in services.values()}
    if ran != set(listed_images):
        raise UntrustedBundle(
            f"its manifest lists the images {', '.join(sorted(listed_images))}, its stack runs "
            f"{', '.join(sorted(ran))}; a bundle holds exactly its stack's images"
        )
    hugetlbfs = any(HUGETLBFS_MOUNT in cast(list, service["volumes"]) for service in services.values())
    return stack_document(
        project_name_for(_loaded_model(choices)),  # never the bundle's `name:`
        _record(document, choices, engines),
        services,
        _page_size(document) if hugetlbfs else None,
        choices.api_key_file,
    )


def _engine_service(
    name: str,
    service: object,
    listed_images: dict[str, str],
    choices: LoadChoices,
    profiled: bool,
) -> dict[str, object]:
    if not isinstance(service, dict):
        raise UntrustedBundle(f"service {name} of its compose.yaml is not a mapping")
    extra = sorted(set(service) - _ENGINE_KEYS)
    if extra:
        raise UntrustedBundle(f"service {name} sets {', '.join(extra)}, which moe-stack never writes")
    image = _image(name, service.get("image"), listed_images)
    environment, caps = _environment(name, service), _caps(name, service.get("cap_add"))
    volumes = [
        *_model_mounts(choices.model_files),
        *_other_mounts(name, service.get("volumes"), choices, environment),
    ]
    healthcheck = service.get("healthcheck")
    start_period = (
        _SECONDS.fullmatch(str(healthcheck.get("start_period"))) if isinstance(healthcheck, dict) else None
    )
    if start_period is None:
        raise UntrustedBundle(f"service {name} has no healthcheck start period in seconds")
    shm_size = str(service.get("shm_size"))
    if not _SIZE.fullmatch(shm_size):
        raise UntrustedBundle(f"service {name}'s shm_size {shm_size!r} is not a size like 1g")
    cpuset = service.get("cpuset")
    if cpuset is not None and not _CPUSET.fullmatch(str(cpuset)):
        raise UntrustedBundle(f"service {name}'s cpuset {cpuset!r} is not a list of CPUs like 0-15,32-47")
    wants_key = service.get("secrets") is not None
    if wants_key and choices.api_key_file is None:
        raise UntrustedBundle("its stack enforces an API key: pass --api-key-file with this host's key file")
    rebuilt = service_of(
        image,
        _command(name, service.get("command")),
        published(CONTAINER_PORT, _port(name, service), choices.bind),
        volumes,
        shm_size,
        int(start_period.group(1)),
        placement(environment, caps, str(cpuset) if cpuset else None, _gpu(name, service)),
        choices.api_key_file is not None,
    )
    if profiled:
        rebuilt["profiles"] = [GPU_PROFILE if name == SERVICE else CPU_PROFILE]
    return rebuilt


def _monitoring(service: object, engines: list[str], choices: LoadChoices) -> dict[str, object]:
    if not isinstance(service, dict) or _image_name(service.get("image")) != prometheus_image(CPU_BASE_SUITE):
        raise UntrustedBundle(
            f"its {MONITORING_SERVICE} service does not run {prometheus_image(CPU_BASE_SUITE)}"
        )
    volumes = service.get("volumes") or []
    if volumes != [{"type": "volume", "source": MONITORING_VOLUME, "target": PROMETHEUS_DATA}]:
        raise UntrustedBundle(f"its {MONITORING_SERVICE} service mounts more than its data volume")
    return monitoring_service(_port(MONITORING_SERVICE, service), engines, choices.api_key_file is not None)


def _image_name(image: object) -> str:
    return unliteral(str(image)).split("@")[0]


def _image(name: str, image: object, listed_images: dict[str, str]) -> str:
    text = unliteral(str(image))
    base, _, digest = text.partition("@")
    if base not in listed_images:
        raise UntrustedBundle(f"service {name} runs {base}, which the bundle's manifest doesn't list")
    if digest and not _DIGEST.fullmatch(digest):
        raise UntrustedBundle(f"service {name}'s image digest {digest!r} is not a sha256 digest")
    return text


def _command(name: str, command: object) -> list[str]:
    """The engine's arguments: they stay inside the container (read-only root, no capabilities)."""
    if not isinstance(command, list) or not command or not all(isinstance(arg, str) for arg in command):
        raise UntrustedBundle(f"service {name}'s command is not a list of the engine's arguments")
    args = [unliteral(arg) for arg in command]
    if any(_CONTROL.search(arg) for arg in args):
        raise UntrustedBundle(f"service {name}'s command holds a control character")
    return args


def _port(name: str, service: dict) -> int:
    ports = service.get("ports")
    port = (
        ports[0].get("published")
        if isinstance(ports, list) and len(ports) == 1 and isinstance(ports[0], dict)
        else None
    )
    if not str(port).isdigit() or not 1 <= int(str(port)) <= 65535:
        raise UntrustedBundle(f"service {name} publishes no single port number")
    return int(str(port))


def _model_mounts(files: tuple[Path, ...]) -> list[dict[str, object]]:
    """Each of the model's files under its own name in /models, read-only: the engine sees them and
    nothing else of the directory they are in (a link is mounted as its target)."""
    return [
        {
            "type": "bind",
            "source": str(path.resolve()),
            "target": f"{MODEL_DIR}/{path.name}",
            "read_only": True,
        }
        for path in files
    ]


def _other_mounts(
    name: str, volumes: object, choices: LoadChoices, environment: dict[str, str]
) -> list[dict[str, object]]:
    """The config directory (the user's) and the hugetlbfs volume, where the bundle's stack had them;
    its model mounts are replaced; anything else is refused."""
    if not isinstance(volumes, list):
        raise UntrustedBundle(f"service {name}'s volumes are not a list")
    mounts: list[dict[str, object]] = []
    for volume in volumes:
        target = str(volume.get("target")) if isinstance(volume, dict) else ""
        if not isinstance(volume, dict) or volume.get("type") not in ("bind", "volume"):
            raise UntrustedBundle(f"service {name} has a volume {volume!r} moe-stack never writes")
        if volume["type"] == "bind" and (target == MODEL_DIR or re.fullmatch(rf"{MODEL_DIR}/[^/]+", target)):
            continue  # the model: mounted from where load put or found it
        if volume["type"] == "bind" and target == CONFIG_DIR:
            if choices.config_dir is None:
                raise UntrustedBundle(
                    f"its stack mounts a config directory at {CONFIG_DIR}: pass --config-dir "
                    "with this host's copy of the model's Hugging Face directory"
                )
            mounts.append(config_mount(choices.config_dir.resolve()))
        elif volume == HUGETLBFS_MOUNT and environment.get(HUGETLBFS_ENV) == HUGETLBFS_DIR:
            mounts.append(HUGETLBFS_MOUNT)
        else:
            raise UntrustedBundle(
                f"service {name} mounts {volume.get('source')} at {target}; a moe-stack stack "
                "mounts only the model, its config directory and its hugetlbfs volume"
            )
    return mounts


def _environment(name: str, service: dict) -> dict[str, str]:
    given = service.get("environment") or {}
    if not isinstance(given, dict):
        raise UntrustedBundle(f"service {name}'s environment is not a mapping")
    environment = {str(key): unliteral(str(value)) for key, value in given.items()}
    unknown = sorted(set(environment) - {NUMA_ENV, HUGETLBFS_ENV, ROUTER_PRESET_ENV})
    if unknown:
        raise UntrustedBundle(
            f"service {name} sets the environment variable {unknown[0]}, which moe-stack never sets"
        )
    if NUMA_ENV in environment and not _NUMA.fullmatch(environment[NUMA_ENV]):
        raise UntrustedBundle(
            f"service {name}'s NUMA policy {environment[NUMA_ENV]!r} is not one moe-stack writes"
        )
    if environment.get(HUGETLBFS_ENV, HUGETLBFS_DIR) != HUGETLBFS_DIR:
        raise UntrustedBundle(f"service {name} stages the model elsewhere than {HUGETLBFS_DIR}")
    preset = environment.get(ROUTER_PRESET_ENV, "")
    if _CONTROL.search(preset.replace("\n", "")):
        raise UntrustedBundle(f"service {name}'s router preset holds a control character")
    return environment


def _caps(name: str, cap_add: object) -> list[str]:
    caps = cap_add or []
    if not isinstance(caps, list) or not set(map(str, caps)) <= set(ALLOWED_CAPS):
        raise UntrustedBundle(
            f"service {name} adds {cap_add!r}; a moe-stack stack adds at most SYS_NICE and IPC_LOCK"
        )
    return [cap for cap in ALLOWED_CAPS if cap in caps]


def _gpu(name: str, service: dict) -> dict[str, object] | None:
    """The GPU reservation's kind and indices, read back (moe-stack's two shapes only)."""
    deploy = service.get("deploy")
    if deploy is None:
        return None
    try:
        device = deploy["resources"]["reservations"]["devices"][0]
        driver, ids = device["driver"], [str(i) for i in device.get("device_ids") or []]
    except (KeyError, IndexError, TypeError, AttributeError):
        driver, ids = None, []
    if driver == "nvidia" and not ids and device.get("count") == "all":
        return gpu_device("nvidia", ())
    if driver == "nvidia" and ids and all(i.isdigit() for i in ids):
        return gpu_device("nvidia", tuple(map(int, ids)))
    indices = [i.removeprefix("nvidia.com/gpu=") for i in ids if i.startswith("nvidia.com/gpu=")]
    if driver == "cdi" and indices == ["all"] and len(ids) == 1:
        return gpu_device("cdi", ())
    if driver == "cdi" and indices and len(indices) == len(ids) and all(i.isdigit() for i in indices):
        return gpu_device("cdi", tuple(map(int, indices)))
    raise UntrustedBundle(
        f"service {name}'s deploy section is not moe-stack's GPU reservation (the nvidia driver "
        "or CDI, all GPUs or their indices)"
    )


def _page_size(document: dict) -> str:
    volume = (document.get("volumes") or {}).get(HUGETLBFS_VOLUME)
    options = ((volume or {}).get("driver_opts") or {}) if isinstance(volume, dict) else {}
    match = _PAGE_SIZE.fullmatch(str(options.get("o", "")))
    if match is None or options.get("type") != "hugetlbfs":
        raise UntrustedBundle(
            f"its {HUGETLBFS_VOLUME} volume is not moe-stack's hugetlbfs volume of 2M or 1G pages"
        )
    return match.group(1)


def _loaded_model(choices: LoadChoices) -> Path:
    """The model's first file where load put or found it (its directory resolved, as compose has it)."""
    return choices.model_files[0].parent.resolve() / choices.model_files[0].name


def _record(document: dict, choices: LoadChoices, engines: list[str]) -> StackRecord:
    """x-moe-stack again: the bundle's own facts (engine, image, names, options, what each service
    serves), each a plain value of its type; the model where load put it, the profiles of the services
    as rebuilt."""
    given = document["x-moe-stack"]
    engine = meant(given.get("engine"))
    if engine not in engine_names():
        raise UntrustedBundle(f"its x-moe-stack names the engine {engine!r}, which moe-stack doesn't know")
    options = meant(given.get("engine-options") or {})
    if not isinstance(options, dict) or not all(
        isinstance(v, str | int | float | bool | list) for v in options.values()
    ):
        raise UntrustedBundle("its x-moe-stack engine-options are not plain values")
    names, served_name = meant(given.get("models")), meant(given.get("served-name"))
    return StackRecord(
        generated_by=_text(meant(given.get("generated-by"))),
        loaded_from=choices.loaded_from,
        engine=str(engine),
        image=_text(meant(given.get("image"))),
        model=_loaded_model(choices),
        served_name=_text(served_name) if served_name is not None else None,
        models=tuple(_text(name) for name in names) if isinstance(names, list) else (),
        engine_options={str(key): value for key, value in options.items()},
        flags_checked=given.get("flags-checked") is True,
        cpu_weights_pinned=given.get("cpu-weights") == "pinned",
        profiles=(GPU_PROFILE, CPU_PROFILE) if len(engines) > 1 else (),
        serves={name: _serves(name, given.get("serves")) for name in engines},
    )


def _serves(name: str, served: object) -> Served:
    """What the record says service `name` serves, each value of its type."""
    facts = served.get(name) if isinstance(served, dict) else None
    if not isinstance(facts, dict):
        raise UntrustedBundle(
            f"its x-moe-stack records nothing of what {name} serves; bundle it again with this moe-stack"
        )
    threads, layers = facts.get("threads"), facts.get("gpu-layers")
    metrics, tool_calls = facts.get("metrics"), facts.get("tool-calls")
    if not (
        type(threads) is int
        and threads >= 1
        and (layers is None or type(layers) is int and layers >= 0)
        and type(metrics) is bool
        and type(tool_calls) is bool
    ):
        raise UntrustedBundle(
            f"its x-moe-stack's serves.{name} is not threads, gpu-layers, metrics and tool-calls"
        )
    return Served(threads=threads, gpu_layers=layers, metrics=metrics, tool_calls=tool_calls)


def _text(value: object) -> str:
    """A string of the record as one printable line."""
    text = str(value)
    if _CONTROL.search(text):
        raise UntrustedBundle("its x-moe-stack record holds a control character")
    return text
