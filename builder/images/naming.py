"""The image naming scheme, formatted and parsed in this one place.

    <registry>/<namespace>/<slug>:<ref>-<cpu|cudaX.Y>-<isa>   the immutable tag of one build
    <registry>/<namespace>/<slug>:<cpu|cudaX.Y>-<isa>         the moving alias beside it
    <registry>/<namespace>/<slug>-tools:...                   the tools image of the same variant

A full 40-character commit ref is shortened to 12 in tags. `parse_variant` reads a tag back into
its parts; `variant_tag` and `parse_variant` round-trip over the whole matrix (tests).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from builder.engines import Engine
from builder.engines.base import ImageSpec
from builder.platform.targets import CPU_TARGETS, cpu_target
from builder.spec import DEFAULT_BASES, FULL_SHA, NO_CUDA, BaseImages, CudaTarget, LocalSource

DEFAULT_REGISTRY = "ghcr.io"
DEFAULT_NAMESPACE = "moe-stack"
DEFAULT_PREFIX = f"{DEFAULT_REGISTRY}/{DEFAULT_NAMESPACE}"  # where images.yml publishes (not yet run)
TOOLS_SUFFIX = "-tools"
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
        return self.tag[len(self.ref) + 1 :]


def image_spec(
    engine: Engine,
    cpu: str = "avx2",
    tree: Path | None = None,
    ref: str | None = None,
    base: BaseImages = DEFAULT_BASES,
    registry: str = DEFAULT_REGISTRY,
    namespace: str = DEFAULT_NAMESPACE,
    cuda: CudaTarget = NO_CUDA,
    tools: bool = False,
) -> ImageSpec:
    """The spec for an engine's image: from the local `tree` (or wheelhouse) if given, else the
    engine's default source at `ref` (a git clone, or for KTransformers the PyPI wheels)."""
    source = (
        LocalSource(path=tree, ref=ref or "local", holds="wheels" if engine.holds_wheels(tree) else "tree")
        if tree is not None
        else engine.default_source(ref)
    )
    spec = ImageSpec(
        engine=engine,
        source=source,
        cpu=cpu_target(cpu),
        cuda=cuda,
        base=base,
        registry=registry,
        namespace=namespace,
        tools=tools,
    )
    engine.check_image(spec)
    return spec


def short_ref(ref: str) -> str:
    """The ref as tags carry it: a full commit shortened to 12 characters."""
    return ref[:12] if FULL_SHA.fullmatch(ref) else ref


def target_key(spec: ImageSpec) -> str:
    """`<cpu|cudaX.Y>-<isa>`: what the alias tag says, without the ref."""
    return f"{spec.cuda.label}-{spec.cpu.name}"


def variant_tag(spec: ImageSpec) -> str:
    """`<ref>-<cpu|cudaX.Y>-<isa>`: the immutable tag of `spec`'s image."""
    return f"{short_ref(spec.ref)}-{target_key(spec)}"


def repository(prefix: str, engine: Engine, tools: bool = False) -> str:
    """`<registry>/<namespace>/<slug>[-tools]` for `prefix` = `<registry>/<namespace>`."""
    return f"{prefix}/{engine.slug}{TOOLS_SUFFIX if tools else ''}"


def image_tag(spec: ImageSpec) -> str:
    """The image's full immutable reference."""
    return f"{repository(f'{spec.registry}/{spec.namespace}', spec.engine, spec.tools)}:{variant_tag(spec)}"


def alias_image_tag(spec: ImageSpec, channel: str | None = None) -> str:
    """The moving alias pushed beside the immutable tag (`<channel>-<cpu|cudaX.Y>-<isa>` for a
    channel such as the nightly `edge` of upstream heads)."""
    key = f"{channel}-{target_key(spec)}" if channel else target_key(spec)
    return f"{repository(f'{spec.registry}/{spec.namespace}', spec.engine, spec.tools)}:{key}"


def tools_image_of(image: str) -> str:
    """The tools image beside a server image: its repository with `-tools`, same tag (a digest,
    which names the server's bytes only, is dropped)."""
    name = image.split("@", 1)[0]
    repo, colon, tag = name.rpartition(":")
    if not colon or "/" in tag:  # no tag: `repo` alone (a registry port is not a tag)
        repo, tag = name, "latest"
    if repo.endswith(TOOLS_SUFFIX):
        return f"{repo}:{tag}"
    return f"{repo}{TOOLS_SUFFIX}:{tag}"


def publish_tags(engine: Engine, variant: Variant, prefix: str) -> list[str]:
    """Where an image of `engine` and `variant` goes under `prefix`: the immutable tag, then the alias."""
    repo = repository(prefix, engine)
    return [f"{repo}:{variant.tag}", f"{repo}:{variant.alias}"]


def cache_key(spec: ImageSpec) -> str:
    """`<slug>-<cpu|cudaX.Y>-<isa>`: shared by every ref of one target (ccache, CI's layer cache)."""
    return f"{spec.engine.slug}-{target_key(spec)}"


def context_name(spec: ImageSpec) -> str:
    """The directory name `build` renders `spec`'s context under."""
    return f"{spec.engine.slug}-{variant_tag(spec)}"


def build_name(spec: ImageSpec) -> str:
    """What a build of `spec` is called (its log's name): the context's name, `-tools` for a tools image,
    which builds from the same context."""
    return context_name(spec) + (TOOLS_SUFFIX if spec.tools else "")


def parse_variant(tag: str) -> Variant | None:
    """The variant a tag names, or None for aliases and foreign tags."""
    match = _VARIANT_TAG.fullmatch(tag)
    if match is None or match["cpu"] not in CPU_TARGETS:
        return None
    accel = match["accel"]
    return Variant(tag=tag, ref=match["ref"], cuda=None if accel == "cpu" else accel[4:], cpu=match["cpu"])
