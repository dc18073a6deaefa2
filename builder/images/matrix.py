"""The published image matrix (dockerfiles/matrix.yaml), expanded into ImageSpecs."""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from builder.engines import get_engine
from builder.errors import SpecError
from builder.files import templates_root
from builder.images.naming import image_spec, image_tag, variant_tag
from builder.platform.toolchain import CUDA_RELEASES, driver_runs
from builder.spec import CudaTarget, ImageSpec


@dataclass(frozen=True)
class Variant:
    spec: ImageSpec | None  # None: no toolchain can build it (see `reason`)
    engine: str
    cuda: str | None
    cpu: str
    reason: str = ""


def cuda_target(version: str | None, archs: tuple[int, ...] = ()) -> CudaTarget:
    """A CUDA target with the release's default archs unless `archs` names others."""
    if version is None:
        return CudaTarget()
    if version not in CUDA_RELEASES:
        raise SpecError(f"unknown CUDA version {version}: choose one of {', '.join(CUDA_RELEASES)}")
    return CudaTarget(version=version, archs=archs or CUDA_RELEASES[version].default_archs)


def load_matrix() -> dict:
    return yaml.safe_load((templates_root() / "matrix.yaml").read_text())


def variants(ref_overrides: dict[str, str] | None = None) -> list[Variant]:
    """Every combination of the matrix, buildable or not, in a stable order."""
    matrix = load_matrix()
    out: list[Variant] = []
    for engine, extra in matrix["engines"].items():
        cpus = [*extra.get("extra_cpu_targets", []), *extra.get("cpu_targets", matrix["cpu_targets"])]
        cudas = [
            *([None] if extra.get("cpu_only", True) else []),
            *extra.get("cuda_versions", matrix["cuda_versions"]),
        ]
        for cuda in cudas:
            for cpu in cpus:
                spec = image_spec(engine, cpu, ref=(ref_overrides or {}).get(engine), cuda=cuda_target(cuda))
                try:
                    get_engine(engine).toolchain(spec)
                except SpecError as why:
                    out.append(Variant(None, engine, cuda, cpu, str(why)))
                    continue
                out.append(Variant(spec, engine, cuda, cpu))
    return out


def engine_cuda_versions(engine: str) -> list[str]:
    """The CUDA releases the matrix builds `engine` for, oldest first."""
    matrix = load_matrix()
    return list(matrix["engines"][engine].get("cuda_versions", matrix["cuda_versions"]))


def default_image_spec(engine: str, gpu: bool, driver: str | None = None) -> ImageSpec:
    """The image a stack names when given none, for the engine's default CPU target (avx2, unless
    matrix.yaml names another): CPU-only, or for a GPU stack the engine's CUDA image of the newest
    release the matrix has and the host's `driver` runs (the newest the matrix has, where the driver
    is not known; its oldest, where the driver runs none of them)."""
    cpu = load_matrix()["engines"].get(engine, {}).get("default_cpu_target", "avx2")
    if not gpu:
        return image_spec(engine, cpu)
    versions = engine_cuda_versions(engine)
    runnable = [v for v in versions if driver is None or driver_runs(driver, v)]
    return image_spec(engine, cpu, cuda=cuda_target(runnable[-1] if runnable else versions[0]))


def published() -> list[ImageSpec]:
    return [v.spec for v in variants() if v.spec is not None]


def edge_specs(heads: dict[str, str]) -> list[ImageSpec]:
    """The nightly edge images: each engine in `heads` (engine → its edge branch's head commit), CPU-only
    and the matrix's edge CUDA versions, on its edge CPU targets."""
    edge = load_matrix()["edge"]
    return [
        image_spec(engine, cpu, ref=head, cuda=cuda_target(cuda))
        for engine, head in heads.items()
        for cuda in [None, *edge["cuda_versions"]]
        for cpu in edge["cpu_targets"]
    ]


def ci_rows(specs: list[ImageSpec] | None = None) -> list[dict[str, str]]:
    """One row per image (default: every published one), as CI's job matrix wants them; `tools` says
    whether a tools image is published beside it."""
    rows = []
    for spec in published() if specs is None else specs:
        rows.append(
            {
                "engine": spec.engine,
                "ref": spec.ref,
                "cuda": spec.cuda.version or "none",
                "cuda_archs": ",".join(str(a) for a in spec.cuda.archs),
                "cpu": spec.cpu.name,
                "variant": variant_tag(spec),
                "tag": image_tag(spec),
                "tools": "true" if get_engine(spec.engine).tool_targets else "false",
            }
        )
    return rows
