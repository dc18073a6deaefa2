"""The CPU and CUDA targets an image can be built for (data, one place).

A CPU target names the `-march` the engine is compiled with, the ggml feature switches that go with
it, and the /proc/cpuinfo flags a host must have to run the result (checked by the image's entrypoint
and written into its labels).
"""

from __future__ import annotations

from builder.errors import SpecError
from builder.spec import CpuTarget

# x86-64-v3 (Haswell / Zen 1 and later): AVX, AVX2, BMI1/2, F16C, FMA, LZCNT ("abm"), MOVBE, XSAVE.
# Flag names are the kernel's /proc/cpuinfo spellings.
AVX2 = CpuTarget(
    name="avx2",
    march="x86-64-v3",
    required_flags=("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"),
    ggml_features=("GGML_SSE42", "GGML_AVX", "GGML_AVX2", "GGML_BMI2", "GGML_FMA", "GGML_F16C"),
    description="x86-64-v3: any AVX2 server (EPYC Zen 1+, Xeon Haswell+)",
)

CPU_TARGETS: dict[str, CpuTarget] = {t.name: t for t in (AVX2,)}

# Every x86 ggml feature switch; a targeted build sets each of them explicitly ON or OFF so nothing
# depends on the build host (ggml turns some of them on by default when GGML_NATIVE is off).
GGML_X86_FEATURES: tuple[str, ...] = (
    "GGML_SSE42", "GGML_AVX", "GGML_AVX2", "GGML_AVX_VNNI", "GGML_BMI2", "GGML_FMA", "GGML_F16C",
    "GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16",
    "GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16",
)

# CUDA toolkits the model accepts (the CUDA matrix itself is published separately).
CUDA_VERSIONS: tuple[str, ...] = ("12.4", "12.6", "12.8", "13.0")


def cpu_target(name: str) -> CpuTarget:
    """The CPU target called `name`, or a SpecError listing the known ones."""
    try:
        return CPU_TARGETS[name]
    except KeyError:
        known = ", ".join(sorted(CPU_TARGETS))
        raise SpecError(f"unknown CPU target {name!r}: choose one of {known}") from None
