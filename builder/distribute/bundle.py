"""Air-gapped transfer: one archive with a stack's images (`docker save`), its compose file and a
manifest of digests and model checksums; `load` restores it and refuses anything that doesn't match.

Archive layout (plain tar): manifest.json, compose.yaml, images.tar, models/<part>... (optional).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tarfile
import tempfile
from pathlib import Path

import yaml
from python_on_whales.exceptions import DockerException

from builder.contract import MODEL_DIR
from builder.distribute.bundle_trust import UntrustedBundle, check_stack_shape, check_tags, saved_image_tags
from builder.docker_client import describe, docker
from builder.errors import MoeStackError
from builder.files import write_file_atomically
from builder.models.hub import recorded
from builder.models.planner import split_parts
from builder.safe_tar import UnsafeArchive, extract_files
from builder.stacks.document import literal, to_yaml

FORMAT = 1
MANIFEST, COMPOSE, IMAGES = "manifest.json", "compose.yaml", "images.tar"
_CHUNK = 16 << 20
_SMALL_MEMBER = 1 << 20  # manifest.json and compose.yaml
# A model part's file name: no directories, no leading dot, nothing a path could be made of.
_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,250}\.gguf")


class BundleError(MoeStackError):
    """A bundle can't be made, or is truncated, corrupt or doesn't match what it says it holds."""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def make_bundle(compose_file: Path, out: Path, include_model: bool = False) -> Path:
    """Write the bundle for `compose_file` (from `moe-stack compose`) to `out`, atomically."""
    document = _stack_document(compose_file)
    images = sorted({service["image"] for service in document["services"].values()})
    client = docker()
    absent = [image for image in images if not client.image.exists(image)]
    if absent:
        raise BundleError(f"image {absent[0]} is not present locally; build or pull it first (`moe-stack pull`)")
    model = Path(document["x-moe-stack"]["model"])
    if not model.is_file():
        raise BundleError(f"model {model} named by {compose_file} does not exist here; the bundle records its checksum")
    parts = split_parts(model)
    out = out.resolve()
    with tempfile.TemporaryDirectory(prefix=".moe-stack-bundle-", dir=out.parent) as tmp:
        staging = Path(tmp)
        try:
            client.image.save(images, output=staging / IMAGES)
        except DockerException as err:
            raise BundleError(f"docker save failed: {describe(err)}") from None
        (staging / COMPOSE).write_bytes(compose_file.read_bytes())
        sums = {part: sha256(part) for part in parts}
        for part, digest in sums.items():
            fetched = recorded(part)
            if fetched is not None and fetched.sha256 is not None and digest != f"sha256:{fetched.sha256}":
                raise BundleError(f"{part} is not the file fetched from the hub (its sha256 differs from "
                                  "moe-stack-model.json's); fetch it again before bundling")
        manifest = {
            "format": FORMAT,
            "files": {name: sha256(staging / name) for name in (COMPOSE, IMAGES)},
            "images": {image: client.image.inspect(image).id for image in images},
            "models": [{"name": part.name, "bytes": part.stat().st_size, "sha256": sums[part],
                        "included": include_model} for part in parts],
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        partial = staging / "bundle.tar"
        with tarfile.open(partial, "w") as archive:
            for name in (MANIFEST, COMPOSE, IMAGES):
                archive.add(staging / name, arcname=name)
            if include_model:
                for part in parts:  # the file, not a link to it (Hugging Face's cache links into blobs/)
                    archive.add(part.resolve(), arcname=f"models/{part.name}")
        os.replace(partial, out)
    return out


def load_bundle(bundle: Path, dest: Path, model_dir: Path | None = None, expect_sha256: str | None = None) -> Path:
    """Check `bundle` (against `expect_sha256`, the one `bundle` printed, if given), every checksum in
    it, its stack's shape and its images' tags; then load its images (checking their IDs) and write its
    stack into `dest`, pointed at the bundled model or at `model_dir`; returns the compose file's path."""
    if expect_sha256 is not None:
        expected = expect_sha256 if expect_sha256.startswith("sha256:") else f"sha256:{expect_sha256}"
        actual = sha256(bundle) if bundle.is_file() else "missing"
        if actual != expected.lower():
            raise BundleError(f"bundle {bundle} is {actual}, not the {expected} you expect; don't load it")
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".moe-stack-load-", dir=dest) as tmp:
        staging = Path(tmp)
        _extract(bundle, staging)
        manifest = _manifest(bundle, staging)
        for name, expected in manifest["files"].items():
            _check(bundle, staging / name, name, expected)
        models = manifest["models"]
        for model in models:
            if model["included"]:
                _check(bundle, staging / "models" / model["name"], f"models/{model['name']}", model["sha256"])
        document = _trusted_stack(bundle, staging, manifest)
        bundled = bool(models) and models[0]["included"]
        model_home = (dest / "models").resolve() if bundled else _model_home(bundle, models, document, model_dir)
        _load_images(bundle, staging / IMAGES, manifest["images"])
        if bundled:  # only now that everything checked out
            model_home.mkdir(exist_ok=True)
            for model in models:
                os.replace(staging / "models" / model["name"], model_home / model["name"])
        for service in document["services"].values():
            for volume in service.get("volumes", []):
                if volume.get("target") == MODEL_DIR:
                    volume["source"] = literal(str(model_home))
                elif str(volume.get("target", "")).startswith(f"{MODEL_DIR}/"):  # one file of the model
                    volume["source"] = literal(str(model_home / Path(volume["target"]).name))
        document["x-moe-stack"]["model"] = str(model_home / Path(document["x-moe-stack"]["model"]).name)
        return write_file_atomically(dest / COMPOSE, to_yaml(document))


def _trusted_stack(bundle: Path, staging: Path, manifest: dict) -> dict:
    """The bundle's compose document, once its shape and images.tar's tags are what moe-stack makes."""
    try:
        document = yaml.safe_load((staging / COMPOSE).read_text())
        check_stack_shape(document, manifest["images"])
        check_tags(saved_image_tags(staging / IMAGES), manifest["images"])
    except yaml.YAMLError as err:
        raise BundleError(f"bundle {bundle}: its compose.yaml is not YAML ({err})") from None
    except UntrustedBundle as err:
        raise BundleError(f"bundle {bundle} refused: {err}") from None
    return document


def _stack_document(compose_file: Path) -> dict:
    try:
        document = yaml.safe_load(compose_file.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise BundleError(f"can't read {compose_file}: {err}") from None
    if not isinstance(document, dict) or "x-moe-stack" not in document or not document.get("services"):
        raise BundleError(f"{compose_file} was not written by `moe-stack compose`; bundle a stack it emitted")
    return document


def _member_limit(name: str) -> int | None:
    """The size cap of a member a bundle may hold (None: no cap); UnsafeArchive for any other name."""
    if name in (MANIFEST, COMPOSE):
        return _SMALL_MEMBER
    if name == IMAGES or (name.startswith("models/") and _MODEL_NAME.fullmatch(name.removeprefix("models/"))):
        return None
    raise UnsafeArchive(f"member {name!r} is not one a moe-stack bundle holds")


def _extract(bundle: Path, into: Path) -> None:
    """Only the regular-file members a bundle holds, each written by moe-stack itself (safe_tar)."""
    try:
        extract_files(bundle, into, _member_limit)
    except UnsafeArchive as err:
        raise BundleError(f"bundle {bundle} refused: {err}; it was not made by `moe-stack bundle`") from None
    except FileNotFoundError:
        raise BundleError(f"bundle {bundle} does not exist") from None
    except (tarfile.TarError, EOFError, OSError) as err:
        raise BundleError(f"bundle {bundle} is truncated or not a tar archive ({err}); copy it again") from None


def _manifest(bundle: Path, staging: Path) -> dict:
    try:
        manifest = json.loads((staging / MANIFEST).read_text())
    except (OSError, ValueError):
        raise BundleError(f"bundle {bundle} has no readable {MANIFEST}; it was not made by `moe-stack bundle`") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise BundleError(f"bundle {bundle} has format {found}; this moe-stack reads format {FORMAT}")
    files, models = manifest.get("files"), manifest.get("models")
    if not isinstance(files, dict) or set(files) != {COMPOSE, IMAGES}:
        raise BundleError(f"bundle {bundle}: its manifest must list exactly {COMPOSE} and {IMAGES} under files")
    if not isinstance(models, list) or not all(
            isinstance(m, dict) and isinstance(m.get("name"), str) and _MODEL_NAME.fullmatch(m["name"]) for m in models):
        raise BundleError(f"bundle {bundle}: its manifest names a model that is not a plain *.gguf file name")
    if not all(isinstance(m.get("bytes"), int) and isinstance(m.get("sha256"), str) and
               isinstance(m.get("included"), bool) for m in models):
        raise BundleError(f"bundle {bundle}: a model entry of its manifest lacks bytes, sha256 or included")
    images = manifest.get("images")
    if not isinstance(images, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in images.items()):
        raise BundleError(f"bundle {bundle}: its manifest's images must map each image to its ID")
    return manifest


def _check(bundle: Path, path: Path, name: str, expected: str) -> None:
    if not path.is_file():
        raise BundleError(f"bundle {bundle} lacks {name} (expected {expected}); copy it again")
    actual = sha256(path)
    if actual != expected:
        raise BundleError(f"bundle {bundle}: {name} is {actual}, the manifest says {expected}; the bundle is "
                          "corrupt, copy it again")


def _model_home(bundle: Path, models: list[dict], document: dict, model_dir: Path | None) -> Path:
    """Where the loaded stack finds a model the bundle doesn't hold: `model_dir`, else where it was;
    the files there must be the ones the bundle was made with."""
    home = (model_dir or Path(document["x-moe-stack"]["model"]).parent).resolve()
    for model in models:
        path = home / model["name"]
        if not path.is_file():
            raise BundleError(f"bundle {bundle} does not hold the model and {path} does not exist; pass "
                              "--model-dir with the directory that holds it")
        if path.stat().st_size != model["bytes"] or sha256(path) != model["sha256"]:
            raise BundleError(f"{path} is not the model the stack was made with (its sha256 is not {model['sha256']})")
    return home


def _load_images(bundle: Path, archive: Path, expected: dict[str, str]) -> None:
    client = docker()
    try:
        client.image.load(archive, quiet=True)
    except DockerException as err:
        raise BundleError(f"docker load of {bundle} failed: {describe(err)}") from None
    for image, image_id in expected.items():
        loaded = client.image.inspect(image).id if client.image.exists(image) else "absent"
        if loaded != image_id:
            raise BundleError(f"after loading {bundle}, {image} is {loaded}, the manifest says {image_id}")

