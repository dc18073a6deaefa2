"""`moe-stack publish | pull | bundle | load`: getting images to where they run. Registered on the
app by cli.py; each verb is a thin layer over publish.py or bundle.py."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from builder.cli.common import EngineOpt, out
from builder.distribute.bundle import load_bundle, make_bundle, sha256
from builder.distribute.publish import publish as publish_images
from builder.distribute.publish import pull as pull_image
from builder.host.probe import probe
from builder.models.planner import size

ToOpt = Annotated[str, typer.Option("--to", help="REGISTRY/NAMESPACE to push to, e.g. ghcr.io/OWNER or 127.0.0.1:5000/moe-stack")]
FromOpt = Annotated[str, typer.Option("--from", help="REGISTRY/NAMESPACE to pull from")]


def publish(
    images: Annotated[list[str], typer.Argument(help="local images built by moe-stack")],
    to: ToOpt,
) -> None:
    """Push images under their immutable tag and moving alias; each digest is checked against the registry."""
    for pushed in publish_images(images, to):
        out.print(f"pushed {pushed.tag} {pushed.digest}", highlight=False, soft_wrap=True)


def pull(
    source: FromOpt = "ghcr.io/moe-stack",
    engine: EngineOpt = "llama.cpp",
    ref: Annotated[str | None, typer.Option("--ref", help="engine ref part of the tag (default: the pinned one)")] = None,
    cpu_only: Annotated[bool, typer.Option("--cpu-only", help="ignore the GPU: pull a CPU-only image")] = False,
) -> None:
    """Pull the variant that fits this host best (CPU flags → ISA target, GPU + driver → CUDA version)."""
    pulled = pull_image(engine, source, probe(), ref, cpu_only)
    out.print(f"pulled {pulled.image} ({pulled.digest})", highlight=False, soft_wrap=True)
    out.print(f"why: {pulled.choice.reason}", highlight=False, soft_wrap=True)


def bundle(
    compose_file: Annotated[Path, typer.Argument(help="compose file from `moe-stack compose`")],
    output: Annotated[Path, typer.Option("--out", "-o", help="archive to write")] = Path("moe-stack-bundle.tar"),
    include_model: Annotated[bool, typer.Option("--include-model", help="put the model file(s) in the archive too")] = False,
) -> None:
    """Write one archive with the stack's images, its compose file and a manifest of digests and model checksums."""
    path = make_bundle(compose_file, output, include_model)
    digest = sha256(path)
    out.print(f"wrote {path} ({size(path.stat().st_size)}), {digest}; on the other machine: moe-stack load "
              f"{path.name} --expect-sha256 {digest.removeprefix('sha256:')}", highlight=False, soft_wrap=True)


def load(
    archive: Annotated[Path, typer.Argument(help="bundle from `moe-stack bundle`")],
    dest: Annotated[Path, typer.Option("--dest", help="directory for the stack (and the bundled model)")] = Path("."),
    model_dir: Annotated[Path | None, typer.Option("--model-dir", help="where the model is, when the bundle doesn't hold it")] = None,
    expect_sha256: Annotated[str | None, typer.Option("--expect-sha256", help="the archive's sha256 that `bundle` printed (got out of band): refuse any other")] = None,
) -> None:
    """Check a bundle's digests, load its images and write its stack; needs no network."""
    compose_file = load_bundle(archive, dest, model_dir, expect_sha256)
    out.print(f"loaded; start it with: moe-stack up {compose_file}", highlight=False, soft_wrap=True)
