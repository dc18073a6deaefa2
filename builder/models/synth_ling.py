"""inclusionAI's Ling family as random-weight GGUFs write it, at real widths by default.

- bailingmoe2 (Ling-1T and Ring-1T; Ling-flash-2.0 and Ling-mini-2.0 are the same architecture, smaller):
  GLM-4.x's FFN (dense leading layers, one shared expert of the routed experts' width, sigmoid routing with
  an expert bias, weights normalised then scaled by 2.5) under one fused q/k/v projection without biases,
  per-head q/k norms, rotary on half of each head; the experts routed within groups. Both pinned engines
  load it (mainline's src/models/bailingmoe2.cpp, ik_llama.cpp's llama-load-tensors.cpp); ik_llama.cpp
  requires the group keys and applies the groups only when told to (-ger), mainline always. The published
  Ling-1T GGUF carries no MTP block, and neither engine drafts with one for this architecture.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import gguf

from builder.models.synth_families import Glm4MoeShape
from builder.models.synth_shapes import MoeShape, Tensor, check_expert_groups, dense_or_shared_moe


@dataclass(frozen=True)
class BailingMoe2Shape(Glm4MoeShape):
    arch: ClassVar[str] = "bailingmoe2"
    nextn_layers: int = 0
    expert_groups: int = 4  # expert_group_count (n_group): ik_llama.cpp requires the key, 0 included
    groups_used: int = 2  # expert_group_used_count (topk_group)
    rope_base: float = 600_000.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.nextn_layers or self.shared_experts != 1 or not self.qk_norm:
            # Both loaders multiply expert_shared_feed_forward_length by the shared count again while the
            # converter writes the total width (mainline's src/models/bailingmoe2.cpp, ik's
            # llama-load-tensors.cpp): every Ling 2.0 model has one, and none a NextN block in its GGUF.
            raise ValueError("bailingmoe2 takes one shared expert, q/k norms and no NextN layer")
        check_expert_groups(self, self.expert_groups, self.groups_used)

    def metadata(self, writer: gguf.GGUFWriter) -> None:
        super().metadata(writer)
        arch = self.arch
        writer.add_uint32(f"{arch}.expert_shared_feed_forward_length", self.expert_ffn)
        writer.add_uint32(f"{arch}.expert_group_count", self.expert_groups)
        writer.add_uint32(f"{arch}.expert_group_used_count", self.groups_used)

    def layer(self, i: int) -> Iterator[Tensor]:
        p, h = f"blk.{i}", self.hidden
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        yield f"{p}.attn_norm.weight", (h,), "norm"
        yield f"{p}.attn_qkv.weight", (h, q + 2 * kv), "quant"
        yield f"{p}.attn_output.weight", (q, h), "quant"
        yield f"{p}.attn_q_norm.weight", (self.head_dim,), "norm"
        yield f"{p}.attn_k_norm.weight", (self.head_dim,), "norm"
        yield f"{p}.ffn_norm.weight", (h,), "norm"
        yield from dense_or_shared_moe(self, i, self.dense_layers, self.dense_ffn, self.shared_experts)


# Ling-1T (Ring-1T the same widths): the header of the published GGUF (ubergarm/Ling-1T-GGUF, written by
# mainline's converter from its config.json, quoted in ik_llama.cpp PR #838): 80 layers (4 dense of 18432),
# 64 query / 8 KV heads of 128, 256 experts of 2048 and one shared of 2048, top-8 in 4 of 8 groups, rope
# theta 600000, context 32768 (128k with YaRN x4, which the GGUF doesn't say), vocabulary 157184; 999.7B
# parameters, 51.1B active.
LING_1T = BailingMoe2Shape(
    layers=80,
    hidden=8192,
    heads=64,
    kv_heads=8,
    head_dim=128,
    expert_ffn=2048,
    experts=256,
    experts_used=8,
    context=32768,
    quant="Q4_0",
    vocab=157184,
    dense_layers=4,
    dense_ffn=18432,
    expert_groups=8,
    groups_used=4,
)
LING_SHAPES: dict[str, MoeShape] = {"bailingmoe2": LING_1T}
# One dense layer and two MoE layers, routed in 2 of 4 groups.
LING_TINY_SHAPES: dict[str, MoeShape] = {"bailingmoe2": BailingMoe2Shape(layers=3, context=LING_1T.context)}
