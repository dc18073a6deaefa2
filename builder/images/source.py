"""Engine sources given to a build instead of its default git clone (platform/clone.py).

A local source may be an engine tree, a tarball of one, an sdist that vendors one (e.g.
llama-cpp-python's vendor/llama.cpp), or `pypi:NAME==VERSION` to fetch such an sdist: hosts that
reach PyPI but not GitHub can still build real engines.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from builder.errors import SourceError
from builder.files import cache_dir, file_sha256, user_path
from builder.safe_tar import UnsafeArchive, extract_tree

if TYPE_CHECKING:
    from builder.engines.base import Engine


def resolve_local(engine: Engine, given: str) -> Path:
    """The engine tree for `given` (dir, tarball, sdist or `pypi:SPEC`), checked to be `engine`'s; or
    a wheelhouse directory, for an engine installed from wheels."""
    if given.startswith("pypi:"):
        path = fetch_sdist(given.removeprefix("pypi:"))
    else:
        path = user_path(Path(given)).resolve()
        if not path.exists():
            raise SourceError(
                f"--source {given}: no such file or directory; give an engine tree, a tarball "
                f"or {engine.source_hint}"
            )
    if path.is_dir() and engine.holds_wheels(path):
        return path
    if path.is_file():
        path = _unpack(path)
    tree = _find_tree(engine, path)
    if tree is None:
        raise SourceError(
            f"--source {given} is not a {engine.name} source tree (nor a tarball or sdist "
            f"holding one); for {engine.name} give {engine.source_hint}"
        )
    return tree


def _find_tree(engine: Engine, path: Path) -> Path | None:
    candidates = [path, path / engine.sdist_subdir]
    candidates += [child / engine.sdist_subdir for child in sorted(path.iterdir()) if child.is_dir()]
    candidates += [child for child in sorted(path.iterdir()) if child.is_dir()]
    return next((c for c in candidates if c.is_dir() and engine.is_source_tree(c)), None)


def _unpack(archive: Path) -> Path:
    """Extract a tarball once into the cache (keyed by content), atomically."""
    if not tarfile.is_tarfile(archive):
        raise SourceError(
            f"--source {archive} is a file but not a tar archive; give a directory or a .tar.gz"
        )
    digest = file_sha256(archive)[:16]
    target = cache_dir() / "sources" / digest
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=target.parent))
    try:
        extract_tree(archive, staging)
        staging.rename(target)
    except UnsafeArchive as err:
        shutil.rmtree(staging, ignore_errors=True)
        raise SourceError(f"--source {archive}: refused, {err}; unpack and check it by hand") from None
    except (tarfile.TarError, OSError) as err:
        shutil.rmtree(staging, ignore_errors=True)
        raise SourceError(f"--source {archive}: can't unpack ({err}); is the archive complete?") from None
    return target


def fetch_sdist(requirement: str) -> Path:
    """Download the sdist for `requirement` (e.g. llama-cpp-python==0.3.36) into the cache."""
    target = cache_dir() / "sdists" / re.sub(r"[^A-Za-z0-9_.=-]", "_", requirement)
    found = sorted(target.glob("*.tar.gz")) if target.is_dir() else []
    if found:
        return found[0]
    target.mkdir(parents=True, exist_ok=True)
    failed = pip_download(target, "--no-binary", ":all:", requirement)
    found = sorted(target.glob("*.tar.gz"))
    if failed is not None or not found:
        raise SourceError(
            f"can't download the sdist {requirement} from PyPI ({failed or 'no sdist'}); give --source DIR "
            "instead"
        )
    return found[0]


def pip_download(dest: Path, *args: str) -> str | None:
    """`pip download --no-deps ARGS` into `dest`, quietly: None when it did, else pip's last error line."""
    result = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(dest), *args],
        capture_output=True,
        text=True,
        check=False,
    )
    return None if result.returncode == 0 else (result.stderr.strip().splitlines() or ["no output"])[-1]
