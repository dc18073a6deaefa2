"""Files another party wrote (a container's output directory), walked, read and written through
directory file descriptors without following a link. Whatever that party left (a symlink, a hard
link to a host file, a device, a FIFO) can't redirect moe-stack's writes, reads, chown or chmod,
which may run as root, to anything outside the directory."""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from builder.errors import MoeStackError

FILE_MODE, DIR_MODE = 0o644, 0o755
MAX_DEPTH = 32  # deeper directories are refused (each level holds a descriptor while it is walked)
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO put in a file's place between lstat and open must not block the open.
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class RefusedEntry(MoeStackError):
    """An entry that isn't a plain file or directory with one link, found and removed while taking a
    directory back; `name` is its path under that directory."""

    def __init__(self, name: str, kind: str) -> None:
        super().__init__(f"{name!r} is {kind}: only plain files and directories are taken; it was removed")
        self.name, self.kind = name, kind


@contextmanager
def open_dir(path: Path) -> Iterator[int]:
    """`path` as a directory descriptor; OSError when it is a link or no directory."""
    fd = os.open(path, _DIR)
    try:
        yield fd
    finally:
        os.close(fd)


def take_back(dir_fd: int, uid: int, gid: int) -> None:
    """Make the tree under `dir_fd` the user's (`uid`:`gid`): each directory 0755, each file 0644, so
    nothing the other party left stays writable by it or by anyone. Anything else is removed and
    refused (RefusedEntry). The top stays private (0700) until every entry is done."""
    _own(dir_fd, uid, gid, 0o700)
    _take_entries(dir_fd, "", uid, gid, 0)
    os.fchmod(dir_fd, DIR_MODE)


def _own(fd: int, uid: int, gid: int, mode: int) -> None:
    held = os.fstat(fd)
    if (held.st_uid, held.st_gid) != (uid, gid):
        os.fchown(fd, uid, gid)
    os.fchmod(fd, mode)  # after fchown, which may clear set-id bits: the mode is exactly this


def _take_entries(dir_fd: int, prefix: str, uid: int, gid: int, depth: int) -> None:
    with os.scandir(dir_fd) as entries:
        names = sorted(entry.name for entry in entries)
    for name in names:
        found = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISDIR(found.st_mode):
            if depth >= MAX_DEPTH:
                shutil.rmtree(name, dir_fd=dir_fd)
                raise RefusedEntry(f"{prefix}{name}", f"a directory over {MAX_DEPTH} levels deep")
            fd = os.open(name, _DIR, dir_fd=dir_fd)
            try:
                _own(fd, uid, gid, DIR_MODE)
                _take_entries(fd, f"{prefix}{name}/", uid, gid, depth + 1)
            finally:
                os.close(fd)
        elif stat.S_ISREG(found.st_mode):
            _take_file(dir_fd, name, prefix, uid, gid)
        else:
            os.unlink(name, dir_fd=dir_fd)
            raise RefusedEntry(f"{prefix}{name}", _kind(found.st_mode))


def _take_file(dir_fd: int, name: str, prefix: str, uid: int, gid: int) -> None:
    fd = os.open(name, _FILE, dir_fd=dir_fd)
    try:
        held = os.fstat(fd)  # the file opened, whatever the name pointed to at lstat
        if stat.S_ISREG(held.st_mode) and held.st_nlink == 1:
            _own(fd, uid, gid, FILE_MODE)
            return
    finally:
        os.close(fd)
    os.unlink(name, dir_fd=dir_fd)  # the name here only: a file it is a hard link of keeps its own
    links = f"a file with {held.st_nlink} hard links (one may be a host file)"
    raise RefusedEntry(f"{prefix}{name}", links if stat.S_ISREG(held.st_mode) else _kind(held.st_mode))


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device node"
    return "neither a file nor a directory"


def read_capped(path: Path, cap: int) -> bytes:
    """`path`'s bytes; OSError when it is no regular file (a device such as /dev/zero, a FIFO, a
    directory) or holds more than `cap` bytes, so a hostile file costs no more than `cap` of memory."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        held = os.fstat(fd)
        if not stat.S_ISREG(held.st_mode):
            raise OSError(errno.EINVAL, f"not a regular file but {_kind(held.st_mode)}", str(path))
        data = handle.read(cap + 1) if held.st_size <= cap else b""
        if held.st_size > cap or len(data) > cap:
            raise OSError(errno.EFBIG, f"over {cap // 1024**2} MiB", str(path))
    return data


def replace_file_at(dir_fd: int, name: str, data: bytes, mode: int) -> None:
    """Write `name` in the directory `dir_fd` atomically: a new temp file (O_EXCL|O_NOFOLLOW, so no
    link is followed or reused) renamed over it. OSError when `name` is a symlink or other non-file:
    it is left as it is and nothing is written."""
    tmp = f".{name}-{secrets.token_hex(6)}"
    fd = os.open(tmp, _NEW, 0o600, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            os.fchmod(handle.fileno(), mode)
        with suppress(FileNotFoundError):
            there = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if not stat.S_ISREG(there.st_mode):
                raise OSError(errno.EEXIST, f"{_kind(there.st_mode)} is in its place", name)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
