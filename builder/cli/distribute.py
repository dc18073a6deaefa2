"""`moe-stack publish | pull | bundle | load`: getting images to where they run; each verb is a thin layer
over publish.py or bundle.py."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from builder.cli.common import out
from builder.cli.options import declared, takes_options
from builder.distribute.bundle import LoadOptions, load_bundle, make_bundle, sha256, unreadable_models
from builder.distribute.publish import publish as publish_images
from builder.distribute.publish import pull as pull_image
from builder.engines import Engine
from builder.errors import SpecError
from builder.host.probe import probe
from builder.images.naming import DEFAULT_PREFIX
from builder.models.planner import size


def publish(
    images: Annotated[list[str], typer.Argument(help="local images built by moe-stack")],
    to: Annotated[
        str,
        typer.Option(
            "--to", help="REGISTRY/NAMESPACE to push to, e.g. ghcr.io/OWNER or 127.0.0.1:5000/moe-stack"
        ),
    ],
) -> None:
    """Push images under their immutable tag and moving alias; each digest is checked against the registry."""
    for pushed in publish_images(images, to):
        out.print(f"pushed {pushed.tag} {pushed.digest}", highlight=False, soft_wrap=True)


@takes_options()
def pull(
    source: Annotated[str, typer.Option("--from", help="REGISTRY/NAMESPACE to pull from")] = DEFAULT_PREFIX,
    engine: Engine = declared(),
    ref: Annotated[
        str | None, typer.Option("--ref", help="engine ref part of the tag (default: the pinned one)")
    ] = None,
    cpu_only: Annotated[
        bool, typer.Option("--cpu-only", help="ignore the GPU: pull a CPU-only image")
    ] = False,
) -> None:
    """Pull the variant that fits this host best (CPU flags → ISA target, GPU + driver → CUDA version)."""
    pulled = pull_image(engine, source, probe(), ref, cpu_only)
    out.print(f"pulled {pulled.image} ({pulled.digest})", highlight=False, soft_wrap=True)
    out.print(f"why: {pulled.choice.reason}", highlight=False, soft_wrap=True)


def bundle(
    compose_file: Annotated[Path, typer.Argument(help="compose file from `moe-stack compose`")],
    output: Annotated[Path, typer.Option("--out", "-o", help="archive to write")] = Path(
        "moe-stack-bundle.tar"
    ),
    include_model: Annotated[
        bool, typer.Option("--include-model", help="put the model file(s) in the archive too")
    ] = False,
) -> None:
    """Write one archive with the stack's images, its compose file, and a manifest of digests and model
    checksums."""
    path = make_bundle(compose_file, output, include_model)
    digest = sha256(path)
    out.print(
        f"wrote {path} ({size(path.stat().st_size)}), {digest}; on the other machine: moe-stack load "
        f"{path.name} --expect-sha256 {digest.removeprefix('sha256:')}",
        highlight=False,
        soft_wrap=True,
    )


@takes_options()
def load(
    archive: Annotated[Path, typer.Argument(help="bundle from `moe-stack bundle`")],
    dest: Annotated[
        Path, typer.Option("--dest", help="directory for the stack (and the bundled model)")
    ] = Path("."),
    expect_sha256: Annotated[
        str | None,
        typer.Option(
            "--expect-sha256",
            help="the archive's sha256 that `bundle` printed (got out of band): refuse any other",
        ),
    ] = None,
    unverified: Annotated[
        bool,
        typer.Option(
            "--unverified",
            help="load without an out-of-band sha256 (the bundle's own checksums catch corruption, not "
            "tampering)",
        ),
    ] = False,
    model_dir: Annotated[
        Path | None,
        typer.Option("--model-dir", help="where the model is, when the bundle doesn't hold it"),
    ] = None,
    bind: str = declared(),
    config_dir: Path | None = declared(
        help="KTransformers: this host's copy of the model's Hugging Face directory, for a stack that "
        "mounts one"
    ),
    api_key_file: Path | None = declared(
        help="this host's API key file: the loaded stack checks this key (a bundle carries none of its own)"
    ),
) -> None:
    """Check a bundle's digests, load its images and write its stack (rebuilt by moe-stack); needs no
    network."""
    if expect_sha256 is None and not unverified:
        raise SpecError(
            "pass --expect-sha256 with the sha256 `moe-stack bundle` printed (got out of band), or "
            "--unverified to trust the bundle's own checksums"
        )
    if expect_sha256 is not None and unverified:
        raise SpecError("--expect-sha256 and --unverified contradict each other; give one")
    options = LoadOptions(
        expect_sha256=expect_sha256,
        model_dir=model_dir,
        bind=bind,
        config_dir=config_dir,
        api_key_file=api_key_file,
    )
    compose_file = load_bundle(archive, dest, options)
    for problem in unreadable_models(compose_file):
        out.print(f"warning: {problem}", highlight=False, soft_wrap=True)
    out.print(f"loaded; start it with: moe-stack up {compose_file}", highlight=False, soft_wrap=True)
