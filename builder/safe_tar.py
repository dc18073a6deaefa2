"""Tar extraction that doesn't trust the archive, nor `tarfile`'s extraction filters.

`tarfile`'s `filter="data"` let symlink chains longer than PATH_MAX through before Python 3.11.13 /
3.12.11 / 3.13.4 (the CVE-2025-4517 family), and 3.11.0-3.11.3 don't accept `filter=` at all. So
moe-stack writes every member itself: regular files are streamed into files opened with
O_CREAT|O_EXCL|O_NOFOLLOW under parents that are real directories (never links), links are checked
before they are made, and devices, FIFOs and absolute or `..` names are refused.
Nothing here depends on the Python version's tarfile fixes.
"""

from __future__ import annotations

import hashlib
import io
import os
import posixpath
import stat
import tarfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING, cast

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

_CHUNK = 16 << 20


class UnsafeArchive(Exception):
    """A member the archive may not hold; `str()` names it and why."""


def member_path(name: str) -> str:
    """`name` as a relative path inside the tree, or UnsafeArchive (absolute, `..`, empty)."""
    clean = posixpath.normpath(name)
    if name.startswith("/") or clean in ("", ".") or clean == ".." or clean.startswith("../"):
        raise UnsafeArchive(f"member {name!r} is not a plain relative path")
    return clean


def _real_parent(root: Path, relative: str, create: bool = True) -> Path:
    """The member's parent directory: every component below `root` a real directory (made here if
    missing and `create`), never a link, so nothing is ever written through a link. No realpath is
    involved, so no PATH_MAX-long link chain can mislead the check."""
    current = root
    for part in PurePosixPath(relative).parts[:-1]:
        current = current / part
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            if not create:
                raise UnsafeArchive(f"link target {relative!r} is not in the tree") from None
            os.mkdir(current)
            continue
        if not stat.S_ISDIR(mode):
            raise UnsafeArchive(f"member {relative!r} would be written through the link or file {part!r}")
    return current


def _check_link(relative: str, linkname: str) -> None:
    """A symlink may only point inside the tree: relative, its `..` steps leading and no more of them
    than its directory is deep (its parents are real directories, so that is exact), then only
    downward (through links that themselves obey this rule, so the walk stays inside)."""
    if linkname.startswith("/"):
        raise UnsafeArchive(f"link {relative!r} points at the absolute path {linkname!r}")
    parts = PurePosixPath(linkname).parts
    ups = next((i for i, part in enumerate(parts) if part != ".."), len(parts))
    if ".." in parts[ups:] or ups > len(PurePosixPath(relative).parts) - 1:
        raise UnsafeArchive(f"link {relative!r} -> {linkname!r} leaves the tree (or climbs after descending)")


def write_stream(source: IO[bytes], target: Path, limit: int | None, name: str, mode: int = 0o644) -> int:
    """Copy `source` into a new file `target` (never an existing one, never through a link)."""
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    except FileExistsError:
        raise UnsafeArchive(f"member {name!r} appears twice") from None
    written = 0
    with os.fdopen(fd, "wb") as out:
        while chunk := source.read(_CHUNK):
            written += len(chunk)
            if limit is not None and written > limit:
                raise UnsafeArchive(f"member {name!r} is larger than {limit} bytes")
            out.write(chunk)
    return written


def extract_tree(archive: Path, dest: Path) -> None:
    """Extract a source tarball (an sdist, a tarball of a checkout) into the empty directory `dest`:
    files, directories, and links that stay inside the tree (hard links are copied)."""
    root = dest.resolve()
    with tarfile.open(archive) as tar:
        for member in tar:
            relative = member_path(member.name)
            target = _real_parent(root, relative) / posixpath.basename(relative)
            if member.isdir():
                if target.is_symlink():
                    raise UnsafeArchive(f"directory {member.name!r} is already a link")
                target.mkdir(exist_ok=True)
            elif member.isreg():
                stream = tar.extractfile(member)
                assert stream is not None
                write_stream(stream, target, None, member.name)
                os.chmod(target, 0o755 if member.mode & stat.S_IXUSR else 0o644)
            elif member.issym():
                _check_link(relative, member.linkname)
                os.symlink(member.linkname, target)
            elif member.islnk():
                origin_name = member_path(member.linkname)
                origin = _real_parent(root, origin_name, create=False) / posixpath.basename(origin_name)
                try:
                    origin_mode = os.lstat(origin).st_mode
                except FileNotFoundError:
                    origin_mode = 0
                if not stat.S_ISREG(origin_mode):
                    raise UnsafeArchive(
                        f"hard link {member.name!r} -> {member.linkname!r} is not to a file of the tree"
                    )
                with origin.open("rb") as stream:
                    write_stream(stream, target, None, member.name)
            else:
                raise UnsafeArchive(f"member {member.name!r} is a device, FIFO or other special file")


def extract_files(archive: Path, dest: Path, limit_for: Callable[[str], int | None]) -> str:
    """Extract only regular files that `limit_for` accepts (it returns their size cap, None for no cap;
    it raises UnsafeArchive for a name it doesn't expect) into `dest`; returns the sha256 of the
    archive's bytes exactly as they were read for that (one pass: a file changed after a separate
    hash can't slip through). A file is private while it is written, then gets the read bits its
    member had (never more than 0644). Directories in the archive are skipped (the accepted names
    imply them); links and anything else are refused."""
    root = dest.resolve()
    with archive.open("rb") as raw:
        reader = _HashingReader(raw)
        with tarfile.open(fileobj=cast(IO[bytes], reader), mode="r|") as tar:
            for member in tar:
                if member.isdir():
                    continue
                relative = member_path(member.name)
                limit = limit_for(relative)
                if not member.isreg():
                    raise UnsafeArchive(
                        f"member {member.name!r} is a link or special file, not a regular file"
                    )
                if limit is not None and member.size > limit:
                    raise UnsafeArchive(f"member {member.name!r} is larger than {limit} bytes")
                stream = tar.extractfile(member)
                assert stream is not None
                target = _real_parent(root, relative) / posixpath.basename(relative)
                write_stream(stream, target, limit, member.name, mode=0o600)
                os.chmod(target, (member.mode & 0o644) | stat.S_IRUSR)
        while reader.read(_CHUNK):  # the end-of-archive blocks and anything after them
            pass
    return f"sha256:{reader.digest.hexdigest()}"


class _HashingReader(io.RawIOBase):
    """A sequential reader that hashes every byte it hands out."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self.digest = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer).cast("B")
        count = self._stream.readinto(view)  # type: ignore[attr-defined]
        self.digest.update(view[:count])
        return count
