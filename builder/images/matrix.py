"""The published image matrix (dockerfiles/matrix.yaml), expanded into ImageSpecs."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import yaml

from builder.engines import Engine, get_engine
from builder.engines.base import ImageSpec
from builder.errors import SpecError
from builder.files import templates_root
from builder.images.naming import image_spec, image_tag, variant_tag
from builder.platform.toolchain import CUDA_RELEASES, driver_runs
from builder.spec import CudaTarget


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


def load_matrix() -> dict[str, Any]:
    matrix: dict[str, Any] = yaml.safe_load((templates_root() / "matrix.yaml").read_text())
    return matrix


def variants(ref_overrides: dict[str, str] | None = None) -> list[Variant]:
    """Every combination of the matrix, buildable or not, in a stable order."""
    matrix = load_matrix()
    out: list[Variant] = []
    for engine, extra in matrix["engines"].items():
        adapter = get_engine(engine)
        cpus = [*extra.get("extra_cpu_targets", []), *extra.get("cpu_targets", matrix["cpu_targets"])]
        cudas = [
            *([None] if extra.get("cpu_only", True) else []),
            *extra.get("cuda_versions", matrix["cuda_versions"]),
        ]
        for cuda in cudas:
            for cpu in cpus:
                spec = image_spec(adapter, cpu, ref=(ref_overrides or {}).get(engine), cuda=cuda_target(cuda))
                try:
                    adapter.toolchain(spec)
                except SpecError as why:
                    out.append(Variant(None, engine, cuda, cpu, str(why)))
                    continue
                out.append(Variant(spec, engine, cuda, cpu))
    return out


def engine_cuda_versions(engine: str) -> list[str]:
    """The CUDA releases the matrix builds `engine` for, oldest first."""
    matrix = load_matrix()
    return list(matrix["engines"][engine].get("cuda_versions", matrix["cuda_versions"]))


def default_image_spec(
    engine: Engine, gpu: bool, driver: str | None = None, cpu_flags: frozenset[str] | None = None
) -> ImageSpec:
    """The image a stack names when given none. CPU-only: the engine's default CPU target (avx2, unless
    matrix.yaml names another), what `moe-stack build` builds by default. With a GPU: a published (built)
    CUDA image where one fits, of the newest release the host's `driver` runs (any, where it is not
    known), at the default target if published, else the one with the most instructions of those the
    host's `cpu_flags` have; where none fits, the default target's CUDA image of the newest release the
    driver runs (the oldest the matrix has, where it runs none), which no one has built (stacks/assemble.py's
    `unbuilt_default` says so)."""
    default_cpu = load_matrix()["engines"].get(engine.name, {}).get("default_cpu_target", "avx2")
    if not gpu:
        return image_spec(engine, default_cpu)

    def runs_here(spec: ImageSpec) -> bool:
        cuda, cpu = spec.cuda.version or "", spec.cpu
        driver_ok = driver is None or driver_runs(driver, cuda)
        return driver_ok and (
            cpu.name == default_cpu or cpu_flags is not None and set(cpu.required_flags) <= cpu_flags
        )

    chosen = _newest_published(
        engine, gpu, runs_here, lambda spec: (spec.cpu.name == default_cpu, len(spec.cpu.required_flags))
    )
    if chosen is not None:
        return chosen
    versions = engine_cuda_versions(engine.name)
    runnable = [v for v in versions if driver is None or driver_runs(driver, v)]
    return image_spec(engine, default_cpu, cuda=cuda_target(runnable[-1] if runnable else versions[0]))


def _release(spec: ImageSpec) -> tuple[int, ...]:
    return tuple(int(part) for part in (spec.cuda.version or "0").split("."))


def buildable() -> list[ImageSpec]:
    """Every variant a toolchain can build (`images.yml`'s manual run with set=all)."""
    return [v.spec for v in variants() if v.spec is not None]


SETS = ("default", "all")


@dataclass(frozen=True)
class Published:
    """A variant every push publishes, and where it was built (a test, or a recorded run's results)."""

    spec: ImageSpec
    built: str


def published() -> list[Published]:
    """matrix.yaml's `published` list: the variants built from the pinned trees, with their evidence."""
    return [
        Published(
            image_spec(
                get_engine(entry["engine"]),
                entry["cpu"],
                cuda=cuda_target(None if entry["cuda"] == "none" else entry["cuda"]),
            ),
            entry["built"],
        )
        for entry in load_matrix()["published"]
    ]


def published_image(engine: Engine, cpus: tuple[str, ...], gpu: bool) -> ImageSpec | None:
    """The published image of `engine` for the first of `cpus` it has one for: its newest CUDA release's
    with `gpu`, else its CPU-only one (None: no such image is published)."""
    for cpu in cpus:
        chosen = _newest_published(engine, gpu, partial(_targets, cpu))
        if chosen is not None:
            return chosen
    return None


def _targets(cpu: str, spec: ImageSpec) -> bool:
    return spec.cpu.name == cpu


def _newest_published(
    engine: Engine,
    gpu: bool,
    fits: Callable[[ImageSpec], bool],
    then: Callable[[ImageSpec], tuple[bool, int]] = lambda spec: (True, 0),
) -> ImageSpec | None:
    """Of `engine`'s published images, CUDA ones with `gpu` (else CPU-only), those that `fits` takes: the
    newest CUDA release's, ranked by `then` among equals (None: none fits)."""
    chosen = [
        entry.spec
        for entry in published()
        if entry.spec.engine is engine and (entry.spec.cuda.version is not None) == gpu and fits(entry.spec)
    ]
    return max(chosen, key=lambda spec: (_release(spec), *then(spec))) if chosen else None


def publish_set(name: str = "default") -> list[ImageSpec]:
    """The images `images.yml` publishes: `default` (every push to main: matrix.yaml's `published`
    variants, each built before) or `all`."""
    if name not in SETS:
        raise SpecError(f"--set {name!r}: choose default (what every push publishes) or all")
    if name == "all":
        return buildable()
    return [entry.spec for entry in published()]


# Mainline's CUDA compile on a 2-core machine, measured: 21.6 min for one arch and 27.1 for two under
# CUDA 13.0 (cuda-images-2026-11-30: 16.1 + 5.5 a CUDA arch). Each engine's own figures (its CPU compile,
# its CUDA compile as a multiple of this) are its adapter's.
MAINLINE_CUDA_MINUTES = (16.1, 5.5)  # fixed, a CUDA arch
TOOLS_FACTOR = 1.25  # the tools image compiles its own targets in the same tree (an estimate)
FIXED_MINUTES = 20.0  # the runner's setup, the CUDA devel image's pull (~10 GB), the push
JOB_LIMIT_MINUTES = 360  # GitHub-hosted runners stop a job at 6 hours


def timeout_minutes(engine: Engine, spec: ImageSpec) -> int:
    """A job timeout for building and pushing `spec` (with its tools image where the engine has one):
    1.5x the 2-core estimate (the engine's figures), within GitHub's 6-hour job limit."""
    compile_minutes = engine.compile_minutes_cpu
    if spec.cuda.version is not None:
        fixed, per_arch = MAINLINE_CUDA_MINUTES
        cuda_minutes = engine.cuda_compile_factor * (fixed + per_arch * len(spec.cuda.archs))
        compile_minutes = max(compile_minutes, cuda_minutes)
    if engine.tool_targets:
        compile_minutes *= TOOLS_FACTOR
    return min(JOB_LIMIT_MINUTES, math.ceil(1.5 * (FIXED_MINUTES + compile_minutes)))


def edge_specs(heads: dict[str, str]) -> list[ImageSpec]:
    """The nightly edge images: each engine in `heads` (engine → its edge branch's head commit), CPU-only
    and the matrix's edge CUDA versions, on its edge CPU targets."""
    edge = load_matrix()["edge"]
    return [
        image_spec(get_engine(engine), cpu, ref=head, cuda=cuda_target(cuda))
        for engine, head in heads.items()
        for cuda in [None, *edge["cuda_versions"]]
        for cpu in edge["cpu_targets"]
    ]


def ci_rows(specs: list[ImageSpec]) -> list[dict[str, str]]:
    """One row per image, as CI's job matrix wants them; `tools` says whether a tools image is published
    beside it, `timeout_minutes` the job's limit."""
    rows = []
    for spec in specs:
        engine = spec.engine
        rows.append(
            {
                "engine": spec.engine.name,
                "ref": spec.ref,
                "cuda": spec.cuda.version or "none",
                "cuda_archs": ",".join(str(a) for a in spec.cuda.archs),
                "cpu": spec.cpu.name,
                "variant": variant_tag(spec),
                "tag": image_tag(spec),
                "tools": "true" if engine.tool_targets else "false",
                "timeout_minutes": str(timeout_minutes(engine, spec)),
            }
        )
    return rows
