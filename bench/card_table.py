"""What each preset gets on a 24, 32, 48 and 80 GB card, by moe-stack's own plan: the full models' shapes
(every preset's architecture as synth-moe writes it) with 4-bit routed experts and Q8_0 attention
(the usual hybrid quants), each llama.cpp engine's measured compute buffers, the preset's context,
cache type and micro-batch, the 1 GiB margin. A card the preset does not fit gets the change that does.

    python bench/card_table.py [--cards 24,32,48,80] > table.md
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from builder.engines import Engine, get_engine
from builder.engines.compute_buffers import gpu_reserve
from builder.models.facts import ModelFacts
from builder.models.kv_cache import DEFAULT_UBATCH
from builder.models.planner import GIB, VramShortfall, plan, size
from builder.models.synth_moe import shape_facts
from builder.stacks.presets import Preset, load_presets
from builder.stacks.vram_levers import GpuDemand, enough

PRESETS = list(load_presets().values())
ENGINES = (get_engine("ik_llama.cpp"), get_engine("llama.cpp"))


def hybrid_quant_facts(preset: Preset) -> ModelFacts:
    """The preset's model at 4-bit (Q4_0-sized) routed experts, everything else Q8_0-sized: bytes as the
    usual hybrid GGUFs."""
    experts, rest = shape_facts(preset.model_shape()), shape_facts(preset.model_shape("Q8_0"))
    return replace(
        experts,
        other_bytes=rest.other_bytes,
        embedding_bytes=rest.embedding_bytes,
        nextn_other_bytes=rest.nextn_other_bytes,
    )


def cell(preset: Preset, adapter: Engine, facts: ModelFacts, card_gib: int) -> str:
    """One card's outcome: the experts it takes, or the change that makes the preset fit."""
    options = preset.engine_options(adapter)
    facts = adapter.loaded_facts(facts, options.mtp)
    demand = GpuDemand(
        adapter,
        facts,
        options.ctx_size,
        options.ubatch_size or DEFAULT_UBATCH,
        options.cache_type or "f16",
        adapter.cache_layout(options.mla),
    )
    reserve = gpu_reserve(adapter.buffer_fits, facts, demand.ctx, demand.ubatch, demand.layout.latent)
    try:
        vram, ram = card_gib * GIB, 4096 * GIB
        fitted = plan(
            facts, vram, ram, demand.ctx, demand.cache_type, demand.layout, reserve, ubatch=demand.ubatch
        )
    except VramShortfall as shortfall:
        least, frees = enough(demand, shortfall.missing)
        if frees < shortfall.missing:
            return f"no: {size(shortfall.missing)} short even at -ub 512, 4k context, q4_0"
        changes = [f"-ub {least.ubatch}"] if least.ubatch != demand.ubatch else []
        changes += [f"-c {least.ctx}"] if least.ctx != demand.ctx else []
        changes += [f"{least.cache_type} cache"] if least.cache_type != demand.cache_type else []
        return f"with {', '.join(changes)}"
    on_gpu = sum(facts.expert_bytes[i] for d in fitted.devices for i in d.expert_layers)
    experts = f", experts of {fitted.gpu_expert_layers} layers ({size(on_gpu)})" if on_gpu else ""
    return f"{size(fitted.gpu_bytes)}{experts}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cards", default="24,32,48,80", help="card sizes, GiB")
    cards = [int(c) for c in parser.parse_args().cards.split(",")]
    print("| preset (context, -ub) | engine | " + " | ".join(f"{c} GB card" for c in cards) + " |")
    print("|---|---|" + "---|" * len(cards))
    for preset in PRESETS:
        facts = hybrid_quant_facts(preset)
        for engine in (engine for engine in ENGINES if engine.name in preset.engines):
            options = preset.engine_options(engine)
            name = f"{preset.name} ({options.ctx_size // 1024}k, {options.ubatch_size or DEFAULT_UBATCH})"
            row = [cell(preset, engine, facts, card) for card in cards]
            print(f"| {name} | {engine} | " + " | ".join(row) + " |")
    print(
        "\nGPU total (weights but token embeddings, KV cache, compute buffer, CUDA context, prefill's pool) "
        "and the routed experts the spare VRAM takes, layer by layer; 1 GiB of each card kept free. "
        "Routed experts in all: "
        + ", ".join(f"{p.name} {size(sum(hybrid_quant_facts(p).expert_bytes))}" for p in PRESETS)
        + "."
    )


if __name__ == "__main__":
    main()
