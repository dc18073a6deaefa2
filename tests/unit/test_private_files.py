"""Files moe-stack writes or mounts stay as private as their owner wants: compose files follow the
umask, an API key file needs only the engine's group, and the hugepage helper never writes through a
planted link or where it shouldn't (security review, low items)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from builder.engines.base import StackSpec
from builder.errors import StackError
from builder.files import write_file_atomically
from tests.specs import compose_dict

ROOT = Path(__file__).resolve().parents[2]


def test_written_files_follow_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        path = write_file_atomically(tmp_path / "compose.yaml", "services: {}\n")
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o600


def _stack(tmp_path: Path, key: Path) -> StackSpec:
    model = tmp_path / "models" / "m.gguf"
    model.parent.mkdir(mode=0o755)
    model.write_bytes(b"GGUF")
    model.chmod(0o644)
    return StackSpec(
        project_name="p", engine="llama.cpp", image_ref="img:1", model=model, cpu_threads=2, api_key_file=key
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="chgrp to the engine's gid needs root")
def test_api_key_readable_by_the_engines_group_only(tmp_path: Path) -> None:
    key = tmp_path / "api.key"
    key.write_text("s3cret\n")
    key.chmod(0o600)
    stack = _stack(tmp_path, key)
    with pytest.raises(StackError, match=r"chgrp 10001 .*api\.key && chmod 0640"):
        compose_dict(stack, "x")
    os.chown(key, 0, 10001)
    key.chmod(0o640)
    document = compose_dict(stack, "x")  # group-readable, not world-readable: accepted
    assert document["secrets"]["moe-stack-api-key"]["file"] == str(key)


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs a C compiler")
def test_hugecopy_creates_nothing_off_hugetlbfs(tmp_path: Path) -> None:
    helper = tmp_path / "moe-stack-hugecopy"
    subprocess.run(
        [
            "gcc",
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-o",
            str(helper),
            str(ROOT / "dockerfiles/common/moe-stack-hugecopy.c"),
        ],
        check=True,
    )
    source = tmp_path / "m.gguf"
    source.write_bytes(b"GGUF")
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    planted = tmp_path / "dst.gguf"
    planted.symlink_to(victim)
    result = subprocess.run(
        [str(helper), str(source), str(planted)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 1 and "is not on a hugetlbfs mount" in result.stderr
    assert planted.is_symlink() and victim.read_text() == "keep me", "nothing unlinked, nothing written"
    result = subprocess.run(
        [str(helper), str(source), str(tmp_path / "new.gguf")], capture_output=True, text=True, check=False
    )
    assert result.returncode == 1 and not (tmp_path / "new.gguf").exists()
