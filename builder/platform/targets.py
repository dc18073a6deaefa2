"""The CPU and CUDA targets an image can be built for (data, one place).

A CPU target names the `-march` the engine is compiled with (or runtime dispatch, for `portable`),
the ggml feature switches that go with it, the /proc/cpuinfo flags a host needs to run the result
(checked by the image's entrypoint, written into its labels), and the oldest GCC that knows it.
"""

from __future__ import annotations

from builder.errors import SpecError
from builder.spec import CpuTarget

_V3 = ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave")
_V3_GGML = ("GGML_SSE42", "GGML_AVX", "GGML_AVX2", "GGML_BMI2", "GGML_FMA", "GGML_F16C")
# What -march=znver4 lets the compiler emit beyond x86-64-v3 (GCC's znver4 ISA list, the parts that
# ordinary or ggml-intrinsic code can use).
_ZEN4 = _V3 + (
    "avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl", "avx512ifma", "avx512vbmi", "avx512_vbmi2",
    "avx512_vnni", "avx512_bitalg", "avx512_vpopcntdq", "avx512_bf16", "gfni", "vaes", "vpclmulqdq", "sha_ni",
    "adx"
)  # fmt: skip
_AVX512_GGML = _V3_GGML + ("GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16")
# The AVX-512 Xeons before AMX (GCC's ISA lists for each -march, the parts ordinary or ggml-intrinsic
# code can use): Skylake-SP has F/CD/BW/DQ/VL; Cascade Lake adds VNNI (enough for ik_llama.cpp's
# HAVE_FANCY_SIMD: F, VNNI, VL, BW, DQ); Ice Lake-SP adds VBMI/VBMI2, IFMA, BITALG, VPOPCNTDQ, GFNI...
_SKYLAKE_SP = _V3 + ("avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl", "adx")
_CASCADELAKE = _SKYLAKE_SP + ("avx512_vnni",)
_ICELAKE = _CASCADELAKE + (
    "avx512ifma", "avx512vbmi", "avx512_vbmi2", "avx512_bitalg", "avx512_vpopcntdq", "gfni", "vaes",
    "vpclmulqdq", "sha_ni"
)  # fmt: skip

AVX2 = CpuTarget(
    name="avx2", march="x86-64-v3", required_flags=_V3, ggml_features=_V3_GGML, min_gcc=(8, 0),
    description="x86-64-v3: any AVX2 server (EPYC Zen 1+, Xeon Haswell+)",
)  # fmt: skip
SKYLAKESP = CpuTarget(
    name="skylakesp", march="skylake-avx512", required_flags=_SKYLAKE_SP,
    ggml_features=_V3_GGML + ("GGML_AVX512",), min_gcc=(6, 0),
    description="Intel Xeon Scalable 1st gen (Skylake-SP): AVX-512 F/CD/BW/DQ/VL",
)  # fmt: skip
CASCADELAKE = CpuTarget(
    name="cascadelake", march="cascadelake", required_flags=_CASCADELAKE,
    ggml_features=_V3_GGML + ("GGML_AVX512", "GGML_AVX512_VNNI"), min_gcc=(9, 0),
    description="Intel Xeon Scalable 2nd gen (Cascade Lake): AVX-512 with VNNI",
)  # fmt: skip
ICELAKE = CpuTarget(
    name="icelake", march="icelake-server", required_flags=_ICELAKE,
    ggml_features=_V3_GGML + ("GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI"), min_gcc=(8, 0),
    description="Intel Xeon Scalable 3rd gen (Ice Lake-SP): AVX-512 with VNNI/VBMI, no BF16",
)  # fmt: skip
ZEN4 = CpuTarget(
    name="zen4", march="znver4", required_flags=_ZEN4, ggml_features=_AVX512_GGML, min_gcc=(12, 3),
    description="AMD Zen 4 (EPYC 9004 Genoa/Bergamo): AVX-512 with VNNI/BF16/VBMI",
)  # fmt: skip
ZEN5 = CpuTarget(
    name="zen5", march="znver5", required_flags=_ZEN4 + ("avx_vnni", "avx512_vp2intersect"),
    ggml_features=_AVX512_GGML + ("GGML_AVX_VNNI",), min_gcc=(14, 0),
    description="AMD Zen 5 (EPYC 9005 Turin): full-width AVX-512",
)  # fmt: skip
SAPPHIRERAPIDS = CpuTarget(
    name="sapphirerapids", march="sapphirerapids",
    required_flags=_ZEN4 + ("avx_vnni", "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16"),
    ggml_features=_AVX512_GGML + ("GGML_AVX_VNNI", "GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16"),
    min_gcc=(11, 0), description="Intel Xeon 4th/5th gen (Sapphire/Emerald Rapids) and later: AVX-512 + AMX",
)  # fmt: skip
# Mainline only: every CPU variant as its own libggml-cpu-*.so, the best one chosen at start.
PORTABLE = CpuTarget(
    name="portable", march=None, required_flags=(), ggml_features=(), min_gcc=(8, 0), runtime_dispatch=True,
    description="any x86-64: the engine picks its CPU variant at start (llama.cpp, KTransformers)",
)  # fmt: skip

CPU_TARGETS: dict[str, CpuTarget] = {
    t.name: t for t in (AVX2, SKYLAKESP, CASCADELAKE, ICELAKE, ZEN4, ZEN5, SAPPHIRERAPIDS, PORTABLE)
}

# Every x86 ggml feature switch; a targeted build sets each of them explicitly ON or OFF so nothing
# depends on the build host (ggml turns some of them on by default when GGML_NATIVE is off).
GGML_X86_FEATURES: tuple[str, ...] = (
    "GGML_SSE42", "GGML_AVX", "GGML_AVX2", "GGML_AVX_VNNI", "GGML_BMI2", "GGML_FMA", "GGML_F16C",
    "GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16", "GGML_AMX_TILE",
    "GGML_AMX_INT8", "GGML_AMX_BF16"
)  # fmt: skip


def cpu_target(name: str) -> CpuTarget:
    """The CPU target called `name`, or a SpecError listing the known ones."""
    try:
        return CPU_TARGETS[name]
    except KeyError:
        raise SpecError(f"unknown CPU target {name!r}: choose one of {', '.join(CPU_TARGETS)}") from None


# Most capable first: the first whose flags a host has is the image to run there.
_PREFERENCE = (SAPPHIRERAPIDS, ZEN5, ZEN4, ICELAKE, CASCADELAKE, SKYLAKESP, AVX2)


def best_cpu_target(host_flags: frozenset[str]) -> CpuTarget | None:
    """The named (non-dispatch) target that makes the most of a host with `host_flags`."""
    return next((t for t in _PREFERENCE if set(t.required_flags) <= host_flags), None)


# What a lesser target leaves unused, by the flag that marks it, richest first.
_UNUSED = (
    ("amx_tile", "AMX"),
    ("avx512_bf16", "AVX-512 BF16"),
    ("avx512_vnni", "AVX-512 VNNI (ik_llama.cpp's HAVE_FANCY_SIMD path)"),
    ("avx512f", "AVX-512"),
)
# Measured on the device (bench/results/device-2026-11-30b, P2): llama.cpp CPU-only, sapphirerapids vs avx2.
MEASURED_ISA_PAYOFF = "prefill 1.28x, decode about equal (sapphirerapids vs avx2 on an Emerald Rapids Xeon)"


def fallback_cost(ideal: CpuTarget, chosen: CpuTarget) -> str:
    """What running `chosen` where `ideal` fits leaves unused, with the one measured payoff we have."""
    lost = [
        name for flag, name in _UNUSED if flag in ideal.required_flags and flag not in chosen.required_flags
    ]
    if not lost:
        return ""
    return f"{', '.join(lost)} left unused; measured payoff of the ISA: {MEASURED_ISA_PAYOFF}"
