"""What `moe-stack load` checks of a bundle's images before `docker load` applies their names.

A manifest only vouches for itself (the archive is held to a sha256 given out of band, bundle.py), and
`docker load` honours every name inside images.tar: RepoTags of docker save's manifest.json, the legacy
`repositories` file, and the OCI index.json's image names (what the containerd image store reads). So
those names must be exactly the manifest's images, which are exactly the stack's (loaded_stack.py), and
a name that already exists here with another ID is replaced only when the user asks.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

from builder.distribute.loaded_stack import UntrustedBundle


def saved_image_tags(images_tar: Path) -> set[str]:
    """The names `docker load` would give, in Docker's short form: RepoTags of docker save's
    manifest.json, the legacy `repositories` file, and index.json's image names (read from the
    archive, nothing extracted)."""
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
            if "index.json" in names:
                for entry in _json_member(archive, "index.json").get("manifests") or []:
                    tags.update(_index_names(entry.get("annotations") or {}))
    except (tarfile.TarError, OSError, ValueError, AttributeError, TypeError) as err:
        raise UntrustedBundle(f"{images_tar.name}'s image index can't be read ({err})") from None
    return {short_name(tag) for tag in tags}


def _index_names(annotations: dict[str, str]) -> set[str]:
    """An OCI index entry's image names: containerd's full name, and the OCI ref name where it is a
    whole reference (a bare tag names nothing on its own)."""
    names = (
        {str(annotations["io.containerd.image.name"])} if "io.containerd.image.name" in annotations else set()
    )
    ref = str(annotations.get("org.opencontainers.image.ref.name", ""))
    if "/" in ref or ":" in ref:
        names.add(ref)
    return names


def short_name(name: str) -> str:
    """An image name as Docker prints it (docker.io/library/debian:trixie is debian:trixie)."""
    for prefix in ("docker.io/library/", "docker.io/", "index.docker.io/library/", "index.docker.io/"):
        if name.startswith(prefix):
            return name.removeprefix(prefix)
    return name


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
        raise UntrustedBundle(
            "its manifest lists no images; a moe-stack bundle always holds the stack's images"
        )
    extra = sorted(saved - {short_name(name) for name in listed})
    if extra:
        raise UntrustedBundle(
            f"images.tar would also tag {', '.join(extra)}, which the manifest doesn't list "
            "(loading it would replace those local images)"
        )


def check_local_names(listed: dict[str, str], local_ids: dict[str, str | None], replace: bool) -> None:
    """A name the bundle loads that this host already has as another image is replaced host-wide
    (every stack running it): only when the user asks (`local_ids`: each listed name's local ID or None)."""
    clashing = sorted(
        name for name, image_id in listed.items() if local_ids.get(name) not in (None, image_id)
    )
    if clashing and not replace:
        raise UntrustedBundle(
            f"loading it would replace the local image {clashing[0]} (here {local_ids[clashing[0]]}, "
            f"the bundle's {listed[clashing[0]]}); pass --replace-images if you mean to"
        )
