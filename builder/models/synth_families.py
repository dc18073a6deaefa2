"""The MoE families people run beside the seed's three, as random-weight GGUFs write them: each
shape's keys and tensor table as both pinned llama.cpp engines load them (ik_llama.cpp's
src/llama-load-tensors.cpp and llama-hparams.cpp, mainline's src/models/<arch>.cpp), real widths by
default (the models' Hugging Face configs, ../shared/MOE-FAMILIES.md §2).

- glm4moe (GLM-4.5/4.6/4.7): grouped-query attention with q/k/v biases and per-head q/k norms, partial
  rotary (half the head), dense leading layers, one shared expert, sigmoid routing with an expert bias,
  one NextN (multi-token-prediction) block after the others that both engines skip unless MTP is on.
- gpt-oss (gpt-oss-120b): attention sinks, biases on q/k/v/o, the router and every expert, sliding-window
  attention on alternate layers, a query width (heads x 64) apart from the hidden width. Real files hold
  MXFP4 experts; these hold Q8_0/Q4_0 (what moe-stack's writer makes).
- minimax-m2 (MiniMax-M2 and its successors): q/k norms over all heads' width, not per head; sigmoid
  routing with an expert bias; no shared expert; both engines read the expert width as
  feed_forward_length.
- glm-dsa (GLM-5, 5.1): DeepSeek's MLA layout (a q latent, the KV latent, dense leading layers, a
  shared expert, sigmoid routing) with DeepSeek Sparse Attention's indexer in every layer: its heads'
  queries from the q latent, one key a token, a projection to the heads' weights, a normed key. Both
  engines require the indexer's tensors at the pinned refs; both cache its keys (ik_llama.cpp since
  8337e4c: 55d3c05 loaded and never used them). GLM-5.2's indexer in 21 layers only is left out:
  ik_llama.cpp at its pin can't load it.
- qwen35moe (Qwen3.5/3.6-MoE: 35B-A3B, 122B-A10B, 397B-A17B): Qwen3-Next's layers (three gated delta
  nets, then gated full attention, a shared expert) with the delta net's beta and alpha projections as
  two tensors, and interleaved multimodal rotary sections (the models read images natively), which both
  engines require (mainline's src/models/qwen35moe.cpp, ik's llama-hparams.cpp and llama-load-tensors.cpp
  at the pinned refs). No MTP block: ik_llama.cpp reads no nextn_predict_layers for it.
- deepseek4 (DeepSeek-V4-Flash; ik_llama.cpp since 8337e4c, which keeps every layer's K at the full
  context and the indexer's keys in f16): a q
  latent, one shared K=V head of 512 with attention sinks, a grouped low-rank output, four hyper-connection
  residual streams, every layer MoE with a shared expert (the first three routed by a token table), and
  compressed attention: every layer keeps a raw window of 128 tokens, and beside it one row per 4 tokens
  (read sparsely, picked by a lightning indexer with its own keys) or per 128 tokens (read densely), in
  turn from the third layer (llama-kv-cache-dsv4.cpp caches each kind apart).
- deepseek32 (DeepSeek-V3.2 and V3.2-Exp; mainline only: ik_llama.cpp at its pin has no such architecture):
  R1's layout (MLA, three dense layers, a shared expert, sigmoid routing in 4 of 8 groups, one MTP block)
  with DeepSeek Sparse Attention's lightning indexer in every layer, as glm-dsa's tensors: mainline's
  src/models/deepseek32.cpp at 0c1e57098 requires the indexer's tensors and the gating function's key,
  and caches the latent and the indexer's keys (llama_kv_cache_dsa), the MTP block's in neither.
- minimax-m3 (MiniMax-M3; mainline only: ik_llama.cpp's pinned tree names it but loads no indexer
  tensors): MiniMax-M2's grouped-query attention with per-head q/k norms, dense leading layers, a
  shared expert beside the routed ones, and MiniMax Sparse Attention on every layer after the dense ones:
  a lightning indexer (a head per KV head, one key of 128 a token) picks blocks of 128 tokens to attend to;
  mainline caches the indexer's key, and a value of the head's width it never reads, in a second cache of
  those layers (llama_kv_cache_msa), and runs it only with flash attention and a cache per slot
  (src/models/minimax-m3.cpp at 0c1e57098). The indexer's projections stay F32 in real files, as the
  converter writes them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import ClassVar

import gguf

from builder.models.synth_shapes import (
    SEED_SHAPES,
    DeepSeek2Shape,
    MoeShape,
    Qwen3NextShape,
    Tensor,
    dense_or_shared_moe,
    swiglu,
)

# What DeepSeek-V3.2 takes from R1's shape (SEED_SHAPES["deepseek2"]): every width and the routing.
R1_WIDTHS = (
    "layers", "hidden", "heads", "q_lora", "expert_ffn", "experts", "experts_used", "context", "quant",
    "dense_layers", "dense_ffn", "expert_groups", "groups_used",
)  # fmt: skip
HYPER_CONNECTIONS = 4  # deepseek4's residual streams (hc_mult): the only count mainline's graph takes


@dataclass(frozen=True)
class Glm4MoeShape(MoeShape):
    arch: ClassVar[str] = "glm4moe"
    dense_layers: int = 1
    dense_ffn: int = 512
    shared_experts: int = 1
    nextn_layers: int = 1
    qk_norm: bool = True  # GLM-4.5/4.6/4.7 have them, GLM-4.5-Air not
    routed_scale: float = 2.5  # expert_weights_scale: the routed experts' normalised weights times this

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.dense_layers < self.layers or self.nextn_layers not in (0, 1):
            raise ValueError("glm4moe needs dense_layers < layers and 0 or 1 NextN layer")

    @property
    def dense_width(self) -> int:
        return self.dense_ffn

    @property
    def blocks(self) -> int:
        return self.layers + self.nextn_layers

    def metadata(self, writer: gguf.GGUFWriter) -> None:
        super().metadata(writer)
        writer.add_rope_dimension_count(self.head_dim // 2)  # partial_rotary_factor 0.5
        writer.add_leading_dense_block_count(self.dense_layers)
        writer.add_expert_shared_count(self.shared_experts)
        writer.add_expert_weights_scale(self.routed_scale)
        writer.add_expert_weights_norm(True)
        writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        if self.nextn_layers:
            writer.add_uint32(f"{self.arch}.nextn_predict_layers", self.nextn_layers)

    def layer(self, i: int) -> Iterator[Tensor]:
        p, h = f"blk.{i}", self.hidden
        yield f"{p}.attn_norm.weight", (h,), "norm"
        yield from self.gqa_attention(p, bias=True, norms="head" if self.qk_norm else "")
        yield f"{p}.post_attention_norm.weight", (h,), "norm"
        yield from dense_or_shared_moe(self, i, self.dense_layers, self.dense_ffn, self.shared_experts)


@dataclass(frozen=True)
class GptOssShape(MoeShape):
    arch: ClassVar[str] = "gpt-oss"
    sliding_window: int = 128
    rope_base: float = 150_000.0

    def metadata(self, writer: gguf.GGUFWriter) -> None:
        super().metadata(writer)
        writer.add_sliding_window(self.sliding_window)
        # YaRN x32 from 4096 tokens (the model's config.json rope_scaling)
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(32.0)
        writer.add_rope_scaling_orig_ctx_len(4096)

    def layer(self, i: int) -> Iterator[Tensor]:
        p, h = f"blk.{i}", self.hidden
        yield f"{p}.attn_norm.weight", (h,), "norm"
        yield f"{p}.post_attention_norm.weight", (h,), "norm"
        yield from self.gqa_attention(p, bias=True, norms="")
        yield f"{p}.attn_output.bias", (h,), "f32"
        yield f"{p}.attn_sinks.weight", (self.heads,), "f32"
        yield from self.routed_experts(i)
        yield f"{p}.ffn_gate_inp.bias", (self.experts,), "f32"
        yield f"{p}.ffn_gate_exps.bias", (self.expert_ffn, self.experts), "f32"
        yield f"{p}.ffn_up_exps.bias", (self.expert_ffn, self.experts), "f32"
        yield f"{p}.ffn_down_exps.bias", (h, self.experts), "f32"


@dataclass(frozen=True)
class MiniMaxM2Shape(MoeShape):
    arch: ClassVar[str] = "minimax-m2"
    rope_base: float = 5_000_000.0

    def metadata(self, writer: gguf.GGUFWriter) -> None:
        super().metadata(writer)
        writer.add_rope_dimension_count(self.head_dim // 2)  # rotary_dim 64 of 128
        writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)

    def layer(self, i: int) -> Iterator[Tensor]:
        p, h = f"blk.{i}", self.hidden
        yield f"{p}.attn_norm.weight", (h,), "norm"
        yield from self.gqa_attention(p, norms="whole")
        yield f"{p}.ffn_norm.weight", (h,), "norm"
        yield from self.routed_experts(i)
        yield f"{p}.exp_probs_b.bias", (self.experts,), "f32"


@dataclass(frozen=True)
class GlmDsaShape(DeepSeek2Shape):
    arch: ClassVar[str] = "glm-dsa"
    indexer_heads: int = 4
    indexer_key: int = 128  # mainline rotates it with a Hadamard matrix: a power of two, 64 at least
    indexer_top_k: int = 2048

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.q_lora:
            raise ValueError("glm-dsa's indexer reads the query latent: give q_lora")
        if (
            self.indexer_key < 64
            or self.indexer_key & (self.indexer_key - 1)
            or self.indexer_key < self.rope_dim
        ):
            raise ValueError("the indexer's key width must be a power of two, 64 and the rope dims at least")

    def metadata(self, writer: gguf.GGUFWriter) -> None:
        super().metadata(writer)
        writer.add_indexer_head_count(self.indexer_heads)
        writer.add_indexer_key_length(self.indexer_key)
        writer.add_indexer_top_k(self.indexer_top_k)

    def layer(self, i: int) -> Iterator[Tensor]:
        yield from super().layer(i)
        p, key = f"blk.{i}.indexer", self.indexer_key
        yield f"{p}.k_norm.weight", (key,), "norm"
        yield f"{p}.k_norm.bias", (key,), "f32"
        yield f"{p}.proj.weight", (self.hidden, self.indexer_heads), "quant"
        yield f"{p}.attn_k.weight", (self.hidden, key), "quant"
        yield f"{p}.attn_q_b.weight", (self.q_lora, self.indexer_heads * key), "quant"


@dataclass(frozen=True)
class DeepSeek32Shape(GlmDsaShape):
    """DeepSeek-V3.2: glm-dsa's tensors and keys under its own name (its graph ropes the indexer NeoX-style
    and reads no indexer types: every layer runs its own)."""

    arch: ClassVar[str] = "deepseek32"


@dataclass(frozen=True)
class Qwen35MoeShape(Qwen3NextShape):
    arch: ClassVar[str] = "qwen35moe"

    @property
    def rope_sections(self) -> list[int]:
        """rope.dimension_sections: the rotary pairs split 11:11:10 over temporal, height and width (the
        released files' [11, 11, 10, 0] at 64 rotary dimensions); text positions make it plain rotary."""
        pairs = self.rope_dim // 2
        side = pairs * 11 // 32
        return [side, side, pairs - 2 * side, 0]

    def metadata(self, writer: gguf.GGUFWriter) -> None:
        super().metadata(writer)
        writer.add_rope_dimension_sections(self.rope_sections)

    def layer(self, i: int) -> Iterator[Tensor]:
        for name, ne, kind in super().layer(i):
            if name.endswith(".ssm_ba.weight"):
                prefix = name.removesuffix("ssm_ba.weight")
                yield f"{prefix}ssm_beta.weight", (self.hidden, self.ssm_v_heads), kind
                yield f"{prefix}ssm_alpha.weight", (self.hidden, self.ssm_v_heads), kind
            else:
                yield name, ne, kind


@dataclass(frozen=True)
class DeepSeek4Shape(MoeShape):
    """deepseek4 as mainline's loader reads it (src/models/deepseek4.cpp at 0c1e57098; the defaults: a tiny
    model the loader and the CPU backend take, as in its tests/test-llama-archs.cpp)."""

    arch: ClassVar[str] = "deepseek4"
    kv_heads: int = 1  # one shared K=V head: the cache writes one row a token (the loader needs 1)
    rope_dim: int = 32  # the rotary tail of each head
    q_lora: int = 64
    out_groups: int = 2  # the grouped output projection: heads per group, then a low rank
    out_lora: int = 32
    shared_experts: int = 1
    sliding_window: int = 128  # every layer attends over this raw window of tokens
    hash_layers: int = 1  # the first layers route each token by a fixed table, not the router
    indexer_heads: int = 4
    indexer_key: int = 64  # a multiple of 64 (its cache is Hadamard-rotated in blocks of 64)
    indexer_top_k: int = 16
    rope_base: float = 10_000.0
    compress_rope_base: float = 160_000.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kv_heads != 1 or self.heads % self.out_groups or self.indexer_key % 64:
            raise ValueError(
                "deepseek4 needs one KV head, heads divisible by out_groups and an indexer key width "
                "that is a multiple of 64 (mainline's loader and its Hadamard rotation)"
            )
        if self.rope_dim > min(self.head_dim, self.indexer_key) or self.hash_layers > self.layers:
            raise ValueError("rope_dim must fit the head and the indexer key; hash_layers at most layers")

    def ratio(self, i: int) -> int:
        """Tokens one compressed row of layer `i` stands for: DeepSeek-V4-Flash's pattern, two layers of
        the window alone, then 4 (sparse, with the indexer) and 128 (dense) in turn."""
        return 0 if i < 2 else (4 if i % 2 == 0 else 128)

    @property
    def ratios(self) -> list[int]:
        return [self.ratio(i) for i in range(self.layers)]

    def metadata(self, writer: gguf.GGUFWriter) -> None:
        super().metadata(writer)
        key = self.arch
        writer.add_rope_dimension_count(self.rope_dim)
        writer.add_q_lora_rank(self.q_lora)
        writer.add_sliding_window(self.sliding_window)
        writer.add_expert_shared_count(self.shared_experts)
        writer.add_expert_weights_scale(1.5)  # routed_scaling_factor
        writer.add_expert_weights_norm(True)
        writer.add_float32(f"{key}.swiglu_clamp_exp", 10.0)  # swiglu_limit
        writer.add_uint32(f"{key}.expert_gating_func", 4)  # sqrtsoftplus, the only scoring it loads
        writer.add_indexer_head_count(self.indexer_heads)
        writer.add_indexer_key_length(self.indexer_key)
        writer.add_indexer_top_k(self.indexer_top_k)
        writer.add_uint32(f"{key}.attention.output_group_count", self.out_groups)
        writer.add_uint32(f"{key}.attention.output_lora_rank", self.out_lora)
        writer.add_array(f"{key}.attention.compress_ratios", self.ratios)
        writer.add_float32(f"{key}.attention.compress_rope_freq_base", self.compress_rope_base)
        writer.add_uint32(f"{key}.hyper_connection.count", HYPER_CONNECTIONS)
        writer.add_uint32(f"{key}.hyper_connection.sinkhorn_iterations", 20)
        writer.add_float32(f"{key}.hyper_connection.epsilon", 1e-6)
        writer.add_uint32(f"{key}.hash_layer_count", self.hash_layers)

    def tensors(self, n_vocab: int) -> Iterator[Tensor]:
        h, streams = self.hidden, HYPER_CONNECTIONS * self.hidden
        yield "token_embd.weight", (h, n_vocab), "quant"
        for i in range(self.layers):
            yield from self.layer(i)
            if i < self.hash_layers:  # each token's experts, from a table of the vocabulary
                yield f"blk.{i}.ffn_gate_tid2eid.weight", (self.experts_used, n_vocab), "expert-ids"
        yield "output_norm.weight", (h,), "norm"
        yield "output.weight", (h, n_vocab), "head"
        yield "output_hc_fn.weight", (streams, HYPER_CONNECTIONS), "f32"
        yield "output_hc_base.weight", (HYPER_CONNECTIONS,), "f32"
        yield "output_hc_scale.weight", (1,), "f32"

    def layer(self, i: int) -> Iterator[Tensor]:
        p, h, d = f"blk.{i}", self.hidden, self.head_dim
        mix = (2 + HYPER_CONNECTIONS) * HYPER_CONNECTIONS
        yield f"{p}.attn_norm.weight", (h,), "norm"
        yield f"{p}.attn_sinks.weight", (self.heads,), "f32"
        yield f"{p}.attn_q_a.weight", (h, self.q_lora), "quant"
        yield f"{p}.attn_q_a_norm.weight", (self.q_lora,), "norm"
        yield f"{p}.attn_q_b.weight", (self.q_lora, self.heads * d), "quant"
        yield f"{p}.attn_kv.weight", (h, d), "quant"
        yield f"{p}.attn_kv_a_norm.weight", (d,), "norm"
        yield (
            f"{p}.attn_output_a.weight",
            (self.heads * d // self.out_groups, self.out_groups * self.out_lora),
            "quant",
        )
        yield f"{p}.attn_output_b.weight", (self.out_groups * self.out_lora, h), "quant"
        for part in ("attn", "ffn"):
            yield f"{p}.hc_{part}_fn.weight", (HYPER_CONNECTIONS * h, mix), "f32"
            yield f"{p}.hc_{part}_base.weight", (mix,), "f32"
            yield f"{p}.hc_{part}_scale.weight", (3,), "f32"
        yield from self._compressor(i)
        yield f"{p}.ffn_norm.weight", (h,), "norm"
        yield from self.routed_experts(i)
        if i >= self.hash_layers:
            yield f"{p}.exp_probs_b.bias", (self.experts,), "f32"
        yield from swiglu(p, "_shexp", h, self.expert_ffn * self.shared_experts)

    def _compressor(self, i: int) -> Iterator[Tensor]:
        """A compressed layer's compressor (its rows twice as wide on the 4-token layers), and there the
        lightning indexer that picks the rows a query reads."""
        ratio = self.ratio(i)
        if not ratio:
            return
        p, h, d, key = f"blk.{i}", self.hidden, self.head_dim, self.indexer_key
        width = (2 if ratio == 4 else 1) * d
        yield f"{p}.attn_compressor_kv.weight", (h, width), "quant"
        yield f"{p}.attn_compressor_gate.weight", (h, width), "quant"
        yield f"{p}.attn_compressor_ape.weight", (width, ratio), "f32"
        yield f"{p}.attn_compressor_norm.weight", (d,), "norm"
        if ratio != 4:
            return
        yield f"{p}.indexer.proj.weight", (h, self.indexer_heads), "quant"
        yield f"{p}.indexer.attn_q_b.weight", (self.q_lora, self.indexer_heads * key), "quant"
        yield f"{p}.indexer_compressor_kv.weight", (h, 2 * key), "quant"
        yield f"{p}.indexer_compressor_gate.weight", (h, 2 * key), "quant"
        yield f"{p}.indexer_compressor_ape.weight", (2 * key, 4), "f32"
        yield f"{p}.indexer_compressor_norm.weight", (key,), "norm"


@dataclass(frozen=True)
class MiniMaxM3Shape(Glm4MoeShape):
    """GLM-4.x's dense leading layers, shared expert and routing keys under MiniMax-M2's attention with
    per-head norms, and MiniMax Sparse Attention's indexer on every layer after the dense ones."""

    arch: ClassVar[str] = "minimax-m3"
    rope_base: float = 5_000_000.0
    nextn_layers: int = 0
    routed_scale: float = 2.0
    indexer_key: int = 128
    indexer_top_k: int = 16  # blocks, not tokens
    indexer_block: int = 128  # tokens a block
    indexer_local: int = 1  # the query's own blocks, always attended to

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.nextn_layers or not self.qk_norm or self.indexer_key < self.head_dim // 2:
            raise ValueError(
                "minimax-m3 has q/k norms, no NextN layer, and an indexer key that holds the rotary dims "
                "(half the head)"
            )

    def metadata(self, writer: gguf.GGUFWriter) -> None:
        super().metadata(writer)
        arch = self.arch
        writer.add_indexer_head_count(self.kv_heads)  # its graph takes one indexer head per KV head
        writer.add_indexer_key_length(self.indexer_key)
        writer.add_indexer_top_k(self.indexer_top_k)
        writer.add_uint32(f"{arch}.attention.indexer.block_size", self.indexer_block)
        writer.add_uint32(f"{arch}.attention.indexer.local_blocks", self.indexer_local)

    def layer(self, i: int) -> Iterator[Tensor]:
        p, h = f"blk.{i}", self.hidden
        yield f"{p}.attn_norm.weight", (h,), "norm"
        yield from self.gqa_attention(p)
        yield f"{p}.ffn_norm.weight", (h,), "norm"
        yield from dense_or_shared_moe(self, i, self.dense_layers, self.dense_ffn, self.shared_experts)
        if i >= self.dense_layers:
            key = self.indexer_key
            yield f"{p}.indexer.q_proj.weight", (h, self.kv_heads * key), "f32"
            yield f"{p}.indexer.k_proj.weight", (h, key), "f32"
            yield f"{p}.indexer.q_norm.weight", (key,), "norm"
            yield f"{p}.indexer.k_norm.weight", (key,), "norm"


# Full size, from the models' configs (MOE-FAMILIES.md §2), at their real vocabularies (the embeddings,
# the output head and ik_llama.cpp's logits in the compute buffer at their real sizes).
# fmt: off
FAMILY_SHAPES: dict[str, MoeShape] = {
    # GLM-4.6: 92 layers (3 dense, 12288 wide) + 1 NextN, 96 query / 8 KV heads of 128, 160 experts of
    # 1536 and one shared, top-8.
    "glm4moe": Glm4MoeShape(
        layers=92, hidden=5120, heads=96, kv_heads=8, head_dim=128, expert_ffn=1536, experts=160,
        experts_used=8, context=202752, quant="Q4_0", vocab=151552, dense_layers=3, dense_ffn=12288,
    ),
    # gpt-oss-120b: 36 layers, 64 query / 8 KV heads of 64, 128 experts of 2880, top-4.
    "gpt-oss": GptOssShape(
        layers=36, hidden=2880, heads=64, kv_heads=8, head_dim=64, expert_ffn=2880, experts=128,
        experts_used=4, context=131072, quant="Q4_0", vocab=201088,
    ),
    # MiniMax-M2: 62 layers, 48 query / 8 KV heads of 128, 256 experts of 1536, top-8.
    "minimax-m2": MiniMaxM2Shape(
        layers=62, hidden=3072, heads=48, kv_heads=8, head_dim=128, expert_ffn=1536, experts=256,
        experts_used=8, context=196608, quant="Q4_0", vocab=200064,
    ),
    # GLM-5: 78 layers (3 dense, 12288 wide) + 1 NextN, 64 heads, q_lora 2048, kv_lora 512, key 192 + 64
    # rope, value 256, 256 experts of 2048 and a shared one, top-8, no groups; its indexer 32 heads of 128,
    # top-2048 (zai-org's config and GGUF headers quoted in the engines' issues; 5.1 the same widths).
    "glm-dsa": GlmDsaShape(
        layers=78, hidden=6144, heads=64, head_dim=256, v_head_dim=256, q_lora=2048, expert_ffn=2048,
        experts=256, experts_used=8, context=202752, quant="Q4_0", vocab=154880, dense_layers=3,
        dense_ffn=12288, rope_base=1_000_000.0, mtp_layers=1, indexer_heads=32,
    ),
    # Qwen3.5-397B-A17B: 60 layers, 32 query / 2 KV heads of 256, 512 experts of 1024 and a shared one,
    # top-10; linear attention 16 key / 64 value heads of 128 (GGUF headers quoted in llama.cpp PR #23269
    # and ik_llama.cpp issue #1432; 35B-A3B: 40 layers of 2048, 256 experts of 512, top-8).
    "qwen35moe": Qwen35MoeShape(
        layers=60, hidden=4096, heads=32, kv_heads=2, head_dim=256, expert_ffn=1024, experts=512,
        experts_used=10, context=262144, quant="Q4_0", vocab=248320, shared_ffn=1024, ssm_groups=16,
        ssm_v_heads=64, rope_dim=64, rope_base=10_000_000.0,
    ),
    # DeepSeek-V4-Flash: 43 layers, 64 heads of 512 (64 rotary) and one K=V head, q_lora 1024, 8 output
    # groups of rank 1024, 256 experts of 2048 and a shared one, top-6, 3 hash-routed layers, window 128,
    # indexer 64 heads of 128, top-512 (its config.json; 284B parameters, 13B active). No MTP block: the
    # converter writes it to a file of its own.
    "deepseek4": DeepSeek4Shape(
        layers=43, hidden=4096, heads=64, head_dim=512, rope_dim=64, q_lora=1024, out_groups=8, out_lora=1024,
        expert_ffn=2048, experts=256, experts_used=6, context=1_048_576, quant="Q4_0", vocab=129280,
        hash_layers=3, indexer_heads=64, indexer_key=128, indexer_top_k=512,
    ),
    # MiniMax-M3: 60 layers (3 dense of 12288, with full attention), 64 query / 4 KV heads of 128, 128
    # experts of 3072 and a shared one, top-4, routed scale 2.0; its sparse attention's indexer 4 heads of
    # 128, the top 16 blocks of 128 tokens and the query's own (its text_config; 426.2B parameters, 24.7B
    # active, as ~428B / 23B published with its vision tower and without the output head).
    "minimax-m3": MiniMaxM3Shape(
        layers=60, hidden=6144, heads=64, kv_heads=4, head_dim=128, expert_ffn=3072, experts=128,
        experts_used=4, context=1_048_576, quant="Q4_0", vocab=200064, dense_layers=3, dense_ffn=12288,
    ),
    # DeepSeek-V3.2: R1's widths (61 layers, 3 dense of 18432, 128 heads, q_lora 1536, kv_lora 512, 256
    # experts of 2048 and a shared one, top-8 in 4 of 8 groups) and its MTP block, which the converter
    # keeps; the indexer 64 heads of 128, top-2048 (its config.json: index_n_heads, index_head_dim,
    # index_topk; ../shared/MOE-FAMILIES.md §2).
    "deepseek32": DeepSeek32Shape(
        **{name: getattr(SEED_SHAPES["deepseek2"], name) for name in R1_WIDTHS}, vocab=129280, mtp_layers=1,
        indexer_heads=64,
    ),
}
# fmt: on
# Small models of each, for the suite's CPU stacks (the byte-level vocabulary; the class's small widths
# unless said), at the real models' training contexts.
FAMILY_TINY_SHAPES: dict[str, MoeShape] = {
    name: replace(small, context=FAMILY_SHAPES[name].context)
    for name, small in {
        "glm4moe": Glm4MoeShape(layers=3),
        # Eight query heads of 64 against 256 hidden: the query width apart from the hidden one, as in 120b.
        "gpt-oss": GptOssShape(heads=8),
        "minimax-m2": MiniMaxM2Shape(),
        "glm-dsa": GlmDsaShape(layers=3),
        "qwen35moe": Qwen35MoeShape(),
        # Layers 2 and 3 compress by 4 and by 128: each kind of cache in four layers.
        "deepseek4": DeepSeek4Shape(),
        # One dense layer (full attention), two sparse ones (the indexer, MoE and a shared expert).
        "minimax-m3": MiniMaxM3Shape(layers=3),
        # Grouped routing and the MTP block kept: the cache leaves that block out.
        "deepseek32": DeepSeek32Shape(layers=3, expert_groups=4, groups_used=2, mtp_layers=1),
    }.items()
}
