"""`moe-stack render | build | cmake-args | base`: the engine images, from a Dockerfile to a pushed tag,
and the base images they build on."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from builder.cli.common import out, raw_stderr
from builder.cli.options import declared, group_values, takes_options
from builder.cli.progress import build_display
from builder.distribute.registry import checked_push
from builder.engines import Engine, adapters
from builder.engines.base import ImageSpec
from builder.errors import SpecError
from builder.files import cache_dir, user_path
from builder.images.baseimage import DEFAULT_LOCAL_TAG, DEFAULT_SUITE, make_base
from builder.images.build import build_context, build_image, build_plan
from builder.images.build_plan import Publishing
from builder.images.cuda_base import CHECK_ARCH, make_cuda_base
from builder.images.mirror import digest_of, mirror_dir, mirror_tree, write_tree
from builder.images.naming import build_name, variant_tag
from builder.images.options import BuildOptions, ImageChoice, ImageTarget
from builder.images.prometheus import make_prometheus
from builder.images.render import configure_args
from builder.images.render import render as render_context
from builder.images.source import resolve_local
from builder.platform.debian_cuda import DebianCuda
from builder.platform.local_cuda import any_local_cuda, origin_of
from builder.platform.pins import pinned_ref


@takes_options(ImageChoice)
def render(
    engine: Engine = declared(),
    out_dir: Annotated[
        Path, typer.Option("--out", "-o", help="directory to write the build context to")
    ] = Path("build"),
    **given: Any,
) -> None:
    """Write the Dockerfile and build context for one image (never touches Docker)."""
    spec = ImageChoice.model_validate(group_values(ImageChoice, given)).spec(engine)
    path = render_context(spec, out_dir)
    out.print(f"rendered {spec.engine} {variant_tag(spec)} → {path / 'Dockerfile'}")


@takes_options(ImageChoice, BuildOptions)
def build(engine: Engine = declared(), **given: Any) -> None:
    """Render and build one image with buildx (the tag says engine, ref, CUDA and CPU target)."""
    image = ImageChoice.model_validate(group_values(ImageChoice, given))
    how = BuildOptions.model_validate(group_values(BuildOptions, given))
    tree, ref = _tree(engine, image.ref, how.source, how.sources)
    spec = image.spec(engine, tree, ref, how.registry, how.namespace, how.tools)
    publishing = _publishing(how.publishing, spec, how.dry_run) if how.push else None
    if how.dry_run:
        context = build_context(spec)
        for line in build_plan(spec, context, tree, publishing).command_lines(cache_dir() / "contract"):
            out.print(line, highlight=False, soft_wrap=True)
        return
    log_path = how.log or cache_dir() / "logs" / f"build-{build_name(spec)}.log"
    with build_display(how.progress) as show:
        tag = build_image(
            spec, tree, show=show, log_path=log_path, publishing=publishing, ccache_dir=how.ccache_dir
        )
    if publishing is not None and publishing.metadata_file is not None:
        # Each tag as the registry serves it, the form `moe-stack publish` prints (CI signs these).
        for name, digest in checked_push(publishing.metadata_file):
            out.print(f"pushed {name} {digest}", highlight=False, soft_wrap=True)
        return
    out.print(f"built {tag} (full log: {log_path})", highlight=False, soft_wrap=True)


def _tree(
    engine: Engine, ref: str | None, source: str | None, sources: Path | None
) -> tuple[Path | None, str | None]:
    """The local tree a build uses and its ref: --source's, a source mirror's (--sources, else
    MOE_STACK_SOURCES, for an engine a mirror holds), or none (a clone of --ref, or the engine's wheels)."""
    if source is not None:
        return resolve_local(engine, source), ref
    mirror = mirror_dir(sources)
    if mirror is None:
        return None, ref
    if not engine.mirrored:
        if sources is None:
            return None, ref  # the environment's mirror: this engine installs wheels
        raise SpecError(f"{engine.name} installs wheels, which a source mirror doesn't hold: give --source")
    pinned = ref or pinned_ref(engine.name)
    return mirror_tree(engine, pinned, mirror), pinned


def _publishing(asked: Publishing, spec: ImageSpec, dry_run: bool) -> Publishing:
    """The push as asked, with a metadata file to check the pushed digest from (the cache's by default)."""
    if asked.metadata_file is not None or dry_run:
        return asked
    metadata_file = cache_dir() / "logs" / f"push-{build_name(spec)}.json"
    metadata_file.parent.mkdir(parents=True, exist_ok=True)
    return replace(asked, metadata_file=metadata_file)


def sources(
    dest: Annotated[Path, typer.Option("--dest", help="the mirror's directory (made if missing)")],
    engines: Annotated[
        list[str] | None,
        typer.Option("--engine", help="only this engine (repeat it); default: every engine a mirror holds"),
    ] = None,
    upstream: Annotated[
        list[str] | None,
        typer.Option(
            "--upstream", help="ENGINE=URL: fetch ENGINE's tree from URL (a copy of its repository) instead"
        ),
    ] = None,
) -> None:
    """Write a source mirror: each pinned engine tree (`git archive` of its pin) as a tarball and a
    manifest of its files, which `build --sources` builds from with no network; needs git and the
    engines' repositories."""
    urls = dict(_pair(given, "--upstream", "ENGINE=URL") for given in upstream or ())
    chosen = [engine for engine in adapters() if engine.mirrored and (not engines or engine.name in engines)]
    unknown = sorted(set(engines or ()) - {engine.name for engine in chosen})
    if unknown or set(urls) - {engine.name for engine in chosen}:
        held = ", ".join(engine.name for engine in adapters() if engine.mirrored)
        raise SpecError(f"a source mirror holds {held}, not {', '.join(unknown or sorted(urls))}")
    dest = user_path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for engine in chosen:
        tree = write_tree(engine, pinned_ref(engine.name), urls.get(engine.name, engine.upstream_url), dest)
        out.print(f"wrote {tree.tarball} and its manifest (sha256 {digest_of(tree)})", highlight=False)


def _pair(given: str, option: str, form: str) -> tuple[str, str]:
    key, sep, value = given.partition("=")
    if not sep or not key or not value:
        raise SpecError(f"{option} {given!r}: give {form}")
    return key, value


@takes_options(ImageTarget)
def cmake_args(
    engine: Engine = declared(),
    ccache: Annotated[
        bool, typer.Option("--ccache/--no-ccache", help="keep the ccache compiler launchers")
    ] = True,
    **given: Any,
) -> None:
    """Print the cmake configure arguments an image build uses, one per line, for a native build
    with the same flags (bare-metal comparisons, hosts without Docker)."""
    spec = ImageTarget.model_validate(group_values(ImageTarget, given)).spec(engine)
    for arg in configure_args(spec):
        if ccache or "_COMPILER_LAUNCHER=" not in arg:
            sys.stdout.write(arg + "\n")


BaseTagOpt = Annotated[str, typer.Option("--tag", help="name of the Debian image to make")]
BaseSuiteOpt = Annotated[str, typer.Option("--suite", help="Debian suite")]
BaseMirrorOpt = Annotated[str | None, typer.Option("--mirror", help="Debian mirror (default: this host's)")]
BaseForceOpt = Annotated[
    bool,
    typer.Option(
        "--force", help="re-make the images even if they exist (new IDs: builds on them start over)"
    ),
]
BaseCudaOpt = Annotated[
    str | None,
    typer.Option(
        "--cuda",
        help="also make moe-stack/cuda:VERSION-devel and -runtime: 13.0 from NVIDIA's PyPI wheels, "
        "12.4 from Debian's non-free archive",
    ),
]
BasePrometheusOpt = Annotated[
    bool,
    typer.Option(
        "--prometheus",
        help="also make moe-stack/prometheus:SUITE from Debian's package (compose --monitoring)",
    ),
]


def base(
    tag: BaseTagOpt = DEFAULT_LOCAL_TAG,
    suite: BaseSuiteOpt = DEFAULT_SUITE,
    mirror: BaseMirrorOpt = None,
    force: BaseForceOpt = False,
    cuda: BaseCudaOpt = None,
    prometheus: BasePrometheusOpt = False,
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
