"""Atomic writes: a failure (disk full, interrupt) never leaves a half-written file or directory."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from importlib import resources
from pathlib import Path

from builder.errors import MoeStackError, SpecError
from builder.fd_files import open_dir, replace_file_at

RENDER_MARK = "# Rendered by moe-stack"


def templates_root() -> Path:
    """dockerfiles/: shipped inside the wheel as builder/dockerfiles, or beside builder/ in a checkout."""
    packaged = Path(str(resources.files("builder"))) / "dockerfiles"
    if packaged.is_dir():
        return packaged
    checkout = Path(__file__).resolve().parents[1] / "dockerfiles"
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError("moe-stack's dockerfiles/ templates are missing from this installation")


def write_file_atomically(path: Path, text: str, *, no_follow: bool = False) -> Path:
    """Write `text` to `path` through a temp file in the same directory and a rename. `no_follow`: for a
    directory that isn't the user's own (a container wrote it), which must exist; the last component
    is never followed (a symlink there is refused) and the temp file is made through the directory's
    descriptor, never through a name someone else planted."""
    if no_follow:
        return _write_no_follow(path.parent.resolve() / path.name, text)
    path = path.resolve()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    except OSError as err:
        raise _write_error(path, err) from None
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, 0o666 & ~_umask())  # what open() would give: the user's umask decides
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise _write_error(path, err) from None
        raise
    return path


def _write_no_follow(path: Path, text: str) -> Path:
    try:
        with open_dir(path.parent) as dir_fd:
            replace_file_at(dir_fd, path.name, text.encode(), 0o666 & ~_umask())
    except OSError as err:
        raise _write_error(path, err) from None
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def replace_rendered_dir(files: dict[str, str], out_dir: Path) -> Path:
    """Make `out_dir` hold exactly `files`. Refuses to replace a directory moe-stack didn't render."""
    out_dir = out_dir.resolve()
    if out_dir.exists() and not _is_rendered(out_dir):
        raise MoeStackError(
            f"{out_dir} exists and was not rendered by moe-stack; choose an empty or new directory with --out"
        )
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    except OSError as err:
        raise _write_error(out_dir, err) from None
    try:
        for name, text in files.items():
            (staging / name).write_text(text)
            os.chmod(staging / name, 0o644)
        os.chmod(staging, 0o755)
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}-old")
            shutil.rmtree(old, ignore_errors=True)
            out_dir.rename(old)
            staging.rename(out_dir)
            shutil.rmtree(old)
        else:
            staging.rename(out_dir)
    except BaseException as err:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(err, OSError):
            raise _write_error(out_dir, err) from None
        raise
    return out_dir


def content_dir(files: dict[str, str], parent: Path, name: str) -> Path:
    """A directory under `parent` holding exactly `files`, named `name` and a hash of them: what a build
    reads there never changes under it (another render of other files goes to another directory; one
    of the same files finds this one and writes nothing)."""
    digest = hashlib.sha256()
    for file_name, text in sorted(files.items()):
        digest.update(f"{len(file_name)}:{file_name}{len(text.encode())}:".encode() + text.encode())
    out_dir = parent.resolve() / f"{name}-{digest.hexdigest()[:12]}"
    if not _holds(out_dir, files):
        replace_rendered_dir(files, out_dir)
    return out_dir


def _holds(directory: Path, files: dict[str, str]) -> bool:
    try:
        return {path.name for path in directory.iterdir()} == set(files) and all(
            (directory / name).read_text() == text for name, text in files.items()
        )
    except OSError:
        return False


def _write_error(path: Path, err: OSError) -> MoeStackError:
    """An OSError while writing (disk full, read-only, permissions) as one line."""
    return MoeStackError(
        f"can't write {path} ({err.strerror or err}); nothing was written: free space there or "
        "choose another output path"
    )


def _is_rendered(directory: Path) -> bool:
    if not directory.is_dir():
        return False
    if not any(directory.iterdir()):
        return True
    dockerfile = directory / "Dockerfile"
    return dockerfile.is_file() and dockerfile.read_text(errors="replace").startswith(RENDER_MARK)


def cache_dir() -> Path:
    """moe-stack's cache: sources, build contexts, logs, wheels, models ($XDG_CACHE_HOME/moe-stack)."""
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return root / "moe-stack"


def file_sha256(path: Path) -> str:
    """The hex sha256 of a file's bytes, read 16 MiB at a time (models and image archives are large)."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while block := stream.read(16 << 20):
            digest.update(block)
    return digest.hexdigest()


def user_path(path: Path) -> Path:
    """`path` with a leading `~` or `~user` expanded; SpecError (one line) when there is no such user or
    home, where pathlib raises RuntimeError."""
    try:
        return path.expanduser()
    except RuntimeError:
        raise SpecError(
            f"{str(path).split('/', 1)[0]} names no user with a home on this host; give the path "
            "without ~, or ~/ for your own home"
        ) from None


def check_beside_model(path: Path, model: Path, what: str) -> None:
    """A file the engine loads with the model (a draft model, a vision projector) must exist and sit in the
    model's directory, which the stack mounts read-only: SpecError naming `what` otherwise."""
    if not path.is_file():
        raise SpecError(f"the {what} {path} does not exist; give the path of its .gguf file")
    if path.parent.resolve() != model.parent.resolve():
        raise SpecError(
            f"the {what} {path} is not in the model's directory {model.parent.resolve()}, which the "
            "stack mounts read-only: put it (or a link to it) there"
        )
