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
_ZEN4 = _V3 + ("avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl", "avx512ifma", "avx512vbmi",
               "avx512_vbmi2", "avx512_vnni", "avx512_bitalg", "avx512_vpopcntdq", "avx512_bf16",
               "gfni", "vaes", "vpclmulqdq", "sha_ni", "adx")
_AVX512_GGML = _V3_GGML + ("GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16")

AVX2 = CpuTarget(
    name="avx2", march="x86-64-v3", required_flags=_V3, ggml_features=_V3_GGML, min_gcc=(8, 0),
    description="x86-64-v3: any AVX2 server (EPYC Zen 1+, Xeon Haswell+)",
)
ZEN4 = CpuTarget(
    name="zen4", march="znver4", required_flags=_ZEN4, ggml_features=_AVX512_GGML, min_gcc=(12, 3),
    description="AMD Zen 4 (EPYC 9004 Genoa/Bergamo): AVX-512 with VNNI/BF16/VBMI",
)
ZEN5 = CpuTarget(
    name="zen5", march="znver5", required_flags=_ZEN4 + ("avx_vnni", "avx512_vp2intersect"),
    ggml_features=_AVX512_GGML + ("GGML_AVX_VNNI",), min_gcc=(14, 0),
    description="AMD Zen 5 (EPYC 9005 Turin): full-width AVX-512",
)
SAPPHIRERAPIDS = CpuTarget(
    name="sapphirerapids", march="sapphirerapids",
    required_flags=_ZEN4 + ("avx_vnni", "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16"),
    ggml_features=_AVX512_GGML + ("GGML_AVX_VNNI", "GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16"),
    min_gcc=(11, 0),
    description="Intel Xeon 4th/5th gen (Sapphire/Emerald Rapids) and later: AVX-512 + AMX",
)
# Mainline only: every CPU variant as its own libggml-cpu-*.so, the best one chosen at start.
PORTABLE = CpuTarget(
    name="portable", march=None, required_flags=(), ggml_features=(), min_gcc=(8, 0), runtime_dispatch=True,
    description="any x86-64: the engine picks its CPU variant at start (llama.cpp, KTransformers)",
)

CPU_TARGETS: dict[str, CpuTarget] = {t.name: t for t in (AVX2, ZEN4, ZEN5, SAPPHIRERAPIDS, PORTABLE)}

# Every x86 ggml feature switch; a targeted build sets each of them explicitly ON or OFF so nothing
# depends on the build host (ggml turns some of them on by default when GGML_NATIVE is off).
GGML_X86_FEATURES: tuple[str, ...] = (
    "GGML_SSE42", "GGML_AVX", "GGML_AVX2", "GGML_AVX_VNNI", "GGML_BMI2", "GGML_FMA", "GGML_F16C",
    "GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16",
    "GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16",
)


def cpu_target(name: str) -> CpuTarget:
    """The CPU target called `name`, or a SpecError listing the known ones."""
    try:
        return CPU_TARGETS[name]
    except KeyError:
        raise SpecError(f"unknown CPU target {name!r}: choose one of {', '.join(CPU_TARGETS)}") from None


# Most capable first: the first whose flags a host has is the image to run there.
_PREFERENCE = (SAPPHIRERAPIDS, ZEN5, ZEN4, AVX2)


def best_cpu_target(host_flags: frozenset[str]) -> CpuTarget | None:
    """The named (non-dispatch) target that makes the most of a host with `host_flags`."""
    return next((t for t in _PREFERENCE if set(t.required_flags) <= host_flags), None)
