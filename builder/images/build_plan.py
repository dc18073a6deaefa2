"""One buildx call as a plain value (BuildPlan: its arguments, its command line, the steps it is made of)
and running it with its log streamed (`stream_build`): what every image build here goes through, the
engine images (build.py), the bases, the chat page's builder and ccache's carry stages."""

from __future__ import annotations

import re
import shlex
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TextIO, TypedDict

from python_on_whales import DockerClient
from python_on_whales.exceptions import DockerException

from builder.container_start import RUNTIME_LOST_INIT
from builder.contract import HELP_FILE, LABEL_PREFIX, local_only
from builder.engines.base import ImageSpec
from builder.errors import INTERRUPTED_MESSAGE, BuildFailed, Interrupted
from builder.images.naming import alias_image_tag, cache_key, image_tag
from builder.platform.flags import LABEL as FLAGS_LABEL

# The stage the image is; the others only build it. A tools image is the stage after it.
RUNTIME_STAGE = "runtime"
TOOLS_STAGE = "tools"
# The stage holding only the server's --help text, exported before the image is built.
CONTRACT_STAGE = "contract"
# Set when the contract was read from another build of the same tree (see contract_stand_in): its tag.
CONTRACT_FROM_LABEL = f"{LABEL_PREFIX}.contract-from"


@dataclass(frozen=True)
class Publishing:
    """How `moe-stack build --push` publishes (CI's image workflows)."""

    cache_repo: str | None = None  # a registry repository holding each variant's build cache
    metadata_file: Path | None = None
    channel: str | None = None  # the moving alias' prefix: `edge` for upstream heads
    attest: bool = True  # SBOM and provenance: needs a docker-container builder


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
        return self.side_step(stage, {"type": "local", "dest": str(dest)})

    def side_step(self, stage: str, output: dict[str, str] | None = None) -> BuildPlan:
        """This build of `stage` alone, its files to `output` if given: nothing tagged, labelled, loaded,
        pushed or cached to a registry."""
        return replace(
            self,
            target=stage,
            tags=(),
            labels={},
            load=False,
            output=output or {},
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
    """Run one buildx call, each log line shown and kept; a failure is BuildFailed with the tail, a step
    the runtime lost built once more. A base made on this host must be here: buildx would pull a missing
    one by its name from Docker Hub."""
    for base in local_bases((plan.context / "Dockerfile").read_text()):
        if not client.image.exists(base):
            raise BuildFailed(
                f"the base image {base} is made on this host and is not here; make it first with "
                f"`moe-stack base{' --cuda VERSION' if 'cuda' in base else ''}` (a build would pull "
                "that name from Docker Hub, where it is not moe-stack's)"
            )
    try:
        _buildx(client, plan, log, log_path, show)
    except BuildFailed as failed:
        if RUNTIME_LOST_INIT not in failed.tail:
            raise
        # BuildKit runs each step in a container of the same runtime (builder/container_start.py): a step
        # whose init was lost ran nothing, and the steps before it are cached.
        image = plan.tags[0] if plan.tags else "the image"
        show(
            f"Docker could not start a build step of {image} (its runtime lost the container's init); "
            "building it again"
        )
        _buildx(client, plan, log, log_path, show)


def _buildx(
    client: DockerClient, plan: BuildPlan, log: TextIO, log_path: Path, show: Callable[[str], None]
) -> None:
    """One buildx call, each log line shown and kept; BuildFailed with the tail when it fails."""
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
