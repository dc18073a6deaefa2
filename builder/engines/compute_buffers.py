"""The GPU compute buffer each llama.cpp-family engine allocates for a hybrid stack (all layers on the
GPU, routed experts on the CPU).

Both engines size it by reserving their worst-case graph: a full micro-batch (`-ub`) of tokens, every
one of them an output. Its peak is the larger of two stages:
- the layers': attention (the mask, MLA's decompression), the activations per micro-batch token, and
  the copy of the routed-expert weights that prefill's offload takes to the GPU (the scheduler copies a
  CPU-resident weight into the GPU's compute buffer for the op it offloads: one tensor per op, so one
  expert tensor for mainline's MUL_MAT_ID and two for ik_llama.cpp's fused up/gate; ggml-backend.cpp's
  split inputs). Fitted here to the sizes the engines logged on the H200 for slices of the real widths
  (bench/results/seed-models-2026-12-01 and -01b: native builds with the images' configure arguments,
  the presets' stacks, `CUDA0 compute buffer size`). The slices did not depend on depth (8 and 16 layers
  logged the same), but had fewer experts than the real models, so the expert copy is moved from the
  slice's tensor size to the model's (from the sources: the slices could not show it);
- the output: every token's logits and the final hidden state, f32 (both engines' reserve; ik_llama.cpp
  prints the same `n_vocab * n_ubatch * 4` as its output layer's size). The slices' vocabulary is 341
  tokens, a real one 129280 (R1) or 151936 (Qwen3): there the output stage can be the larger.
Where nothing was measured, a flat reserve stands and the plan says it is an estimate.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from builder.models.planner import ModelFacts

MIB = 1024**2
KIB = 1024
# The CUDA context, cuBLAS workspace and allocator slack beside the logged buffers: nvidia-smi showed
# 603 MiB (mainline) and 993 MiB (ik_llama.cpp) over the buffers' sum on the H200.
CUDA_CONTEXT_BYTES = 1024 * MIB
# Unmeasured: with the context, the flat 2 GiB reserve moe-stack kept before any buffer was measured.
UNMEASURED_BYTES = 1024 * MIB
R1_HEADS = 128
DEFAULT_UBATCH = 512  # both engines' -ub when a stack doesn't set one
F16_MASK_BYTES = 2  # the attention mask: ubatch x context, f16 (mainline's fits show exactly this term)
# Expert tensors copied at once for an offloaded op: mainline's MUL_MAT_ID takes one weight, ik's fused
# up/gate two.
COPIED_EXPERT_TENSORS = {"llama.cpp": 1, "ik_llama.cpp": 2}
# One routed-expert tensor (ffn_up/gate/down_exps of a layer) of the slices the fits were measured on:
# 32 (R1, Qwen3-235B) or 128 (Qwen3-Next) experts of the real widths, Q4_0 (18 bytes per 32 weights).
SLICE_EXPERT_TENSOR_BYTES = {
    "deepseek2": 32 * 7168 * 2048 * 18 // 32,  # 252 MiB
    "qwen3moe": 32 * 4096 * 1536 * 18 // 32,  # 108 MiB
    "qwen3next": 128 * 2048 * 512 * 18 // 32,  # 72 MiB
}
# Mainline on R1 widths, the layers' stage less the mask, at the micro-batches measured (MiB): 622 at
# 32k/512, 1158 at 16k/1024, 1644 at 32k/2048 (and 1548 at 8k/2048, which the mask term predicts).
# It is not linear in -ub (+536 MiB from 512 to 1024, +390 from 1024 to 2048): interpolated.
MAINLINE_R1_LAYERS_MIB = ((512, 590.0), (1024, 1126.1), (2048, 1516.0))


@dataclass(frozen=True)
class ComputeEstimate:
    bytes: int
    measured: bool  # from a fit to this engine's logs for this architecture, within its measured range
    basis: str  # what it was fitted to, for the plan's output


def gpu_compute(engine: str, facts: ModelFacts, ctx: int, ubatch: int, latent: bool) -> ComputeEstimate:
    """The engine's CUDA compute buffer for a stack of `facts` at `ctx` tokens and micro-batch `ubatch`
    (`latent`: the MLA cache)."""
    fitted = layer_stage(engine, facts, ctx, ubatch, latent)
    if fitted is None:
        return ComputeEstimate(
            UNMEASURED_BYTES, False, "not measured for this engine and architecture: an estimate"
        )
    logged, measured, basis = fitted
    slice_copy = expert_copy(engine, facts.arch, SLICE_EXPERT_TENSOR_BYTES[facts.arch])
    model_copy = expert_copy(engine, facts.arch, max(facts.expert_bytes, default=0) // 3)
    layers = max(0, logged - slice_copy) + model_copy
    if model_copy != slice_copy:  # from the sources: the slices had the one size
        measured = False
        basis += f", prefill's expert copy moved to this model's {size_mib(model_copy)} (from the sources)"
    output = output_stage(facts, ubatch)
    if output > layers:
        return ComputeEstimate(
            output,
            False,
            f"the output stage ({facts.vocab}-token vocabulary x {ubatch}-token micro-batch, f32, from the "
            f"engines' sources), larger than the layers' ({basis})",
        )
    return ComputeEstimate(layers, measured, basis)


def layer_stage(
    engine: str, facts: ModelFacts, ctx: int, ubatch: int, latent: bool
) -> tuple[int, bool, str] | None:
    """The layers' stage as the slices logged it, their expert copy in it; whether (ctx, ubatch) is in
    the range it was measured over; its basis (None: never measured)."""
    if facts.arch == "deepseek2" and latent:
        heads = (facts.heads or R1_HEADS) / R1_HEADS
        if engine == "ik_llama.cpp":
            # -mla 3 decompresses the whole cache for prefill: a term in the context. Fitted to 6888 MiB at
            # 32k/2048, 6330 at 32k/512, 1928 at 8k/2048; checked at 16k/1024 (predicted 3396, logged 3412).
            size = 275.1 * MIB + heads * (ctx * 0.17910 * MIB + ubatch * ctx * 11.63)
            return int(size), True, "ik_llama.cpp -mla 3 on DeepSeek-R1 widths (H200, 3 points and a check)"
        if engine == "llama.cpp":
            inside = MAINLINE_R1_LAYERS_MIB[0][0] <= ubatch <= MAINLINE_R1_LAYERS_MIB[-1][0]
            size = interpolate(MAINLINE_R1_LAYERS_MIB, ubatch) * MIB + ubatch * ctx * F16_MASK_BYTES
            return int(size), inside, "llama.cpp on DeepSeek-R1 widths (H200, 4 points; -ub 512-2048)"
    if facts.arch == "qwen3next" and engine in ("ik_llama.cpp", "llama.cpp"):
        # The same at -ub 512 and 2048 (the recurrent layers split the batch themselves), linear in the
        # context: 8k, 32k and 131k, within 3 % (mainline 165/225/513 MiB, ik 233/257/363).
        base, per_token = {"ik_llama.cpp": (222.85, 1.0893), "llama.cpp": (136.79, 2.9286)}[engine]
        size = base * MIB + ctx * per_token * KIB
        return int(size), True, f"{engine} on Qwen3-Next widths (H200, 3 contexts, 2 micro-batches)"
    if facts.arch == "qwen3moe" and engine == "llama.cpp":
        # 244 MiB at 16k/512, 908 at 16k/2048; 972 at 32k/2048 is the mask term's check (+64 MiB).
        size = 22.7 * MIB + ubatch * 0.40106 * MIB + ubatch * ctx * F16_MASK_BYTES
        return int(size), 512 <= ubatch <= 2048, "llama.cpp on Qwen3-235B widths (H200, 3 points)"
    if facts.arch == "qwen3moe" and engine == "ik_llama.cpp":
        # 760 MiB at 16k/2048 with 32 experts; 936 at 16k/512 with 128 (two 432 MiB tensors copied,
        # bench/results/cuda-images-2026-11-30): less their copies, 544 and 72 MiB of activations (ik's
        # CPU build, which copies nothing, logged 544.02 MiB for the 32-expert file at 16k/2048).
        activations = max(0.0, 72 + (ubatch - 512) * (544 - 72) / (2048 - 512)) * MIB
        size = activations + expert_copy(engine, facts.arch, SLICE_EXPERT_TENSOR_BYTES["qwen3moe"])
        return int(size), False, "ik_llama.cpp on Qwen3-235B widths (H200, 2 points of unlike models)"
    return None


def expert_copy(engine: str, arch: str, tensor_bytes: int) -> int:
    """What prefill's offload copies into the compute buffer: `tensor_bytes` (one layer's ffn_*_exps
    tensor) times the tensors an offloaded op takes (0 for an architecture without a fit)."""
    if arch not in SLICE_EXPERT_TENSOR_BYTES:
        return 0
    return COPIED_EXPERT_TENSORS.get(engine, 1) * tensor_bytes


def size_mib(n_bytes: int) -> str:
    return f"{n_bytes / MIB:.0f} MiB"


def output_stage(facts: ModelFacts, ubatch: int) -> int:
    """Every token's logits and the final hidden state of a full micro-batch, f32."""
    return ubatch * (facts.vocab + facts.hidden) * 4


def interpolate(points: tuple[tuple[int, float], ...], x: int) -> float:
    """Piecewise linear through `points` (sorted by x), extended by the nearest segment outside them."""
    xs = [p[0] for p in points]
    i = min(max(bisect.bisect_left(xs, x), 1), len(points) - 1)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def gpu_reserve(engine: str, facts: ModelFacts, ctx: int, ubatch: int, latent: bool) -> int:
    """VRAM a plan keeps free beside weights and KV cache: the compute buffer and the CUDA context."""
    return gpu_compute(engine, facts, ctx, ubatch, latent).bytes + CUDA_CONTEXT_BYTES
