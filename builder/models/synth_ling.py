"""inclusionAI's Ling family as random-weight GGUFs write it, at real widths by default.

- bailingmoe2 (Ling-1T and Ring-1T; Ling-flash-2.0 and Ling-mini-2.0 are the same architecture, smaller):
  GLM-4.x's FFN (dense leading layers, one shared expert of the routed experts' width, sigmoid routing with
  an expert bias, weights normalised then scaled by 2.5) under one fused q/k/v projection without biases,
  per-head q/k norms, rotary on half of each head; the experts routed within groups. Both pinned engines
  load it (mainline's src/models/bailingmoe2.cpp, ik_llama.cpp's llama-load-tensors.cpp); ik_llama.cpp
  requires the group keys and applies the groups only when told to (-ger), mainline always. The published
  Ling-1T GGUF carries no MTP block, and neither engine drafts with one for this architecture.
- bailingmoe3 (Ling-3.0 and Ring-3.0; mainline only: ik_llama.cpp at its pin has no such architecture): a
  Kimi Delta Attention hybrid (synth_delta.py) whose last layer of each group of `layer_group` is gated MLA
  (a sigmoid gate per head on its output), as are a trailing partial group and the MTP block; KDA's decay
  and output gate full-rank; DeepSeek's FFN routed in groups. Mainline creates the MTP block's weights
  TENSOR_SKIP unless it drafts with them but caches that layer's latent either way (src/models/bailingmoe3.cpp
  at 0c1e57098). The per-layer SwiGLU clamps of the real models are left out: they change no size.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import gguf

from builder.models.synth_delta import KdaHybridShape
from builder.models.synth_families import Glm4MoeShape
from builder.models.synth_shapes import MoeShape, Tensor, dense_or_shared_moe


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


@dataclass(frozen=True)
class BailingMoe3Shape(KdaHybridShape):
    arch: ClassVar[str] = "bailingmoe3"
    nextn_head_norm: ClassVar[str] = "layer_output_norm"
    heads: int = 4
    q_lora: int = 0  # Ling-3.0-flash has none (a plain attn_q); Ling-3.0-tiny 256
    layer_group: int = 4  # layer_group_size: the last layer of each group is MLA
    expert_groups: int = 4
    groups_used: int = 2
    mtp_layers: int = 1
    rope_base: float = 6_000_000.0

    def __post_init__(self) -> None:
        if self.layer_group < 2:
            raise ValueError("bailingmoe3's layer_group must be 2 or more (one MLA layer in each)")
        super().__post_init__()

    def is_mla(self, i: int) -> bool:
        """The converter's full-attention layers: each group's last, a trailing partial group, the MTP
        block."""
        group = self.layer_group
        return i >= self.layers or (i + 1) % group == 0 or i >= self.layers // group * group

    def metadata(self, writer: gguf.GGUFWriter) -> None:
        super().metadata(writer)
        writer.add_uint32(
            f"{self.arch}.expert_shared_feed_forward_length", self.expert_ffn * self.shared_experts
        )

    def layer(self, i: int) -> Iterator[Tensor]:
        p, h = f"blk.{i}", self.hidden
        inner = self.heads * self.kda_head_dim
        yield f"{p}.attn_norm.weight", (h,), "norm"
        if self.is_mla(i):
            yield from self.mla_attention(p)
            yield f"{p}.attn_gate.weight", (h, self.heads), "f32"  # a gate per head: too narrow to quantize
        else:
            yield from self.kda_convolutions(p)
            yield f"{p}.ssm_f_a.weight", (h, inner), "quant"
            yield f"{p}.ssm_beta.weight", (h, self.heads), "f32"
            yield f"{p}.ssm_a", (1, self.heads), "norm"  # stored as exp(A_log): positive
            yield f"{p}.ssm_dt.bias", (inner,), "f32"
            yield f"{p}.ssm_g_a.weight", (h, inner), "quant"
            yield f"{p}.ssm_norm.weight", (self.kda_head_dim,), "norm"
            yield f"{p}.attn_output.weight", (inner, h), "quant"
        yield f"{p}.ffn_norm.weight", (h,), "norm"
        trunk = i < self.layers  # the MTP block is MoE whatever dense_layers says
        yield from dense_or_shared_moe(
            self, i, self.dense_layers if trunk else 0, self.dense_ffn, self.shared_experts
        )


# Ling-1T (Ring-1T the same widths): the header of the published GGUF (ubergarm/Ling-1T-GGUF, written by
# mainline's converter from its config.json, quoted in ik_llama.cpp PR #838): 80 layers (4 dense of 18432),
# 64 query / 8 KV heads of 128, 256 experts of 2048 and one shared of 2048, top-8 in 4 of 8 groups, rope
# theta 600000, context 32768 (128k with YaRN x4, which the GGUF doesn't say), vocabulary 157184; 999.7B
# parameters, 51.1B active.
# fmt: off
LING_1T = BailingMoe2Shape(
    layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, expert_ffn=2048, experts=256, experts_used=8,
    context=32768, quant="Q4_0", vocab=157184, dense_layers=4, dense_ffn=18432, expert_groups=8,
    groups_used=4,
)
# fmt: on
# Ling-3.0-flash (Ring-3.0-flash the same widths): 42 layers (groups of 6: 35 KDA, 7 MLA) and one MTP block,
# hidden 2560, 32 heads (KDA heads of 128, a 4-tap convolution; MLA without a q latent, kv_lora 512, 128 + 64
# rope, value 128), 2 dense layers of 6144, then 512 experts of 768 and one shared, top-8 in 4 of 8 groups,
# rope theta 6e6, vocabulary 157184, context 262144 (a config another engine's tests carry, checked against
# a Flash-VL GGUF's description; 124.4B parameters, 5.1B active, 127.5B with the MTP block: the card's 127B).
# fmt: off
LING_3_FLASH = BailingMoe3Shape(
    layers=42, hidden=2560, heads=32, expert_ffn=768, experts=512, experts_used=8, context=262144,
    quant="Q4_0", vocab=157184, layer_group=6, dense_layers=2, dense_ffn=6144, expert_groups=8, groups_used=4,
)
# fmt: on

LING_SHAPES: dict[str, MoeShape] = {"bailingmoe2": LING_1T, "bailingmoe3": LING_3_FLASH}
LING_TINY_SHAPES: dict[str, MoeShape] = {
    # One dense layer and two MoE layers, routed in 2 of 4 groups.
    "bailingmoe2": BailingMoe2Shape(layers=3, context=LING_1T.context),
    # Layers 0-2 KDA (0 dense), 3 MLA, and the MTP block: each kind of layer.
    "bailingmoe3": BailingMoe3Shape(layers=4, context=LING_3_FLASH.context),
}
