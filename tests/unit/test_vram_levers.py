"""A plan that does not fit names the levers, what each frees and which change is enough."""

from __future__ import annotations

import pytest

from builder.engines import get_engine
from builder.engines.compute_buffers import gpu_reserve
from builder.errors import SpecError
from builder.models.kv_cache import CacheLayout
from builder.models.planner import GIB, VramShortfall, plan
from builder.models.synth_catalog import synth_shape
from builder.models.synth_moe import shape_facts
from builder.stacks.vram_levers import GpuDemand, advice, enough, levers

QWEN3_235B = shape_facts(synth_shape("qwen3moe", quant="Q8_0"))


def _refusal(demand: GpuDemand, vram_gib: int) -> VramShortfall:
    reserve = gpu_reserve(
        demand.engine.buffer_fits, demand.facts, demand.ctx, demand.ubatch, demand.layout.latent
    )
    with pytest.raises(VramShortfall) as refused:
        plan(demand.facts, vram_gib * GIB, 1024 * GIB, demand.ctx, demand.cache_type, gpu_reserve=reserve)
    return refused.value


def test_each_lever_frees_what_the_plan_would_then_need() -> None:
    demand = GpuDemand(get_engine("llama.cpp"), QWEN3_235B, 32768, 2048, "f16", CacheLayout())
    found = {lever.option: lever.saves for lever in levers(demand)}
    assert list(found) == ["-ub 1024", "--ctx-size 16384", "--cache-type q8_0"]  # cheapest first
    for option, saves in found.items():
        assert saves > 0, option
    # a 16k f16 cache is half of the 32k one: halving the context frees at least that half
    assert found["--ctx-size 16384"] >= 0.5 * (
        demand.bytes() - gpu_reserve(get_engine("llama.cpp").buffer_fits, QWEN3_235B, 32768, 2048, False)
    )
    assert levers(GpuDemand(get_engine("llama.cpp"), QWEN3_235B, 4096, 512, "q4_0", CacheLayout())) == []


def test_a_refusal_names_the_change_that_is_enough() -> None:
    demand = GpuDemand(get_engine("llama.cpp"), QWEN3_235B, 32768, 2048, "f16", CacheLayout())
    refused = _refusal(demand, 12)
    least, frees = enough(demand, refused.missing)
    assert frees >= refused.missing and (least.ubatch, least.ctx, least.cache_type) == (512, 8192, "f16")
    text = advice(refused, demand)
    assert (
        "Alone, cheapest first: -ub 1024 frees" in text and "enough: -ub 512 --ctx-size 8192 (frees" in text
    )
    hopeless = _refusal(demand, 4)
    assert "use a larger GPU" in advice(hopeless, demand) and "enough:" not in advice(hopeless, demand)
    assert isinstance(refused, SpecError)  # the command line's one line
