"""A model from a Hugging Face repository onto this host (`moe-stack fetch-model --hf REPO --include
PATTERN`): the matching files into a plain directory (no symlinked cache: split GGUFs and mounts need
real files), a broken connection resumed where it left off (huggingface_hub's retries), files already
complete kept on a rerun, each file's sha256 checked against the repository's LFS metadata and
recorded beside them (moe-stack-model.json).

huggingface_hub does the talking: HF_ENDPOINT (a mirror), HF_TOKEN or its token file, its resume.
The stacks stay offline: nothing here runs in an image.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

from huggingface_hub import HfApi, constants, snapshot_download
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError
from huggingface_hub.utils import disable_progress_bars
from huggingface_hub.utils import logging as hub_logging

from builder.errors import ModelError
from builder.files import file_sha256, write_file_atomically

HUB = "https://huggingface.co"  # huggingface_hub's endpoint when HF_ENDPOINT names no mirror
MANIFEST = "moe-stack-model.json"  # what was fetched: repository, commit, each file's size and sha256
# The only revision passed on to huggingface_hub is the commit the hub names, and it must be one: the
# library files a revision under refs/<revision> in its cache, so `../` in it would choose a path.
_COMMIT = re.compile(r"[0-9a-f]{40}")
# What --revision may be: a branch, tag or commit name (git's rules, narrowed).
_REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,254}")
_GLOB_OR_CONTROL = re.compile(r"[*?\[\]\\\x00-\x1f\x7f]")


def hub_token() -> str | bool | None:
    """The token huggingface_hub may send: its own choice (HF_TOKEN, else the stored login) for the hub
    itself; for a mirror (HF_ENDPOINT) only a token given for it in HF_TOKEN, never the stored login, which
    is the hub's; and no plain http except on this machine's loopback (the token and the files would cross
    the network in the clear)."""
    endpoint = constants.ENDPOINT
    parts = urlsplit(endpoint)
    host = parts.hostname or ""
    if not (parts.scheme == "https" or (parts.scheme == "http" and _loopback(host))):
        raise ModelError(
            f"HF_ENDPOINT {endpoint} is not https: models and tokens would travel in the clear; give an "
            "https:// mirror (plain http only on 127.0.0.1 or localhost)"
        )
    if endpoint.rstrip("/") == HUB:
        return None
    return os.environ.get("HF_TOKEN") or False


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_revision(revision: str) -> str:
    """`revision` when it is a plain branch, tag or commit name; ModelError otherwise."""
    if (
        not _REVISION.fullmatch(revision)
        or ".." in revision
        or "//" in revision
        or revision.endswith(("/", ".lock"))
    ):
        raise ModelError(
            f"--revision {revision!r} is not a branch, tag or commit name (letters, digits and . _ - /, "
            "no '..'); give one the repository has"
        )
    return revision


def _plain_name(repo: str, name: str) -> str:
    """A file name the hub lists, when it is a plain relative POSIX path (it becomes a path under --dest)."""
    parts = PurePosixPath(name).parts
    if (
        not parts
        or name.startswith("/")
        or any(part in ("", ".", "..") for part in parts)
        or _GLOB_OR_CONTROL.search(name)
        or name != "/".join(parts)
    ):
        raise ModelError(
            f"the hub lists a file of {repo} named {name!r}, which is not a plain relative path (no "
            "'..', control or glob characters): refused, nothing was written"
        )
    return name


@dataclass(frozen=True)
class HubFile:
    name: str
    size: int
    sha256: str | None  # None for a file the repository keeps outside LFS (small text files)


@dataclass(frozen=True)
class Fetched:
    directory: Path
    commit: str
    files: tuple[HubFile, ...]

    @property
    def first_model(self) -> Path:
        """The file `compose --model` takes: the first GGUF (the first shard of a split one)."""
        ggufs = sorted(f.name for f in self.files if f.name.endswith(".gguf"))
        return self.directory / (ggufs[0] if ggufs else self.files[0].name)


# A Hugging Face checkpoint's files: config and generation config, tokenizer, safetensors weights.
CHECKPOINT_FILES = ("*.json", "*.safetensors", "tokenizer*", "*.model", "*.tiktoken", "merges.txt", "vocab.*")


def check_checkpoint(repo: str, files: tuple[HubFile, ...]) -> None:
    """Refuse a repository whose selected files are not a checkpoint (a GGUF repository, say)."""
    names = {f.name for f in files}
    if "config.json" not in names or not any(name.endswith(".safetensors") for name in names):
        raise ModelError(
            f"{repo} holds no Hugging Face checkpoint (config.json and *.safetensors): give the "
            "original model's repository (e.g. Qwen/Qwen3-235B-A22B), not a GGUF one"
        )


def plan_fetch(repo: str, include: list[str], revision: str | None = None) -> tuple[str, tuple[HubFile, ...]]:
    """The repository's commit and the files the patterns select (sizes and sha256 from LFS metadata)."""
    if revision is not None:
        check_revision(revision)
    token = hub_token()
    try:
        info = HfApi().model_info(repo, revision=revision, files_metadata=True, token=token)
    except RepositoryNotFoundError:
        raise ModelError(
            f"no repository {repo} on the hub (or it needs a token: `hf auth login`, or HF_TOKEN)"
        ) from None
    except RevisionNotFoundError:
        raise ModelError(f"{repo} has no revision {revision}") from None
    except (HfHubHTTPError, OSError) as err:
        raise ModelError(
            f"the hub did not answer for {repo} ({err}); check the network or HF_ENDPOINT"
        ) from None
    except (ValueError, KeyError, TypeError) as err:  # an answer that is not the hub's JSON
        raise ModelError(
            f"the hub's answer for {repo} is not a model listing ({type(err).__name__}); check HF_ENDPOINT"
        ) from None
    except Exception as err:  # noqa: BLE001 - its HTTP stack's transport errors (httpx's in 2.x), not OSError
        reason = str(err).splitlines()[-1] if str(err).strip() else type(err).__name__
        raise ModelError(
            f"can't reach the hub at {constants.ENDPOINT} ({reason}); check the network, or set HF_ENDPOINT "
            "to a mirror this host reaches"
        ) from None
    commit = str(info.sha)
    if not _COMMIT.fullmatch(commit):
        raise ModelError(
            f"the hub answered {commit!r} as the commit of {repo}, not a 40-hex commit id: refused, "
            "nothing was written; check HF_ENDPOINT"
        )
    siblings = info.siblings or []
    for sibling in siblings:  # a listing with one hostile name is a hostile listing
        _plain_name(repo, sibling.rfilename)
    chosen = tuple(
        HubFile(s.rfilename, int(s.size or (s.lfs.size if s.lfs else 0)), s.lfs.sha256 if s.lfs else None)
        for s in siblings
        if any(fnmatch.fnmatch(s.rfilename, p) for p in include)
    )
    if not chosen:
        names = ", ".join(sorted(repr(s.rfilename) for s in siblings)[:12])
        raise ModelError(f"no file of {repo} matches {' '.join(include)}; it has: {names}")
    return commit, chosen


def fetch(repo: str, include: list[str], dest: Path, revision: str | None = None) -> Fetched:
    """Download the selected files into `dest` (resuming a partial download), check and record them."""
    commit, files = plan_fetch(repo, include, revision)
    dest.mkdir(parents=True, exist_ok=True)
    before = {
        f.name: _identity(dest / f.name) for f in files
    }  # a file the download leaves as it was isn't ours
    missing = sum(f.size for f in files if not _complete(dest / f.name, f))
    free = shutil.disk_usage(dest).free
    if missing > free:
        raise ModelError(
            f"{repo}'s files need {missing / 1e9:.1f} GB more and {dest} has {free / 1e9:.1f} GB free; "
            "free some space or pick another --dest"
        )
    if not sys.stderr.isatty():  # its progress bars and retry notes are for a terminal; logs get the result
        disable_progress_bars()
        hub_logging.set_verbosity_error()
    try:
        snapshot_download(
            repo, revision=commit, local_dir=dest, allow_patterns=[f.name for f in files], token=hub_token()
        )
    except Exception as err:  # noqa: BLE001 - whatever HTTP stack it uses: one line, and how to go on
        reason = str(err).splitlines()[-1] if str(err).strip() else type(err).__name__
        raise ModelError(
            f"the download from {repo} broke off ({reason}); run the same command again: the files "
            "already complete are kept"
        ) from None
    for file in files:
        path = dest / file.name
        if file.sha256 is not None and _sha256(path) != file.sha256:
            if before[file.name] is not None and before[file.name] == _identity(path):
                raise ModelError(
                    f"{path} was there before this run and does not have the sha256 {repo} lists "
                    f"({file.sha256[:12]}…); remove it and run the command again"
                )
            path.unlink()
            raise ModelError(
                f"{file.name} from {repo} does not have the sha256 the repository lists "
                f"({file.sha256[:12]}…); it was removed: run the command again to fetch it anew"
            )
    fetched = Fetched(directory=dest, commit=commit, files=files)
    write_file_atomically(
        dest / MANIFEST,
        json.dumps(
            {
                "repository": repo,
                "commit": commit,
                "files": [{"name": f.name, "size": f.size, "sha256": f.sha256} for f in files],
            },
            indent=2,
        )
        + "\n",
    )
    return fetched


def _identity(path: Path) -> tuple[int, int, int] | None:
    """(inode, size, mtime) of a file, None when there is none: whether a download rewrote it."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return None
    return info.st_ino, info.st_size, info.st_mtime_ns


def _complete(path: Path, file: HubFile) -> bool:
    return path.is_file() and path.stat().st_size == file.size


def _sha256(path: Path) -> str:
    if path.is_symlink() or not path.is_file():  # a FIFO or a device would hang the hash
        raise ModelError(f"{path} is not a regular file; remove it and run the command again")
    return file_sha256(path)


def recorded(part: Path) -> HubFile | None:
    """What `fetch` recorded for `part` (its size and sha256), from the moe-stack-model.json of the
    directory it was fetched into (the part's own or one up to two levels above); None if none."""
    for directory in list(part.resolve().parents)[:3]:
        manifest = directory / MANIFEST
        if manifest.is_file():
            name = str(part.resolve().relative_to(directory))
            try:
                entries = json.loads(manifest.read_text())["files"]
                return next(
                    (HubFile(e["name"], int(e["size"]), e["sha256"]) for e in entries if e["name"] == name),
                    None,
                )
            except (ValueError, KeyError, TypeError):
                raise ModelError(
                    f"{manifest} is not a moe-stack model record; fetch the model again"
                ) from None
    return None


def size_problems(parts: list[Path]) -> list[str] | None:
    """For a fetched model: each part whose size differs from the record (a quick check; the sha256
    is checked at fetch and by `bundle`); None when the model has no record."""
    found = [(part, recorded(part)) for part in parts]
    if all(record is None for _, record in found):
        return None
    return [
        f"{part.name} is {part.stat().st_size} bytes, {record.size} when fetched"
        for part, record in found
        if record is not None and part.stat().st_size != record.size
    ]
