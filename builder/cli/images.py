"""`moe-stack render | build | cmake-args | base | matrix | refs`: the engine images, from a Dockerfile to a
pushed tag, and the matrix and pins they come from."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Annotated, Literal, cast

import typer
from rich.text import Text

from builder.cli.common import (
    out,
    raw_stderr,
    text_table,
)
from builder.cli.options import declared, takes_options
from builder.cli.progress import ProgressMode, build_display
from builder.distribute.registry import checked_push
from builder.engines import get_engine
from builder.errors import (
    SpecError,
)
from builder.files import cache_dir, write_file_atomically
from builder.images.baseimage import DEFAULT_LOCAL_TAG, DEFAULT_SUITE, make_base
from builder.images.build import Publishing, build_context, build_image, build_plan
from builder.images.cuda_base import CHECK_ARCH, make_cuda_base
from builder.images.matrix import Variant as MatrixVariant
from builder.images.matrix import (
    ci_rows,
    cuda_target,
    edge_specs,
    publish_set,
    variants,
)
from builder.images.naming import build_name, image_spec, variant_tag
from builder.images.prometheus import make_prometheus
from builder.images.refs import NetworkUpstream, edge_refs, plan_bumps
from builder.images.render import configure_args
from builder.images.render import render as render_context
from builder.images.source import resolve_local
from builder.platform.debian_cuda import DebianCuda
from builder.platform.local_cuda import any_local_cuda, origin_of
from builder.platform.pins import bump_pins, load_pins, parse_pins, pins_path, summary
from builder.spec import BaseImages, CudaTarget
from builder.stacks.options import int_list

CpuOpt = Annotated[str, typer.Option("--cpu", help="CPU target (ISA), e.g. avx2")]
RefOpt = Annotated[
    str | None,
    typer.Option(
        "--ref", help="engine git ref (default: the pinned one); with --source, the label for the image tag"
    ),
]
SourceOpt = Annotated[
    str | None,
    typer.Option(
        "--source",
        help="local engine tree, tarball, sdist, or pypi:NAME==VERSION (default: git clone of --ref)",
    ),
]
ProgressOpt = Annotated[
    str,
    typer.Option(
        "--progress",
        help="auto (one live line in a terminal, BuildKit's plain lines otherwise), plain or tty",
    ),
]
CudaOpt = Annotated[
    str | None, typer.Option("--cuda", help="CUDA version, e.g. 12.8 (default: CPU-only image)")
]
ArchsOpt = Annotated[
    str | None, typer.Option("--cuda-archs", help="GPU archs, e.g. 89,120 (default: the release's)")
]
BaseOpt = Annotated[str | None, typer.Option("--base-image", help="base image for both stages")]
BuildBaseOpt = Annotated[str | None, typer.Option("--build-base", help="base image of the build stage")]
RuntimeBaseOpt = Annotated[str | None, typer.Option("--runtime-base", help="base image of the runtime stage")]
CudaBaseOpt = Annotated[
    str,
    typer.Option(
        "--cuda-base",
        help="CUDA images' toolkit: nvidia (pull nvidia/cuda), pypi (moe-stack/cuda:13.0-*, made "
        "from NVIDIA's PyPI wheels by `moe-stack base --cuda 13.0`) or debian (moe-stack/cuda:12.4-*, "
        "from Debian's non-free archive by `moe-stack base --cuda 12.4`)",
    ),
]


def _progress(mode: str) -> ProgressMode:
    if mode not in ("auto", "plain", "tty"):
        raise SpecError(f"--progress {mode!r}: choose auto (live in a terminal), plain or tty")
    return cast(ProgressMode, mode)


def _cuda(version: str | None, archs: str | None) -> CudaTarget:
    if archs and version is None:
        raise SpecError("--cuda-archs needs --cuda VERSION")
    return cuda_target(version, int_list(archs, "--cuda-archs"))


def _bases(
    base_image: str | None, build_base: str | None, runtime_base: str | None, cuda_base: str = "nvidia"
) -> BaseImages:
    if cuda_base not in ("nvidia", "pypi", "debian"):
        raise SpecError(
            f"--cuda-base {cuda_base!r}: choose nvidia (NVIDIA's images), pypi or debian (made by "
            "moe-stack base --cuda)"
        )
    return BaseImages(
        build=build_base or base_image,
        runtime=runtime_base or base_image,
        cuda=cast(Literal["nvidia", "pypi", "debian"], cuda_base),
    )


@takes_options()
def render(
    engine: str = declared(),
    cpu: CpuOpt = "avx2",
    cuda: CudaOpt = None,
    cuda_archs: ArchsOpt = None,
    ref: RefOpt = None,
    out_dir: Annotated[
        Path, typer.Option("--out", "-o", help="directory to write the build context to")
    ] = Path("build"),
    base_image: BaseOpt = None,
    build_base: BuildBaseOpt = None,
    runtime_base: RuntimeBaseOpt = None,
    cuda_base: CudaBaseOpt = "nvidia",
) -> None:
    """Write the Dockerfile and build context for one image (never touches Docker)."""
    spec = image_spec(
        engine,
        cpu,
        ref=ref,
        base=_bases(base_image, build_base, runtime_base, cuda_base),
        cuda=_cuda(cuda, cuda_archs),
    )
    path = render_context(spec, out_dir)
    out.print(f"rendered {spec.engine} {variant_tag(spec)} → {path / 'Dockerfile'}")


@takes_options()
def build(
    engine: str = declared(),
    cpu: CpuOpt = "avx2",
    cuda: CudaOpt = None,
    cuda_archs: ArchsOpt = None,
    ref: RefOpt = None,
    source: SourceOpt = None,
    base_image: BaseOpt = None,
    build_base: BuildBaseOpt = None,
    runtime_base: RuntimeBaseOpt = None,
    cuda_base: CudaBaseOpt = "nvidia",
    registry: Annotated[str, typer.Option("--registry", help="registry part of the image tag")] = "ghcr.io",
    namespace: Annotated[
        str, typer.Option("--namespace", help="namespace part of the image tag")
    ] = "moe-stack",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the build command, run nothing")] = False,
    log: Annotated[Path | None, typer.Option("--log", help="where to keep the full build log")] = None,
    push: Annotated[
        bool,
        typer.Option(
            "--push",
            help="push to the registry (tag + moving alias, SBOM, provenance) instead of loading; needs a "
            "buildx builder that can export attestations (docker-container)",
        ),
    ] = False,
    registry_cache: Annotated[
        str | None,
        typer.Option(
            "--registry-cache",
            help="with --push: read and write the build cache (every stage, mode=max) at REPO:<variant>, "
            "e.g. ghcr.io/OWNER/moe-stack-cache",
        ),
    ] = None,
    attest: Annotated[
        bool,
        typer.Option(
            "--attest/--no-attest",
            help="with --push: SBOM and provenance attestations (a docker-container builder; the docker "
            "driver has none: --no-attest)",
        ),
    ] = True,
    metadata_file: Annotated[
        Path | None,
        typer.Option("--metadata-file", help="with --push: write buildx's metadata (the pushed digest) here"),
    ] = None,
    progress: ProgressOpt = "auto",
    channel: Annotated[
        str | None,
        typer.Option(
            "--channel",
            help="with --push: the moving alias is CHANNEL-<cpu|cudaX.Y>-<isa> (edge: the nightly images of "
            "upstream heads)",
        ),
    ] = None,
    tools: Annotated[
        bool,
        typer.Option(
            "--tools",
            help="the tools image: the server plus llama-bench, sweep-bench (ik_llama.cpp), quantize, "
            "gguf-split, perplexity, imatrix and gguf-py, from the same build",
        ),
    ] = False,
    ccache_dir: Annotated[
        Path | None,
        typer.Option(
            "--ccache-dir",
            help="carry the compile cache through DIR (one only you can write: its objects are linked into "
            "the image): its ccache objects seed the build's ccache before the build, DIR holds them after "
            "(a CI runner's builder starts empty; llama.cpp engines)",
        ),
    ] = None,
) -> None:
    """Render and build one image with buildx (the tag says engine, ref, CUDA and CPU target)."""
    if (registry_cache or metadata_file or channel or not attest) and not push:
        raise SpecError(
            "--registry-cache, --metadata-file, --channel and --no-attest go with --push "
            "(CI's image workflows)"
        )
    if channel is not None and not re.fullmatch(r"[a-z][a-z0-9]*", channel):
        raise SpecError(f"--channel {channel!r}: a lowercase word such as edge (it prefixes the alias tag)")
    display = _progress(progress)
    tree = resolve_local(get_engine(engine), source) if source else None
    spec = image_spec(
        engine,
        cpu,
        tree,
        ref,
        _bases(base_image, build_base, runtime_base, cuda_base),
        registry,
        namespace,
        _cuda(cuda, cuda_archs),
        tools,
    )
    if push and metadata_file is None and not dry_run:  # the pushed digest is checked from it
        metadata_file = cache_dir() / "logs" / f"push-{build_name(spec)}.json"
        metadata_file.parent.mkdir(parents=True, exist_ok=True)
    publishing = Publishing(registry_cache, metadata_file, channel, attest) if push else None
    if dry_run:
        context = build_context(spec)
        for line in build_plan(spec, context, tree, publishing).command_lines(cache_dir() / "contract"):
            out.print(line, highlight=False, soft_wrap=True)
        return
    log_path = log or cache_dir() / "logs" / f"build-{build_name(spec)}.log"
    with build_display(display) as show:
        tag = build_image(
            spec, tree, show=show, log_path=log_path, publishing=publishing, ccache_dir=ccache_dir
        )
    if publishing is not None and publishing.metadata_file is not None:
        # Each tag as the registry serves it, the form `moe-stack publish` prints (CI signs these).
        for name, digest in checked_push(publishing.metadata_file):
            out.print(f"pushed {name} {digest}", highlight=False, soft_wrap=True)
        return
    out.print(f"built {tag} (full log: {log_path})", highlight=False, soft_wrap=True)


@takes_options()
def cmake_args(
    engine: str = declared(),
    cpu: CpuOpt = "avx2",
    cuda: CudaOpt = None,
    cuda_archs: ArchsOpt = None,
    cuda_base: CudaBaseOpt = "nvidia",
    ccache: Annotated[
        bool, typer.Option("--ccache/--no-ccache", help="keep the ccache compiler launchers")
    ] = True,
) -> None:
    """Print the cmake configure arguments an image build uses, one per line, for a native build
    with the same flags (bare-metal comparisons, hosts without Docker)."""
    spec = image_spec(engine, cpu, cuda=_cuda(cuda, cuda_archs), base=_bases(None, None, None, cuda_base))
    for arg in configure_args(spec):
        if ccache or "_COMPILER_LAUNCHER=" not in arg:
            sys.stdout.write(arg + "\n")


def base(
    tag: Annotated[str, typer.Option("--tag", help="name of the Debian image to make")] = DEFAULT_LOCAL_TAG,
    suite: Annotated[str, typer.Option("--suite", help="Debian suite")] = DEFAULT_SUITE,
    mirror: Annotated[
        str | None, typer.Option("--mirror", help="Debian mirror (default: this host's)")
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="re-make the images even if they exist (new IDs: builds on them start over)"
        ),
    ] = False,
    cuda: Annotated[
        str | None,
        typer.Option(
            "--cuda",
            help="also make moe-stack/cuda:VERSION-devel and -runtime: 13.0 from NVIDIA's PyPI wheels, "
            "12.4 from Debian's non-free archive",
        ),
    ] = None,
    prometheus: Annotated[
        bool,
        typer.Option(
            "--prometheus",
            help="also make moe-stack/prometheus:SUITE from Debian's package (compose --monitoring)",
        ),
    ] = False,
) -> None:
    """Make base images locally, for hosts that can't pull: Debian (debootstrap + docker import) and,
    with --cuda, CUDA devel/runtime images on it (checked before tagging): 13.0 from NVIDIA's PyPI
    wheels, 12.4 from Debian's non-free archive."""
    release = any_local_cuda(cuda) if cuda is not None else None  # a bad version fails before any work
    if isinstance(release, DebianCuda) and suite != release.suite:
        raise SpecError(
            f"CUDA {release.version} comes from Debian {release.suite}'s archive: drop --suite {suite} "
            f"(or pass --suite {release.suite})"
        )
    debian = make_base(tag=tag, suite=suite, mirror=mirror, force=force)
    out.print(f"base image ready: {debian}")
    if prometheus:
        made_prometheus = make_prometheus(
            debian,
            suite,
            cache_dir() / "contexts",
            show=raw_stderr,
            log_path=cache_dir() / "logs" / f"prometheus-{suite}.log",
            force=force,
        )
        out.print(f"monitoring image ready: {made_prometheus} (compose --monitoring)", highlight=False)
    if release is None:
        return
    made = make_cuda_base(
        release,
        debian,
        cache_dir(),
        show=raw_stderr,
        log_path=cache_dir() / "logs" / f"cuda-{release.version}-base.log",
        force=force,
    )
    origin = origin_of(release.version)
    what = "wheels" if origin == "pypi" else "packages"
    if made.stub_symbols is None:
        out.print(
            f"kept: {made.devel} and {made.runtime} hold these {what} already (checked when made; --force "
            "makes them again)",
            highlight=False,
        )
    else:
        out.print(
            f"checked: a kernel + cuBLAS program built for sm_{CHECK_ARCH} in the devel image resolves every "
            f"library in the runtime image (libcuda.so.1 comes from the host driver); the driver stub has "
            f"{made.stub_symbols} entry points",
            highlight=False,
        )
    out.print(
        f"CUDA base images ready: {made.devel} {made.runtime} (build with --cuda-base {origin})",
        highlight=False,
    )


def matrix(
    as_json: Annotated[
        bool, typer.Option("--json", help='the CI job matrix: {"include": [...]} on one line')
    ] = False,
    edge: Annotated[
        bool,
        typer.Option(
            "--edge",
            help="the nightly edge images instead: upstream heads of pins.yaml's edge branches (reads them "
            "with git ls-remote)",
        ),
    ] = False,
    publish: Annotated[
        str,
        typer.Option(
            "--set",
            help="default: what images.yml publishes on every push to main; all: every variant (its "
            "manual run)",
        ),
    ] = "all",
) -> None:
    """Print the image matrix (dockerfiles/matrix.yaml): a table, or JSON for CI's job matrix."""
    specs = edge_specs(edge_refs(load_pins(), NetworkUpstream())) if edge else publish_set(publish)
    if as_json:
        sys.stdout.write(json.dumps({"include": ci_rows(specs)}, separators=(",", ":")) + "\n")
        return
    table = text_table("engine", "cuda", "archs", "cpu", "tag, or why not built")
    chosen = {variant_tag(s) for s in specs}
    for variant in (
        [v for v in variants() if (variant_tag(v.spec) in chosen if v.spec else publish == "all")]
        if not edge
        else [MatrixVariant(s, s.engine, s.cuda.version, s.cpu.name) for s in specs]
    ):
        if variant.spec is None:
            table.add_row(
                variant.engine, variant.cuda or "-", "", variant.cpu, Text(variant.reason, style="dim")
            )
        else:
            archs = ",".join(str(a) for a in variant.spec.cuda.archs)
            table.add_row(variant.engine, variant.cuda or "-", archs, variant.cpu, variant_tag(variant.spec))
    out.print(table)


def refs(
    bump: Annotated[
        bool, typer.Option("--bump", help="write upstream's newer refs into the pins file")
    ] = False,
    pins_file: Annotated[
        Path | None,
        typer.Option("--pins", help="the pins file (default: dockerfiles/pins.yaml of this installation)"),
    ] = None,
    summary_file: Annotated[
        Path | None,
        typer.Option("--summary", help="also write a Markdown summary of the moves (a pull request's body)"),
    ] = None,
) -> None:
    """Compare the pinned engine refs (dockerfiles/pins.yaml) with upstream: llama.cpp's newest bNNNN
    tag, ik_llama.cpp's main, kt-kernel on PyPI (git ls-remote and PyPI's JSON API)."""
    path = pins_file or pins_path()
    if not path.is_file():
        raise SpecError(f"no pins file {path}: give --pins dockerfiles/pins.yaml")
    text = path.read_text()
    bumps = plan_bumps(parse_pins(text), NetworkUpstream())
    for move in bumps:
        out.print(f"{move.engine}: {move.old} -> {move.new} ({move.note})", highlight=False)
    if not bumps:
        out.print("every pinned ref is current")
    if bump and bumps:
        write_file_atomically(path, bump_pins(text, bumps))
        out.print(
            f"wrote {path}; re-render the golden files: "
            "MOE_STACK_UPDATE_GOLDEN=1 pytest tests/unit/test_golden.py",
            highlight=False,
            soft_wrap=True,
        )
    if summary_file is not None:
        write_file_atomically(summary_file, summary(bumps))
