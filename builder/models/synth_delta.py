"""Kimi Delta Attention hybrids as random-weight GGUFs write them: most layers a gated delta rule over a
recurrent state (KDA: q, k and v each through their own short convolution, a per-channel decay), the rest
DeepSeek's MLA, which alone caches tokens. Mainline's loaders (src/models/bailingmoe3.cpp and kimi-k3.cpp at
0c1e57098) read a layer's kind from the per-block `attention.head_count_kv` array (0: KDA); ik_llama.cpp at
its pin has neither architecture. Per sequence each KDA layer keeps, in f32, the last d_conv - 1 inputs of
its three convolutions and a head_dim x head_dim state per head (llama-hparams.cpp's n_embd_r and n_embd_s
for KDA).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import gguf

from builder.models.gguf_facts import kda_state_bytes
from builder.models.synth_shapes import DeepSeek2Shape, Tensor, swiglu


@dataclass(frozen=True)
class KdaHybridShape(DeepSeek2Shape):
    """MLA layers (DeepSeek2Shape's, with `heads` query heads) among KDA layers of as many heads of
    `kda_head_dim`; which is which is the subclass's `is_mla`."""

    kda_head_dim: int = 128
    ssm_conv: int = 4
    gate_lower_bound: float = -5.0  # the decay's floor (kda.gate_lower_bound; the loaders assert < 0)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.gate_lower_bound >= 0 or self.heads * self.kda_head_dim % 32:
            raise ValueError("KDA needs a negative gate_lower_bound and heads*kda_head_dim a multiple of 32")
        if not 0 < self.mla_layers < self.layers:
            raise ValueError("a KDA hybrid needs both kinds of layer among its layers")

    def is_mla(self, i: int) -> bool:
        raise NotImplementedError

    @property
    def kv_head_counts(self) -> list[int]:
        """One a block: 1 for an MLA layer (one latent "head"), 0 for KDA."""
        return [1 if self.is_mla(i) else 0 for i in range(self.blocks)]

    @property
    def mla_layers(self) -> int:
        return sum(self.is_mla(i) for i in range(self.layers))

    @property
    def recurrent_state(self) -> int:
        return kda_state_bytes(self.heads, self.kda_head_dim, self.ssm_conv, self.layers - self.mla_layers)

    def metadata(self, writer: gguf.GGUFWriter) -> None:
        super().metadata(writer)
        arch = self.arch
        writer.add_ssm_conv_kernel(self.ssm_conv)
        writer.add_uint32(f"{arch}.kda.head_dim", self.kda_head_dim)
        writer.add_float32(f"{arch}.kda.gate_lower_bound", self.gate_lower_bound)

    def kda_convolutions(self, p: str) -> Iterator[Tensor]:
        """The KDA layer's q/k/v: a projection and a short convolution each."""
        h, inner = self.hidden, self.heads * self.kda_head_dim
        for x in "qkv":
            yield f"{p}.ssm_conv1d_{x}.weight", (self.ssm_conv, 1, inner, 1), "conv"
            yield f"{p}.attn_{x}.weight", (h, inner), "quant"


@dataclass(frozen=True)
class KimiK3Shape(KdaHybridShape):
    """kimi-k3 (Kimi-K3; mainline only): KDA in most layers (its decay low-rank, its output gate full-rank),
    MLA with a sigmoid output gate in every `attention_every`-th layer and the last; a latent MoE (the routed
    experts run `latent` wide between a down and an up projection, the router and the shared experts read the
    full width); cross-layer attention residuals (a score vector before attention, before the FFN and before
    the output norm). Its routed scale (1.0) and norm epsilon (1e-5) are left at DeepSeek's: they change no
    size. Mainline's src/models/kimi-k3.cpp at 0c1e57098."""

    arch: ClassVar[str] = "kimi-k3"
    heads: int = 4
    kda_head_dim: int = 64
    attention_every: int = 4
    shared_experts: int = 2
    latent: int = 128  # expert_latent_length (routed_expert_hidden_size)
    attn_res_block: int = 2  # attn_res.block_size (0: no cross-layer residuals)
    situ_beta: float = 4.0  # the situ activation's (activation.situ_beta, situ_linear_beta)
    situ_linear_beta: float = 25.0

    def __post_init__(self) -> None:
        if self.latent % 32 or self.attention_every < 2:
            raise ValueError("kimi-k3's latent must be a multiple of 32 and attention_every 2 or more")
        super().__post_init__()

    def is_mla(self, i: int) -> bool:
        """Its config's full_attn_layers: every `attention_every`-th (1-indexed) and the last."""
        return (i + 1) % self.attention_every == 0 or i == self.layers - 1

    def metadata(self, writer: gguf.GGUFWriter) -> None:
        super().metadata(writer)
        arch = self.arch
        writer.add_uint32(f"{arch}.expert_latent_length", self.latent)
        writer.add_uint32(f"{arch}.attn_res.block_size", self.attn_res_block)
        writer.add_float32(f"{arch}.activation.situ_beta", self.situ_beta)
        writer.add_float32(f"{arch}.activation.situ_linear_beta", self.situ_linear_beta)

    def tensors(self, n_vocab: int) -> Iterator[Tensor]:
        yield from super().tensors(n_vocab)
        if self.attn_res_block:
            yield "output_res_score.weight", (self.hidden,), "f32"

    def layer(self, i: int) -> Iterator[Tensor]:
        p, h = f"blk.{i}", self.hidden
        inner, d = self.heads * self.kda_head_dim, self.kda_head_dim
        yield f"{p}.attn_norm.weight", (h,), "norm"
        yield f"{p}.ffn_norm.weight", (h,), "norm"
        if self.attn_res_block:
            yield f"{p}.attn_res_score.weight", (h,), "f32"
            yield f"{p}.ffn_res_score.weight", (h,), "f32"
        if self.is_mla(i):
            yield from self.mla_attention(p)
            yield f"{p}.attn_gate.weight", (h, self.heads * self.v_head_dim), "quant"
        else:
            yield from self.kda_convolutions(p)
            yield f"{p}.ssm_f_a.weight", (h, d), "quant"
            yield f"{p}.ssm_f_b.weight", (d, inner), "quant"
            yield f"{p}.ssm_beta.weight", (h, self.heads), "quant"
            yield f"{p}.ssm_a", (self.heads,), "decay"  # -exp(A_log), as the converter folds it
            yield f"{p}.ssm_dt.bias", (inner,), "f32"
            yield f"{p}.ssm_g.weight", (h, inner), "quant"
            yield f"{p}.ssm_norm.weight", (d,), "norm"
            yield f"{p}.attn_output.weight", (inner, h), "quant"
        if i < self.dense_layers:
            yield from swiglu(p, "", h, self.dense_ffn)
            return
        yield f"{p}.ffn_gate_inp.weight", (h, self.experts), "f32"
        yield f"{p}.exp_probs_b.bias", (self.experts,), "f32"
        yield f"{p}.ffn_gate_exps.weight", (self.latent, self.expert_ffn, self.experts), "quant"
        yield f"{p}.ffn_up_exps.weight", (self.latent, self.expert_ffn, self.experts), "quant"
        yield f"{p}.ffn_down_exps.weight", (self.expert_ffn, self.latent, self.experts), "quant"
        yield f"{p}.ffn_routed_down.weight", (h, self.latent), "quant"
        yield f"{p}.ffn_routed_up.weight", (self.latent, h), "quant"
        yield f"{p}.ffn_routed_norm.weight", (self.latent,), "norm"
        yield from swiglu(p, "_shexp", h, self.expert_ffn * self.shared_experts)


# Kimi-K3 (its config.json's text_config, as another engine's tests quote it): 93 layers (layer 0 dense,
# 33792 wide), hidden 7168, 96 heads (MLA: q_lora 1536, kv_lora 512, 128 + 64 rope, value 128; KDA: heads of
# 128, a 4-tap convolution), MLA in every 4th layer and the last (24 of 93), 896 experts of 3072 at a latent
# width of 3584, top-16, 2 shared, attention-residual blocks of 12, vocabulary 163840, context 1048576;
# 2779.5B parameters, 105.4B active (its card: 2.8T, 104B).
# fmt: off
KIMI_K3 = KimiK3Shape(
    layers=93, hidden=7168, heads=96, q_lora=1536, kda_head_dim=128, expert_ffn=3072, experts=896,
    experts_used=16, latent=3584, dense_ffn=33792, attn_res_block=12, context=1_048_576, quant="Q4_0",
    vocab=163840,
)
# fmt: on
# Layers 0-2 KDA (0 dense), 3 MLA: each kind of layer, residual blocks of 2.
KIMI_K3_TINY = KimiK3Shape(layers=4, context=KIMI_K3.context)
