"""The image naming scheme, formatted and parsed in this one place.

    <registry>/<namespace>/<slug>:<ref>-<cpu|cudaX.Y>-<isa>   the immutable tag of one build
    <registry>/<namespace>/<slug>:<cpu|cudaX.Y>-<isa>         the moving alias beside it

A full 40-character commit ref is shortened to 12 in tags. `parse_variant` reads a tag back into
its parts; `variant_tag` and `parse_variant` round-trip over the whole matrix (tests).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from builder.engines import get_engine
from builder.images.targets import CPU_TARGETS, cpu_target
from builder.spec import DEFAULT_BASES, FULL_SHA, NO_CUDA, BaseImages, CudaTarget, ImageSpec, LocalSource

DEFAULT_REGISTRY = "ghcr.io"
DEFAULT_NAMESPACE = "moe-stack"
_VARIANT_TAG = re.compile(r"^(?P<ref>[A-Za-z0-9_.-]+)-(?P<accel>cpu|cuda[0-9]+\.[0-9]+)-(?P<cpu>[a-z0-9]+)$")


@dataclass(frozen=True)
class Variant:
    """A variant tag read back into its parts."""

    tag: str
    ref: str
    cuda: str | None  # None: a CPU-only image
    cpu: str

    @property
    def alias(self) -> str:
        """The moving alias of this variant: `<cpu|cudaX.Y>-<isa>`."""
        return self.tag[len(self.ref) + 1:]


def image_spec(engine_name: str, cpu: str = "avx2", tree: Path | None = None, ref: str | None = None,
               base: BaseImages = DEFAULT_BASES, registry: str = DEFAULT_REGISTRY,
               namespace: str = DEFAULT_NAMESPACE, cuda: CudaTarget = NO_CUDA) -> ImageSpec:
    """The spec for an engine's image: from the local `tree` (or wheelhouse) if given, else the
    engine's default source at `ref` (a git clone, or for KTransformers the PyPI wheels)."""
    engine = get_engine(engine_name)
    source = (LocalSource(path=tree, ref=ref or "local", holds="wheels" if engine.holds_wheels(tree) else "tree")
              if tree is not None else engine.default_source(ref))
    spec = ImageSpec(engine=engine.name, source=source, cpu=cpu_target(cpu), cuda=cuda, base=base,
                     registry=registry, namespace=namespace)
    engine.check_image(spec)
    return spec


def short_ref(ref: str) -> str:
    """The ref as tags carry it: a full commit shortened to 12 characters."""
    return ref[:12] if FULL_SHA.match(ref) else ref


def target_key(spec: ImageSpec) -> str:
    """`<cpu|cudaX.Y>-<isa>`: what the alias tag says, without the ref."""
    return f"{spec.cuda.label}-{spec.cpu.name}"


def variant_tag(spec: ImageSpec) -> str:
    """`<ref>-<cpu|cudaX.Y>-<isa>`: the immutable tag of `spec`'s image."""
    return f"{short_ref(spec.ref)}-{target_key(spec)}"


def repository(prefix: str, engine: str) -> str:
    """`<registry>/<namespace>/<slug>` for `prefix` = `<registry>/<namespace>`."""
    return f"{prefix}/{get_engine(engine).slug}"


def image_tag(spec: ImageSpec) -> str:
    """The image's full immutable reference."""
    return f"{repository(f'{spec.registry}/{spec.namespace}', spec.engine)}:{variant_tag(spec)}"


def alias_image_tag(spec: ImageSpec) -> str:
    """The moving alias pushed beside the immutable tag."""
    return f"{repository(f'{spec.registry}/{spec.namespace}', spec.engine)}:{target_key(spec)}"


def publish_tags(engine: str, variant: Variant, prefix: str) -> list[str]:
    """Where an image of `engine` and `variant` goes under `prefix`: the immutable tag, then the alias."""
    repo = repository(prefix, engine)
    return [f"{repo}:{variant.tag}", f"{repo}:{variant.alias}"]


def cache_key(spec: ImageSpec) -> str:
    """`<slug>-<cpu|cudaX.Y>-<isa>`: shared by every ref of one target (ccache, CI's layer cache)."""
    return f"{get_engine(spec.engine).slug}-{target_key(spec)}"


def context_name(spec: ImageSpec) -> str:
    """The directory name `build` renders `spec`'s context under."""
    return f"{get_engine(spec.engine).slug}-{variant_tag(spec)}"


def parse_variant(tag: str) -> Variant | None:
    """The variant a tag names, or None for aliases and foreign tags."""
    match = _VARIANT_TAG.match(tag)
    if match is None or match["cpu"] not in CPU_TARGETS:
        return None
    accel = match["accel"]
    return Variant(tag=tag, ref=match["ref"], cuda=None if accel == "cpu" else accel[4:], cpu=match["cpu"])
