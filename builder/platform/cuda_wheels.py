"""CUDA toolkits assembled from NVIDIA's PyPI wheels: which wheels, pinned by sha256, and the names of
the base images `moe-stack base --cuda` makes from them. Facts only; no Docker, no downloads.

Only CUDA 13.x has a compiler on PyPI: the 13.x wheels share one prefix (nvidia/cu13) and hold nvcc,
cicc, ptxas, fatbinary, nvlink and the crt/CCCL headers. Every 12.x `nvidia-cuda-nvcc-cu12` wheel
(12.4 to 12.9) has only ptxas, libnvvm and headers: CUDA 12.4 comes from Debian (debian_cuda.py), the
other 12.x releases from NVIDIA's images.
"""

from __future__ import annotations

from dataclasses import dataclass

from builder.contract import LOCAL_ONLY

LOCAL_CUDA_REPOSITORY = f"{LOCAL_ONLY}cuda"
# The wheels are tagged for these manylinux platforms (cuBLAS for 2_27 only): pip is told them all,
# so the download doesn't depend on the host's own platform.
WHEEL_PLATFORMS = (
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_12_x86_64",
    "manylinux2010_x86_64",
)


@dataclass(frozen=True)
class Package:
    """One pinned part of a CUDA release: a PyPI wheel, pinned by its sha256 (`requirement`), or a Debian
    package, pinned by its version (`pin`: apt checks it against the archive's signed index)."""

    name: str
    version: str
    sha256: str = ""  # a wheel's
    runtime: bool = False  # part of the runtime base (what a server loads), not only the devel one

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version} --hash=sha256:{self.sha256}"

    @property
    def pin(self) -> str:
        return f"{self.name}={self.version}"

    @property
    def label(self) -> tuple[str, str]:
        """Its label's key under the base's prefix and its value: `wheel.<name>`, its version and sha256,
        or `deb.<name>`, its version."""
        if self.sha256:
            return f"wheel.{self.name}", f"{self.version} sha256:{self.sha256}"
        return f"deb.{self.name}", self.version


@dataclass(frozen=True, kw_only=True)
class CudaRelease:
    """One CUDA release a registry-free base is made of, whatever its origin."""

    version: str
    full_version: str  # the cudart version, as NVIDIA's images set CUDA_VERSION
    min_driver: str  # NVIDIA_REQUIRE_CUDA: the container toolkit refuses older drivers at start
    packages: tuple[Package, ...]  # what it is made of: wheels, or Debian packages

    def parts(self, runtime: bool) -> list[Package]:
        """What the runtime base holds (`runtime`), or the devel one: every package."""
        return [package for package in self.packages if package.runtime or not runtime]

    def image(self, flavour: str) -> str:
        """`moe-stack/cuda:<version>-devel|runtime`."""
        return f"{LOCAL_CUDA_REPOSITORY}:{self.version}-{flavour}"

    @property
    def prefix(self) -> str:
        return f"/usr/local/cuda-{self.version}"


@dataclass(frozen=True, kw_only=True)
class PypiCuda(CudaRelease):
    """One CUDA release assembled from wheels."""

    wheel_root: str  # the prefix inside every wheel of the release
    runtime_libs: tuple[str, ...]  # the sonames a server loads (the driver's libcuda.so.1 aside)


def wheel_table(text: str) -> tuple[Package, ...]:
    """The wheels of a table a line each: name, version, sha256, and `runtime` for the runtime base's."""
    rows = (line.split() for line in text.splitlines() if line.strip())
    return tuple(
        Package(name, version, sha256, runtime=kind == ["runtime"]) for name, version, sha256, *kind in rows
    )


# Sizes and the checks behind this set: shared notes, CUDA-FROM-PYPI.md (checked 2026-11-30). No
# cuobjdump 13.0 wheel exists; 13.2.51's reads 13.0 binaries.
_CUDA_13_0_WHEELS = """
nvidia-cuda-nvcc       13.0.88   56fe502eb77625a12f25172caa3cdddb4e4c8ba2c8c17dba44b164761b380f03
nvidia-cuda-crt        13.0.88   2c8043c7c9e02492716426e9919fc78d2c5b3b2a7a768a88e952676b08aa55a4
nvidia-nvvm            13.0.88   c5f41ffeb6466944a026dfa5317d7d85355c119bbec279205d22f1869d1054e0
nvidia-cuda-cccl       13.0.85   e0da7ad981f3a8aff08241b5bfc1af868742a63e2762f53a5171c492ef242649
nvidia-cuda-cuobjdump  13.2.51   95c69d3ddf0c2c1f535ec44c3433a66aeee19f588d9d22f73356e20b25f12b50
nvidia-cuda-runtime    13.0.96   7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548 runtime
nvidia-cublas          13.1.0.3  ee8722c1f0145ab246bccb9e452153b5e0515fd094c3678df50b2a0888b8b171 runtime
"""
PYPI_CUDA: dict[str, PypiCuda] = {
    c.version: c
    for c in (
        PypiCuda(
            version="13.0",
            full_version="13.0.96",
            wheel_root="nvidia/cu13",
            packages=wheel_table(_CUDA_13_0_WHEELS),
            runtime_libs=("libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13"),
            min_driver="580",
        ),
    )
}
