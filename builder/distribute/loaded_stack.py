"""The stack `moe-stack load` writes: rebuilt from what moe-stack itself emits, never the bundle's text.

A bundle's compose.yaml is read for a few values only, each parsed into the type moe-stack would have
written (a port number, a page size, a cpuset, GPU indices, the engine's arguments); the services are then
made again through the same builders `moe-stack compose` uses (stackfile/service_parts.py, the features).
What reaches the host is set by `load` and the user, not by the bundle: the model's mounts (its files,
where `load` put or found them), the published address (loopback unless the user binds elsewhere), the
config directory and the API key file (only from the user's options), and the compose project, named as a
project of its own (a bundle's own name, or the one `compose` gives the same model, could be another
stack's: `up` would recreate that one, share its prompt cache, and `down -v` remove its volumes). The
images run under names scoped to the bundle (`loaded_image`), never a name the builder or another stack
resolves; the API key is the host's: a bundle carrying one, or reading none where the user gives one, is
refused. Anything else in a service is refused."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from builder.contract import (
    API_KEY_FILE_ENV,
    API_KEY_PATH,
    CONFIG_DIR,
    CONTAINER_PORT,
    HUGETLBFS_DIR,
    HUGETLBFS_ENV,
    LOADED_IMAGES,
    MODEL_DIR,
    NUMA_ENV,
    PROMPTS_ENV,
    PROMPTS_MAX_ENV,
    PROMPTS_QUIET_ENV,
    ROUTER_PRESET_ENV,
    SLOTS_ENV,
    prometheus_image,
)
from builder.engines.base import KEY_FILE_FLAG, Engine
from builder.errors import MoeStackError
from builder.features.hugepages import HUGETLBFS_MOUNT, HUGETLBFS_VOLUME, hugetlbfs_volume
from builder.features.keep_prompts import PROMPTS_MOUNT, with_kept_prompts
from builder.features.monitoring import MONITORING_MOUNT, MONITORING_SERVICE, monitoring_service
from builder.platform.toolchain import CPU_BASE_SUITE
from builder.stackfile.record import Record, Served
from builder.stackfile.service_parts import (
    CPU_PROFILE,
    CPU_SERVICE,
    GPU_PROFILE,
    SERVICE,
    api_key_environment,
    config_mount,
    file_mount,
    gpu_device,
    placement,
    published,
    service_of,
    stack_document,
)
from builder.stackfile.stack_file import Device, Mount, Service, StackFile, StackFileError, Volume
from builder.untrusted_text import ANY_CONTROL

# The capabilities a moe-stack stack may add: SYS_NICE (NUMA policy), IPC_LOCK (--mlock).
ALLOWED_CAPS = ("SYS_NICE", "IPC_LOCK")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_NUMA = re.compile(r"interleave(:[0-9]+(,[0-9]+)*)?|(membind|cpunodebind):[0-9]+(,[0-9]+)*")
_CPUSET = re.compile(r"[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*")
_SIZE = re.compile(r"[1-9][0-9]*[kmg]?")
_SECONDS = re.compile(r"([1-9][0-9]{0,5})s")
_PAGE_SIZE = re.compile(r"pagesize=(2M|1G),.*")
_PROMPTS_KEY = re.compile(r"[0-9a-f]{16}")
_SLOTS = re.compile(r"[1-9][0-9]{0,2}")
_QUIET = re.compile(r"[1-9][0-9]{0,5}")
_PROMPTS_MAX_MIB = re.compile(r"[1-9][0-9]{0,9}")
# Every engine's key flags begin so (llama.cpp's --api-key and --api-key-file, SGLang's --api-key).
_KEY_FLAGS = ("--api-key",)


class UntrustedBundle(MoeStackError):
    """The bundle asks for more than a stack moe-stack emitted would."""


@dataclass(frozen=True)
class LoadChoices:
    """What the user (and `load`) decide about the loaded stack's host side."""

    model_files: tuple[Path, ...]  # the model's files on this host, checked against the manifest
    bundle_digest: str  # the archive's sha256 (`sha256:HEX`): its images' names and project derive from it
    dest: Path  # the directory the stack is written to (a bundle loaded twice is two stacks)
    bind: str = "127.0.0.1"
    config_dir: Path | None = None
    api_key_file: Path | None = None
    loaded_from: str = ""  # the bundle's file name and how it was verified, for the record


def rebuild_stack(document: object, listed_images: dict[str, str], choices: LoadChoices) -> StackFile:
    """The stack file for a bundle's stack, made by moe-stack from the few values read out of
    `document` (validated as a StackFile: a key moe-stack never writes is refused there);
    UntrustedBundle (one line) for anything moe-stack would not have written."""
    try:
        given = StackFile.parse(document, "its compose.yaml")
    except StackFileError as err:
        raise UntrustedBundle(str(err)) from None
    unknown = sorted(set(given.services) - {SERVICE, CPU_SERVICE, MONITORING_SERVICE})
    if unknown:
        raise UntrustedBundle(f"its compose.yaml has the service {unknown[0]}, which moe-stack never writes")
    if SERVICE not in given.services:
        raise UntrustedBundle(
            f"its compose.yaml has no {SERVICE} service; it was not written by `moe-stack compose`"
        )
    ran = {name: _image(name, service.image, listed_images) for name, service in given.services.items()}
    if set(ran.values()) != set(listed_images):
        raise UntrustedBundle(
            f"its manifest lists the images {', '.join(sorted(listed_images))}, its stack runs "
            f"{', '.join(sorted(set(ran.values())))}; a bundle holds exactly its stack's images"
        )
    engines = [name for name in (SERVICE, CPU_SERVICE) if name in given.services]
    services: dict[str, Service] = {}
    for name in engines:
        services[name] = _engine_service(
            name, given.services[name], given.record.engine, choices, len(engines) > 1
        )
    if MONITORING_SERVICE in given.services:
        services[MONITORING_SERVICE] = _monitoring(given.services[MONITORING_SERVICE], engines, choices)
    services = {
        name: service.model_copy(
            update={"image": loaded_image(ran[name], choices.bundle_digest), "pull_policy": "never"}
        )
        for name, service in services.items()
    }
    hugetlbfs = any(HUGETLBFS_MOUNT in (service.volumes or ()) for service in services.values())
    return stack_document(
        loaded_project_name(_loaded_model(choices), choices),  # never the bundle's `name:`, nor compose's
        _record(given.record, listed_images, choices, engines),
        services,
        hugetlbfs_volume(_page_size(given.volumes or {}) if hugetlbfs else None),
        choices.api_key_file,
    )


def loaded_image(image: str, bundle_digest: str) -> str:
    """The name a bundle's `image` gets here: under LOADED_IMAGES and the bundle's digest, its registry
    left out (`ghcr.io/moe-stack/ik-llama-cpp:T` from bundle sha256:abc... is
    `moe-stack-loaded/abc.../moe-stack/ik-llama-cpp:T`). No name the builder or another stack resolves
    can be one of these, and a bundle's own can't be another bundle's."""
    first, _, rest = image.partition("/")
    path = rest if rest and ("." in first or ":" in first or first == "localhost") else image
    return f"{LOADED_IMAGES}{_scope(bundle_digest)}/{path}"


def loaded_project_name(model: Path, choices: LoadChoices) -> str:
    """The loaded stack's compose project: the model's name, and a hash of the bundle and where it was
    loaded. `compose` names its projects `moe-stack-...`: none of them is ever a loaded stack's."""
    slug = re.sub(r"[^a-z0-9_-]+", "-", model.stem.lower()).strip("-_")
    where = hashlib.sha256(f"{choices.bundle_digest}|{choices.dest}".encode()).hexdigest()[:12]
    return f"{f'moe-loaded-{slug}'[:50].rstrip('-_')}-{where}"


def _scope(bundle_digest: str) -> str:
    digest = bundle_digest.removeprefix("sha256:")
    if not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise UntrustedBundle(f"its digest {bundle_digest!r} is not a sha256 digest")
    return digest[:16]


def _engine_service(
    name: str,
    service: Service,
    engine: Engine,
    choices: LoadChoices,
    profiled: bool,
) -> Service:
    keyed = _reads_key(name, service, choices)
    environment, caps = _environment(name, service, engine, keyed), _caps(name, service.cap_add)
    volumes = (
        *(file_mount(path.resolve(), path.name) for path in choices.model_files),
        *_other_mounts(name, service.volumes or (), choices, environment),
    )
    start_period = _SECONDS.fullmatch(str(service.healthcheck.start_period if service.healthcheck else None))
    if start_period is None:
        raise UntrustedBundle(f"service {name} has no healthcheck start period in seconds")
    shm_size = str(service.shm_size)
    if not _SIZE.fullmatch(shm_size):
        raise UntrustedBundle(f"service {name}'s shm_size {shm_size!r} is not a size like 1g")
    cpuset = service.cpuset
    if cpuset is not None and not _CPUSET.fullmatch(cpuset):
        raise UntrustedBundle(f"service {name}'s cpuset {cpuset!r} is not a list of CPUs like 0-15,32-47")
    rebuilt = service_of(
        service.image,  # the name loaded_image gives it, once the services are made
        [*_command(name, service.command), *(engine.key_args() if keyed else [])],
        published(CONTAINER_PORT, _port(name, service), choices.bind),
        volumes,
        shm_size,
        int(start_period.group(1)),
        placement(environment, caps, cpuset or None, _gpu(name, service)),
        choices.api_key_file is not None,
    )
    if PROMPTS_MOUNT in (service.volumes or ()):
        rebuilt = with_kept_prompts(rebuilt)
    if profiled:
        return rebuilt.model_copy(update={"profiles": (GPU_PROFILE if name == SERVICE else CPU_PROFILE,)})
    return rebuilt


def _monitoring(service: Service, engines: list[str], choices: LoadChoices) -> Service:
    if service.image.split("@")[0] != prometheus_image(CPU_BASE_SUITE):
        raise UntrustedBundle(
            f"its {MONITORING_SERVICE} service does not run {prometheus_image(CPU_BASE_SUITE)}"
        )
    if service.volumes != (MONITORING_MOUNT,):
        raise UntrustedBundle(f"its {MONITORING_SERVICE} service mounts more than its data volume")
    return monitoring_service(_port(MONITORING_SERVICE, service), engines, choices.api_key_file is not None)


def _image(name: str, image: str, listed_images: dict[str, str]) -> str:
    """The image (as the manifest lists it) service `name` runs: its registry digest is the registry's,
    and load names the image by the bundle instead."""
    base, _, digest = image.partition("@")
    if base not in listed_images:
        raise UntrustedBundle(f"service {name} runs {base}, which the bundle's manifest doesn't list")
    if digest and not _DIGEST.fullmatch(digest):
        raise UntrustedBundle(f"service {name}'s image digest {digest!r} is not a sha256 digest")
    return base


def _reads_key(name: str, service: Service, choices: LoadChoices) -> bool:
    """Whether the loaded service checks an API key: exactly when the user gives this host's key file;
    a stack that enforced one of its own needs the user's."""
    if service.secrets is not None and choices.api_key_file is None:
        raise UntrustedBundle(
            f"its stack's {name} enforces an API key: pass --api-key-file with this host's key file"
        )
    return choices.api_key_file is not None


def _command(name: str, command: tuple[str, ...] | None) -> list[str]:
    """The engine's arguments, less the reading of the stack's key file (load writes its own: the key is
    the host's): they stay inside the container (read-only root, no capabilities). A key of the bundle's
    (any other --api-key argument) is refused."""
    if not command:
        raise UntrustedBundle(f"service {name}'s command is not a list of the engine's arguments")
    if any(ANY_CONTROL.search(arg) for arg in command):
        raise UntrustedBundle(f"service {name}'s command holds a control character")
    args = list(command)
    for at in range(len(args) - 1):
        if args[at : at + 2] == [KEY_FILE_FLAG, API_KEY_PATH]:
            del args[at : at + 2]
            break
    carried = next((arg for arg in args if arg.split("=", 1)[0].startswith(_KEY_FLAGS)), None)
    if carried is not None:
        raise UntrustedBundle(
            f"service {name}'s command sets its own API key ({carried.split('=', 1)[0]}); the key is this "
            "host's: bundle the stack without one and load it with --api-key-file"
        )
    return args


def _port(name: str, service: Service) -> int:
    ports = service.ports or ()
    if len(ports) != 1 or not 1 <= int(ports[0].published) <= 65535:
        raise UntrustedBundle(f"service {name} publishes no single port number")
    return int(ports[0].published)


def _other_mounts(
    name: str, volumes: tuple[Mount, ...], choices: LoadChoices, environment: dict[str, str]
) -> list[Mount]:
    """The config directory (the user's) and the hugetlbfs volume, where the bundle's stack had them;
    its model mounts are replaced; anything else is refused."""
    mounts: list[Mount] = []
    for volume in volumes:
        target = volume.target
        if volume.type == "bind" and (target == MODEL_DIR or re.fullmatch(rf"{MODEL_DIR}/[^/]+", target)):
            continue  # the model: mounted from where load put or found it
        if volume.type == "bind" and target == CONFIG_DIR:
            if choices.config_dir is None:
                raise UntrustedBundle(
                    f"its stack mounts a config directory at {CONFIG_DIR}: pass --config-dir "
                    "with this host's copy of the model's Hugging Face directory"
                )
            mounts.append(config_mount(choices.config_dir.resolve()))
        elif volume == HUGETLBFS_MOUNT and environment.get(HUGETLBFS_ENV) == HUGETLBFS_DIR:
            mounts.append(HUGETLBFS_MOUNT)
        elif volume == PROMPTS_MOUNT and PROMPTS_ENV in environment:
            continue  # mounted by with_kept_prompts, with the time its last save takes
        else:
            raise UntrustedBundle(
                f"service {name} mounts {volume.source} at {target}; a moe-stack stack "
                "mounts only the model, its config directory, its hugetlbfs volume and its prompt cache"
            )
    return mounts


def _environment(name: str, service: Service, engine: Engine, keyed: bool) -> dict[str, str]:
    """The entrypoint's and the prompt helper's variables, each checked; the key file's is load's own."""
    environment = service.env
    known = {
        NUMA_ENV,
        HUGETLBFS_ENV,
        ROUTER_PRESET_ENV,
        PROMPTS_ENV,
        SLOTS_ENV,
        PROMPTS_QUIET_ENV,
        PROMPTS_MAX_ENV,
        API_KEY_FILE_ENV,
    }
    unknown = sorted(set(environment) - known)
    if unknown:
        raise UntrustedBundle(
            f"service {name} sets the environment variable {unknown[0]}, which moe-stack never sets"
        )
    if NUMA_ENV in environment and not _NUMA.fullmatch(environment[NUMA_ENV]):
        raise UntrustedBundle(
            f"service {name}'s NUMA policy {environment[NUMA_ENV]!r} is not one moe-stack writes"
        )
    if environment.get(API_KEY_FILE_ENV, API_KEY_PATH) != API_KEY_PATH:
        raise UntrustedBundle(f"service {name} reads its API key elsewhere than {API_KEY_PATH}")
    environment = {key: value for key, value in environment.items() if key != API_KEY_FILE_ENV}
    if environment.get(HUGETLBFS_ENV, HUGETLBFS_DIR) != HUGETLBFS_DIR:
        raise UntrustedBundle(f"service {name} stages the model elsewhere than {HUGETLBFS_DIR}")
    if (
        not _PROMPTS_KEY.fullmatch(environment.get(PROMPTS_ENV, "0" * 16))
        or not _SLOTS.fullmatch(environment.get(SLOTS_ENV, "1"))
        or not _QUIET.fullmatch(environment.get(PROMPTS_QUIET_ENV, "1"))
        or not _PROMPTS_MAX_MIB.fullmatch(environment.get(PROMPTS_MAX_ENV, "1"))
    ):
        raise UntrustedBundle(f"service {name}'s prompt cache is not named as moe-stack names it")
    preset = environment.get(ROUTER_PRESET_ENV, "")
    if ANY_CONTROL.search(preset.replace("\n", "")):
        raise UntrustedBundle(f"service {name}'s router preset holds a control character")
    if any(line.strip().startswith(_KEY_FLAGS[0].lstrip("-")) for line in preset.splitlines()):
        raise UntrustedBundle(f"service {name}'s router preset sets an API key; the key is this host's")
    return environment | (api_key_environment(engine, PROMPTS_ENV in environment) if keyed else {})


def _caps(name: str, cap_add: tuple[str, ...] | None) -> list[str]:
    caps = cap_add or ()
    if not set(caps) <= set(ALLOWED_CAPS):
        raise UntrustedBundle(
            f"service {name} adds {list(caps)!r}; a moe-stack stack adds at most SYS_NICE and IPC_LOCK"
        )
    return [cap for cap in ALLOWED_CAPS if cap in caps]


def _gpu(name: str, service: Service) -> Device | None:
    """The GPU reservation's kind and indices, read back (moe-stack's two shapes only)."""
    if service.deploy is None:
        return None
    devices = service.deploy.resources.reservations.devices
    device = devices[0] if len(devices) == 1 else None
    driver, ids = (device.driver, list(device.device_ids or ())) if device else (None, [])
    if driver == "nvidia" and not ids and device is not None and device.count == "all":
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


def _page_size(volumes: dict[str, Volume]) -> str:
    volume = volumes.get(HUGETLBFS_VOLUME)
    options = (volume.driver_opts if volume else None) or {}
    match = _PAGE_SIZE.fullmatch(options.get("o", ""))
    if match is None or options.get("type") != "hugetlbfs":
        raise UntrustedBundle(
            f"its {HUGETLBFS_VOLUME} volume is not moe-stack's hugetlbfs volume of 2M or 1G pages"
        )
    return match.group(1)


def _loaded_model(choices: LoadChoices) -> Path:
    """The model's first file where load put or found it (its directory resolved, as compose has it)."""
    return choices.model_files[0].parent.resolve() / choices.model_files[0].name


def _record(given: Record, listed_images: dict[str, str], choices: LoadChoices, engines: list[str]) -> Record:
    """x-moe-stack again: the bundle's own facts (engine, image, names, options, what each service
    serves), each of its type (StackFile.parse checked that); the model where load put it, the image by
    its loaded name, the profiles of the services as rebuilt, no tuning record and no lint exceptions
    (stack_document derives them)."""
    texts = [given.generated_by, given.image, given.served_name or "", *given.models]
    if any(ANY_CONTROL.search(text) for text in texts):
        raise UntrustedBundle("its x-moe-stack record holds a control character")
    if given.image not in listed_images:
        raise UntrustedBundle(
            f"its x-moe-stack names the image {given.image}, which its manifest doesn't list"
        )
    return Record(
        generated_by=given.generated_by,
        loaded_from=choices.loaded_from,
        engine=given.engine,
        image=loaded_image(given.image, choices.bundle_digest),
        model=_loaded_model(choices),
        served_name=given.served_name,
        models=given.models,
        engine_options=given.engine_options,
        flags_checked=given.flags_checked,
        cpu_weights=given.cpu_weights,
        profiles=(GPU_PROFILE, CPU_PROFILE) if len(engines) > 1 else (),
        serves={name: _serves(name, given.serves.get(name)) for name in engines},
    )


def _serves(name: str, served: Served | None) -> Served:
    """What the record says service `name` serves, in range."""
    if served is None:
        raise UntrustedBundle(
            f"its x-moe-stack records nothing of what {name} serves; bundle it again with this moe-stack"
        )
    if served.threads < 1 or (served.gpu_layers is not None and served.gpu_layers < 0):
        raise UntrustedBundle(
            f"its x-moe-stack's serves.{name} is not threads, gpu-layers, metrics and tool-calls"
        )
    return served
