"""A stack file's services as typed values: what up, smoke, tune, bench and bundle read from them. The
file is written by stacks/document.py; a user may have edited it, so a part of the wrong shape is one
line naming the service and the key, never a traceback. Values are as meant (compose's `$$` undone)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from builder.contract import MODEL_DIR
from builder.errors import StackError
from builder.stacks.escaping import unliteral

Wrong = Callable[[str, str], StackError]  # (key, the shape it should have) -> the error to raise


@dataclass(frozen=True)
class Service:
    name: str
    image: str
    command: tuple[str, ...]
    environment: dict[str, str]
    profiles: tuple[str, ...]
    cpuset: str | None
    ports: tuple[tuple[str, int], ...]  # (host address, published port)
    wants_gpu: bool  # a device reservation (deploy.resources.reservations.devices)
    pull_never: bool  # pull_policy: never (an image made on this host)
    model_files: tuple[tuple[str, Path], ...]  # files mounted one by one: (NAME of /models/NAME, host file)
    document: dict  # the service as the file holds it (to derive another file from it)

    def runs_under(self, profiles: list[str]) -> bool:
        """Whether compose starts it with `profiles` active (a service without profiles always runs)."""
        return not self.profiles or bool(set(profiles) & set(self.profiles))


def read_services(document: dict, source: Path | str = "the stack file") -> dict[str, Service]:
    """Every service of a stack file's `document`, by name."""
    services = document.get("services") if isinstance(document, dict) else None
    if not isinstance(services, dict):
        raise StackError(f"{source} has no services; emit it with `moe-stack compose`")
    return {str(name): _service(str(name), raw, source) for name, raw in services.items()}


def service_named(document: dict, name: str, source: Path | str = "the stack file") -> Service:
    service = read_services(document, source).get(name)
    if service is None:
        raise StackError(f"{source} has no {name} service; emit it with `moe-stack compose`")
    return service


def _service(name: str, raw: object, source: Path | str) -> Service:
    def wrong(key: str, shape: str) -> StackError:
        return StackError(f"{source}: service {name}'s {key} is not {shape}; emit the file again")

    if not isinstance(raw, dict):
        raise wrong("definition", "a mapping")
    command = raw.get("command") or []
    if not isinstance(command, list):
        raise wrong("command", "a list")
    return Service(
        name=name,
        image=unliteral(str(raw.get("image", ""))),
        command=tuple(unliteral(str(arg)) for arg in command),
        environment=_environment(raw.get("environment"), wrong),
        profiles=tuple(map(str, raw.get("profiles") or [])),
        cpuset=str(raw["cpuset"]) if raw.get("cpuset") else None,
        ports=_ports(raw.get("ports"), wrong),
        wants_gpu=bool(_path(raw, "deploy", "resources", "reservations", "devices")),
        pull_never=raw.get("pull_policy") == "never",
        model_files=_model_files(raw.get("volumes"), wrong),
        document=raw,
    )


def _environment(raw: object, wrong: Wrong) -> dict[str, str]:
    if raw is None:
        return {}
    if isinstance(raw, dict):
        return {str(key): unliteral(str(value)) for key, value in raw.items()}
    if isinstance(raw, list):  # compose's other form: KEY=VALUE items
        return {key: value for key, _, value in (unliteral(str(item)).partition("=") for item in raw)}
    raise wrong("environment", "a mapping")


def _ports(raw: object, wrong: Wrong) -> tuple[tuple[str, int], ...]:
    if not isinstance(raw, list | type(None)):
        raise wrong("ports", "a list")
    pairs = []
    for port in raw or []:
        if isinstance(port, dict) and port.get("published"):
            try:
                pairs.append((str(port.get("host_ip") or "0.0.0.0"), int(port["published"])))
            except ValueError:
                raise wrong("ports", "host ports of numbers") from None
    return tuple(pairs)


def _model_files(raw: object, wrong: Wrong) -> tuple[tuple[str, Path], ...]:
    if not isinstance(raw, list | type(None)):
        raise wrong("volumes", "a list")
    files = []
    for volume in raw or []:
        target = str(volume.get("target", "")) if isinstance(volume, dict) else ""
        if target.startswith(f"{MODEL_DIR}/"):
            source = Path(unliteral(str(volume.get("source", ""))))
            files.append((target.removeprefix(f"{MODEL_DIR}/"), source))
    return tuple(files)


def _path(raw: dict, *keys: str) -> object:
    """raw[k1][k2]... where each step is a mapping (None where one is not)."""
    value: object = raw
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value
