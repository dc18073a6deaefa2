"""Base images and compilers per (CUDA, CPU) target.

CPU images build and run on Debian trixie (GCC 14 knows every CPU target, znver5 included). CUDA
images build on NVIDIA's `devel` image and run on its `runtime` image (or on the registry-free bases
`moe-stack base --cuda` makes on trixie); where the CPU target needs a newer GCC than that OS ships,
the distribution's gcc-N is installed and named to cmake, within the host-compiler range that CUDA
release accepts. Where the OS's compiler is newer than that range (trixie's GCC 14 for CUDA 12.4's
nvcc), nvcc alone gets an older g++-N of the OS as its host compiler.
"""

from __future__ import annotations

from dataclasses import dataclass

from builder.errors import SpecError
from builder.platform.local_cuda import local_cuda
from builder.spec import DEFAULT_BASES, BaseImages, CpuTarget, CudaTarget

# Minimum Linux driver per CUDA toolkit (NVIDIA's CUDA release notes, "CUDA Toolkit and Corresponding
# Driver Versions"): an image built with that toolkit needs at least this driver.
MIN_DRIVER: dict[str, tuple[int, int]] = {
    "12.4": (550, 54),
    "12.6": (560, 28),
    "12.8": (570, 26),
    "13.0": (580, 65),
}
CPU_BASE = "debian:trixie-slim"
CPU_BASE_SUITE = "trixie"


@dataclass(frozen=True)
class CudaRelease:
    version: str
    image_version: str  # nvidia/cuda tag prefix
    ubuntu: str
    max_gcc: int  # newest host GCC major this nvcc accepts
    default_archs: tuple[int, ...]

    def image(self, flavour: str) -> str:
        return f"nvidia/cuda:{self.image_version}-{flavour}-{self.ubuntu}"


# Host compiler limits from each release's installation guide (supported host compilers).
CUDA_RELEASES: dict[str, CudaRelease] = {
    r.version: r
    for r in (
        CudaRelease("12.4", "12.4.1", "ubuntu22.04", 13, (86, 89, 90)),
        CudaRelease("12.6", "12.6.3", "ubuntu24.04", 13, (86, 89, 90)),
        CudaRelease("12.8", "12.8.1", "ubuntu24.04", 14, (86, 89, 90, 120)),
        CudaRelease("13.0", "13.0.1", "ubuntu24.04", 15, (86, 89, 90, 120)),
    )
}

# (default GCC, {major: version of the installable gcc-N package}) per build OS.
_OS_GCC: dict[str, tuple[tuple[int, int], dict[int, tuple[int, int]]]] = {
    CPU_BASE_SUITE: ((14, 2), {13: (13, 3)}),
    "ubuntu22.04": ((11, 4), {12: (12, 3)}),
    "ubuntu24.04": ((13, 3), {14: (14, 0)}),
}


@dataclass(frozen=True)
class Toolchain:
    build_image: str
    runtime_image: str
    gcc_major: int | None  # a gcc-N installed beside the default one; None: the default compiler
    build_packages: tuple[str, ...]
    runtime_packages: tuple[str, ...]
    # An older g++-N for nvcc alone, where the OS's compiler is newer than nvcc accepts.
    cuda_host_gcc: int | None = None

    def compiler_args(self, cuda: CudaTarget) -> list[str]:
        """cmake arguments that select the installed gcc-N (also as nvcc's host compiler, unless nvcc
        has one of its own)."""
        args = []
        if self.gcc_major is not None:
            args += [f"-DCMAKE_C_COMPILER=gcc-{self.gcc_major}", f"-DCMAKE_CXX_COMPILER=g++-{self.gcc_major}"]
        host = self.cuda_host_gcc or self.gcc_major
        if cuda.version is not None and host is not None:
            args.append(f"-DCMAKE_CUDA_HOST_COMPILER=g++-{host}")
        return args


def cuda_release(cuda: CudaTarget) -> CudaRelease:
    assert cuda.version is not None
    return CUDA_RELEASES[cuda.version]


def toolchain(cpu: CpuTarget, cuda: CudaTarget, base: BaseImages = DEFAULT_BASES) -> Toolchain:
    """The toolchain for a (CPU, CUDA) target, or a SpecError saying why none exists."""
    if base.cuda != "nvidia" and cuda.version is not None:
        local_cuda(base.cuda, cuda.version)  # a release that origin lacks is refused first, for what it is
    try:
        return _toolchain(cpu, cuda, base)
    except _NoCompiler as problem:
        works = [v for v in CUDA_RELEASES if _works(cpu, cuda.model_copy(update={"version": v}))]
        fix = f"use CUDA {works[0]} or newer" if works else "pick another CPU target"
        raise SpecError(f"CPU target {cpu.name} with CUDA {cuda.version}: {problem}; {fix}") from None


class _NoCompiler(Exception):
    pass


def _works(cpu: CpuTarget, cuda: CudaTarget) -> bool:
    try:
        _toolchain(cpu, cuda, DEFAULT_BASES)
    except _NoCompiler:
        return False
    return True


def _build_os(cuda: CudaTarget, base: BaseImages) -> str:
    """The distribution release the build stage runs: the one its base image is made of."""
    if cuda.version is None or base.cuda != "nvidia":
        return CPU_BASE_SUITE
    return cuda_release(cuda).ubuntu


def _cuda_images(cuda: CudaTarget, base: BaseImages) -> tuple[str, str]:
    """(devel, runtime) base images of a CUDA build."""
    if base.cuda != "nvidia":
        local = local_cuda(base.cuda, cuda.version or "")
        return local.image("devel"), local.image("runtime")
    release = cuda_release(cuda)
    return release.image("devel"), release.image("runtime")


def _toolchain(cpu: CpuTarget, cuda: CudaTarget, base: BaseImages) -> Toolchain:
    build_os = _build_os(cuda, base)
    default_gcc, installable = _OS_GCC[build_os]
    gcc_major = None
    if default_gcc < cpu.min_gcc:
        gcc_major = next(
            (major for major, version in sorted(installable.items()) if version >= cpu.min_gcc), None
        )
        if gcc_major is None:
            raise _NoCompiler(
                f"needs GCC >= {cpu.min_gcc[0]}.{cpu.min_gcc[1]}, which {build_os} does not have"
            )
    cuda_host_gcc = None
    if cuda.version is not None:
        release = cuda_release(cuda)
        used = gcc_major or default_gcc[0]
        if used > release.max_gcc:
            # nvcc alone on an older g++-N of the OS, one that still knows the CPU target (the host
            # code is compiled for it too).
            cuda_host_gcc = max(
                (m for m, version in installable.items() if m <= release.max_gcc and version >= cpu.min_gcc),
                default=None,
            )
            if cuda_host_gcc is None:
                raise _NoCompiler(
                    f"needs GCC {used}, but nvcc {cuda.version} accepts host compilers up to GCC "
                    f"{release.max_gcc}"
                )
        build_image, runtime_image = _cuda_images(cuda, base)
    else:
        build_image = runtime_image = CPU_BASE
    gcc_packages = tuple(
        f"{tool}-{major}" for major in (gcc_major, cuda_host_gcc) if major for tool in ("gcc", "g++")
    )
    return Toolchain(
        build_image=base.build or build_image,
        runtime_image=base.runtime or runtime_image,
        gcc_major=gcc_major,
        cuda_host_gcc=cuda_host_gcc,
        build_packages=(
            "build-essential",
            "ca-certificates",
            "ccache",
            "cmake",
            "git",
            "ninja-build",
            *gcc_packages,
        ),
        runtime_packages=("libgomp1", "numactl"),
    )


def driver_runs(driver: str, cuda: str) -> bool:
    """Whether an NVIDIA driver version (e.g. "570.86.15") runs images of CUDA release `cuda`."""
    parts = driver.split(".")[:2]
    if not all(part.isdigit() for part in parts) or cuda not in MIN_DRIVER:
        return False
    return tuple(int(part) for part in parts) >= MIN_DRIVER[cuda]


def highest_cuda(driver: str) -> str | None:
    """The newest CUDA release of the matrix this driver runs, or None."""
    usable = [version for version in MIN_DRIVER if driver_runs(driver, version)]
    return usable[-1] if usable else None
