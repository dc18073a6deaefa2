"""Presets translate per engine; the example stacks in compose/ are what the presets give today.

After an intended change: MOE_STACK_UPDATE_GOLDEN=1 pytest tests/unit/test_presets.py
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from builder.engines import get_engine
from builder.errors import SpecError
from builder.files import write_file_atomically
from builder.images.recorded_contracts import recorded_contract
from builder.spec import EXPERTS_ON_CPU_RULE, EngineOptions
from builder.stacks.presets import example_stacks, get_preset, load_presets

COMPOSE = Path(__file__).resolve().parents[2] / "compose"


def test_seed_presets() -> None:
    assert set(load_presets()) == {
        *("deepseek-r1-671b", "qwen3-235b-a22b", "qwen3-next-80b-a3b"),  # the seed's
        # the families (../shared/MOE-FAMILIES.md)
        *("glm-4.6", "gpt-oss-120b", "minimax-m2", "kimi-k2", "qwen3.5-397b-a17b", "glm-5"),
        *("deepseek-v4-flash", "deepseek-v3.2", "ling-1t", "ling-3.0-flash", "kimi-k3", "minimax-m3"),
    }
    r1 = get_preset("deepseek-r1-671b")
    assert r1.engine_options(get_engine("ik_llama.cpp")) == EngineOptions(
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
    assert r1.override_rules(get_engine("ik_llama.cpp")) == (EXPERTS_ON_CPU_RULE,)
    mainline = r1.engine_options(get_engine("llama.cpp"))
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


def test_a_preset_needs_no_nulls_each_engine_takes_what_it_honours() -> None:
    """compose/presets.yaml says what each model wants once; an engine takes the options it reads and
    leaves the rest (KTransformers no cache type, layer count or batch), with no `null` to undo them."""
    lines = [line.split("#", 1)[0] for line in (COMPOSE / "presets.yaml").read_text().splitlines()]
    assert not any(re.search(r":\s*null\b", line) for line in lines)
    for preset in load_presets().values():
        for engine in preset.engines:
            given = preset.engine_options(get_engine(engine)).model_dump(exclude_unset=True)
            assert set(given) <= get_engine(engine).honours, (preset.name, engine, set(given))
    kt = get_preset("qwen3-235b-a22b").engine_options(get_engine("ktransformers"))
    assert kt.cache_type is None and kt.gpu_layers is None and kt.ctx_size == 16384


@pytest.mark.parametrize(
    ("name", "arch", "sampling"),
    [
        ("deepseek-v4-flash", "deepseek4", (1.0, 1.0)),
        ("deepseek-v3.2", "deepseek32", (1.0, 0.95)),
        ("ling-3.0-flash", "bailingmoe3", (0.7, 0.9)),
        ("kimi-k3", "kimi-k3", (1.0, 0.95)),
        ("minimax-m3", "minimax-m3", (1.0, 0.95)),
    ],
)
def test_a_preset_for_one_engine_names_why_the_others_cant_serve_it(
    name: str, arch: str, sampling: tuple[float, float]
) -> None:
    """The families mainline loaded first: served by ik_llama.cpp where its pinned tree names the
    architecture (its recorded contract: DeepSeek-V4 and Ling-3 since 8337e4c) and its adapter takes the
    files (not MiniMax-M3's, whose indexer tensors ik's loader refuses), else refused in one line naming
    that tree; KTransformers refused with the reason, and the card's sampling is the preset's."""
    preset = get_preset(name)
    ik = get_engine("ik_llama.cpp")
    contract = recorded_contract(ik)
    assert contract is not None
    loads = arch in contract.architectures and arch not in ik.refused_architectures
    assert list(preset.engines) == (["ik_llama.cpp", "llama.cpp"] if loads else ["llama.cpp"])
    assert preset.architecture == arch
    options = preset.engine_options(get_engine("llama.cpp"))
    assert (options.temperature, options.top_p, options.cache_type) == (*sampling, "q8_0")
    if loads:
        assert preset.engine_options(ik).moe_offload_batch == 1
    else:
        # the tree whose contract is recorded (a pin bump moves the pin first, the record once it is built)
        tree = rf"its pinned tree \({contract.ref[:7]}\)"
        refused = rf"ik_llama.cpp can't serve it \({tree} (has no|names) {arch} "
        with pytest.raises(SpecError, match=refused):
            preset.engine_options(ik)
    others = rf"^preset {name}: \S+ can't serve it \(.+\); use --engine {' or '.join(preset.engines)}$"
    for engine in ("ktransformers", "ktransformers-legacy"):
        with pytest.raises(SpecError, match=others):
            preset.engine_options(get_engine(engine))
