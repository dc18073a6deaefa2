"""Specs the tests share: each engine's default (pinned git ref) image spec."""

from __future__ import annotations

from builder.engines import get_engine
from builder.spec import GitSource, ImageSpec
from builder.targets import cpu_target


def default_spec(engine: str, cpu: str = "avx2") -> ImageSpec:
    adapter = get_engine(engine)
    return ImageSpec(engine=adapter.name, source=GitSource(url=adapter.upstream_url, ref=adapter.default_ref),
                     cpu=cpu_target(cpu))

