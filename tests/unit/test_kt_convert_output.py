"""kt-convert takes the converter's output back as another party's (security review, third round, item
1): the container ran as the image's user (for root) and may leave links, hard links, devices, FIFOs
or world-writable files in the staging directory. What a hostile converter could leave is made here
by hand, and the step after the container (`finish_conversion`) runs on it as it would after Docker."""

from __future__ import annotations

import json
import os
import resource
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from builder.contract import IMAGE_UID
from builder.errors import ModelError, MoeStackError
from builder.files import write_file_atomically
from builder.host.probe import probe
from builder.models.kt_weights import INDEX, RECORD, read_checkpoint, read_converted
from builder.models.synth_hf import write_hf_checkpoint
from builder.models.synth_shapes import TINY_SHAPES
from builder.running.kt_convert import CONVERTER, Conversion, finish_conversion, plan_conversion
from tests.hosts import XEON_EMR_FLAGS, fake_host
from tests.kt_layout import write_converted

SHAPE = TINY_SHAPES["qwen3moe"]
MAX_DEPTH = 32  # builder.fd_files.MAX_DEPTH: the directory levels taken
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (device nodes, other owners)")


@pytest.fixture
def plan(tmp_path: Path) -> Conversion:
    checkpoint = write_hf_checkpoint(tmp_path / "Qwen3-tiny", SHAPE)
    source = tmp_path / "ktransformers"
    (source / CONVERTER).parent.mkdir(parents=True)
    (source / CONVERTER).write_text("# kt-kernel's converter\n")
    host = probe(fake_host(tmp_path / "emr", XEON_EMR_FLAGS, 2, 4, 1, 64), nvidia_smi_text="")
    return plan_conversion(read_checkpoint(checkpoint), source, "AMXINT4", host, "kt:img")


@pytest.fixture
def staging(plan: Conversion) -> Path:
    """What an honest converter writes (no record: moe-stack writes that)."""
    return write_converted(
        plan.output.with_name(f".{plan.output.name}.staging"), layers=SHAPE.layers, experts=SHAPE.experts,
        pools=plan.numa_pools, hidden=SHAPE.hidden, ffn=SHAPE.expert_ffn, method=None,
    )  # fmt: skip


@pytest.fixture
def memory_capped() -> Iterator[None]:
    """Reading /dev/zero unbounded (the bug) ends in a MemoryError within 2 GiB, not in the host's swap."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    used = int(Path("/proc/self/statm").read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (used + 2 * 1024**3, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _left_by_container(staging: Path) -> None:
    """As root, the converter runs as the image's user: everything it wrote is that user's."""
    if os.geteuid() == 0:
        for path in [staging, *staging.rglob("*")]:
            os.chown(path, IMAGE_UID, IMAGE_UID, follow_symlinks=False)


def test_an_honest_output_is_recorded_and_made_the_users(plan: Conversion, staging: Path) -> None:
    shard = next(staging.glob("*.safetensors"))
    shard.chmod(0o666)  # world-writable, as the container's umask left it
    (staging / "tokenizer").mkdir(mode=0o777)
    (staging / "tokenizer/vocab.json").write_text("{}")
    (staging / "tokenizer/vocab.json").chmod(0o4777)
    _left_by_container(staging)
    weights = finish_conversion(staging, plan, [])
    assert weights.path == plan.output and weights.numa_pools == plan.numa_pools
    assert json.loads((plan.output / RECORD).read_text())["method"] == "AMXINT4"
    for path in [plan.output, *plan.output.rglob("*")]:
        held = path.lstat()
        assert stat.S_IMODE(held.st_mode) == (0o755 if path.is_dir() else 0o644) or path.name == RECORD, path
        assert (held.st_uid, held.st_gid) == (os.getuid(), os.getgid()), path


@pytest.mark.parametrize("target", ["host.conf", "made/by/root.conf"])
def test_a_record_linked_out_of_the_output_is_refused_and_its_target_untouched(
    plan: Conversion, staging: Path, tmp_path: Path, target: str
) -> None:
    victim = tmp_path / target
    if target == "host.conf":
        victim.write_text("host's own\n")
        victim.chmod(0o600)
    (staging / RECORD).symlink_to(victim)
    _left_by_container(staging)
    with pytest.raises(ModelError, match=f"left '{RECORD}' in its output, a symbolic link; .* --source$"):
        finish_conversion(staging, plan, [])
    assert not (staging / RECORD).is_symlink() and not plan.output.exists()
    if target == "host.conf":
        assert victim.read_text() == "host's own\n" and stat.S_IMODE(victim.stat().st_mode) == 0o600
    else:
        assert not victim.parent.exists()


@pytest.mark.usefixtures("memory_capped")
def test_an_index_linked_to_dev_zero_is_refused_before_it_is_read(plan: Conversion, staging: Path) -> None:
    (staging / INDEX).unlink()
    (staging / INDEX).symlink_to("/dev/zero")
    _left_by_container(staging)
    with pytest.raises(ModelError, match=f"left '{INDEX}' in its output, a symbolic link"):
        finish_conversion(staging, plan, [])
    assert not (staging / INDEX).is_symlink()


@pytest.mark.usefixtures("memory_capped")
def test_an_index_that_is_no_file_or_too_big_is_one_line(tmp_path: Path) -> None:
    """Where a user's directory links its index (a Hugging Face snapshot may), reading still stops at a
    device or at the cap."""
    weights = write_converted(tmp_path / "w")
    (weights / INDEX).unlink()
    (weights / INDEX).symlink_to("/dev/zero")
    with pytest.raises(
        ModelError, match=r"can't be read as an index \(not a regular file but a device node\)"
    ):
        read_converted(weights)
    (weights / INDEX).unlink()
    with (weights / INDEX).open("wb") as index:
        index.truncate(256 * 1024**2 + 1)  # sparse: no disk, but over the cap
    with pytest.raises(ModelError, match=r"index.json can't be read as an index \(over 256 MiB\)"):
        read_converted(weights)


def test_a_hard_linked_file_is_refused_and_its_other_name_untouched(
    plan: Conversion, staging: Path, tmp_path: Path
) -> None:
    host_file = tmp_path / "host.conf"
    host_file.write_text("host's own\n")
    host_file.chmod(0o600)
    os.link(host_file, staging / "extra.safetensors")
    _left_by_container(staging)
    with pytest.raises(ModelError, match="left 'extra.safetensors' in its output, a file with 2 hard links"):
        finish_conversion(staging, plan, [])
    assert not (staging / "extra.safetensors").exists() and not plan.output.exists()
    assert host_file.read_text() == "host's own\n" and stat.S_IMODE(host_file.stat().st_mode) == 0o600


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("fifo", "a FIFO"),
        pytest.param("null", "a device node", marks=ROOT_ONLY),
        (f"{'d/' * (MAX_DEPTH + 1)}deep", f"a directory over {MAX_DEPTH} levels deep"),
    ],
    ids=["fifo", "device", "too-deep"],
)
def test_what_is_no_plain_file_or_directory_is_refused_and_removed(
    plan: Conversion, staging: Path, name: str, kind: str
) -> None:
    path = staging / "tokenizer" / name
    path.parent.mkdir(parents=True)
    if name == "fifo":
        os.mkfifo(path)
    elif name == "null":
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    else:
        path.mkdir(parents=True)
    _left_by_container(staging)
    shown = "tokenizer/" + (name if name in ("fifo", "null") else "d/" * (MAX_DEPTH - 1) + "d")
    with pytest.raises(ModelError, match=f"left '{shown}' in its output, {kind}"):
        finish_conversion(staging, plan, [])
    assert not os.path.lexists(staging / shown) and not plan.output.exists()


def test_the_no_follow_write_refuses_a_link_in_the_files_place(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("kept\n")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "record.json").symlink_to(outside)
    with pytest.raises(
        MoeStackError, match=r"can't write .*record\.json \(a symbolic link is in its place\)"
    ):
        write_file_atomically(theirs / "record.json", "{}\n", no_follow=True)
    assert outside.read_text() == "kept\n" and (theirs / "record.json").is_symlink()
    assert [path.name for path in theirs.iterdir()] == ["record.json"]  # no temp file left
    (theirs / "record.json").unlink()
    (theirs / "record.json").write_text("old\n")  # a plain file there is replaced
    assert write_file_atomically(theirs / "record.json", "{}\n", no_follow=True).read_text() == "{}\n"
