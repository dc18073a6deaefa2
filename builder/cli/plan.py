"""`moe-stack plan`: VRAM and RAM for a hybrid run of a model, and the -ot rules that place it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from builder.cli.common import out, text_table
from builder.cli.options import declared, given_options, takes_options
from builder.engines import Engine
from builder.stacks.memory_report import MemoryAsk, memory_report
from builder.stacks.options import float_list


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
    engine: Engine = declared(),
    ubatch_size: int = declared(512, help="the stack's -ub (the presets: 2048)"),
    mmap: bool | None = declared(help="the stack's mmap setting (the engine's default: mapped)"),
    draft_model: Path | None = declared(
        help="the stack's draft model (its weights, KV and buffer on the GPU)"
    ),
    mmproj: Path | None = declared(help="the stack's vision projector (its weights and buffer on the GPU)"),
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Plan VRAM and RAM for a hybrid run and print the -ot rules (experts on CPU, leftover VRAM filled):
    weights, the KV cache (MLA latent, recurrent state), the engine's measured compute buffer, a draft
    model's and a vision projector's share."""
    # The limits of the options a stack shares are the stack's (spec.NeutralOptions), named by flag.
    given = {"ctx_size": ctx_size, "cache_type": cache_type, "ubatch_size": ubatch_size}
    options = given_options(given | {"mmap": mmap, "draft_model": draft_model, "mmproj": mmproj})
    vrams = float_list(vram_gb, "--vram-gb")
    ask = MemoryAsk(vrams, ram_gb, vram_margin_gb, ctx_size, cache_type, mla, ubatch_size, mmap, options)
    report = memory_report(engine, engine.open_model(model), ask)
    if as_json:
        sys.stdout.write(json.dumps(report.as_json()) + "\n")
        return
    table = text_table("", "bytes", "where")
    for row in (*report.gpu_rows(), *report.total_rows()):
        table.add_row(*row)
    out.print(f"{report.model.name}: {report.facts.arch}, {report.facts.layers} layers")
    out.print(table)
    for line in report.flags():
        out.print(line, highlight=False)
    if not report.plan.override_rules:
        out.print(f"no -ot rules needed: the whole model fits on the {'GPUs' if len(vrams) > 1 else 'GPU'}")
