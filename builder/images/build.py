"""Build a rendered context with buildx. The calls are a plain value (BuildPlan) first, so tests and
`--dry-run` see exactly what runs; python-on-whales then makes them: first the `contract` stage
(the server's --help, parsed into the flags label), then the image, from the same cached layers."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from contextlib import nullcontext
from datetime import UTC, datetime
from pathlib import Path

from builder.contract import (
    ARCHITECTURES_FILE,
    ARCHITECTURES_LABEL,
    CHAT_PAGE_CONTEXT,
    HELP_FILE,
    PARSER_FLAGS_FILE,
)
from builder.docker_client import docker
from builder.engines.base import ImageSpec
from builder.errors import BuildFailed, SpecError
from builder.files import cache_dir, content_dir
from builder.host.probe import CpuInfo, read_cpu
from builder.images.build_plan import (
    CONTRACT_FROM_LABEL,
    RUNTIME_STAGE,
    TOOLS_STAGE,
    BuildPlan,
    Publishing,
    stream_build,
)
from builder.images.ccache_carry import carried
from builder.images.chat_page import chat_page, fetched_ui
from builder.images.naming import build_name, context_name, image_tag
from builder.images.render import render_files
from builder.platform.flags import LABEL as FLAGS_LABEL
from builder.platform.flags import parse_contract, to_label
from builder.platform.targets import best_cpu_target
from builder.spec import GitSource, LocalSource


def plan_build(
    spec: ImageSpec,
    context: Path,
    source_tree: Path | None,
    created: datetime | None = None,
    page: Path | None = None,
) -> BuildPlan:
    """The build of `spec` from its rendered `context`; `source_tree` replaces the git clone, `page` is
    the built chat page the image embeds (chat_page.py)."""
    created = created or datetime.now(UTC)
    holds = spec.source.holds if isinstance(spec.source, LocalSource) else "tree"
    contexts = {spec.engine.source_context(holds): str(source_tree)} if source_tree is not None else {}
    if page is not None:
        contexts[CHAT_PAGE_CONTEXT] = str(page)
    return BuildPlan(
        context=context,
        tags=(image_tag(spec),),
        labels={"org.opencontainers.image.created": created.strftime("%Y-%m-%dT%H:%M:%SZ")},
        build_contexts=contexts,
        target=TOOLS_STAGE if spec.tools else RUNTIME_STAGE,
    )


def run_build(
    plan: BuildPlan,
    required_flags: frozenset[str],
    log_path: Path,
    show: Callable[[str], None],
    contract_plan: BuildPlan | None = None,
    ccache_dir: Path | None = None,
) -> str:
    """Build the flag contract, then the image labelled with it; returns the image's first tag.

    `required_flags`: what the server's --help must list (none for an image without a server).
    `contract_plan`: where the contract comes from when this build host can't run the image's server
    (see `contract_stand_in`). `ccache_dir`: the compile cache carried in and out (ccache_carry). Each
    log line is shown and kept in `log_path`. On failure raise BuildFailed with the failing step's tail
    and where the full log is. The second step reuses every layer of the first.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    client = docker()
    with (
        log_path.open("w") as log,
        tempfile.TemporaryDirectory(prefix="moe-stack-contract-") as tmp,
        carried(plan, ccache_dir, lambda step: stream_build(client, step, log, log_path, show))
        if ccache_dir is not None
        else nullcontext(),
    ):
        stream_build(client, (contract_plan or plan).contract_step(Path(tmp)), log, log_path, show)
        literals = Path(tmp) / PARSER_FLAGS_FILE
        help_text = (Path(tmp) / HELP_FILE).read_text(errors="replace")
        flags = parse_contract(help_text, literals.read_text() if literals.exists() else None)
        if not required_flags <= flags.keys():
            first = next((line for line in help_text.splitlines() if line.strip()), "(no output)")
            raise BuildFailed(
                f"the built server's --help does not list {', '.join(sorted(required_flags))}: it "
                f"printed {first.strip()!r}; the binary may not run on this build host "
                f"(full log: {log_path})",
                log_path=str(log_path),
            )
        labels = {FLAGS_LABEL: to_label(flags)}
        architectures = Path(tmp) / ARCHITECTURES_FILE
        if architectures.exists() and architectures.read_text().split():
            labels[ARCHITECTURES_LABEL] = " ".join(architectures.read_text().split())
        if contract_plan is not None:
            labels[CONTRACT_FROM_LABEL] = contract_plan.tags[0]
        stream_build(client, plan.with_labels(labels), log, log_path, show)
    return plan.tags[0]


def contract_stand_in(spec: ImageSpec, host: CpuInfo) -> ImageSpec | None:
    """The same engine tree, ref, CUDA and bases for a CPU target this build host runs, when it can't run
    `spec`'s server (a zen4 image built on an AVX2-only host: its --help dies of an illegal instruction).
    The flags a server accepts don't depend on the instructions it was compiled for, so that build's
    --help is the contract; None when the host runs `spec`'s own (or it picks its code path at run time)."""
    engine = spec.engine
    if spec.cpu.runtime_dispatch or engine.installs_wheels or set(spec.cpu.required_flags) <= host.flags:
        return None
    target = best_cpu_target(host.flags)
    if target is None:
        raise BuildFailed(
            f"this build host runs none of the CPU targets, so {spec.engine}'s --help (its flag "
            "contract) can't be read here; build on an x86-64-v3 (AVX2) host or better"
        )
    return spec.model_copy(update={"cpu": target, "tools": False})


def build_context(spec: ImageSpec) -> Path:
    """`spec`'s rendered context, in the cache under its name and a hash of its files (content_dir): a
    render for another base, or a dry run, never changes what a running build reads, and the printed
    build command can be rerun."""
    return content_dir(render_files(spec), cache_dir() / "contexts", context_name(spec))


def build_plan(
    spec: ImageSpec, context: Path, tree: Path | None, publishing: Publishing | None, page: Path | None = None
) -> BuildPlan:
    plan = plan_build(spec, context, tree, page=page)
    return plan if publishing is None else plan.for_publishing(spec, publishing)


def build_image(
    spec: ImageSpec,
    tree: Path | None,
    show: Callable[[str], None],
    log_path: Path | None = None,
    publishing: Publishing | None = None,
    ccache_dir: Path | None = None,
) -> str:
    """Render `spec` into the cache and build it (or push it, when `publishing`); returns the tag.
    The whole path `build`, CI and the demo take. `ccache_dir`: the compile cache carried in and out."""
    if ccache_dir is not None and not spec.engine.carries_ccache:
        raise SpecError(f"{spec.engine}'s image build compiles nothing through ccache: drop --ccache-dir")
    spec.engine.check_local_source(spec, tree)
    context = build_context(spec)
    page = page_for(spec, tree, show)
    stand_in = contract_stand_in(spec, read_cpu())
    contract_plan = plan_build(stand_in, build_context(stand_in), tree, page=page) if stand_in else None
    return run_build(
        build_plan(spec, context, tree, publishing, page),
        spec.engine.required_flags(spec.cuda),
        log_path or cache_dir() / "logs" / f"build-{build_name(spec)}.log",
        show,
        contract_plan,
        ccache_dir,
    )


def page_for(spec: ImageSpec, tree: Path | None, show: Callable[[str], None]) -> Path | None:
    """The chat page an image of `spec` embeds: built from the local engine tree, or for a git ref (the
    tree is cloned inside the build) from the page's directory fetched at that ref. A tools image gets
    it too: its build shares the configure stage, and so the compile, with the server's. Its build's
    container is made from the image's own Debian base where the image is a CPU one on a given base,
    else from the project's (ensure_base)."""
    ui = spec.engine.chat_page_dir
    if ui is None:
        return None
    base = spec.base.build if spec.cuda.version is None else None
    if tree is not None:
        return chat_page(tree / ui, show, base)
    if isinstance(spec.source, GitSource):
        fetched = fetched_ui(spec.source.url, spec.source.ref, ui, show)
        return chat_page(fetched, show, base) if fetched is not None else None
    return None
