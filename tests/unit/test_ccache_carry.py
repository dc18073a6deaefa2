"""`build --ccache-dir`: the two side builds that carry the compile cache in and out of the cache mount,
as values (the round trip through a real builder: tests/integration/test_publish_workflow.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.errors import SpecError
from builder.images.build import BuildPlan, build_image, plan_build
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
    return plan_build(image_spec("llama.cpp", "avx2"), tmp_path / "ctx", tmp_path / "tree")


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
    dockerfile = render_files(image_spec("ik_llama.cpp", "zen4"))["Dockerfile"]
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
    spec = image_spec("ktransformers", "avx2")
    with pytest.raises(SpecError, match="compiles nothing through ccache: drop --ccache-dir"):
        build_image(spec, None, print, ccache_dir=tmp_path)
