"""Hostile GGUF headers: a few hundred bytes that would exhaust memory or crash the planner are one
ModelError each, quickly and with flat memory (security issue, medium and low items)."""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
from pathlib import Path

import gguf
import pytest

from builder.errors import ModelError
from builder.models.gguf_bounds import check_header
from builder.models.gguf_facts import read_facts
from builder.models.synth_moe import MoeShape, write_moe_gguf
from tests.cli import run_cli

ROOT = Path(__file__).resolve().parents[2]


def _string(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def _header(tensors: int, keys: list[bytes], tail: bytes = b"") -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, tensors, len(keys)) + b"".join(keys) + tail


def _kv(key: bytes, kind: int, value: bytes) -> bytes:
    return _string(key) + struct.pack("<I", kind) + value


@pytest.mark.parametrize(
    ("data", "why"),
    [
        # An array of 2^63 u8 at the end of the file: the reader would advance 0 bytes per element.
        (
            _header(0, [_kv(b"a", 9, struct.pack("<IQ", 0, 1 << 63))]),
            "array element count 9223372036854775808",
        ),
        (_header(0, [_kv(b"a", 9, struct.pack("<IQ", 8, 1 << 40))]), "array element count"),
        (_header(1 << 40, []), "tensor count"),
        (b"GGUF" + struct.pack("<IQQ", 3, 0, 1 << 62), "key count"),
        (_header(0, [_kv(b"a", 8, struct.pack("<Q", 1 << 62))]), "string byte count"),
        (_header(0, [_kv(b"a", 99, b"")]), "unknown value type 99"),
        (_header(1, [], _string(b"t") + struct.pack("<I", 9) + b"\0" * 84), "9 dimensions"),
        (b"GGUF" + struct.pack("<I", 7) + b"\0" * 16, "version 7"),
        (b"GGUF\3\0", "ends inside a field"),
    ],
)
def test_hostile_headers_are_one_error_fast_and_flat(tmp_path: Path, data: bytes, why: str) -> None:
    """Read in a child held to 20 s and an address-space cap (four times its size at start, plus 1 GiB):
    the unchecked reader breaks the cap (MemoryError) or the time (it loops); the checked one answers
    in well under 0.5 s."""
    path = tmp_path / "hostile.gguf"
    path.write_bytes(data)
    probe = (
        "import json, resource, sys, time\n"
        "from builder.errors import ModelError\nfrom builder.models.gguf_facts import read_facts\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_AS)\n"
        "size = int(open('/proc/self/statm').read().split()[0]) * resource.getpagesize()\n"
        "resource.setrlimit(resource.RLIMIT_AS, (size * 4 + (1 << 30), hard))\n"
        "started = time.monotonic()\n"
        "try:\n    read_facts(__import__('pathlib').Path(sys.argv[1])); said = 'read'\n"
        "except ModelError as error:\n    said = str(error)\n"
        "print(json.dumps({'said': said, 'seconds': time.monotonic() - started}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, str(path)],
        capture_output=True,
        text=True,
        timeout=20,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    answer = json.loads(result.stdout)
    assert re.search(why, answer["said"]) and answer["seconds"] < 0.5, answer


def _model_with(tmp_path: Path, **overrides: object) -> Path:
    """A real synthetic model, then one field of its header rewritten by gguf's own writer."""
    source = write_moe_gguf(
        tmp_path / "ok.gguf",
        MoeShape(
            layers=2, hidden=64, heads=2, kv_heads=1, head_dim=32, expert_ffn=32, experts=4, experts_used=2
        ),
    )
    reader = gguf.GGUFReader(str(source), "r+")
    for key, value in overrides.items():
        field = reader.fields[key]
        field.parts[field.data[0]][...] = value
    return source


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("qwen3moe.block_count", 1 << 28, "268435456 layers"),
        ("qwen3moe.block_count", 1, "is in layer 1, but the model has 1 layers"),
        ("qwen3moe.attention.head_count", 0, "0 attention heads"),
        ("qwen3moe.expert_count", 1 << 30, "1073741824 experts"),
    ],
)
def test_crafted_model_fields(tmp_path: Path, key: str, value: int, why: str) -> None:
    path = _model_with(tmp_path, **{key: value})
    with pytest.raises(ModelError, match=why):
        read_facts(path)


def test_invalid_utf8_architecture_and_duplicate_keys(tmp_path: Path) -> None:
    arch = _kv(b"general.architecture", 8, _string(b"\xff\xfe"))
    path = tmp_path / "bad.gguf"
    path.write_bytes(_header(0, [arch]))
    with pytest.raises(ModelError, match="not UTF-8"):
        read_facts(path)
    path.write_bytes(_header(0, [arch, arch]))
    with pytest.raises(ModelError, match="not a readable GGUF"):
        read_facts(path)


@pytest.mark.cli
def test_the_plan_verb_says_one_line(tmp_path: Path) -> None:
    path = tmp_path / "hostile.gguf"
    path.write_bytes(_header(0, [_kv(b"a", 9, struct.pack("<IQ", 0, 1 << 63))]))
    result = run_cli("plan", str(path))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and "header does not hold together" in result.stderr


def test_real_models_pass(tmp_path: Path) -> None:
    check_header(_model_with(tmp_path))
