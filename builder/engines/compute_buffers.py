"""The GPU compute buffer each llama.cpp-family engine allocates for a hybrid stack (all layers on the
GPU, routed experts on the CPU), as measured: the buffer depends on the model's widths, the context and
the micro-batch, not on its depth (an 8- and a 16-layer slice logged the same), so a slice of the real
widths measures the real model's.

Fitted to the sizes the engines logged on the H200 (bench/results/seed-models-2026-12-01: native builds
with the images' configure arguments, the presets' stacks, `CUDA0 compute buffer size`); every form is
named with the points it was fitted to. Where nothing was measured, the old flat reserve stands and the
plan says it is an estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

from builder.models.planner import ModelFacts

MIB = 1024**2
# The CUDA context, cuBLAS workspace and allocator slack beside the logged buffers: nvidia-smi showed
# 603 MiB (mainline) and 993 MiB (ik_llama.cpp) over the buffers' sum on the H200.
CUDA_CONTEXT_BYTES = 1024 * MIB
# Unmeasured: with the context, the flat 2 GiB reserve moe-stack kept before any buffer was measured.
UNMEASURED_BYTES = 1024 * MIB
R1_HEADS = 128
DEFAULT_UBATCH = 512  # both engines' -ub when a stack doesn't set one


@dataclass(frozen=True)
class ComputeEstimate:
    bytes: int
    measured: bool  # from a fit to this engine's logs for this architecture
    basis: str  # what it was fitted to, for the plan's output


def gpu_compute(engine: str, facts: ModelFacts, ctx: int, ubatch: int, latent: bool) -> ComputeEstimate:
    """The engine's CUDA compute buffer for a stack of `facts` at `ctx` tokens and micro-batch `ubatch`
    (`latent`: the MLA cache)."""
    if facts.arch == "deepseek2" and latent:
        heads = (facts.heads or R1_HEADS) / R1_HEADS
        if engine == "ik_llama.cpp":
            # -mla 3 decompresses the whole cache for prefill: a term in the context (fitted: 6888 MiB at
            # 32k/2048, 6330 at 32k/512, 1928 at 8k/2048; three points, three terms: no point to check it).
            size = 275.1 * MIB + heads * (ctx * 0.17910 * MIB + ubatch * ctx * 11.63)
            return ComputeEstimate(
                int(size), True, "ik_llama.cpp -mla 3 on DeepSeek-R1 widths (H200, 3 points)"
            )
        if engine == "llama.cpp":
            # The f16 attention mask (ubatch x ctx) and activations per micro-batch token (1644 MiB at
            # 32k/2048, 622 at 32k/512; predicted 1548 at 8k/2048, logged 1548).
            size = 281.4 * MIB + ubatch * 0.60285 * MIB + ubatch * ctx * 2
            return ComputeEstimate(int(size), True, "llama.cpp on DeepSeek-R1 widths (H200, 3 points)")
    if facts.arch == "qwen3next" and engine in ("ik_llama.cpp", "llama.cpp"):
        # The same at -ub 512 and 2048 (the recurrent layers split the batch themselves); context 32768.
        size = {"ik_llama.cpp": 256.52, "llama.cpp": 224.79}[engine] * MIB
        return ComputeEstimate(int(size), True, f"{engine} on Qwen3-Next widths at a 32k context (H200)")
    if facts.arch == "qwen3moe" and engine == "ik_llama.cpp" and ubatch <= 512 and ctx <= 16384:
        # Qwen3-235B-A22B widths, 16k context, -ub 512 (bench/results/cuda-images-2026-11-30): 936 MiB.
        return ComputeEstimate(
            936 * MIB, True, "ik_llama.cpp on Qwen3-235B widths at 16k, -ub 512 (H200, 1 point)"
        )
    return ComputeEstimate(
        UNMEASURED_BYTES, False, "not measured for this engine and architecture: an estimate"
    )


def gpu_reserve(engine: str, facts: ModelFacts, ctx: int, ubatch: int, latent: bool) -> int:
    """VRAM a plan keeps free beside weights and KV cache: the compute buffer and the CUDA context."""
    return gpu_compute(engine, facts, ctx, ubatch, latent).bytes + CUDA_CONTEXT_BYTES
