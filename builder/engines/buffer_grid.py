"""A compute buffer as an engine logged it at the corners of a (context, micro-batch) rectangle, for the
architectures measured that way (`compute_buffers`): read between them bilinearly, and outside them along
the same lines.

Ggml's allocator sizes the buffer by its largest stage, whose terms are a constant, one per micro-batch
token, one per cached token (MLA's decompression) and one per both (the attention mask, ub x ctx): a
bilinear form, which four corners fix. Where the corner of the short context at the other micro-batch was
not run, it is completed on the assumption that the context's term is the mask's alone (it grows with the
micro-batch), as mainline logged it to the MiB for GLM-4.6, MiniMax-M2 (GQA) and Kimi-K2 (MLA);
ik_llama.cpp's -mla 3 has a term in the context alone (it decompresses the whole cache), so its cases run
all four corners (bench/device/family_buffers.cases).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from builder.models.planner import ModelFacts

MIB = 1024**2


@dataclass(frozen=True)
class Grid:
    """MiB logged for `arch` (of `heads` attention heads, where that tells two models of one architecture
    apart) at (ctx, ubatch): `low_ctx`/`ctx` x `ubatch`/`other_ubatch`; `short_other` the corner of the
    short context at the other micro-batch, None where it was not run."""

    arch: str
    heads: int | None
    ctx: int
    low_ctx: int
    ubatch: int
    other_ubatch: int
    at_preset: float  # (ctx, ubatch)
    other: float  # (ctx, other_ubatch)
    short: float  # (low_ctx, ubatch)
    short_other: float | None = None

    def corners(self) -> tuple[float, float, float, float]:
        """The four corners' MiB: (ctx, ubatch), (ctx, other), (low_ctx, ubatch), (low_ctx, other)."""
        if self.short_other is not None:
            return self.at_preset, self.other, self.short, self.short_other
        per_token_and_cached = (self.at_preset - self.short) / (self.ubatch * (self.ctx - self.low_ctx))
        completed = self.other - per_token_and_cached * self.other_ubatch * (self.ctx - self.low_ctx)
        return self.at_preset, self.other, self.short, completed

    def size(self, ctx: int, ubatch: int) -> tuple[int, bool]:
        """The buffer at (ctx, ubatch) in bytes, and whether that lies within the corners measured."""
        high, high_other, low, low_other = self.corners()
        x = (ctx - self.low_ctx) / (self.ctx - self.low_ctx)  # 0 at the short context, 1 at the preset's
        y = (ubatch - self.ubatch) / (self.other_ubatch - self.ubatch)  # 0 at the preset's micro-batch
        mib = (1 - x) * ((1 - y) * low + y * low_other) + x * ((1 - y) * high + y * high_other)
        ubatches = sorted((self.ubatch, self.other_ubatch))
        inside = self.low_ctx <= ctx <= self.ctx and ubatches[0] <= ubatch <= ubatches[1]
        return int(max(mib, 0.0) * MIB), inside


def grid_for(grids: tuple[Grid, ...], facts: ModelFacts) -> Grid | None:
    """The grid measured for the model's architecture (and head count, where a grid names one)."""
    for grid in grids:
        if grid.arch == facts.arch and grid.heads in (None, facts.heads):
            return grid
    return None


# Mainline llama.cpp 0c1e57098 on the H200 (bench/results/family-buffers-2026-12-04: native build with the
# images' configure arguments, each family's preset stack, `CUDA0 compute buffer size`), slices of 4
# layers at the real widths with 16 experts and the synthetic vocabulary: the layers' stage at the preset's
# context and micro-batch, at the other micro-batch (512 or 2048) and at a quarter of the context.
MAINLINE_GRIDS = (
    Grid("glm4moe", None, 32768, 8192, 2048, 512, 1232.12, 318.09, 1136.12),  # GLM-4.6
    Grid("gpt-oss", None, 65536, 16384, 2048, 512, 773.26, 313.73, 562.45),  # gpt-oss-120b
    Grid("minimax-m2", None, 32768, 8192, 2048, 512, 608.12, 196.21, 512.12),  # MiniMax-M2
    Grid("glm-dsa", None, 32768, 8192, 2048, 512, 1428.10, 384.07, 1228.10),  # GLM-5
    Grid("qwen35moe", None, 32768, 8192, 512, 2048, 264.39, 1012.55, 248.14),  # Qwen3.5-397B-A17B
    # Kimi-K2: R1's layout at 64 heads, where R1's fit (128 heads) said 1644 MiB for 1262.
    Grid("deepseek2", 64, 32768, 8192, 2048, 512, 1262.02, 346.01, 1166.02),
    Grid("deepseek4", None, 131072, 32768, 2048, 512, 1172.03, 290.26, 1086.28),  # DeepSeek-V4-Flash
)
