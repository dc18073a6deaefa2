"""Build a rendered context with buildx. The calls are a plain value (BuildPlan) first, so tests and
`--dry-run` see exactly what runs; python-on-whales then makes them: first the `contract` stage
(the server's --help, parsed into the flags label), then the image, from the same cached layers."""

from __future__ import annotations

import re
import shlex
import tempfile
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO, TypedDict

from python_on_whales import DockerClient
from python_on_whales.exceptions import DockerException

from builder.contract import (
    ARCHITECTURES_FILE,
    ARCHITECTURES_LABEL,
    CHAT_PAGE_CONTEXT,
    HELP_FILE,
    LABEL_PREFIX,
    PARSER_FLAGS_FILE,
    local_only,
)
from builder.docker_client import docker
from builder.engines.specs import ImageSpec
from builder.errors import INTERRUPTED_MESSAGE, BuildFailed, Interrupted, SpecError
from builder.files import cache_dir, content_dir
from builder.host.probe import CpuInfo, read_cpu
from builder.images.ccache_carry import carried
from builder.images.chat_page import chat_page, fetched_ui
from builder.images.naming import alias_image_tag, build_name, cache_key, context_name, image_tag
from builder.images.render import render_files
from builder.platform.flags import LABEL as FLAGS_LABEL
from builder.platform.flags import parse_contract, to_label
from builder.platform.targets import best_cpu_target
from builder.spec import GitSource, LocalSource

# The stage the image is; the others only build it. A tools image is the stage after it.
RUNTIME_STAGE = "runtime"
TOOLS_STAGE = "tools"
# The stage holding only the server's --help text, exported before the image is built.
CONTRACT_STAGE = "contract"
# Set when the contract was read from another build of the same tree (see contract_stand_in): its tag.
CONTRACT_FROM_LABEL = f"{LABEL_PREFIX}.contract-from"


class _BuildxRequired(TypedDict):
    context_path: Path
    file: Path
    target: str
    tags: list[str]
    labels: dict[str, str]
    build_contexts: dict[str, str | Path]
    load: bool


class BuildxArgs(_BuildxRequired, total=False):
    """`docker.buildx.build`'s arguments, typed as python-on-whales takes them."""

    output: dict[str, str]
    push: bool
    sbom: bool
    provenance: dict[str, str]
    cache_from: str
    cache_to: str
    metadata_file: Path


@dataclass(frozen=True)
class BuildPlan:
    context: Path
    tags: tuple[str, ...]
    labels: dict[str, str] = field(default_factory=dict)
    build_contexts: dict[str, str] = field(default_factory=dict)
    load: bool = True
    target: str = RUNTIME_STAGE
    output: dict[str, str] = field(default_factory=dict)
    # Publishing (CI): push instead of load, with SBOM and provenance attestations, a cache to share.
    push: bool = False
    attest: bool = True  # with push: SBOM and provenance (a docker-container builder; no docker driver)
    cache_from: str | None = None
    cache_to: str | None = None
    metadata_file: Path | None = None

    def kwargs(self) -> BuildxArgs:
        """Arguments for `docker.buildx.build`."""
        kwargs = BuildxArgs(
            context_path=self.context,
            file=self.context / "Dockerfile",
            target=self.target,
            tags=list(self.tags),
            labels=dict(self.labels),
            build_contexts=dict[str, str | Path](self.build_contexts),
            load=self.load,
        )
        if self.output:
            kwargs["output"] = dict(self.output)
        if self.push:
            kwargs["push"] = True
            if self.attest:
                kwargs["sbom"], kwargs["provenance"] = True, {"mode": "max"}
        if self.cache_from:
            kwargs["cache_from"] = self.cache_from
        if self.cache_to:
            kwargs["cache_to"] = self.cache_to
        if self.metadata_file:
            kwargs["metadata_file"] = self.metadata_file
        return kwargs

    def argv(self) -> list[str]:
        """The same build as a `docker buildx build` command line."""
        argv = [
            "docker",
            "buildx",
            "build",
            "--file",
            str(self.context / "Dockerfile"),
            "--target",
            self.target,
        ]
        for tag in self.tags:
            argv += ["--tag", tag]
        for key, value in self.labels.items():
            argv += ["--label", f"{key}={value}"]
        for name, path in self.build_contexts.items():
            argv += ["--build-context", f"{name}={path}"]
        if self.output:
            argv += ["--output", ",".join(f"{k}={v}" for k, v in self.output.items())]
        if self.load:
            argv.append("--load")
        if self.push:
            argv += ["--push", *(["--sbom=true", "--provenance=mode=max"] if self.attest else [])]
        if self.cache_from:
            argv += ["--cache-from", self.cache_from]
        if self.cache_to:
            argv += ["--cache-to", self.cache_to]
        if self.metadata_file:
            argv += ["--metadata-file", str(self.metadata_file)]
        return argv + [str(self.context)]

    def contract_step(self, dest: Path, stage: str = CONTRACT_STAGE) -> BuildPlan:
        """The first step: export the server's --help text (the `contract` stage, or another files-only
        `stage`) into `dest` (reading the shared cache; the second step writes it)."""
        return replace(
            self,
            target=stage,
            tags=(),
            labels={},
            load=False,
            output={"type": "local", "dest": str(dest)},
            push=False,
            cache_to=None,
            metadata_file=None,
        )

    def for_publishing(self, spec: ImageSpec, publishing: Publishing) -> BuildPlan:
        """The same build pushed to the registry instead of loaded: the immutable tag and the moving
        alias, SBOM and max-mode provenance (a registry push can carry attestations, the docker image
        store can't), and a registry cache: every stage's layers (mode=max, so an unchanged variant
        compiles nothing) under a tag of their own per variant, the ref left out of it so a new ref
        reuses the toolchain layers."""
        cache = f"{publishing.cache_repo}:{cache_key(spec)}" if publishing.cache_repo else None
        return replace(
            self,
            tags=(image_tag(spec), alias_image_tag(spec, publishing.channel)),
            load=False,
            push=True,
            attest=publishing.attest,
            cache_from=f"type=registry,ref={cache}" if cache else None,
            # OCI media types and an image manifest: the form GHCR and distribution both store.
            cache_to=f"type=registry,ref={cache},mode=max,image-manifest=true,oci-mediatypes=true"
            if cache
            else None,
            metadata_file=publishing.metadata_file,
        )

    def with_labels(self, labels: dict[str, str]) -> BuildPlan:
        return replace(self, labels={**self.labels, **labels})

    def command_lines(self, contract_dir: Path) -> list[str]:
        """Both buildx calls, as shell lines (the second's flags label comes from the first's output)."""
        final = self.with_labels({FLAGS_LABEL: f"<flags parsed from {contract_dir}/{HELP_FILE}>"})
        return [shlex.join(self.contract_step(contract_dir).argv()), shlex.join(final.argv())]


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


def local_bases(dockerfile: str) -> list[str]:
    """The images made on this host (contract.LOCAL_ONLY) that a Dockerfile's FROM lines name."""
    stages, images = set(), []
    for match in re.finditer(
        r"^FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", dockerfile, re.MULTILINE | re.IGNORECASE
    ):
        if match.group(1).lower() not in stages and local_only(match.group(1)):
            images.append(match.group(1))
        if match.group(2):
            stages.add(match.group(2).lower())
    return images


def stream_build(
    client: DockerClient, plan: BuildPlan, log: TextIO, log_path: Path, show: Callable[[str], None]
) -> None:
    """Run one buildx call, each log line shown and kept; a failure is BuildFailed with the tail. A
    base made on this host must be here: buildx would pull a missing one by its name from Docker Hub."""
    for base in local_bases((plan.context / "Dockerfile").read_text()):
        if not client.image.exists(base):
            raise BuildFailed(
                f"the base image {base} is made on this host and is not here; make it first with "
                f"`moe-stack base{' --cuda VERSION' if 'cuda' in base else ''}` (a build would pull "
                "that name from Docker Hub, where it is not moe-stack's)"
            )
    tail: deque[str] = deque(maxlen=25)
    try:
        lines = client.buildx.build(**plan.kwargs(), progress="plain", stream_logs=True)
        if not isinstance(lines, Iterator):  # stream_logs=True returns the log's lines
            raise BuildFailed(
                f"buildx returned {type(lines).__name__}, not its log (full log: {log_path})",
                log_path=str(log_path),
            )
        for line in lines:
            line = line.rstrip("\n")
            log.write(line + "\n")
            tail.append(line)
            show(line)
    except DockerException as err:
        extra = (err.stderr or "").strip().splitlines()
        log.write("".join(line + "\n" for line in extra))
        log.flush()
        if any("context canceled" in line for line in extra):  # buildx saw the Ctrl-C first
            raise Interrupted(INTERRUPTED_MESSAGE) from None
        tail.extend(extra[-10:])
        failing = next(
            (line for line in reversed(tail) if "ERROR" in line or "error:" in line), "see the log"
        )
        raise BuildFailed(
            f"image build failed: {failing.strip()} (full log: {log_path})",
            tail="\n".join(tail),
            log_path=str(log_path),
        ) from None
    log.flush()


def build_context(spec: ImageSpec) -> Path:
    """`spec`'s rendered context, in the cache under its name and a hash of its files (content_dir): a
    render for another base, or a dry run, never changes what a running build reads, and the printed
    build command can be rerun."""
    return content_dir(render_files(spec), cache_dir() / "contexts", context_name(spec))


@dataclass(frozen=True)
class Publishing:
    """How `moe-stack build --push` publishes (CI's image workflows)."""

    cache_repo: str | None = None  # a registry repository holding each variant's build cache
    metadata_file: Path | None = None
    channel: str | None = None  # the moving alias' prefix: `edge` for upstream heads
    attest: bool = True  # SBOM and provenance: needs a docker-container builder


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
