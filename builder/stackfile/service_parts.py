"""The shape every service of a stack shares and the names its parts go by: the services' and profiles'
names, the hardening, the healthcheck, the logs' bound, a published port, the model's mounts. The stack
file's builders (document.py), its features and `load`'s rebuild of a bundle's stack all make services
of these."""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

from builder.contract import MODEL_DIR
from builder.stackfile.stack_file import Logging, Mount, Port

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


def published(target: int, port: int, bind: str) -> Port:
    """A container port published on `bind`:`port` of the host."""
    return Port(target=target, published=str(port), host_ip=bind, protocol="tcp")


def directory_mount(model: Path) -> Mount:
    """The model's directory at /models, read-only."""
    return Mount(type="bind", source=str(model.parent), target=MODEL_DIR, read_only=True)


def file_mount(source: Path, name: str) -> Mount:
    """One file of the model at /models/`name`, read-only (the engine sees it and nothing beside it)."""
    return Mount(type="bind", source=str(source), target=f"{MODEL_DIR}/{name}", read_only=True)
