"""`moe-stack matrix | refs`: the images CI builds (dockerfiles/matrix.yaml) and the engine refs they
pin (dockerfiles/pins.yaml), against upstream."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from builder.cli.common import (
    out,
    text_table,
)
from builder.engines import get_engine
from builder.errors import (
    SpecError,
)
from builder.files import write_file_atomically
from builder.images.matrix import Variant as MatrixVariant
from builder.images.matrix import (
    ci_rows,
    edge_specs,
    publish_set,
    variants,
)
from builder.images.mirror import mirror_dir
from builder.images.naming import variant_tag
from builder.images.refs import NetworkUpstream, edge_refs, plan_bumps
from builder.platform.pins import Bump, bump_pins, load_pins, parse_pins, pins_path, summary
from builder.stacks.bump_gate import gate_bump


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
        else [MatrixVariant(s, s.engine.name, s.cuda.version, s.cpu.name) for s in specs]
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
        bool,
        typer.Option(
            "--bump",
            help="write upstream's newer refs into the pins file, each llama.cpp engine's once it proves "
            "itself (smoke and an A/B bench against the pin on this host)",
        ),
    ] = False,
    pins_file: Annotated[
        Path | None,
        typer.Option("--pins", help="the pins file (default: dockerfiles/pins.yaml of this installation)"),
    ] = None,
    summary_file: Annotated[
        Path | None,
        typer.Option("--summary", help="also write a Markdown summary of the moves (a pull request's body)"),
    ] = None,
    sources: Annotated[
        Path | None,
        typer.Option(
            "--sources", help="the source mirror holding both trees (default: each ref's git clone)"
        ),
    ] = None,
    gate_model: Annotated[
        Path | None,
        typer.Option("--gate-model", help="the GGUF the gate serves (default: a tiny synthetic MoE)"),
    ] = None,
    no_gate: Annotated[
        bool,
        typer.Option("--no-gate", help="write the bumps unproven (the tests of a pull request prove them)"),
    ] = False,
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
    refused = {} if not bump or no_gate else _gated_out(bumps, mirror_dir(sources), gate_model)
    kept = [move for move in bumps if move.engine not in refused]
    if bump and kept:
        write_file_atomically(path, bump_pins(text, kept))
        out.print(
            f"wrote {path}; re-render the golden files: "
            "MOE_STACK_UPDATE_GOLDEN=1 pytest tests/unit/test_golden.py",
            highlight=False,
            soft_wrap=True,
        )
    if summary_file is not None:
        write_file_atomically(summary_file, summary(kept))
    if refused:
        raise SpecError(f"refused: {'; '.join(f'{name}: {why}' for name, why in refused.items())}")


def _gated_out(bumps: list[Bump], sources: Path | None, model: Path | None) -> dict[str, str]:
    """Each bump of an engine built from a tree, proven (bump_gate.py), its table printed; the refused
    ones, with why."""
    refused = {}
    for move in bumps:
        engine = get_engine(move.engine)
        if not engine.mirrored:
            out.print(f"{move.engine}: not gated (it installs wheels)", highlight=False)
            continue
        with tempfile.TemporaryDirectory(prefix="moe-stack-gate-") as work:
            verdict = gate_bump(engine, move.old, move.new, sources, model, Path(work), out.print)
        for line in verdict.table():
            out.print(line, highlight=False, soft_wrap=True)
        if verdict.refused is not None:
            refused[move.engine] = verdict.refused
    return refused
