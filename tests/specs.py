"""Specs the tests share: the published defaults of each engine."""

from __future__ import annotations

from builder.engines import engine_names, get_engine
from builder.spec import GitSource, ImageSpec
from builder.targets import cpu_target


def default_spec(engine: str, cpu: str = "avx2") -> ImageSpec:
    adapter = get_engine(engine)
    return ImageSpec(engine=adapter.name, source=GitSource(url=adapter.upstream_url, ref=adapter.default_ref),
                     cpu=cpu_target(cpu))


def published_specs() -> list[ImageSpec]:
    """The variants with golden renders (the CPU images; the CUDA matrix comes later)."""
    return [default_spec(name) for name in engine_names()]
