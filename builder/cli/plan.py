"""`moe-stack plan`: VRAM and RAM for a hybrid run of a model, and the -ot rules that place it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from builder.cli.common import out, text_table
from builder.cli.options import declared, given_options, takes_options
from builder.engines import get_engine
from builder.engines.compute_buffers import CUDA_CONTEXT_BYTES, gpu_compute, prefill_pool
from builder.models.planner import GIB, size
from builder.stacks.memory_use import beside_model_bytes, prompt_cache_bytes
from builder.stacks.options import float_list
from builder.stacks.speculative import checked_speculative, draft_vram_bytes
from builder.stacks.vram_levers import GpuDemand, vram_plan


@takes_options()
def plan_memory(
    model: Annotated[
        Path, typer.Argument(help="the GGUF (its header and tensor table are read, not the weights)")
    ],
    vram_gb: Annotated[
        str,
        typer.Option("--vram-gb", help="GPU memory to plan with, GiB; several GPUs: each one's, e.g. 24,24"),
    ] = "24",
    ram_gb: Annotated[float, typer.Option("--ram-gb", help="CPU RAM to plan with, GiB")] = 384.0,
    vram_margin_gb: float = declared(help="VRAM left free on each GPU, GiB (as the engines' fit)"),
    ctx_size: int = declared(32768, help="context length"),
    cache_type: str = declared("q8_0", help="KV cache type (f16, q8_0, q4_0...)"),
    mla: Annotated[
        bool, typer.Option("--mla", help="MLA KV cache (DeepSeek; ik_llama.cpp -mla; mainline always)")
    ] = False,
    engine: str = declared(),
    ubatch_size: int = declared(512, help="the stack's -ub (the presets: 2048)"),
    mmap: bool | None = declared(help="the stack's mmap setting (the engine's default: mapped)"),
    draft_model: Path | None = declared(
        help="the stack's draft model (its weights, KV and buffer on the GPU)"
    ),
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Plan VRAM and RAM for a hybrid run and print the -ot rules (experts on CPU, leftover VRAM filled):
    weights, the KV cache (MLA latent, recurrent state), the engine's measured compute buffer, a draft
    model's share."""
    # The limits of the options a stack shares are the stack's (spec.NeutralOptions), named by flag.
    given = given_options(
        {
            "ctx_size": ctx_size,
            "cache_type": cache_type,
            "ubatch_size": ubatch_size,
            "mmap": mmap,
            "draft_model": draft_model,
        }
    )
    vrams = float_list(vram_gb, "--vram-gb")
    adapter = get_engine(engine)
    model = adapter.check_model(model)
    facts = adapter.model_format.facts(model)
    latent = adapter.caches_latent(3 if mla else None)
    compute = gpu_compute(adapter.name, facts, ctx_size, ubatch_size, latent)
    pool = prefill_pool(adapter.name, facts, ctx_size, ubatch_size, latent)
    draft = draft_vram_bytes(checked_speculative(given, model, adapter), adapter, ctx_size, ubatch_size)
    demand = GpuDemand(adapter.name, facts, ctx_size, ubatch_size, cache_type, latent)
    result = vram_plan(
        demand, [int(v * GIB) for v in vrams], int(ram_gb * GIB), int(vram_margin_gb * GIB), draft
    )
    pinned = adapter.pins_cpu_weights(mmap, gpu=True)
    # Beside the weights in RAM: the engine's host prompt cache (its default; compose --cache-ram sizes
    # it) and its own buffers, as a stack's memory sum counts them (stacks/memory_use.py).
    beside = beside_model_bytes(adapter.name)
    if as_json:
        sys.stdout.write(
            json.dumps(
                {
                    "arch": facts.arch,
                    "layers": facts.layers,
                    "expert_bytes": sum(facts.expert_bytes),
                    "other_bytes": facts.other_bytes,
                    "kv_bytes": result.kv_bytes,
                    "gpu_bytes": result.gpu_bytes,
                    "cpu_bytes": result.cpu_bytes,
                    "gpu_expert_layers": result.gpu_expert_layers,
                    "devices": [
                        {
                            "gpu": d.index,
                            "layers": [d.layers.start, d.layers.stop],
                            "bytes": d.used_bytes,
                            "expert_layers": list(d.expert_layers),
                        }
                        for d in result.devices
                    ],
                    "tensor_split": list(result.tensor_split),
                    "override_tensor": list(result.override_rules),
                    "override_tensor_bytes": [moved for _, moved in result.rule_bytes],
                    "margin_bytes": result.margin_bytes,
                    "compute_bytes": compute.bytes,
                    "prefill_pool_bytes": pool,
                    "draft_bytes": draft,
                    "compute_measured": compute.measured,
                    "cpu_weights": "pinned" if pinned else "mapped",
                    "prompt_cache_bytes": prompt_cache_bytes(adapter.name),
                    "ram_total_bytes": result.cpu_bytes + beside,
                }
            )
            + "\n"
        )
        return
    table = text_table("", "bytes", "where")
    table.add_row("routed experts", size(sum(facts.expert_bytes)), result.experts_where())
    table.add_row("other weights", size(facts.other_bytes), "GPU")
    kind = (
        ", MLA latent"
        if latent and facts.mla_dim
        else ", with recurrent state"
        if facts.recurrent_state_bytes
        else ""
    )
    table.add_row(f"KV cache ({ctx_size} × {cache_type}{kind})", size(result.kv_bytes), "GPU")
    table.add_row(
        f"compute buffer (-ub {ubatch_size}) + CUDA context",
        size(compute.bytes + CUDA_CONTEXT_BYTES),
        compute.basis,
    )
    if pool:
        table.add_row(
            f"prefill's CUDA pool ({ctx_size}-token prompt)",
            size(pool),
            "its growth past load, as measured on the H200 (grows with the prompt on R1 widths)",
        )
    if draft:
        table.add_row(
            f"draft model {draft_model.name if draft_model else ''} (weights, f16 KV, buffer)",
            size(draft),
            "GPU (-ngld 99)",
        )
    table.add_row("total on GPU (with compute reserve)", size(result.gpu_bytes), f"of {sum(vrams):g} GiB")
    table.add_row("kept free (margin)", size(result.margin_bytes * len(vrams)), "--vram-margin-gb, each GPU")
    if len(result.devices) > 1:
        for device in result.devices:
            experts = f", experts of {len(device.expert_layers)}" if device.expert_layers else ""
            table.add_row(
                f"  GPU {device.index}: layers {device.layers.start}-{device.layers.stop - 1}{experts}",
                size(device.used_bytes),
                f"of {device.vram_bytes / GIB:g} GiB",
            )
    table.add_row(
        "weights in RAM",
        size(result.cpu_bytes),
        "pinned (page-locked CUDA_Host buffers)" if pinned else "mapped page cache",
    )
    table.add_row(
        "prompt cache and engine buffers",
        size(beside),
        f"{adapter.name}'s default prompt cache (compose --cache-ram sizes it)",
    )
    table.add_row("total in RAM", size(result.cpu_bytes + beside), f"of {ram_gb:g} GiB")
    out.print(f"{model.name}: {facts.arch}, {facts.layers} layers")
    out.print(table)
    if result.tensor_split:
        out.print(f"-ts {','.join(map(str, result.tensor_split))}", highlight=False)
    for rule, moved in result.rule_bytes:
        out.print(f"-ot '{rule}'   # {size(moved)}", highlight=False)
    if not result.override_rules:
        out.print(f"no -ot rules needed: the whole model fits on the {'GPUs' if len(vrams) > 1 else 'GPU'}")
