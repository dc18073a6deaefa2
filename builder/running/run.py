"""Run an emitted stack: `up --wait` and `down` through python-on-whales, with clear failures."""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

from python_on_whales import Container, DockerClient
from python_on_whales.exceptions import DockerException

from builder.container_start import start_container
from builder.contract import LOADED_IMAGES, prometheus_image
from builder.docker_client import describe, docker, gpu_passthrough_available
from builder.errors import StackError
from builder.running.load_progress import watching_load
from builder.stackfile.host_checks import check_port_free
from builder.stackfile.service_parts import engine_service_name
from builder.stackfile.stack_file import Service, StackFile
from builder.untrusted_text import printable


def _require(compose_file: Path) -> Path:
    if not compose_file.is_file():
        raise StackError(f"compose file {compose_file} does not exist; emit one with `moe-stack compose`")
    return compose_file


def _client(compose_file: Path, profiles: list[str]) -> DockerClient:
    docker()  # fail early and clearly when there is no daemon
    return DockerClient(compose_files=[compose_file], compose_profiles=profiles)


def _profiles(compose_file: Path, document: StackFile, wanted: str | None) -> list[str]:
    """The profile to run: `wanted`, else the file's first (gpu); [] for a file without profiles."""
    offered = list(document.record.profiles)
    if wanted is None:
        return offered[:1]
    if wanted not in offered:
        raise StackError(
            f"{compose_file} has no profile {wanted!r} (it has: {', '.join(offered) or 'none'}); "
            "emit it with `moe-stack compose --gpu nvidia --cpu-image IMAGE` for gpu/cpu profiles"
        )
    return [wanted]


def published_ports(compose_file: Path, document: StackFile | None = None) -> list[tuple[str, int]]:
    """(host address, port) pairs the stack publishes."""
    services = (document or StackFile.read(compose_file)).services.values()
    return sorted({pair for service in services for pair in service.published})  # gpu and cpu: the same port


def running_container(compose_file: Path, service: str, profile: str | None) -> Container | None:
    """The running container of the stack's `service`, None when it isn't running."""
    running = DockerClient(
        compose_files=[compose_file], compose_profiles=[profile] if profile else ["*"]
    ).compose.ps()
    return next(
        (c for c in running if (c.config.labels or {}).get("com.docker.compose.service") == service), None
    )


def run_in_service(compose_file: Path, service: str, profile: str | None, command: list[str]) -> str:
    """What `command` prints run inside the stack's running `service` (as the image's user), terminal
    controls out; StackError when it isn't running or the command fails."""
    container = running_container(compose_file, service, profile)
    if container is None:
        raise StackError(f"no running container of {service}")
    try:
        printed = start_container(lambda: container.execute(command), f"{command[0]} in {service}")
    except DockerException as err:
        raise StackError(f"{command[0]} did not run in the container: {describe(err)}") from None
    return printable(printed) if isinstance(printed, str) else ""


def run_in_image(image: str, command: list[str]) -> str:
    """What `command` prints run once in a fresh container of the local `image` (as the image's user, no
    network, no capabilities), terminal controls out; StackError naming its last error line when the
    image is missing or the command fails."""
    client = docker()
    if not client.image.exists(image):
        raise StackError(f"no image {image} in the Docker store (`docker images` lists them)")

    def run() -> str:
        printed = client.container.run(
            image,
            command[1:],
            entrypoint=command[0],
            remove=True,
            pull="never",
            networks=["none"],
            cap_drop=["ALL"],
            security_options=["no-new-privileges"],
            stream=True,
        )
        return "".join(raw.decode(errors="replace") for source, raw in printed if source == "stdout")

    try:
        return printable(start_container(run, f"a container of {image}"))
    except DockerException as err:
        said = [
            line for line in printable(err.stderr or "").splitlines() if line.strip() and "--help" not in line
        ]
        raise StackError(f"{command[0]} failed in {image}: {(said or ['no output'])[-1].strip()}") from None


def stack_api_key(compose_file: Path) -> str | None:
    """The API key a stack enforces (first line of its secret file), or None."""
    for secret in (StackFile.read(compose_file).secrets or {}).values():
        try:
            return Path(secret.file).read_text().splitlines()[0].strip()
        except (OSError, IndexError):
            raise StackError(f"can't read the API key file of {compose_file}; the bench needs it") from None
    return None


def up(
    compose_file: Path,
    timeout_s: int,
    profile: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> None:
    """Start the stack (of a file with gpu/cpu profiles: `profile`, by default gpu) and wait until it
    is healthy, its engine's newest log line said through `progress` (if given) as it loads; on failure
    say why, with the engine's last log."""
    document = StackFile.read(compose_file)
    profiles = _profiles(compose_file, document, profile)
    client = _client(compose_file, profiles)
    _check_gpu_passthrough(document, profiles)
    _check_local_images(document, profiles)
    if not client.compose.ps():
        check_model_here(document, compose_file)
        for bind, port in published_ports(compose_file, document):
            check_port_free(bind, port)
    try:
        watching = (
            watching_load(client, engine_service_name(profile), progress) if progress else nullcontext()
        )
        with watching:
            start_container(
                lambda: client.compose.up(detach=True, wait=True, wait_timeout=timeout_s, quiet=True),
                "a container of the stack",
                progress,
            )
    except DockerException as err:
        missing = _missing_images(document, profiles)
        if missing:
            raise StackError(
                f"image {missing[0]} is not here and compose could not pull it ({describe(err)}); build it "
                "(`moe-stack build`) or get it from its registry (`moe-stack pull`)"
            ) from None
        log_tail = _service_log_tail(client)
        raise StackError(
            f"the stack did not become healthy ({describe(err)}); engine log: {log_tail}"
        ) from None


def check_model_here(document: StackFile, compose_file: Path) -> None:
    """The model the stack serves is on this host: without it the engine starts and dies loading it."""
    model = document.record.model
    if not model.exists():
        raise StackError(
            f"the stack's model {model} is not on this host (moved or deleted?): put it back, or emit the "
            f"stack again for where it is now; {compose_file} stays as it was"
        )


def _active(document: StackFile, profiles: list[str]) -> dict[str, Service]:
    """The services that run under `profiles` (those without a profile always do), by name."""
    return {name: service for name, service in document.services.items() if service.runs_under(profiles)}


def _missing_images(document: StackFile, profiles: list[str]) -> list[str]:
    """The images of the services `profiles` run that this Docker doesn't have."""
    images = [service.image for service in _active(document, profiles).values()]
    return [image for image in dict.fromkeys(images) if not docker().image.exists(image)]


def _check_gpu_passthrough(document: StackFile, profiles: list[str]) -> None:
    """A GPU service on a Docker that can't pass a GPU through fails late and vaguely: say it first."""
    for name, service in _active(document, profiles).items():
        if service.wants_gpu and not gpu_passthrough_available(docker()):
            other = " or start its cpu profile (--profile cpu)" if "cpu" in document.record.profiles else ""
            raise StackError(
                f"service {name} asks for an NVIDIA GPU and this Docker has neither the nvidia runtime "
                f"nor a CDI spec for one; install the NVIDIA Container Toolkit (`sudo nvidia-ctk runtime "
                f"configure --runtime=docker`){other}"
            )


def _check_local_images(document: StackFile, profiles: list[str]) -> None:
    """An image made on this host is never pulled (its name would resolve to Docker Hub): say how to
    make a missing one, rather than let compose fail on `pull_policy: never`."""
    for name, service in _active(document, profiles).items():
        image = service.image
        if service.pull_policy == "never" and not docker().image.exists(image):
            raise StackError(
                f"service {name} runs {image}, which is made on this host and is not here; "
                f"{_how_to_make(image, document)} (it is never pulled: that name on Docker Hub is not "
                "moe-stack's)"
            )


def _how_to_make(image: str, document: StackFile) -> str:
    if image.startswith(LOADED_IMAGES):
        bundle = (document.record.loaded_from or "BUNDLE").split(" ")[0]
        return f"load its bundle again with `moe-stack load {bundle}`"
    how = "moe-stack base --prometheus" if image.startswith(prometheus_image("")) else "moe-stack base"
    return f"make it with `{how}`"


def down(compose_file: Path) -> None:
    client = _client(_require(compose_file), ["*"])  # whichever profile is running
    try:
        client.compose.down(remove_orphans=True, volumes=True, timeout=10)
    except DockerException as err:
        raise StackError(f"docker compose down failed: {describe(err)}") from None


def _service_log_tail(client: DockerClient) -> str:
    try:
        text = client.compose.logs(tail="500", no_log_prefix=True)  # a usage text can follow the error
    except DockerException:
        return "unavailable"
    return log_error_summary(str(text))


def log_error_summary(text: str) -> str:
    """One line of an engine's log that says why it stopped."""
    # Terminal controls (the engine's progress lines) would end up inside the one-line error.
    lines = [line for line in printable(text).splitlines() if line.strip()]
    said = [line for line in lines if re.match(r"\W*(error|fatal)\b", line, re.IGNORECASE)]
    errors = said or [line for line in lines if "error" in line.lower()]
    if not errors:
        return (lines or ["(empty)"])[-1].strip()
    # An engine that restarts writes its errors again while the log is read: the last distinct few, in
    # order, say the same whichever attempt was cut short (ik names the bad value, then the flag).
    distinct = list(dict.fromkeys(line.strip() for line in errors))
    return " / ".join(distinct[-3:])
