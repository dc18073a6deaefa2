"""Presets translate per engine; the example stacks in compose/ are what the presets give today.

After an intended change: MOE_STACK_UPDATE_GOLDEN=1 pytest tests/unit/test_presets.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from builder.errors import SpecError
from builder.files import write_file_atomically
from builder.spec import EXPERTS_ON_CPU_RULE, EngineOptions
from builder.stacks.presets import example_stacks, get_preset, load_presets

COMPOSE = Path(__file__).resolve().parents[2] / "compose"


def test_seed_presets() -> None:
    assert set(load_presets()) == {"deepseek-r1-671b", "qwen3-235b-a22b", "qwen3-next-80b-a3b"}
    r1 = get_preset("deepseek-r1-671b")
    assert r1.engine_options("ik_llama.cpp") == EngineOptions(
        ctx_size=32768,
        cache_type="q8_0",
        gpu_layers=99,
        flash_attention="on",
        mla=3,
        fused_moe=True,
        moe_offload_batch=1,
        temperature=0.6,
        top_p=0.95,
        batch_size=2048,
        ubatch_size=2048,
    )
    assert r1.override_rules("ik_llama.cpp") == (EXPERTS_ON_CPU_RULE,)
    mainline = r1.engine_options("llama.cpp")
    assert mainline.mla is None and mainline.moe_offload_batch is None and mainline.ctx_size == 32768
    with pytest.raises(SpecError, match="unknown preset 'r2'"):
        get_preset("r2")


def test_example_stacks_are_current() -> None:
    files = example_stacks()
    if os.environ.get("MOE_STACK_UPDATE_GOLDEN") == "1":
        for name, text in files.items():
            write_file_atomically(COMPOSE / name, text)
    on_disk = {p.name for p in COMPOSE.glob("*.*.yaml")}
    assert on_disk == set(files), (
        "compose/ examples differ from the presets: re-run with MOE_STACK_UPDATE_GOLDEN=1"
    )
    for name, text in files.items():
        assert (COMPOSE / name).read_text() == text, (
            f"compose/{name} is stale: re-run with MOE_STACK_UPDATE_GOLDEN=1"
        )
    r1 = files["deepseek-r1-671b.ik_llama.cpp.yaml"]
    assert "- -mla\n    - '3'" in r1 and "-fmoe" not in r1 and "cpuset: 0-31" in r1 and "driver: nvidia" in r1
    assert r1.count("offload-batch-size=1") == 1, (
        "the GPU service only: the cpu profile has no GPU to offload to"
    )
