"""Air-gapped transfer: one archive with a stack's images (`docker save`), its compose file and a
manifest of digests and model checksums; `load` restores it and refuses anything that doesn't match.

Archive layout (plain tar): manifest.json, compose.yaml, images.tar, models/<part>... (optional).
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from python_on_whales import DockerClient
from python_on_whales.exceptions import DockerException

from builder.distribute.bundle_trust import check_images_tar, nameless
from builder.distribute.loaded_stack import LoadChoices, UntrustedBundle, loaded_image, rebuild_stack
from builder.docker_client import describe, docker
from builder.errors import MoeStackError, StackError
from builder.files import file_sha256, write_file_atomically
from builder.models.formats import FORMATS
from builder.models.hub import recorded
from builder.safe_tar import UnsafeArchive, extract_files
from builder.stackfile.host_checks import check_api_key_file, check_readable_in_container
from builder.stackfile.stack_file import StackFile
from builder.untrusted_text import UnreadableYaml, read_yaml

FORMAT = 1
MANIFEST, COMPOSE, IMAGES = "manifest.json", "compose.yaml", "images.tar"
_SMALL_MEMBER = 1 << 20  # manifest.json and compose.yaml
# A model part's file name: no directories, no leading dot, nothing a path could be made of.
_MODEL_NAME = re.compile(
    r"[A-Za-z0-9][A-Za-z0-9._+-]{0,250}(?:" + "|".join(re.escape(f.suffix) for f in FORMATS) + ")"
)


class BundleError(MoeStackError):
    """A bundle can't be made, or is truncated, corrupt or doesn't match what it says it holds."""


def sha256(path: Path) -> str:
    """A file's digest as the bundle's manifest writes it."""
    return f"sha256:{file_sha256(path)}"


def make_bundle(compose_file: Path, out: Path, include_model: bool = False) -> Path:
    """Write the bundle for `compose_file` (from `moe-stack compose`) to `out`, atomically."""
    document = _stack_file(compose_file)
    client = docker()
    images = _present_images(document, client)
    parts = _model_parts(document, compose_file)
    out = out.resolve()
    with tempfile.TemporaryDirectory(prefix=".moe-stack-bundle-", dir=out.parent) as tmp:
        staging = Path(tmp)
        try:
            client.image.save(images, output=staging / IMAGES)
        except DockerException as err:
            raise BundleError(f"docker save failed: {describe(err)}") from None
        (staging / COMPOSE).write_bytes(compose_file.read_bytes())
        sums = _checked_sums(parts)
        manifest = {
            "format": FORMAT,
            "files": {name: sha256(staging / name) for name in (COMPOSE, IMAGES)},
            "images": {image: client.image.inspect(image).id for image in images},
            "models": [
                {"name": name, "bytes": part.stat().st_size, "sha256": sums[name], "included": include_model}
                for name, part in parts.items()
            ],
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        partial = staging / "bundle.tar"
        with tarfile.open(partial, "w") as archive:
            for name in (MANIFEST, COMPOSE, IMAGES):
                archive.add(staging / name, arcname=name)
            if include_model:
                # the file, not a link to it (Hugging Face's cache links into blobs/)
                for name, part in parts.items():
                    archive.add(part.resolve(), arcname=f"models/{name}")
        os.replace(partial, out)
    return out


def _present_images(document: StackFile, client: DockerClient) -> list[str]:
    """The images the stack's services run, by name (a pinned digest is the registry's, and the manifest
    records the local ID), each present here."""
    images = sorted({service.image.split("@")[0] for service in document.services.values()})
    absent = [image for image in images if not client.image.exists(image)]
    if absent:
        raise BundleError(
            f"image {absent[0]} is not present locally; build or pull it first (`moe-stack pull`)"
        )
    return images


def _model_parts(document: StackFile, compose_file: Path) -> dict[str, Path]:
    """The model's files the stack mounts, by the name each is mounted under: its own parts, a router's
    other models and a cache's links; a draft model or projector refused."""
    record = document.record
    for option, what in (("draft_model", "a draft model"), ("mmproj", "a vision projector")):
        if record.engine_options.get(option):
            raise BundleError(
                f"{compose_file} serves with {what} ({record.engine_options[option]}); a bundle carries the "
                f"model's own files only: emit the stack without --{option.replace('_', '-')} to bundle it"
            )
    model = record.model
    if not model.is_file():
        raise BundleError(
            f"model {model} named by {compose_file} does not exist here; the bundle records its checksum"
        )
    parts = {part.name: part for part in record.engine.model_format.parts(model)}
    for name, source in _model_sources(document):
        if parts.setdefault(name, source).resolve() != source.resolve():
            raise BundleError(
                f"{compose_file} mounts two model files named {name}; a bundle holds each under its name"
            )
    return parts


def _checked_sums(parts: dict[str, Path]) -> dict[str, str]:
    """Each part's sha256, held to the hub's where the part was fetched with one."""
    sums = {name: sha256(part) for name, part in parts.items()}
    for name, part in parts.items():
        fetched = recorded(part)
        if fetched is not None and fetched.sha256 is not None and sums[name] != f"sha256:{fetched.sha256}":
            raise BundleError(
                f"{part} is not the file fetched from the hub (its sha256 differs from "
                "moe-stack-model.json's); fetch it again before bundling"
            )
    return sums


@dataclass(frozen=True)
class LoadOptions:
    """What the user decides of a loaded stack: the out-of-band digest (None: --unverified), where the
    model is when the bundle doesn't hold it, the address to publish on, the config directory and API
    key file on this host."""

    expect_sha256: str | None
    model_dir: Path | None = None
    bind: str = "127.0.0.1"
    config_dir: Path | None = None
    api_key_file: Path | None = None


def load_bundle(bundle: Path, dest: Path, options: LoadOptions) -> Path:
    """Extract `bundle` (hashing exactly the bytes extracted, held to `options.expect_sha256`), check
    every checksum in it and its images' names, rebuild its stack from what moe-stack emits
    (loaded_stack.py), load its images (checking their IDs), and write the stack into `dest`, pointed
    at the bundled model or at `options.model_dir`; returns the compose file's path. Nothing is
    written to `dest` before every check passed."""
    try:
        ipaddress.ip_address(options.bind)
    except ValueError:
        raise BundleError(
            f"--bind {options.bind!r} is not an IP address: publish on 127.0.0.1 (default), 0.0.0.0 "
            "or one of this host's addresses"
        ) from None
    dest = dest.resolve()
    if not dest.parent.is_dir():
        raise BundleError(f"--dest {dest}: its parent directory does not exist; create it first")
    with tempfile.TemporaryDirectory(prefix=".moe-stack-load-", dir=dest.parent) as tmp:
        staging = Path(tmp)
        digest = _extract(bundle, staging)
        verified = _verified(bundle, digest, options.expect_sha256)
        manifest = _manifest(bundle, staging)
        for name, expected in manifest["files"].items():
            _check(bundle, staging / name, name, expected)
        models = manifest["models"]
        for model in models:
            if model["included"]:
                _check(bundle, staging / "models" / model["name"], f"models/{model['name']}", model["sha256"])
        bundled = models[0]["included"]
        model_home = dest / "models" if bundled else _model_home(bundle, models, options.model_dir)
        choices = LoadChoices(
            model_files=tuple(model_home / model["name"] for model in models),
            bundle_digest=digest,
            dest=dest,
            bind=options.bind,
            config_dir=options.config_dir,
            api_key_file=_key_file(options.api_key_file),
            loaded_from=f"{bundle.name} {digest} ({verified})",
        )
        document = _rebuilt_stack(bundle, staging, manifest, choices)
        _load_images(bundle, staging / IMAGES, manifest["images"], digest)
        dest.mkdir(exist_ok=True)
        if bundled:  # only now that everything checked out
            model_home.mkdir(exist_ok=True)
            for model in models:
                os.replace(staging / "models" / model["name"], model_home / model["name"])
        return write_file_atomically(dest / COMPOSE, document.to_yaml())


def unreadable_models(compose_file: Path) -> list[str]:
    """What keeps the loaded stack's engine from reading its model (the files keep the read bits they
    had where they were bundled): one line each, with the fix."""
    problems = []
    for _, source in _model_sources(StackFile.read(compose_file)):
        try:
            check_readable_in_container(source, parent_too=False)
        except StackError as err:
            problems.append(str(err))
    return problems


def _verified(bundle: Path, digest: str, expect_sha256: str | None) -> str:
    if expect_sha256 is None:
        return "unverified: its own checksums only"
    expected = (
        expect_sha256.lower() if expect_sha256.startswith("sha256:") else f"sha256:{expect_sha256.lower()}"
    )
    if digest != expected:
        raise BundleError(f"bundle {bundle} is {digest}, not the {expected} you expect; don't load it")
    return "the sha256 expected"


def _key_file(path: Path | None) -> Path | None:
    if path is None:
        return None
    if not path.is_file():
        raise BundleError(f"--api-key-file {path} is not a file; give the file holding this host's API key")
    check_api_key_file(path)
    return path.resolve()


def _rebuilt_stack(bundle: Path, staging: Path, manifest: dict[str, Any], choices: LoadChoices) -> StackFile:
    """The stack moe-stack writes for the bundle's, once images.tar's names are the manifest's, each
    with the ID the manifest lists (read from images.tar before Docker sees it)."""
    try:
        document = read_yaml(staging / COMPOSE)
        rebuilt = rebuild_stack(document, manifest["images"], choices)
        check_images_tar(staging / IMAGES, manifest["images"])
    except UnreadableYaml as err:
        raise BundleError(f"bundle {bundle}: its compose.yaml {err}") from None
    except UntrustedBundle as err:
        raise BundleError(f"bundle {bundle} refused: {err}") from None
    return rebuilt


def _model_sources(document: StackFile) -> list[tuple[str, Path]]:
    """The model files a stack mounts one by one, as (NAME of /models/NAME, host file)."""
    services = document.services.values()
    return list(dict.fromkeys(file for service in services for file in service.model_files))


def _stack_file(compose_file: Path) -> StackFile:
    try:
        return StackFile.read(compose_file)
    except StackError as err:
        raise BundleError(f"{err}; bundle a stack it emitted") from None


def _member_limit(name: str) -> int | None:
    """The size cap of a member a bundle may hold (None: no cap); UnsafeArchive for any other name."""
    if name in (MANIFEST, COMPOSE):
        return _SMALL_MEMBER
    if name == IMAGES or (name.startswith("models/") and _MODEL_NAME.fullmatch(name.removeprefix("models/"))):
        return None
    raise UnsafeArchive(f"member {name!r} is not one a moe-stack bundle holds")


def _extract(bundle: Path, into: Path) -> str:
    """Only the regular-file members a bundle holds, each written by moe-stack itself (safe_tar); the
    sha256 of the bytes read for that."""
    try:
        return extract_files(bundle, into, _member_limit)
    except UnsafeArchive as err:
        raise BundleError(f"bundle {bundle} refused: {err}; it was not made by `moe-stack bundle`") from None
    except FileNotFoundError:
        raise BundleError(f"bundle {bundle} does not exist") from None
    except (tarfile.TarError, EOFError, OSError) as err:
        raise BundleError(
            f"bundle {bundle} is truncated or not a tar archive ({err}); copy it again"
        ) from None


def _manifest(bundle: Path, staging: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((staging / MANIFEST).read_text())
    except (OSError, ValueError):
        raise BundleError(
            f"bundle {bundle} has no readable {MANIFEST}; it was not made by `moe-stack bundle`"
        ) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise BundleError(f"bundle {bundle} has format {found}; this moe-stack reads format {FORMAT}")
    files, models = manifest.get("files"), manifest.get("models")
    if not isinstance(files, dict) or set(files) != {COMPOSE, IMAGES}:
        raise BundleError(
            f"bundle {bundle}: its manifest must list exactly {COMPOSE} and {IMAGES} under files"
        )
    if models == []:
        raise BundleError(
            f"bundle {bundle}: its manifest lists no model file; a moe-stack bundle names its stack's model"
        )
    if not isinstance(models, list) or not all(
        isinstance(m, dict) and isinstance(m.get("name"), str) and _MODEL_NAME.fullmatch(m["name"])
        for m in models
    ):
        suffixes = ", ".join("*" + f.suffix for f in FORMATS)
        raise BundleError(
            f"bundle {bundle}: its manifest names a model that is not a plain model file name ({suffixes})"
        )
    if not all(
        isinstance(m.get("bytes"), int)
        and isinstance(m.get("sha256"), str)
        and isinstance(m.get("included"), bool)
        for m in models
    ):
        raise BundleError(f"bundle {bundle}: a model entry of its manifest lacks bytes, sha256 or included")
    if len({m["included"] for m in models}) != 1 or len({m["name"] for m in models}) != len(models):
        raise BundleError(
            f"bundle {bundle}: its manifest holds some model files and not others, or one twice"
        )
    images = manifest.get("images")
    if not isinstance(images, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in images.items()
    ):
        raise BundleError(f"bundle {bundle}: its manifest's images must map each image to its ID")
    return manifest


def _check(bundle: Path, path: Path, name: str, expected: str) -> None:
    if not path.is_file():
        raise BundleError(f"bundle {bundle} lacks {name} (expected {expected}); copy it again")
    actual = sha256(path)
    if actual != expected:
        raise BundleError(
            f"bundle {bundle}: {name} is {actual}, the manifest says {expected}; the bundle is "
            "corrupt, copy it again"
        )


def _model_home(bundle: Path, models: list[dict[str, Any]], model_dir: Path | None) -> Path:
    """Where the loaded stack finds a model the bundle doesn't hold: `model_dir` (the user's, never a
    path from the bundle); the files there must be the ones the bundle was made with."""
    if model_dir is None:
        raise BundleError(
            f"bundle {bundle} does not hold the model; pass --model-dir with the directory that holds "
            f"{models[0]['name']}"
        )
    home = model_dir.resolve()
    for model in models:
        path = home / model["name"]
        if not path.is_file():
            raise BundleError(
                f"{path} does not exist; pass --model-dir with the directory that holds {model['name']}"
            )
        if path.stat().st_size != model["bytes"] or sha256(path) != model["sha256"]:
            raise BundleError(
                f"{path} is not the model the stack was made with (its sha256 is not {model['sha256']})"
            )
    return home


def _load_images(bundle: Path, archive: Path, expected: dict[str, str], digest: str) -> None:
    """images.tar loaded with no name of its own (bundle_trust.nameless), each image then tagged by its
    ID under the bundle's scope (loaded_image)."""
    client = docker()
    try:
        client.image.load(nameless(archive), quiet=True)
    except DockerException as err:
        raise BundleError(f"docker load of {bundle} failed: {describe(err)}") from None
    for image, image_id in expected.items():
        if not client.image.exists(image_id):
            raise BundleError(f"after loading {bundle}, this host has no image {image_id} ({image})")
        client.image.tag(image_id, loaded_image(image, digest))
