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

import gguf

from builder.models.planner import kda_state_bytes
from builder.models.synth_shapes import DeepSeek2Shape, Tensor


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
