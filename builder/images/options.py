"""The options that choose an image (its CPU target, CUDA release and bases) and how `build` makes it, each
declared once (type, default, spellings, help) with its checks: `render`, `build` and `cmake-args` take
them as groups (cli/options.takes_options), so a default or a check is written here alone."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, field_validator, model_validator

from builder.engines.base import Engine, ImageSpec
from builder.errors import SpecError
from builder.images.build_plan import Publishing
from builder.images.matrix import cuda_target
from builder.images.mirror import SOURCES_ENV
from builder.images.naming import DEFAULT_NAMESPACE, DEFAULT_REGISTRY, image_spec
from builder.request import Numbers
from builder.spec import BaseImages, Strict, option

CudaBase = Literal["nvidia", "pypi", "debian"]
ProgressMode = Literal["auto", "plain", "tty"]  # how cli/progress.py shows a build


class _Group(Strict):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ImageTarget(_Group):
    """What the image is built for: the CPU's ISA and the CUDA release, its GPU archs and toolkit."""

    cpu: str = option("avx2", "--cpu", help="CPU target (ISA), e.g. avx2")
    cuda: str | None = option(None, "--cuda", help="CUDA version, e.g. 12.8 (default: CPU-only image)")
    cuda_archs: Numbers = option((), "--cuda-archs", help="GPU archs, e.g. 89,120 (default: the release's)")
    cuda_base: CudaBase = option(
        "nvidia",
        "--cuda-base",
        help="CUDA images' toolkit: nvidia (pull nvidia/cuda), pypi (moe-stack/cuda:13.0-*, made from "
        "NVIDIA's PyPI wheels by `moe-stack base --cuda 13.0`) or debian (moe-stack/cuda:12.4-*, from "
        "Debian's non-free archive by `moe-stack base --cuda 12.4`)",
    )

    @field_validator("cuda_base", mode="before")
    @classmethod
    def _known_toolkit(cls, given: str) -> str:
        if given not in ("nvidia", "pypi", "debian"):
            raise SpecError(
                f"--cuda-base {given!r}: choose nvidia (NVIDIA's images), pypi or debian (made by "
                "moe-stack base --cuda)"
            )
        return given

    @model_validator(mode="after")
    def _archs_of_a_release(self) -> ImageTarget:
        if self.cuda_archs and self.cuda is None:
            raise SpecError("--cuda-archs needs --cuda VERSION")
        return self

    @property
    def bases(self) -> BaseImages:
        """The stages' bases: the target's defaults, with this CUDA toolkit."""
        return BaseImages(cuda=self.cuda_base)

    def spec(self, engine: Engine) -> ImageSpec:
        """The image of `engine` for this target, from its default source and bases."""
        return image_spec(engine, self.cpu, cuda=cuda_target(self.cuda, self.cuda_archs), base=self.bases)


class ImageChoice(ImageTarget):
    """One image: its target, the engine's ref and the bases of its two stages."""

    ref: str | None = option(
        None,
        "--ref",
        help="engine git ref (default: the pinned one); with --source, the label for the image tag",
    )
    base_image: str | None = option(None, "--base-image", help="base image for both stages")
    build_base: str | None = option(None, "--build-base", help="base image of the build stage")
    runtime_base: str | None = option(None, "--runtime-base", help="base image of the runtime stage")

    @property
    def bases(self) -> BaseImages:
        """--base-image for both stages unless a stage's own is given."""
        return BaseImages(
            build=self.build_base or self.base_image,
            runtime=self.runtime_base or self.base_image,
            cuda=self.cuda_base,
        )

    def spec(
        self,
        engine: Engine,
        tree: Path | None = None,
        ref: str | None = None,
        registry: str = DEFAULT_REGISTRY,
        namespace: str = DEFAULT_NAMESPACE,
        tools: bool = False,
    ) -> ImageSpec:
        """The image of `engine` from `tree` (None: its default source) at `ref` (None: this choice's)."""
        return image_spec(
            engine,
            self.cpu,
            tree,
            ref or self.ref,
            self.bases,
            registry,
            namespace,
            cuda_target(self.cuda, self.cuda_archs),
            tools,
        )


class BuildOptions(_Group):
    """How `build` makes the image: its source, its tag, its log and display, and a push's own options."""

    source: str | None = option(
        None,
        "--source",
        help="local engine tree, tarball, sdist, or pypi:NAME==VERSION (default: git clone of --ref)",
    )
    sources: Path | None = option(
        None,
        "--sources",
        help="a source mirror (`moe-stack sources`): the engine's tree at --ref from it, checked file by "
        f"file against its manifest, nothing fetched (default: ${SOURCES_ENV})",
    )
    registry: str = option(DEFAULT_REGISTRY, "--registry", help="registry part of the image tag")
    namespace: str = option(DEFAULT_NAMESPACE, "--namespace", help="namespace part of the image tag")
    tools: bool = option(
        False,
        "--tools",
        help="the tools image: the server plus llama-bench, sweep-bench (ik_llama.cpp), quantize, "
        "gguf-split, perplexity, imatrix and gguf-py, from the same build",
    )
    dry_run: bool = option(False, "--dry-run", help="print the build command, run nothing")
    log: Path | None = option(None, "--log", help="where to keep the full build log")
    progress: ProgressMode = option(
        "auto",
        "--progress",
        help="auto (one live line in a terminal, BuildKit's plain lines otherwise), plain or tty",
    )
    ccache_dir: Path | None = option(
        None,
        "--ccache-dir",
        help="carry the compile cache through DIR (one only you can write: its objects are linked into the "
        "image): its ccache objects seed the build's ccache before the build, DIR holds them after (a CI "
        "runner's builder starts empty; llama.cpp engines)",
    )
    push: bool = option(
        False,
        "--push",
        help="push to the registry (tag + moving alias, SBOM, provenance) instead of loading; needs a buildx "
        "builder that can export attestations (docker-container)",
    )
    registry_cache: str | None = option(
        None,
        "--registry-cache",
        help="with --push: read and write the build cache (every stage, mode=max) at REPO:<variant>, e.g. "
        "ghcr.io/OWNER/moe-stack-cache",
    )
    attest: bool = option(
        True,
        "--attest/--no-attest",
        help="with --push: SBOM and provenance attestations (a docker-container builder; the docker driver "
        "has none: --no-attest)",
    )
    metadata_file: Path | None = option(
        None, "--metadata-file", help="with --push: write buildx's metadata (the pushed digest) here"
    )
    channel: str | None = option(
        None,
        "--channel",
        help="with --push: the moving alias is CHANNEL-<cpu|cudaX.Y>-<isa> (edge: the nightly images of "
        "upstream heads)",
    )

    @field_validator("progress", mode="before")
    @classmethod
    def _known_display(cls, given: str) -> str:
        if given not in ("auto", "plain", "tty"):
            raise SpecError(f"--progress {given!r}: choose auto (live in a terminal), plain or tty")
        return given

    @model_validator(mode="after")
    def _push_options_with_push(self) -> BuildOptions:
        """--push's own options only with --push, and a channel that can prefix a tag."""
        pushing = (self.registry_cache, self.metadata_file, self.channel, not self.attest)
        if any(pushing) and not self.push:
            raise SpecError(
                "--registry-cache, --metadata-file, --channel and --no-attest go with --push (CI's image "
                "workflows)"
            )
        if self.channel is not None and not re.fullmatch(r"[a-z][a-z0-9]*", self.channel):
            raise SpecError(
                f"--channel {self.channel!r}: a lowercase word such as edge (it prefixes the alias tag)"
            )
        if self.source is not None and self.sources is not None:
            raise SpecError("--source and --sources both name the engine's tree: give one")
        return self

    @property
    def publishing(self) -> Publishing:
        return Publishing(self.registry_cache, self.metadata_file, self.channel, self.attest)
