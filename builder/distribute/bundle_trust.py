"""What `moe-stack load` checks before it trusts a bundle beyond its own checksums.

A manifest only vouches for itself, so: the archive can be held to a sha256 given out of band (the one
`bundle` prints); `docker load` honours every tag inside images.tar, so the tags there must be exactly
the images the manifest and the stack name (a bundle can't retag a local base image or a trusted
`ghcr.io/moe-stack` tag); and the compose file must have the shape `moe-stack compose` emits (no
privileged mode, host namespaces, extra mounts, devices or capabilities beyond the two it adds).
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

from builder.contract import API_KEY_SECRET, CONFIG_DIR, HUGETLBFS_DIR, MODEL_DIR, PROMETHEUS_DATA
from builder.errors import MoeStackError
from builder.stacks.document import MONITORING_VOLUME

# The capabilities a moe-stack stack may add: SYS_NICE (NUMA policy), IPC_LOCK (--mlock).
ALLOWED_CAPS = frozenset({"SYS_NICE", "IPC_LOCK"})
# Service keys `moe-stack compose` writes; anything else (privileged, network_mode, pid, devices,
# volumes_from, user...) was added by someone else.
SERVICE_KEYS = frozenset({"image", "command", "ports", "volumes", "read_only", "tmpfs", "shm_size", "cap_drop",
                          "security_opt", "healthcheck", "restart", "environment", "cap_add", "ulimits", "cpuset",
                          "deploy", "secrets", "profiles", "logging"})
TOP_KEYS = frozenset({"name", "x-moe-stack", "services", "volumes", "secrets"})
_BIND_TARGETS = frozenset({MODEL_DIR, CONFIG_DIR})


class UntrustedBundle(MoeStackError):
    """The bundle asks for more than a stack moe-stack emitted would."""


def saved_image_tags(images_tar: Path) -> set[str]:
    """The tags `docker load` would give: RepoTags of docker save's manifest.json and the legacy
    `repositories` file (read from the archive, nothing extracted)."""
    tags: set[str] = set()
    try:
        with tarfile.open(images_tar, "r:") as archive:
            names = set(archive.getnames())
            if "manifest.json" not in names:
                raise UntrustedBundle(f"{images_tar.name} is not a `docker save` archive (no manifest.json)")
            for entry in _json_member(archive, "manifest.json"):
                tags.update(entry.get("RepoTags") or [])
            if "repositories" in names:
                for repo, by_tag in _json_member(archive, "repositories").items():
                    tags.update(f"{repo}:{tag}" for tag in by_tag)
    except (tarfile.TarError, OSError, ValueError, AttributeError, TypeError) as err:
        raise UntrustedBundle(f"{images_tar.name}'s image index can't be read ({err})") from None
    return tags


def _json_member(archive: tarfile.TarFile, name: str) -> Any:
    member = archive.getmember(name)
    if not member.isreg() or member.size > 1 << 20:
        raise UntrustedBundle(f"images.tar's {name} is not a small regular file")
    stream = archive.extractfile(member)
    assert stream is not None
    return json.load(stream)


def check_tags(saved: set[str], listed: dict[str, str]) -> None:
    """images.tar may tag only what the manifest lists (docker load would apply every other tag too)."""
    if not listed:
        raise UntrustedBundle("its manifest lists no images; a moe-stack bundle always holds the stack's images")
    extra = sorted(saved - set(listed))
    if extra:
        raise UntrustedBundle(f"images.tar would also tag {', '.join(extra)}, which the manifest doesn't list "
                              "(loading it would replace those local images)")


def check_stack_shape(document: object, listed_images: dict[str, str]) -> None:
    """The compose file must be what `moe-stack compose` emits, services and all."""
    record = document.get("x-moe-stack") if isinstance(document, dict) else None
    if not isinstance(document, dict) or not isinstance(document.get("services"), dict) or \
            not isinstance(record, dict) or not isinstance(record.get("model"), str):
        raise UntrustedBundle("its compose.yaml was not written by `moe-stack compose` (no services or "
                              "x-moe-stack.model)")
    extra_top = sorted(set(document) - TOP_KEYS)
    if extra_top:
        raise UntrustedBundle(f"its compose.yaml has top-level {', '.join(extra_top)}, which moe-stack never writes")
    for name, service in document["services"].items():
        _check_service(str(name), service, listed_images)
    for volume_name, volume in (document.get("volumes") or {}).items():
        plain = volume_name == MONITORING_VOLUME and volume in ({}, None)  # Prometheus' data, a local volume
        if not plain and (not isinstance(volume, dict) or (volume.get("driver_opts") or {}).get("type") != "hugetlbfs"):
            raise UntrustedBundle("its compose.yaml declares a volume that is not moe-stack's hugetlbfs volume")
    for secret_name, secret in (document.get("secrets") or {}).items():
        if secret_name != API_KEY_SECRET or not isinstance(secret, dict) or set(secret) != {"file"}:
            raise UntrustedBundle(f"its compose.yaml declares the secret {secret_name!r}, which moe-stack never writes")



def _check_service(name: str, service: object, listed_images: dict[str, str]) -> None:
    if not isinstance(service, dict):
        raise UntrustedBundle(f"service {name} of its compose.yaml is not a mapping")
    extra = sorted(set(service) - SERVICE_KEYS)
    if extra:
        raise UntrustedBundle(f"service {name} sets {', '.join(extra)}, which moe-stack never writes")
    image = str(service.get("image", "")).split("@")[0]
    if image not in listed_images:
        raise UntrustedBundle(f"service {name} runs {image}, which the bundle's manifest doesn't list")
    caps = set(service.get("cap_add") or [])
    if not caps <= ALLOWED_CAPS:
        raise UntrustedBundle(f"service {name} adds {', '.join(sorted(caps - ALLOWED_CAPS))}; a moe-stack stack adds "
                              "at most SYS_NICE and IPC_LOCK")
    if service.get("cap_drop") != ["ALL"] or service.get("security_opt") != ["no-new-privileges:true"] or \
            service.get("read_only") is not True:
        raise UntrustedBundle(f"service {name} loosens moe-stack's defaults (cap_drop ALL, no-new-privileges, "
                              "read-only root)")
    logging = service.get("logging", {"driver": "json-file"})
    if not isinstance(logging, dict) or logging.get("driver") != "json-file" or \
            not set(logging.get("options") or {}) <= {"max-size", "max-file"}:
        raise UntrustedBundle(f"service {name} sends its logs elsewhere ({logging!r}); a moe-stack stack keeps them "
                              "in Docker's rotated json-file logs")
    for volume in service.get("volumes") or []:
        if not isinstance(volume, dict):
            raise UntrustedBundle(f"service {name} has a short-syntax volume {volume!r}; moe-stack writes long syntax")
        target = str(volume.get("target", ""))
        model_file = target.startswith(f"{MODEL_DIR}/") and "/" not in target.removeprefix(f"{MODEL_DIR}/")
        bind_ok = volume.get("type") == "bind" and (target in _BIND_TARGETS or model_file) and \
            volume.get("read_only") is True
        named_ok = volume.get("type") == "volume" and volume.get("target") in (HUGETLBFS_DIR, PROMETHEUS_DATA)
        if not (bind_ok or named_ok):
            raise UntrustedBundle(f"service {name} mounts {volume.get('source')} at {target}; a moe-stack stack "
                                  "mounts only the model (and config) directory read-only")
