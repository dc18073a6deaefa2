"""A GGUF header walk that trusts no count: run before gguf.GGUFReader, which believes them.

A few hundred hostile bytes can otherwise exhaust memory: an array whose count is 2^63 at the end of
the file makes the reader advance zero bytes per element forever, and huge tensor or key counts
allocate before anything is read. Here every count is checked against the bytes left in the file
(count × the smallest size one element can have), strings against their length, tensors against
ggml's 4 dimensions: a hostile header is a one-line ModelError in well under a second, memory flat.
Layout (GGUF v2/v3): magic, version u32, tensor count u64, key count u64, keys (string key, u32
type, value), tensor infos (string name, u32 dims, u64 × dims, u32 type, u64 offset).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

from builder.errors import ModelError

# Smallest encoded size of one value of each GGUF type (a string: its u64 length; an array: its u32
# element type and u64 count).
_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 8: 8, 9: 12, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
MAX_TENSORS = 1 << 20
MAX_KEYS = 1 << 16
MAX_DIMS = 4  # GGML_MAX_DIMS
_MAX_NESTING = 4


class _Header:
    def __init__(self, handle: BinaryIO, size: int, path: Path) -> None:
        self.handle, self.size, self.path = handle, size, path

    def fail(self, what: str) -> ModelError:
        return ModelError(
            f"{self.path}'s GGUF header does not hold together: {what} (at byte {self.handle.tell()}); "
            "the file is cut short or corrupt: download it again from a source you trust"
        )

    def left(self) -> int:
        return self.size - self.handle.tell()

    def read(self, fmt: str) -> int:
        need = struct.calcsize(fmt)
        if need > self.left():
            raise self.fail("it ends inside a field")
        value: int = struct.unpack(fmt, self.handle.read(need))[0]
        return value

    def count(self, fmt: str, element_size: int, what: str, cap: int | None = None) -> int:
        value = self.read(fmt)
        if (cap is not None and value > cap) or value * element_size > self.left():
            raise self.fail(f"{what} count {value} does not fit in the {self.left()} bytes left")
        return value

    def skip(self, n_bytes: int) -> None:
        if n_bytes > self.left():
            raise self.fail("a value runs past the end of the file")
        self.handle.seek(n_bytes, 1)

    def string(self) -> None:
        self.skip(self.count("<Q", 1, "string byte"))

    def value(self, kind: int, depth: int = 0) -> None:
        if kind not in _SIZE:
            raise self.fail(f"unknown value type {kind}")
        if kind == _STRING:
            self.string()
        elif kind == _ARRAY:
            element = self.read("<I")
            if element not in _SIZE or depth >= _MAX_NESTING:
                raise self.fail(f"array of unknown type {element}, or nested {depth + 1} deep")
            items = self.count("<Q", _SIZE[element], "array element")
            if element in (_STRING, _ARRAY):
                for _ in range(items):
                    self.value(element, depth + 1)
            else:
                self.skip(items * _SIZE[element])
        else:
            self.skip(_SIZE[kind])


def check_header(path: Path) -> int:
    """Walk the header of the GGUF at `path` with every count bounded; ModelError if it doesn't hold.
    Returns its length: the bytes of its keys and tensor index, before the alignment to the data."""
    with path.open("rb") as handle:
        header = _Header(handle, path.stat().st_size, path)
        if handle.read(4) != b"GGUF":
            raise header.fail("no GGUF magic")
        version = header.read("<I")
        if version not in (2, 3):
            raise header.fail(f"version {version} (moe-stack reads GGUF 2 and 3)")
        tensors = header.count("<Q", 8 + 4 + 8 + 4 + 8, "tensor", MAX_TENSORS)
        keys = header.count("<Q", 8 + 4 + 1, "key", MAX_KEYS)
        for _ in range(keys):
            header.string()
            header.value(header.read("<I"))
        for _ in range(tensors):
            header.string()
            dims = header.read("<I")
            if not 1 <= dims <= MAX_DIMS:
                raise header.fail(f"a tensor with {dims} dimensions (ggml has 1 to {MAX_DIMS})")
            header.skip(8 * dims + 4 + 8)
        return handle.tell()
