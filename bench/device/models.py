"""Write the two synthetic MoE GGUFs the device benchmarks use and print what a decoded token reads.

Shapes are the real models' (Qwen3-30B-A3B: hidden 2048, expert FFN 768, 128 experts, 8 used, 48
layers; Qwen3-235B-A22B: hidden 4096, expert FFN 1536, 128 experts, 8 used, here an 8-layer slice),
weights random Q4_0: speed depends on shapes and bytes, not on the values.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from builder.models.synth_catalog import synth_shape
from builder.models.synth_moe import MoeShape, write_moe_gguf

SHAPES = {
    "a3b": MoeShape(
        layers=48,
        hidden=2048,
        heads=32,
        kv_heads=4,
        head_dim=128,
        expert_ffn=768,
        experts=128,
        experts_used=8,
        quant="Q4_0",
    ),
    # Qwen3-235B-A22B's widths (synth_shapes), 8 layers, at the writer's default context.
    "q235b": synth_shape("qwen3moe", layers=8, context=4096),
}


def active_expert_bytes(path: Path, shape: MoeShape) -> int:
    """Routed-expert bytes one decoded token reads: experts_used of experts, every layer."""
    del path  # Q4_0: 18 bytes per 32 weights; gate, up and down of each used expert, every layer
    return shape.layers * shape.experts_used * 3 * shape.hidden * shape.expert_ffn * 18 // 32


def main(a3b: str, q235b: str) -> None:
    for name, target in (("a3b", a3b), ("q235b", q235b)):
        path = write_moe_gguf(Path(target), SHAPES[name])
        print(
            json.dumps(
                {
                    "model": name,
                    "path": str(path),
                    "bytes": path.stat().st_size,
                    "active_expert_bytes_per_token": active_expert_bytes(path, SHAPES[name]),
                }
            )
        )


if __name__ == "__main__":
    main(*sys.argv[1:3])
