"""CUDA toolkits from Debian's non-free archive: which packages, pinned by version, and the names of the
base images `moe-stack base --cuda` makes from them. Facts only; no Docker, no downloads.

Debian trixie's non-free component carries NVIDIA's CUDA 12.4.1 (source package nvidia-cuda-toolkit
12.4.1-2): nvcc 12.4.131 with GCC 13 as its host compiler (g++-13, which trixie has beside its GCC 14),
cudart 12.4.127, cuBLAS 12.4.5.8. Its nvcc targets sm_50 to sm_90: no sm_100/sm_120 (Blackwell), which
needs CUDA 12.8, a release only NVIDIA's images carry. apt checks every package against the archive's
signed index, so a version pin is a content pin.
"""

from __future__ import annotations

from dataclasses import dataclass

from builder.platform.cuda_wheels import CudaRelease, Package


@dataclass(frozen=True, kw_only=True)
class DebianCuda(CudaRelease):
    """One CUDA release from a Debian suite's non-free component."""

    suite: str
    component: str
    host_gcc: int  # the g++-N the toolkit's nvcc compiles host code with (its newest supported GCC)


# nvidia-cuda-toolkit brings nvcc, ptxas, cicc and the rest of the compiler, and through nvidia-cuda-dev
# the headers, the link stubs (libcuda.so among them) and every library's development files.
# nvidia-cuda-dev depends on the driver's libcuda.so.1 and libnvidia-ml.so.1, which a container gets
# from the host at run time: the base installs a package that provides those names and holds no file
# (cuda_base.py).
DEBIAN_CUDA: dict[str, DebianCuda] = {
    c.version: c
    for c in (
        DebianCuda(
            version="12.4",
            full_version="12.4.127",
            suite="trixie",
            component="non-free",
            packages=(
                Package("nvidia-cuda-toolkit", "12.4.131~12.4.1-2"),
                Package("nvidia-cuda-dev", "12.4.127~12.4.1-2"),
                Package("libcudart12", "12.4.127~12.4.1-2", runtime=True),
                Package("libcublas12", "12.4.5.8~12.4.1-2", runtime=True),
                Package("libcublaslt12", "12.4.5.8~12.4.1-2", runtime=True),
            ),
            host_gcc=13,
            min_driver="550",
        ),
    )
}
