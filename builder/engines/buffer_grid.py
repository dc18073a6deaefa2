"""A compute buffer as an engine logged it at the corners of a (context, micro-batch) rectangle, for the
architectures measured that way (`compute_buffers`): read between them bilinearly, and outside them along
the same lines.

Ggml's allocator sizes the buffer by its largest stage, whose terms are a constant, one per micro-batch
token, one per cached token (MLA's decompression) and one per both (the attention mask, ub x ctx): a
bilinear form, which four corners fix. Where the corner of the short context at the other micro-batch was
not run, it is completed as the larger of what the context's two forms of term give: the mask's alone (it
grows with the micro-batch), as mainline logged it to the MiB for GLM-4.6, MiniMax-M2 (GQA) and Kimi-K2
(MLA), or one in the context alone, as ik_llama.cpp's -mla 3 has (it decompresses the whole cache; its
MLA cases run all four corners, bench/results/family-buffers-2026-12-0{4,5}/cases). The larger never plans
under either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from builder.models.facts import ModelFacts

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

    @property
    def corners_run(self) -> int:
        """Corners run on the device (the fourth completed where it was not)."""
        return 3 if self.short_other is None else 4

    def corners(self) -> tuple[float, float, float, float]:
        """The four corners' MiB: (ctx, ubatch), (ctx, other), (low_ctx, ubatch), (low_ctx, other)."""
        if self.short_other is not None:
            return self.at_preset, self.other, self.short, self.short_other
        context_term = self.at_preset - self.short
        as_mask = self.other - context_term * self.other_ubatch / self.ubatch
        return self.at_preset, self.other, self.short, max(as_mask, self.other - context_term)

    def size(self, ctx: int, ubatch: int) -> tuple[int, bool]:
        """The buffer at (ctx, ubatch) in bytes, and whether that lies within the corners measured."""
        high, high_other, low, low_other = self.corners()
        x = (ctx - self.low_ctx) / (self.ctx - self.low_ctx)  # 0 at the short context, 1 at the preset's
        y = (ubatch - self.ubatch) / (self.other_ubatch - self.ubatch)  # 0 at the preset's micro-batch
        mib = (1 - x) * ((1 - y) * low + y * low_other) + x * ((1 - y) * high + y * high_other)
        ubatches = sorted((self.ubatch, self.other_ubatch))
        inside = self.low_ctx <= ctx <= self.ctx and ubatches[0] <= ubatch <= ubatches[1]
        return int(max(mib, 0.0) * MIB), inside


@dataclass(frozen=True)
class PoolLine:
    """What ik_llama.cpp's CUDA pool grew by in prefill (nvidia-smi after a prompt less after load), MiB,
    for `arch` (of `heads`, where that tells two apart) at -ub `ubatch`: a line through two prompts'
    growth, most of it with the first micro-batch."""

    arch: str
    heads: int | None
    ubatch: int
    short: tuple[int, float]  # (prompt tokens, MiB)
    long: tuple[int, float]

    def mib(self, prompt: int) -> float:
        """The growth after a prompt of `prompt` tokens, along the line."""
        (x0, y0), (x1, y1) = self.short, self.long
        return y0 + (y1 - y0) * (prompt - x0) / (x1 - x0)


Measured = TypeVar("Measured", Grid, PoolLine)


def measured_for(measured: tuple[Measured, ...], facts: ModelFacts) -> Measured | None:
    """What was measured for the model's architecture (and head count, where it names one)."""
    for entry in measured:
        if entry.arch == facts.arch and entry.heads in (None, facts.heads):
            return entry
    return None


# Mainline llama.cpp 0c1e57098 on the H200 (bench/results/family-buffers-2026-12-04 and -05: native build
# with the images' configure arguments, each family's preset stack, `CUDA0 compute buffer size`), slices of 4
# layers (6 for Ling-3: its five KDA layers and an MLA one) at the real widths with 16 experts and the
# synthetic vocabulary: the layers' stage at the preset's context and micro-batch, at the other micro-batch
# (512 or 2048) and at a quarter of the context.
MAINLINE_GRIDS = (
    Grid("glm4moe", None, 32768, 8192, 2048, 512, 1232.12, 318.09, 1136.12),  # GLM-4.6
    Grid("gpt-oss", None, 65536, 16384, 2048, 512, 773.26, 313.73, 562.45),  # gpt-oss-120b
    Grid("minimax-m2", None, 32768, 8192, 2048, 512, 608.12, 196.21, 512.12),  # MiniMax-M2
    Grid("glm-dsa", None, 32768, 8192, 2048, 512, 1428.10, 384.07, 1228.10),  # GLM-5
    Grid("qwen35moe", None, 32768, 8192, 512, 2048, 264.39, 1012.55, 248.14),  # Qwen3.5-397B-A17B
    # Kimi-K2: R1's layout at 64 heads, where R1's fit (128 heads) said 1644 MiB for 1262.
    Grid("deepseek2", 64, 32768, 8192, 2048, 512, 1262.02, 346.01, 1166.02),
    Grid("deepseek4", None, 131072, 32768, 2048, 512, 1172.03, 290.26, 1086.28),  # DeepSeek-V4-Flash
    Grid("deepseek32", None, 32768, 8192, 2048, 512, 2572.10, 670.07, 2353.10),  # DeepSeek-V3.2
    Grid("bailingmoe2", None, 32768, 8192, 2048, 512, 1616.12, 384.09, 1456.43),  # Ling-1T
    Grid("bailingmoe3", None, 131072, 32768, 512, 2048, 410.95, 1165.19, 206.95),  # Ling-3.0-flash
    Grid("kimi-k3", None, 131072, 32768, 512, 2048, 710.50, 2046.50, 518.50),  # Kimi-K3
    # MiniMax-M3: its sparse attention's prefill scores are a micro-batch against the context (x4 from 16k
    # to 64k at -ub 512), the bilinear term.
    Grid("minimax-m3", None, 65536, 16384, 512, 2048, 1256.85, 5026.40, 344.66),
)
# ik_llama.cpp 55d3c05 likewise (bench/results/family-buffers-2026-12-05), at its presets' -mla 3 where
# the model has MLA (GLM-5 and Kimi-K2 at all four corners: their context's term is largely the cache's
# decompression, 169 and 97 KiB a token, not the mask's).
IK_GRIDS = (
    Grid("glm4moe", None, 32768, 8192, 2048, 512, 787.51, 315.00, 691.51),  # GLM-4.6
    Grid("gpt-oss", None, 65536, 16384, 2048, 512, 911.39, 312.14, 527.39),  # gpt-oss-120b
    Grid("minimax-m2", None, 32768, 8192, 2048, 512, 545.38, 197.10, 449.38),  # MiniMax-M2
    Grid("glm-dsa", None, 32768, 8192, 2048, 512, 5904.13, 5508.03, 1776.13, 1452.03),  # GLM-5
    Grid("qwen35moe", None, 32768, 8192, 512, 2048, 196.02, 664.34, 196.02),  # Qwen3.5-397B-A17B
    Grid("deepseek2", 64, 32768, 8192, 2048, 512, 3560.13, 3194.03, 1160.13, 866.03),  # Kimi-K2
    Grid("bailingmoe2", None, 32768, 8192, 2048, 512, 1184.32, 384.08, 1088.32),  # Ling-1T, -ger
)
# ik_llama.cpp's pool after a 2545- and a 20346-token prompt (bench/results/family-buffers-2026-12-05 and
# seed-models-2026-12-02 for R1), at each preset's -ub: the first micro-batch grows it most (GLM-5 916 MiB,
# then 166 more over 17801 tokens); R1's 128 heads grow it by 44 KiB a prompt token, Kimi-K2's 64 by 7.
IK_POOLS = (
    PoolLine("glm4moe", None, 2048, (2545, 788.0), (20346, 854.0)),  # GLM-4.6
    PoolLine("gpt-oss", None, 2048, (2545, 270.0), (20346, 304.0)),  # gpt-oss-120b
    PoolLine("minimax-m2", None, 2048, (2545, 396.0), (20346, 460.0)),  # MiniMax-M2
    PoolLine("glm-dsa", None, 2048, (2545, 916.0), (20346, 1082.0)),  # GLM-5
    PoolLine("qwen35moe", None, 512, (2545, 104.0), (20346, 140.0)),  # Qwen3.5-397B-A17B
    PoolLine("deepseek2", 64, 2048, (2545, 464.0), (20346, 590.0)),  # Kimi-K2
    PoolLine("deepseek2", 128, 2048, (2545, 464.0), (20346, 1246.0)),  # DeepSeek-R1
    PoolLine("bailingmoe2", None, 2048, (2545, 634.0), (20346, 636.0)),  # Ling-1T
)
