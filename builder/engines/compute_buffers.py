"""The GPU compute buffer each llama.cpp-family engine allocates for a hybrid stack (all layers on the
GPU, routed experts on the CPU).

Both engines size it by reserving their worst-case graph, a full micro-batch (`-ub`) of tokens; ggml's
allocator reuses memory along the graph, so the buffer is its largest stage, not a sum:
- attention's: the mask, MLA's decompression, the activations per micro-batch token. Fitted to the sizes
  the engines logged for slices of the real widths (bench/results/seed-models-2026-12-01, -01b and -01c on
  the H200, ik-ab-2026-12-06 on an H100: native builds with the images' configure arguments, the presets'
  stacks, `CUDA0 compute buffer size`). Depth does not move it (8 and 16 layers logged the same). Each fit
  names its points; the runs it was not fitted to are held to it in tests/unit/test_held_out_buffers.py.
- prefill's MoE stage: the scheduler copies a CPU-resident weight into the GPU's compute buffer for the
  op it offloads (ggml-backend.cpp, the split inputs), one expert tensor for mainline's MUL_MAT_ID, two
  for ik_llama.cpp's fused up/gate, beside the experts' activations. The copy grows with the experts a
  layer has, and the slices had fewer than the real models: on Qwen3-235B widths it is ik's peak (32
  experts 288 MiB, 128 experts 936 MiB at 16k/512: the difference is the two tensors' growth), on R1
  widths it is not (32 and 64 experts logged the same on both engines), so there the plan takes the
  larger of the fitted stage and this one, moved to the model's expert count (an estimate).
- the output: ik_llama.cpp reserves every micro-batch token's logits and two hidden-state rows, f32
  (2048 x (151936 + 2 x 4096) x 4 B = 1251.0 MiB, logged to the MiB with Qwen3's vocabulary); mainline's
  server reserves its slots' outputs only (`n_outputs_max = 1`: its buffer did not move, 341 or 151936
  tokens).
Where nothing was measured, a flat reserve stands and the plan says it is an estimate.

Beside the buffers, prefill grows the CUDA memory pool (ggml-cuda's temporaries, kept at their high-water
mark) past what the engine held at load: `prefill_pool`.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import NamedTuple

from builder.engines.buffer_grid import IK_GRIDS, IK_POOLS, MAINLINE_GRIDS, Grid, measured_for
from builder.models.facts import ModelFacts

MIB = 1024**2
KIB = 1024
# The CUDA context, cuBLAS workspace and allocator slack beside the logged buffers: nvidia-smi showed
# 603 MiB (mainline) and 993 MiB (ik_llama.cpp) over the buffers' sum on the H200.
CUDA_CONTEXT_BYTES = 1024 * MIB
# Unmeasured: with the context, the flat 2 GiB reserve moe-stack kept before any buffer was measured.
UNMEASURED_BYTES = 1024 * MIB
R1_HEADS = 128
F32_BYTES = 4
F16_MASK_BYTES = 2  # the attention mask: ubatch x context, f16 (mainline's fits show exactly this term)
# One routed-expert tensor (ffn_up/gate/down_exps of a layer) of the slices the fits were measured on:
# 32 (R1, Qwen3-235B) or 128 (Qwen3-Next) experts of the real widths, Q4_0 (18 bytes per 32 weights).
SLICE_EXPERT_TENSOR_BYTES = {
    "deepseek2": 32 * 7168 * 2048 * 18 // 32,  # 252 MiB
    "qwen3moe": 32 * 4096 * 1536 * 18 // 32,  # 108 MiB
    "qwen3next": 128 * 2048 * 512 * 18 // 32,  # 72 MiB
}
# Where a slice's logged peak was prefill's MoE stage (LayerStage.moe_peak: the fit then holds the slice's
# copy): measured for Qwen3-235B (ik: 32 vs 128 experts differ by the copies);
# assumed for Qwen3-Next, whose expert count never varied. R1's widths: attention peaked on mainline and on
# ik 55d3c05 (32 → 64 experts moved neither buffer, 1158.1 / 3412 MiB at 16k/1024); on ik 8337e4c, whose
# attention no longer decompresses the whole cache, what the MoE stage gives from the sources (the two
# 252 MiB tensors and the activations at R1's widths: 614, 855, 1336 and 2298 MiB at -ub 512, 1024, 2048,
# 4096) is what it logged (602, 788, 1352-1464, 2137): taken as its peak, the expert count not yet varied.
# ik's MoE activations on Qwen3-235B widths (hidden 4096): 72 MiB at -ub 512, 544 at 2048 (above).
MOE_ACTIVATIONS_MIB = ((512, 72.0), (2048, 544.0))
MOE_ACTIVATIONS_WIDTHS = (4096, 1536, 8)  # hidden, expert width, experts a token uses: Qwen3-235B's
# Mainline on R1 widths, the layers' stage less the mask, at the micro-batches measured (MiB): 622 at
# 32k/512, 1158 at 16k/1024, 1644 at 32k/2048 (and 1548 at 8k/2048, which the mask term predicts).
# It is not linear in -ub (+536 MiB from 512 to 1024, +390 from 1024 to 2048): interpolated.
MAINLINE_R1_LAYERS_MIB = ((512, 590.0), (1024, 1126.1), (2048, 1516.0))
# Prefill's pool growth, nvidia-smi after prompts less after load: ik_llama.cpp's lines per architecture
# (buffer_grid.IK_POOLS); elsewhere Qwen3-235B's +520 and +536 MiB (12155 tokens, -ub 2048,
# bench/results/seed-models-2026-12-02), Qwen3-Next's never measured, the same assumed. Mainline on R1
# widths +242 both times: with its 603 MiB at load, inside CUDA_CONTEXT_BYTES.
IK_POOL_MIB = 536.0
POOL_UBATCH = 2048  # the micro-batch that was measured at
# ik_llama.cpp 8337e4c's -mla 3 on R1 widths (bench/results/ik-ab-2026-12-06, H100, r1-8 and r1-16): the
# micro-batch sets the buffer and the context barely moves it (-ub 2048: 1352, 1464 and 1449 MiB at 8k, 36k
# and 64k), so the fit is the largest logged at each micro-batch over 8k-64k. Fitted to r1-8 at 32k/512,
# 32k/1024, 8k/2048, 64k/2048 and 32k/4096; the runs held out (r1-8 at 36k/2048, r1-16 at 16k/1024,
# 32k/2048 and 32k/4096) come within -1 % to +10 %. The pin before (55d3c05) decompressed the whole cache
# for prefill, a term in the context: 7672 MiB at 36k/2048, 5.2 times this tree's.
IK_R1_LAYERS_MIB = ((512, 602.12), (1024, 788.23), (2048, 1448.76), (4096, 2137.52))
IK_R1_CONTEXTS = (8192, 65536)  # the contexts it was measured over


# The fits' error on runs they were not fitted to (bench/results/ik-ab-2026-12-06, held to them in
# tests/unit/test_held_out_buffers.py): -12 % (ik on Qwen3-235B widths at 64k/4096, beyond the micro-batches
# measured) to +10 % (ik on R1's 16-layer slice at 32k/2048). A shortfall that size on these buffers (191 MiB)
# is inside the 1 GiB every plan leaves free (planner.DEFAULT_VRAM_MARGIN).
HELD_OUT_ERROR = 0.13


@dataclass(frozen=True)
class ComputeEstimate:
    bytes: int
    measured: bool  # from a fit to this engine's logs for this architecture, within its measured range
    basis: str  # what it was fitted to, for the plan's output


class LayerStage(NamedTuple):
    """The layers' stage as an engine's slices logged it, for a model's facts, the context and micro-batch."""

    bytes: int
    inside: bool  # (ctx, ubatch) within the range it was measured over
    basis: str  # what it was fitted to
    moe_peak: bool = False  # the peak logged was prefill's MoE stage: it holds the slice's expert copy


# A fit: for a model's facts, the context, the micro-batch and whether the cache is MLA's latent, its
# stage, or None where the engine was never measured on that architecture.
LayerFit = Callable[["ModelFacts", int, int, bool], "LayerStage | None"]


@dataclass(frozen=True)
class BufferFits:
    """What an engine's logs measured of its CUDA buffers (its adapter's `buffer_fits`)."""

    layers: LayerFit | None = None  # None: never measured, a flat estimate stands
    copied_expert_tensors: int = 1  # expert tensors an offloaded op copies at once
    logits_in_buffer: bool = False  # a full micro-batch's logits in the buffer (`output_stage`)
    pool_grows: bool = False  # prefill grows its CUDA pool past the context's allowance (`prefill_pool`)
    activation_scale: float = 1.0  # its MoE activations against ik's (`moe_activations`)
    indexer_scores_in_pool: bool = False  # a sparse-attention indexer's scores grow the pool (`prefill_pool`)


def gpu_compute(fits: BufferFits, facts: ModelFacts, ctx: int, ubatch: int, latent: bool) -> ComputeEstimate:
    """An engine's CUDA compute buffer (`fits`: what its logs measured) for a stack of `facts` at `ctx`
    tokens and micro-batch `ubatch` (`latent`: the MLA cache); what no fit measured is called an estimate,
    with the error the held-out runs showed."""
    estimate = _compute(fits, facts, ctx, ubatch, latent)
    if estimate.measured or "estimate" in estimate.basis:
        return estimate
    return replace(
        estimate,
        basis=f"{estimate.basis}; an estimate (held-out runs missed by up to {HELD_OUT_ERROR:.0%})",
    )


def _compute(fits: BufferFits, facts: ModelFacts, ctx: int, ubatch: int, latent: bool) -> ComputeEstimate:
    fitted = fits.layers(facts, ctx, ubatch, latent) if fits.layers is not None else None
    if fitted is None:
        return unmeasured(fits, facts, ubatch)
    logged, measured, basis, peaks_in_moe = fitted
    model_copy = expert_copy(fits, max(facts.expert_bytes, default=0) // 3)
    stage = logged
    slice_copy = expert_copy(fits, SLICE_EXPERT_TENSOR_BYTES[facts.arch]) if peaks_in_moe else 0
    if peaks_in_moe and model_copy != slice_copy:
        stage = max(0, logged - slice_copy) + model_copy
        measured = False
        basis += f", prefill's expert copy moved to this model's {size_mib(model_copy)} (from the sources)"
    elif not peaks_in_moe:
        moe = model_copy + moe_activations(fits, facts, ubatch)
        if moe > stage:
            stage, measured = moe, False
            basis = (
                f"prefill's MoE stage: this model's expert copy ({size_mib(model_copy)}) and activations, "
                f"from the sources, larger than attention's ({basis})"
            )
    output = output_stage(fits, facts, ubatch)
    if output > stage:
        return ComputeEstimate(  # its form held to the MiB (Qwen3's vocabulary, -ub 2048, H200)
            output,
            True,
            f"the output stage ({facts.vocab}-token vocabulary x {ubatch}-token micro-batch, f32), larger "
            f"than the layers' ({basis})",
        )
    return ComputeEstimate(stage, measured, basis)


def unmeasured(fits: BufferFits, facts: ModelFacts, ubatch: int) -> ComputeEstimate:
    """No fit for this engine and architecture: the larger of the flat reserve and what the sources say
    any architecture's micro-batch needs (prefill's copy of the largest expert tensor and the experts'
    activations; ik's logits): at GLM's, gpt-oss's and MiniMax's widths and -ub 2048 those exceed 1 GiB."""
    copy = expert_copy(fits, max(facts.expert_bytes, default=0) // 3)
    stages = max(copy + moe_activations(fits, facts, ubatch), output_stage(fits, facts, ubatch))
    if stages <= UNMEASURED_BYTES:
        return ComputeEstimate(
            UNMEASURED_BYTES, False, "not measured for this engine and architecture: an estimate"
        )
    return ComputeEstimate(
        stages,
        False,
        "not measured for this engine and architecture: an estimate from the sources (prefill's expert "
        f"copy {size_mib(copy)} and activations, or the output stage), larger than the flat 1 GiB",
    )


def _measured_grid(
    grids: tuple[Grid, ...], engine: str, facts: ModelFacts, ctx: int, ubatch: int, latent: bool
) -> LayerStage | None:
    """The layers' stage from the engine's grid for the model's architecture (an MLA model's measured with
    its latent cache, the presets' form), None where there is none."""
    grid = measured_for(grids, facts)
    if grid is None or (facts.mla_dim is not None and not latent):
        return None
    at, inside = grid.size(ctx, ubatch)
    return LayerStage(
        at, inside, f"{engine} on {facts.arch} widths (H200, {grid.corners_run} points, 16-expert slices)"
    )


def _ik_layers(facts: ModelFacts, ctx: int, ubatch: int, latent: bool) -> LayerStage | None:
    """ik_llama.cpp's layers' stage (a LayerFit)."""
    if (gridded := _measured_grid(IK_GRIDS, "ik_llama.cpp 55d3c05", facts, ctx, ubatch, latent)) is not None:
        return gridded
    if facts.arch == "deepseek2" and latent:
        (low_ctx, high_ctx), ubatches = IK_R1_CONTEXTS, [point[0] for point in IK_R1_LAYERS_MIB]
        inside = (
            low_ctx <= ctx <= high_ctx and ubatches[0] <= ubatch <= ubatches[-1] and facts.heads == R1_HEADS
        )
        size = interpolate(IK_R1_LAYERS_MIB, ubatch) * MIB
        basis = "ik_llama.cpp 8337e4c -mla 3 on DeepSeek-R1 widths (H100, 5 points, 4 held out)"
        return LayerStage(int(size), inside, basis, moe_peak=True)
    if facts.arch == "qwen3next":
        # The same at -ub 512 and 2048 (the recurrent layers split the batch themselves), linear in the
        # context: 8k, 32k and 131k, within 3 % (ik 233/257/363 MiB).
        size = 222.85 * MIB + ctx * 1.0893 * KIB
        return LayerStage(
            int(size), True, "ik_llama.cpp on Qwen3-Next widths (H200, 3 contexts, 2 -ub)", True
        )
    if facts.arch == "qwen3moe":
        # 760 MiB at 16k/2048 with 32 experts; 936 at 16k/512 with 128 (two 432 MiB tensors copied,
        # bench/results/cuda-images-2026-11-30): less their copies, 544 and 72 MiB of activations (ik's
        # CPU build, which copies nothing, logged 544.02 MiB for the 32-expert file at 16k/2048).
        # 288 MiB at 16k/512 with 32 experts checks it (bench/results/seed-models-2026-12-01c).
        activations = max(0.0, interpolate(MOE_ACTIVATIONS_MIB, ubatch)) * MIB
        size = activations + expert_copy(IK_BUFFERS, SLICE_EXPERT_TENSOR_BYTES["qwen3moe"])
        return LayerStage(
            int(size), 512 <= ubatch <= 2048, "ik_llama.cpp on Qwen3-235B widths (H200, 3 points)", True
        )
    return None


def _mainline_layers(facts: ModelFacts, ctx: int, ubatch: int, latent: bool) -> LayerStage | None:
    """Mainline llama.cpp's layers' stage (a LayerFit)."""
    if (gridded := _measured_grid(MAINLINE_GRIDS, "llama.cpp", facts, ctx, ubatch, latent)) is not None:
        return gridded
    if facts.arch == "deepseek2" and latent:
        inside = MAINLINE_R1_LAYERS_MIB[0][0] <= ubatch <= MAINLINE_R1_LAYERS_MIB[-1][0]
        size = interpolate(MAINLINE_R1_LAYERS_MIB, ubatch) * MIB + ubatch * ctx * F16_MASK_BYTES
        return LayerStage(int(size), inside, "llama.cpp on DeepSeek-R1 widths (H200, 4 points; -ub 512-2048)")
    if facts.arch == "qwen3next":
        # As ik's (above): mainline 165/225/513 MiB at 8k, 32k and 131k.
        size = 136.79 * MIB + ctx * 2.9286 * KIB
        return LayerStage(int(size), True, "llama.cpp on Qwen3-Next widths (H200, 3 contexts, 2 -ub)", True)
    if facts.arch == "qwen3moe":
        # 244 MiB at 16k/512, 908 at 16k/2048; 972 at 32k/2048 is the mask term's check (+64 MiB).
        size = 22.7 * MIB + ubatch * 0.40106 * MIB + ubatch * ctx * F16_MASK_BYTES
        return LayerStage(
            int(size), 512 <= ubatch <= 2048, "llama.cpp on Qwen3-235B widths (H200, 3 points)", True
        )
    return None


# Mainline's MUL_MAT_ID copies one expert tensor, ik's fused up/gate two (ik's CPU build, which copies
# nothing, logged the 544 MiB of activations that ik's CUDA 760 MiB less two 108 MiB tensors leaves;
# Qwen3-235B widths, 32 experts, 16k/2048).
# Mainline's activations: MiniMax-M2's slice with its 256 experts logged 1160 MiB at 32k/2048 (the 16-expert
# slice 608), its one 648 MiB expert tensor copied and 512 MiB of activations, where ik's moved to its
# widths (3072, 1536, 8) say 480 (bench/results/family-buffers-2026-12-04; one point).
MAINLINE_BUFFERS = BufferFits(_mainline_layers, activation_scale=512.0 / 480.0, indexer_scores_in_pool=True)
IK_BUFFERS = BufferFits(_ik_layers, copied_expert_tensors=2, logits_in_buffer=True, pool_grows=True)


def expert_copy(fits: BufferFits, tensor_bytes: int) -> int:
    """What prefill's offload copies into the compute buffer: `tensor_bytes` (one layer's ffn_*_exps
    tensor) times the tensors an offloaded op takes."""
    return fits.copied_expert_tensors * tensor_bytes


def size_mib(n_bytes: int) -> str:
    return f"{n_bytes / MIB:.0f} MiB"


def output_stage(fits: BufferFits, facts: ModelFacts, ubatch: int) -> int:
    """ik_llama.cpp: a full micro-batch's logits and two hidden-state rows a token, f32. Mainline's server
    reserves one output a slot: nothing the other stages don't hold."""
    if not fits.logits_in_buffer:
        return 0
    return ubatch * (facts.vocab + 2 * facts.hidden) * 4


def moe_activations(fits: BufferFits, facts: ModelFacts, ubatch: int) -> int:
    """The routed experts' activations in prefill's MoE stage: ik's on Qwen3-235B widths (f32 rows of the
    hidden width and three of the expert's, for each expert a token uses: 4096 + 3 x 1536 floats x 8 experts
    x 2048 tokens is the 544 MiB logged), moved to the model's widths and by the engine's
    `activation_scale` (an estimate beyond the widths measured)."""
    hidden = facts.hidden or MOE_ACTIVATIONS_WIDTHS[0]
    ffn = facts.expert_ffn or MOE_ACTIVATIONS_WIDTHS[1]
    used = facts.experts_used or MOE_ACTIVATIONS_WIDTHS[2]
    measured = (MOE_ACTIVATIONS_WIDTHS[0] + 3 * MOE_ACTIVATIONS_WIDTHS[1]) * MOE_ACTIVATIONS_WIDTHS[2]
    scale = fits.activation_scale * (hidden + 3 * ffn) * used / measured
    return int(max(0.0, interpolate(MOE_ACTIVATIONS_MIB, ubatch)) * scale * MIB)


def interpolate(points: tuple[tuple[int, float], ...], x: int) -> float:
    """Piecewise linear through `points` (sorted by x), extended by the nearest segment outside them."""
    xs = [p[0] for p in points]
    i = min(max(bisect.bisect_left(xs, x), 1), len(points) - 1)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def prefill_pool(fits: BufferFits, facts: ModelFacts, ctx: int, ubatch: int, latent: bool) -> int:
    """What ik_llama.cpp's CUDA pool grows by in prefill, beyond the CUDA context's allowance, for a
    prompt as long as the context: the measured figures, kept below the micro-batch they were measured at
    (never measured there, so not lowered) and scaled with the micro-batch above it. Mainline's stays
    inside the allowance but for a sparse-attention indexer's scores."""
    if not fits.pool_grows:
        # Mainline's pool on GLM-5's widths grew by 382 MiB after a 20346-token prompt at -ub 2048, about
        # 200 more than on GLM-4.6's, gpt-oss's and MiniMax-M2's (126-190), past the context's allowance:
        # read as the indexer's f32 scores of a micro-batch against the context it has seen (one point,
        # bench/results/family-buffers-2026-12-04; the plan takes a prompt that fills the context).
        indexed = fits.indexer_scores_in_pool and facts.indexer_dim > 0
        return ubatch * ctx * F32_BYTES if indexed else 0
    line = measured_for(IK_POOLS, facts) if facts.mla_dim is None or latent else None
    mib, measured_at = (line.mib(ctx), line.ubatch) if line is not None else (IK_POOL_MIB, POOL_UBATCH)
    return int(mib * max(1.0, ubatch / measured_at) * MIB)


def gpu_reserve(fits: BufferFits, facts: ModelFacts, ctx: int, ubatch: int, latent: bool) -> int:
    """VRAM a plan keeps free beside weights and KV cache: the compute buffer, the CUDA context and
    prefill's pool growth."""
    return (
        gpu_compute(fits, facts, ctx, ubatch, latent).bytes
        + CUDA_CONTEXT_BYTES
        + prefill_pool(fits, facts, ctx, ubatch, latent)
    )
