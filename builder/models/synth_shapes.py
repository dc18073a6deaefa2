"""The shapes of the seed's three MoE architectures, as random-weight GGUFs write them: each shape's
metadata keys and tensor table in the layout current converters write (llama.cpp's
convert_hf_to_gguf.py, which both engines load), real per-layer and per-expert widths by default.

- qwen3moe (Qwen3-235B-A22B): grouped-query attention with q/k norms, a router, routed experts.
- deepseek2 (DeepSeek-R1-671B): MLA in mainline's form (attn_q_a/q_b, attn_kv_a_mqa, attn_k_b/v_b per
  head, head_count_kv 1, key/value_length 576/512 and their *_mla 192/128), three dense leading layers,
  one shared expert, sigmoid routing with an expert bias and 8 expert groups (ik_llama.cpp ignores the
  groups and routes plain top-k; mainline applies them).
- qwen3next (Qwen3-Next-80B-A3B): three gated-delta-net (recurrent) layers to one gated full-attention
  layer, 512 routed experts plus a gated shared expert.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import ClassVar, Literal

import gguf

QUANTS = {"Q8_0": gguf.GGMLQuantizationType.Q8_0, "Q4_0": gguf.GGMLQuantizationType.Q4_0}
# A tensor of the table: its name, its ne (ggml's order: row length first) and what fills it:
# "quant" (random blocks), "head" (the output matrix), "norm" (F32 ones), "f32" (small F32 values),
# "decay" (F32, negative: the recurrent layers' A), "conv" (F32 convolution taps), "expert-ids" (I32
# expert numbers: deepseek4's token-to-expert table).
Tensor = tuple[str, tuple[int, ...], str]
MIN_VOCAB = 512  # room for the byte-level vocabulary synth_moe writes before any padding


@dataclass(frozen=True)
class MoeShape:
    """qwen3moe: the fields every architecture has (the defaults: a tiny model for tests)."""

    arch: ClassVar[str] = "qwen3moe"
    # A NextN (MTP) block's last norm, as the converter names it (Ling-3's is its layer_output_norm).
    nextn_head_norm: ClassVar[str] = "nextn.shared_head_norm"
    layers: int = 4
    hidden: int = 256
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    expert_ffn: int = 128
    experts: int = 8
    experts_used: int = 2
    context: int = 4096
    quant: str = "Q8_0"
    rope_base: float = 1_000_000.0
    # The vocabulary's size: 0 is the byte-level one synth_moe writes (a few hundred tokens); more pads it
    # with unused tokens to a real model's width (Qwen3's 151936, R1's 129280), so the embeddings, the
    # output head and the compute buffer's output stage have their real sizes.
    vocab: int = 0
    # Routing within groups of experts (expert_group_count and _used_count; 0: plain top-k).
    expert_groups: int = 0
    groups_used: int = 0
    # The sparse-attention indexer's key width a token caches per layer (glm-dsa and its kin; 0: none).
    indexer_key: int = 0

    def __post_init__(self) -> None:
        if self.quant not in QUANTS:
            raise ValueError(f"quant must be one of {', '.join(QUANTS)}")
        for name in ("hidden", "expert_ffn"):
            if getattr(self, name) % 32:
                raise ValueError(f"{name} must be a multiple of 32 (the quant block size)")
        if self.heads * self.head_dim % 32 or self.experts_used > self.experts:
            raise ValueError("heads*head_dim must be a multiple of 32 and experts_used <= experts")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.vocab and self.vocab < MIN_VOCAB:
            raise ValueError(f"vocab must be 0 (the byte-level vocabulary) or at least {MIN_VOCAB}")
        # Mainline asserts these for more than one group (llama-model.cpp).
        if self.expert_groups and (
            self.experts % self.expert_groups
            or not 0 < self.groups_used < max(2, self.expert_groups)
            or self.experts_used > self.groups_used * self.experts // self.expert_groups
        ):
            raise ValueError(
                "experts must divide into expert_groups, 0 < groups_used < expert_groups, and the groups "
                "used must hold experts_used experts"
            )

    @property
    def dense_width(self) -> int:
        """feed_forward_length: a dense FFN's width (no layer has one here: the experts')."""
        return self.expert_ffn

    @property
    def kv_head_counts(self) -> int | list[int]:
        """attention.head_count_kv: one count, or one a layer (0 where a layer caches nothing)."""
        return self.kv_heads

    @property
    def cached_lengths(self) -> tuple[int, int]:
        """key_length and value_length: per KV head, what the cache holds."""
        return self.head_dim, self.head_dim

    @property
    def blocks(self) -> int:
        """block_count: the layers, and the multi-token-prediction layers after them."""
        return self.layers

    def metadata(self, writer: gguf.GGUFWriter) -> None:
        """The architecture's keys beyond the vocabulary."""
        writer.add_block_count(self.blocks)
        writer.add_context_length(self.context)
        writer.add_embedding_length(self.hidden)
        writer.add_feed_forward_length(self.dense_width)
        writer.add_expert_feed_forward_length(self.expert_ffn)
        writer.add_head_count(self.heads)
        writer.add_head_count_kv(self.kv_head_counts)
        writer.add_key_length(self.cached_lengths[0])
        writer.add_value_length(self.cached_lengths[1])
        writer.add_layer_norm_rms_eps(1e-6)
        writer.add_rope_freq_base(self.rope_base)
        writer.add_expert_count(self.experts)
        writer.add_expert_used_count(self.experts_used)

    def tensors(self, n_vocab: int) -> Iterator[Tensor]:
        h = self.hidden
        yield "token_embd.weight", (h, n_vocab), "quant"
        for i in range(self.layers):
            yield from self.layer(i)
        yield "output_norm.weight", (h,), "norm"
        yield "output.weight", (h, n_vocab), "head"
        yield from nextn_blocks(self)

    def layer(self, i: int) -> Iterator[Tensor]:
        p, h = f"blk.{i}", self.hidden
        yield f"{p}.attn_norm.weight", (h,), "norm"
        yield from self.gqa_attention(p)
        yield f"{p}.ffn_norm.weight", (h,), "norm"
        yield from self.routed_experts(i)

    def gqa_attention(
        self, p: str, gated: bool = False, bias: bool = False, norms: Literal["head", "whole", ""] = "head"
    ) -> Iterator[Tensor]:
        """Grouped-query attention's projections in layer `p` (`gated`: the query projection twice as wide,
        the query and its output gate; `bias`: q, k and v biased), with a q and a k norm a head, over the
        whole projection, or none."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        yield f"{p}.attn_q.weight", (h, 2 * q if gated else q), "quant"
        yield f"{p}.attn_k.weight", (h, kv), "quant"
        yield f"{p}.attn_v.weight", (h, kv), "quant"
        if bias:
            yield f"{p}.attn_q.bias", (q,), "f32"
            yield f"{p}.attn_k.bias", (kv,), "f32"
            yield f"{p}.attn_v.bias", (kv,), "f32"
        yield f"{p}.attn_output.weight", (q, h), "quant"
        if norms:
            yield f"{p}.attn_q_norm.weight", (q if norms == "whole" else self.head_dim,), "norm"
            yield f"{p}.attn_k_norm.weight", (kv if norms == "whole" else self.head_dim,), "norm"

    def routed_experts(self, i: int) -> Iterator[Tensor]:
        p, h = f"blk.{i}", self.hidden
        yield f"{p}.ffn_gate_inp.weight", (h, self.experts), "f32"
        yield f"{p}.ffn_gate_exps.weight", (h, self.expert_ffn, self.experts), "quant"
        yield f"{p}.ffn_up_exps.weight", (h, self.expert_ffn, self.experts), "quant"
        yield f"{p}.ffn_down_exps.weight", (self.expert_ffn, h, self.experts), "quant"


@dataclass(frozen=True)
class DeepSeek2Shape(MoeShape):
    """deepseek2 with MLA as mainline's converter writes it. ik_llama.cpp converts that form only for
    kv_lora_rank 512, 64 rope dims and a head count divisible by 4 (llama-hparams.cpp), so those hold."""

    arch: ClassVar[str] = "deepseek2"
    heads: int = 8
    kv_heads: int = 1
    head_dim: int = 192  # the query/key head: 128 without rope + 64 with it
    v_head_dim: int = 128
    q_lora: int = 128
    kv_lora: int = 512
    rope_dim: int = 64
    dense_layers: int = 1
    dense_ffn: int = 512
    shared_experts: int = 1
    rope_base: float = 10_000.0
    # DeepSeek-V3/R1's multi-token-prediction layer, as mainline's converter keeps it: one more MoE
    # block after the others (block_count counts it, nextn_predict_layers says so) with its NextN
    # projections; mainline's --spec-type draft-mtp drafts with it.
    mtp_layers: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if (self.kv_lora, self.rope_dim, self.kv_heads) != (512, 64, 1) or self.heads % 4:
            raise ValueError(
                "deepseek2 in mainline's MLA form needs kv_lora 512, 64 rope dims, one KV head and a "
                "head count divisible by 4 (what ik_llama.cpp can convert)"
            )
        if not 0 <= self.dense_layers < self.layers:
            raise ValueError(
                f"dense_layers ({self.dense_layers}) must leave at least one MoE layer of {self.layers}"
            )
        if self.q_lora and self.layers in (26, 27):
            raise ValueError(
                "both engines take a 26- or 27-layer deepseek2 for a Lite model without q_lora: "
                "pick another layer count"
            )
        if not 0 <= self.mtp_layers <= 1:
            raise ValueError("mtp_layers must be 0 or 1 (DeepSeek-V3/R1 have one)")

    @property
    def dense_width(self) -> int:
        return self.dense_ffn

    @property
    def blocks(self) -> int:
        return self.layers + self.mtp_layers

    @property
    def cached_lengths(self) -> tuple[int, int]:
        """With MLA the cache holds the compressed latent and the rope part: 576 and 512."""
        return self.kv_lora + self.rope_dim, self.kv_lora

    def metadata(self, writer: gguf.GGUFWriter) -> None:
        super().metadata(writer)
        arch = self.arch
        writer.add_uint32(f"{arch}.attention.key_length_mla", self.head_dim)
        writer.add_uint32(f"{arch}.attention.value_length_mla", self.v_head_dim)
        if self.q_lora:
            writer.add_q_lora_rank(self.q_lora)
        writer.add_kv_lora_rank(self.kv_lora)
        writer.add_rope_dimension_count(self.rope_dim)
        writer.add_leading_dense_block_count(self.dense_layers)
        writer.add_expert_shared_count(self.shared_experts)
        writer.add_expert_weights_scale(2.5)
        writer.add_expert_weights_norm(True)
        writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        if self.mtp_layers:
            writer.add_uint32(f"{arch}.nextn_predict_layers", self.mtp_layers)
        if self.expert_groups:
            writer.add_uint32(f"{arch}.expert_group_count", self.expert_groups)
            writer.add_uint32(f"{arch}.expert_group_used_count", self.groups_used)

    def layer(self, i: int) -> Iterator[Tensor]:
        p, h = f"blk.{i}", self.hidden
        yield f"{p}.attn_norm.weight", (h,), "norm"
        yield from self.mla_attention(p)
        yield f"{p}.ffn_norm.weight", (h,), "norm"
        yield from dense_or_shared_moe(self, i, self.dense_layers, self.dense_ffn, self.shared_experts)

    def mla_attention(self, p: str) -> Iterator[Tensor]:
        """MLA's projections in layer `p`: the q latent (or a plain query), the KV latent and rope part,
        the per-head up-projections of K and V, the output."""
        h, nope = self.hidden, self.head_dim - self.rope_dim
        if self.q_lora:
            yield f"{p}.attn_q_a_norm.weight", (self.q_lora,), "norm"
            yield f"{p}.attn_q_a.weight", (h, self.q_lora), "quant"
            yield f"{p}.attn_q_b.weight", (self.q_lora, self.heads * self.head_dim), "quant"
        else:
            yield f"{p}.attn_q.weight", (h, self.heads * self.head_dim), "quant"
        yield f"{p}.attn_kv_a_norm.weight", (self.kv_lora,), "norm"
        yield f"{p}.attn_kv_a_mqa.weight", (h, self.kv_lora + self.rope_dim), "quant"
        yield f"{p}.attn_k_b.weight", (nope, self.kv_lora, self.heads), "quant"
        yield f"{p}.attn_v_b.weight", (self.kv_lora, self.v_head_dim, self.heads), "quant"
        yield f"{p}.attn_output.weight", (self.heads * self.v_head_dim, h), "quant"


def dense_or_shared_moe(
    shape: MoeShape, i: int, dense_layers: int, dense_ffn: int, shared_experts: int
) -> Iterator[Tensor]:
    """DeepSeek's FFN, which GLM-4.x shares: a dense FFN in the leading layers, else the routed experts
    with their selection bias and `shared_experts` shared ones of the experts' width."""
    p, h = f"blk.{i}", shape.hidden
    if i < dense_layers:
        yield from swiglu(p, "", h, dense_ffn)
        return
    yield from shape.routed_experts(i)
    yield f"{p}.exp_probs_b.bias", (shape.experts,), "f32"
    yield from swiglu(p, "_shexp", h, shape.expert_ffn * shared_experts)


def swiglu(p: str, kind: str, h: int, width: int) -> Iterator[Tensor]:
    """A gated FFN of `width` in layer `p`: ffn_gate, ffn_up and ffn_down, each with `kind` after it (a
    dense layer's "", a shared expert's "_shexp")."""
    yield f"{p}.ffn_gate{kind}.weight", (h, width), "quant"
    yield f"{p}.ffn_up{kind}.weight", (h, width), "quant"
    yield f"{p}.ffn_down{kind}.weight", (width, h), "quant"


def nextn_blocks(shape: MoeShape) -> Iterator[Tensor]:
    """The multi-token-prediction blocks after the layers, as mainline's converter keeps them: a layer
    of the model's own kind and its NextN projections."""
    h = shape.hidden
    for i in range(shape.layers, shape.blocks):
        yield from shape.layer(i)
        yield f"blk.{i}.nextn.eh_proj.weight", (2 * h, h), "quant"
        yield f"blk.{i}.nextn.enorm.weight", (h,), "norm"
        yield f"blk.{i}.nextn.hnorm.weight", (h,), "norm"
        yield f"blk.{i}.{shape.nextn_head_norm}.weight", (h,), "norm"


@dataclass(frozen=True)
class Qwen3NextShape(MoeShape):
    """qwen3next: every 4th layer gated full attention (its query projection twice as wide: the query
    and its gate), the others gated delta nets; both engines place full attention at (i + 1) % 4 == 0."""

    arch: ClassVar[str] = "qwen3next"
    head_dim: int = 64
    shared_ffn: int = 128
    ssm_state: int = 128  # each linear-attention head's key/value width
    ssm_groups: int = 2  # key heads
    ssm_v_heads: int = 4  # value heads
    ssm_conv: int = 4
    rope_dim: int = 32  # a quarter of the head (partial rotary)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.layers % 4:
            raise ValueError(
                "qwen3next layers come in fours (three recurrent, one attention): give a multiple of 4"
            )
        if self.ssm_v_heads % self.ssm_groups:
            raise ValueError("ssm_v_heads must be a multiple of ssm_groups")

    def metadata(self, writer: gguf.GGUFWriter) -> None:
        super().metadata(writer)
        arch = self.arch
        writer.add_uint32(f"{arch}.expert_shared_feed_forward_length", self.shared_ffn)
        writer.add_rope_dimension_count(self.rope_dim)
        writer.add_ssm_conv_kernel(self.ssm_conv)
        writer.add_ssm_inner_size(self.ssm_state * self.ssm_v_heads)
        writer.add_ssm_state_size(self.ssm_state)
        writer.add_ssm_time_step_rank(self.ssm_v_heads)
        writer.add_ssm_group_count(self.ssm_groups)
        writer.add_uint32(f"{arch}.full_attention_interval", 4)

    def layer(self, i: int) -> Iterator[Tensor]:
        p, h = f"blk.{i}", self.hidden
        yield f"{p}.attn_norm.weight", (h,), "norm"
        yield f"{p}.post_attention_norm.weight", (h,), "norm"
        if (i + 1) % 4 == 0:
            yield from self.gqa_attention(p, gated=True)
        else:
            key, value = self.ssm_state * self.ssm_groups, self.ssm_state * self.ssm_v_heads
            yield f"{p}.attn_qkv.weight", (h, 2 * key + value), "quant"
            yield f"{p}.attn_gate.weight", (h, value), "quant"
            yield f"{p}.ssm_conv1d.weight", (self.ssm_conv, 2 * key + value), "conv"
            yield f"{p}.ssm_dt.bias", (self.ssm_v_heads,), "f32"
            yield f"{p}.ssm_a", (self.ssm_v_heads,), "decay"
            yield f"{p}.ssm_ba.weight", (h, 2 * self.ssm_v_heads), "quant"
            yield f"{p}.ssm_norm.weight", (self.ssm_state,), "norm"
            yield f"{p}.ssm_out.weight", (value, h), "quant"
        yield from self.routed_experts(i)
        yield f"{p}.ffn_gate_inp_shexp.weight", (h,), "f32"
        yield from swiglu(p, "_shexp", h, self.shared_ffn)


# The seed's models at full size (their Hugging Face configs); `moe-stack synth-moe` writes these unless
# told fewer layers or experts.
# fmt: off
SEED_SHAPES: dict[str, MoeShape] = {
    # Qwen3-235B-A22B: 94 layers, 64 query / 4 KV heads of 128, 128 experts of 1536, top-8.
    "qwen3moe": MoeShape(
        layers=94, hidden=4096, heads=64, kv_heads=4, head_dim=128, expert_ffn=1536, experts=128,
        experts_used=8, context=40960, quant="Q4_0",
    ),
    # DeepSeek-R1: 61 layers (3 dense, 18432 wide), 128 heads, q_lora 1536, kv_lora 512, 256 experts of
    # 2048 and one shared, top-8 in 4 of 8 groups.
    "deepseek2": DeepSeek2Shape(
        layers=61, hidden=7168, heads=128, expert_ffn=2048, experts=256, experts_used=8, context=163840,
        quant="Q4_0", q_lora=1536, dense_layers=3, dense_ffn=18432, expert_groups=8, groups_used=4,
    ),
    # Qwen3-Next-80B-A3B: 48 layers, 16 query / 2 KV heads of 256, 512 experts of 512 + a shared one,
    # top-10; linear attention 16 key / 32 value heads of 128.
    "qwen3next": Qwen3NextShape(
        layers=48, hidden=2048, heads=16, kv_heads=2, head_dim=256, expert_ffn=512, experts=512,
        experts_used=10, context=262144, quant="Q4_0", shared_ffn=512, ssm_groups=16, ssm_v_heads=32,
        rope_dim=64, rope_base=10_000_000.0,
    ),
}
# fmt: on
# Small models of each architecture, for the test suite's CPU stacks (seconds to write and load; the
# class's small widths unless said). Their training contexts are the real models', so a preset's context
# is served as it is, not capped.
TINY_SHAPES: dict[str, MoeShape] = {
    name: replace(small, context=SEED_SHAPES[name].context)
    for name, small in {
        "qwen3moe": MoeShape(),
        "deepseek2": DeepSeek2Shape(layers=3, expert_groups=4, groups_used=2),
        "qwen3next": Qwen3NextShape(),
    }.items()
}
ARCHITECTURES = tuple(SEED_SHAPES)
