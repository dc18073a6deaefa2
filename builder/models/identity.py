"""A model's identity, for what is kept across restarts under its name (`compose --keep-prompts`): a hash
of what describes its weights, not of its file's name and size (another model of the same name and size
would restore this one's saved prompts). Each file counts by its header and tensor index: a GGUF's keys
and tensor table (shapes, types, offsets), a safetensors file's JSON header; any other file (or one whose
header doesn't hold together) by its bytes, by its size alone above _WHOLE_FILE_MAX. Reading a header is
quick even for a 400 GB model (a few MB), and each file's hash is kept in moe-stack's cache under its
device, inode, size and mtime, so it is read once.
"""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path

from builder.errors import ModelError
from builder.files import cache_dir, file_sha256, write_file_atomically
from builder.models.gguf_bounds import check_header

_SAFETENSORS_MAX_HEADER = 256 * 1024**2
_WHOLE_FILE_MAX = 64 * 1024**2


def model_identity(parts: list[Path]) -> str:
    """The hex sha256 of the model made of `parts` (in order): each file's header and tensor index."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(f"{_file_identity(part)}\0".encode())
    return digest.hexdigest()


def _file_identity(path: Path) -> str:
    """One file's hash, from the cache when the file is the one hashed (same inode, size and mtime)."""
    info = path.stat()
    where = f"{info.st_dev}:{info.st_ino}:{info.st_size}:{info.st_mtime_ns}"
    cached = cache_dir() / "model-identity" / hashlib.sha256(where.encode()).hexdigest()
    try:
        return cached.read_text().strip()
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    identity = _hash_of_index(path)
    cached.parent.mkdir(parents=True, exist_ok=True)
    write_file_atomically(cached, identity + "\n")  # one file a model file: nothing shared to clash on
    return identity


def _hash_of_index(path: Path) -> str:
    with path.open("rb") as handle:
        magic = handle.read(8)
        length = _index_length(path, magic)
        if length is None:
            size = os.path.getsize(path)
            return file_sha256(path) if size <= _WHOLE_FILE_MAX else f"size-{size}"
        handle.seek(0)
        digest = hashlib.sha256()
        left = length
        while left and (block := handle.read(min(left, 16 << 20))):
            digest.update(block)
            left -= len(block)
    return digest.hexdigest() + f"-{os.path.getsize(path)}"


def _index_length(path: Path, magic: bytes) -> int | None:
    """The bytes of a GGUF's or safetensors file's header and tensor index; None for another file."""
    if magic[:4] == b"GGUF":
        try:
            return check_header(path)
        except ModelError:
            return None
    header = struct.unpack("<Q", magic)[0] if len(magic) == 8 else 0
    if 2 <= header <= min(_SAFETENSORS_MAX_HEADER, os.path.getsize(path) - 8):
        return 8 + header
    return None
