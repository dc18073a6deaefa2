"""The registry-free CUDA bases by origin: `--cuda-base pypi` (NVIDIA's PyPI wheels, CUDA 13.0) and
`--cuda-base debian` (Debian's non-free archive, CUDA 12.4). Both make `moe-stack/cuda:V-devel|runtime`
with `moe-stack base --cuda V`; every other release comes from NVIDIA's images only."""

from __future__ import annotations

from typing import Literal

from builder.errors import SpecError
from builder.platform.cuda_wheels import PYPI_CUDA, PypiCuda
from builder.platform.debian_cuda import DEBIAN_CUDA, DebianCuda

LocalOrigin = Literal["pypi", "debian"]
LocalCuda = PypiCuda | DebianCuda
LOCAL_CUDA: dict[LocalOrigin, dict[str, PypiCuda] | dict[str, DebianCuda]] = {
    "pypi": PYPI_CUDA,
    "debian": DEBIAN_CUDA,
}
WHERE: dict[LocalOrigin, str] = {"pypi": "NVIDIA's PyPI wheels", "debian": "Debian's non-free archive"}


def origin_of(version: str) -> LocalOrigin | None:
    """Where a registry-free base of CUDA `version` comes from (None: no such base)."""
    return next((origin for origin, releases in LOCAL_CUDA.items() if version in releases), None)


def local_cuda(origin: LocalOrigin, version: str) -> LocalCuda:
    """The release of `version` from `origin`, or a SpecError naming the one that has it."""
    releases = LOCAL_CUDA[origin]
    if version in releases:
        return releases[version]
    other = origin_of(version)
    fix = (
        f"--cuda-base {other} has it"
        if other
        else f"registry-free bases exist for {registry_free_summary()}; for {version} use NVIDIA's "
        "images (--cuda-base nvidia)"
    )
    reason = " (NVIDIA's -cu12 nvcc wheels hold no nvcc)" if origin == "pypi" else ""
    raise SpecError(f"CUDA {version} has no compiler in {WHERE[origin]}{reason}: {fix}")


def any_local_cuda(version: str) -> LocalCuda:
    """The registry-free release of `version`, whatever its origin (`moe-stack base --cuda`)."""
    origin = origin_of(version)
    if origin is None:
        raise SpecError(
            f"no registry-free CUDA {version} base: they exist for {registry_free_summary()}; CUDA "
            f"{version} comes from NVIDIA's images (--cuda-base nvidia)"
        )
    return local_cuda(origin, version)


def registry_free_summary() -> str:
    """`13.0 (--cuda-base pypi), 12.4 (--cuda-base debian)`."""
    return ", ".join(
        f"{version} (--cuda-base {origin})" for origin, rel in LOCAL_CUDA.items() for version in rel
    )


def local_cuda_images() -> list[str]:
    """Every image `moe-stack base --cuda` can make, devel and runtime of each release."""
    return [
        release.image(flavour)
        for releases in LOCAL_CUDA.values()
        for release in releases.values()
        for flavour in ("devel", "runtime")
    ]
