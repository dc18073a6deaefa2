"""Every Dockerfile the unit tests render and lint: the published matrix, plus the variants users
build that are not published (KTransformers' CPU-only kernel images, a kt-kernel source build)."""

from __future__ import annotations

from pathlib import Path

from builder.engines import get_engine
from builder.engines.base import ImageSpec
from builder.images.matrix import buildable, cuda_target
from builder.images.naming import context_name, image_spec
from builder.spec import LocalSource

# A checkout path never reaches the render (the named build context replaces the clone stage).
_CHECKOUT = Path("/src/ktransformers")

UNPUBLISHED: dict[str, ImageSpec] = {
    "ktransformers-kernels-cpu-portable": image_spec(get_engine("ktransformers"), "portable"),
    "ktransformers-kernels-cpu-avx2": image_spec(get_engine("ktransformers"), "avx2"),
    "ktransformers-source-cuda12.8-sapphirerapids": image_spec(
        get_engine("ktransformers"), "sapphirerapids", cuda=cuda_target("12.8")
    ).model_copy(update={"source": LocalSource(path=_CHECKOUT, ref="v0.7.2")}),
    "ktransformers-source-cuda12.8-portable": image_spec(
        get_engine("ktransformers"), "portable", cuda=cuda_target("12.8")
    ).model_copy(update={"source": LocalSource(path=_CHECKOUT, ref="v0.7.2")}),
}


def all_specs() -> dict[str, ImageSpec]:
    """Name → spec for every variant the unit tests render."""
    specs = {context_name(s): s for s in buildable()}
    return {**specs, **UNPUBLISHED}
