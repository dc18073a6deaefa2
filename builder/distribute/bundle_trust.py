"""What `moe-stack load` checks of a bundle's images, and how Docker is given them.

A manifest only vouches for itself (the archive is held to a sha256 given out of band, bundle.py), and
`docker load` honours every name inside images.tar: RepoTags of docker save's manifest.json, the legacy
`repositories` file, and the OCI index.json's image names (what the containerd image store reads). So
those names must be exactly the manifest's images, which are exactly the stack's (loaded_stack.py), and
each must get from images.tar the very image ID the manifest lists for it (the sha256 of its config
blob, or for the containerd store the digest of the manifest or index it names, hashed here from the
archive's bytes): read from the tar in place, before `docker load` runs. Docker is then given the
archive with no name in it (`nameless`): a bundle's image is named only under the bundle's own scope
(loaded_stack.loaded_image), never a name the builder starts FROM or another stack runs.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import re
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from builder.distribute.loaded_stack import UntrustedBundle
from builder.safe_tar import UnsafeArchive, member_path

_INDEX_LIMIT = 1 << 20  # manifest.json, index.json, repositories
_BLOB_LIMIT = 8 << 20  # an image config, manifest or index
_BLOBS_READ = 256  # configs, manifests and indexes read in all: a hostile index can't make load read more
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_CHUNK = 1 << 20


@dataclass(frozen=True)
class SavedName:
    """A name `docker load` would give from images.tar (Docker's short form), the file saying so, and
    the image IDs it can get from there, the one Docker's own store reports first (None: only from
    `repositories`, which docker load reads only in an archive without manifest.json, refused here)."""

    name: str
    where: str
    ids: tuple[str, ...] | None


def check_images_tar(images_tar: Path, listed: dict[str, str]) -> None:
    """Refuse images.tar unless each name it holds is one the manifest lists (`listed`: name to image
    ID) and gets from it exactly that ID; read from the archive itself, nothing loaded or extracted."""
    check_saved_names(saved_names(images_tar), listed)


def check_saved_names(saved: list[SavedName], listed: dict[str, str]) -> None:
    """images.tar may tag only what the manifest lists (docker load would apply every other tag too),
    each with the ID listed for it (a name listed with its local image's ID can't carry other code)."""
    if not listed:
        raise UntrustedBundle(
            "its manifest lists no images; a moe-stack bundle always holds the stack's images"
        )
    claimed: dict[str, set[str]] = {}
    for name, image_id in listed.items():
        claimed.setdefault(short_name(name), set()).add(image_id)
    twice = sorted(name for name, ids in claimed.items() if len(ids) > 1)
    if twice:
        raise UntrustedBundle(f"its manifest lists {twice[0]} under two spellings with two image IDs")
    extra = sorted({entry.name for entry in saved} - set(claimed))
    if extra:
        raise UntrustedBundle(
            f"images.tar would also tag {', '.join(extra)}, which the manifest doesn't list "
            "(loading it would replace those local images)"
        )
    missing = sorted(set(claimed) - {entry.name for entry in saved if entry.ids is not None})
    if missing:
        raise UntrustedBundle(f"images.tar holds no image named {missing[0]}, which its manifest lists")
    for entry in saved:
        (expected,) = claimed[entry.name]
        if entry.ids is not None and expected not in entry.ids:
            raise UntrustedBundle(
                f"images.tar's {entry.where} gives {entry.name} the image {entry.ids[0]}, its manifest "
                f"lists {expected}; loading it would re-point {entry.name} at an image the manifest "
                "doesn't name"
            )


def saved_names(images_tar: Path) -> list[SavedName]:
    """Every name images.tar gives and the IDs it gives it (read in place, nothing extracted)."""
    try:
        with tarfile.open(images_tar, "r:") as tar:
            archive = _SavedArchive(tar)
            if "manifest.json" not in archive.members:
                raise UntrustedBundle(f"{images_tar.name} is not a `docker save` archive (no manifest.json)")
            indexed = _index_entries(archive)
            saved: list[SavedName] = []  # manifest.json's first: what Docker's own store reads
            for entry in archive.json("manifest.json"):
                config = archive.digest_of(member_path(str(entry["Config"])))
                for tag in map(short_name, entry.get("RepoTags") or []):
                    # The containerd store knows the same image by the digest index.json gives this
                    # name, where the manifest or index of that digest holds this config.
                    known_as = [
                        digest
                        for named, digest, configs in indexed
                        if named.name == tag and config in configs
                    ]
                    saved.append(SavedName(tag, "manifest.json", tuple(dict.fromkeys([config, *known_as]))))
            saved += [entry for entry, _, _ in indexed]
            if "repositories" in archive.members:
                for repo, by_tag in archive.json("repositories").items():
                    saved.extend(
                        SavedName(short_name(f"{repo}:{tag}"), "repositories", None) for tag in by_tag
                    )
    except (tarfile.TarError, OSError, ValueError, AttributeError, TypeError, KeyError, UnsafeArchive) as err:
        raise UntrustedBundle(f"{images_tar.name}'s image index can't be read ({err})") from None
    return saved


def _index_entries(archive: _SavedArchive) -> list[tuple[SavedName, str, frozenset[str]]]:
    """index.json's names, each with the IDs it can get (the digest it names; the config of that
    manifest, where it is one), that digest, and the configs of the images under it."""
    if "index.json" not in archive.members:
        return []
    entries = []
    for entry in archive.json("index.json").get("manifests") or []:
        names = _index_names(entry.get("annotations") or {})
        if not names:
            continue  # an entry without a name tags nothing
        digest = _digest(entry["digest"])
        config = _config_of(archive.blob_json(digest))
        ids = (digest,) if config is None else (digest, config)
        configs = archive.configs(digest)
        entries += [
            (SavedName(short_name(name), "index.json", ids), digest, configs) for name in sorted(names)
        ]
    return entries


# The index.json annotations that name an image (containerd's image store reads them).
_NAMING = ("io.containerd.image.name", "org.opencontainers.image.ref.name")


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


def _digest(value: object) -> str:
    if not isinstance(value, str) or not _DIGEST.fullmatch(value):
        raise UntrustedBundle(f"images.tar names the digest {value!r}, not a sha256 one")
    return value


def _config_of(document: Any) -> str | None:
    """The config digest of an image manifest (None for an index)."""
    config = document.get("config") if isinstance(document, dict) else None
    return _digest(config.get("digest")) if isinstance(config, dict) else None


class _SavedArchive:
    """images.tar read in place: its members by their normalised names (each once, none under a link
    or file, so the bytes read here are the bytes Docker reads), small files only, each counted."""

    def __init__(self, tar: tarfile.TarFile) -> None:
        self._tar = tar
        self.members = _file_members(tar)
        self._reads = 0
        self._blobs: dict[str, Any] = {}

    def read(self, name: str, limit: int) -> bytes:
        member = self.members.get(name)
        if member is None:
            raise UntrustedBundle(f"images.tar lacks {name}, which its index names")
        if not member.isreg() or member.size > limit:
            raise UntrustedBundle(f"images.tar's {name} is not a regular file of at most {limit} bytes")
        self._reads += 1
        if self._reads > _BLOBS_READ:
            raise UntrustedBundle(f"images.tar's index names more than {_BLOBS_READ} configs and manifests")
        stream = self._tar.extractfile(member)
        assert stream is not None
        return stream.read()

    def json(self, name: str) -> Any:
        return json.loads(self.read(name, _INDEX_LIMIT))

    def digest_of(self, name: str) -> str:
        return f"sha256:{hashlib.sha256(self.read(name, _BLOB_LIMIT)).hexdigest()}"

    def blob_json(self, digest: str) -> Any:
        """The manifest or index of `digest`, its bytes held to that digest."""
        if digest not in self._blobs:
            name = f"blobs/sha256/{digest.removeprefix('sha256:')}"
            data = self.read(name, _BLOB_LIMIT)
            if f"sha256:{hashlib.sha256(data).hexdigest()}" != digest:
                raise UntrustedBundle(f"images.tar's {name} does not hash to its name")
            self._blobs[digest] = json.loads(data)
        return self._blobs[digest]

    def configs(self, digest: str, depth: int = 0) -> frozenset[str]:
        """The configs of the images under `digest`: its own, or those of the manifests of an index
        that the archive holds (an index of an index at most, as Docker saves them)."""
        document = self.blob_json(digest)
        config = _config_of(document)
        if config is not None:
            return frozenset({config})
        children = document.get("manifests") if isinstance(document, dict) and depth < 2 else None
        if not isinstance(children, list):
            return frozenset()
        held = [
            child
            for child in map(_digest, (entry.get("digest") for entry in children))
            if f"blobs/sha256/{child.removeprefix('sha256:')}" in self.members
        ]
        return frozenset().union(*(self.configs(child, depth + 1) for child in held))


def _file_members(tar: tarfile.TarFile) -> dict[str, tarfile.TarInfo]:
    """The archive's members other than directories, by normalised name; UntrustedBundle for a name
    held twice or one under a non-directory (a link there would make Docker read other bytes)."""
    files: dict[str, tarfile.TarInfo] = {}
    directories: set[str] = set()
    for member in tar.getmembers():
        name = member_path(member.name)
        if name in files or (name in directories and not member.isdir()):
            raise UntrustedBundle(f"images.tar holds {name} twice")
        if member.isdir():
            directories.add(name)
        else:
            files[name] = member
    for name in files:
        for parent in list(PurePosixPath(name).parents)[:-1]:
            if str(parent) in files:
                raise UntrustedBundle(f"images.tar holds {name} under {parent}, which is not a directory")
    return files


def nameless(images_tar: Path) -> Iterator[bytes]:
    """images.tar as `docker load` is given it: every name left out (manifest.json's RepoTags, index.json's
    image names, the legacy `repositories` file), the images byte for byte. Docker then names nothing: the
    images get only the names `load` tags them with (loaded_stack.loaded_image)."""
    with tarfile.open(images_tar, "r:") as tar:
        for member in tar:
            where = member_path(member.name)
            if where == "repositories":
                continue
            stream = tar.extractfile(member) if member.isreg() else None
            if stream is not None and where in ("manifest.json", "index.json"):
                data = _unnamed(where, json.loads(stream.read(_INDEX_LIMIT + 1)))
                member = _resized(member, len(data))
                stream = io.BytesIO(data)
            yield member.tobuf(tar.format, tar.encoding, tar.errors)
            if stream is not None:
                while chunk := stream.read(_CHUNK):
                    yield chunk
                if member.size % tarfile.BLOCKSIZE:
                    yield tarfile.NUL * (tarfile.BLOCKSIZE - member.size % tarfile.BLOCKSIZE)
    yield tarfile.NUL * (2 * tarfile.BLOCKSIZE)


def _unnamed(where: str, document: Any) -> bytes:
    """manifest.json's entries without their RepoTags, index.json's without the annotations naming them."""
    if where == "manifest.json":
        document = [{**entry, "RepoTags": None} for entry in document]
    else:
        document = {
            **document,
            "manifests": [
                {
                    **entry,
                    "annotations": {
                        key: value
                        for key, value in (entry.get("annotations") or {}).items()
                        if key not in _NAMING
                    },
                }
                for entry in document.get("manifests") or []
            ],
        }
    return json.dumps(document).encode()


def _resized(member: tarfile.TarInfo, size: int) -> tarfile.TarInfo:
    resized = copy.copy(member)
    resized.size = size
    resized.pax_headers = {key: value for key, value in member.pax_headers.items() if key != "size"}
    return resized
