"""What the command-line modules share: the console, common options, small parsers."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Column, Table

from builder.engines import engine_names
from builder.errors import SpecError

# Markup off: paths, model names and engine output printed here may hold `[...]` (rich would read `x[/]`
# as a tag and fail); the few styled cells build their Text explicitly (Text.from_markup + escape).
out = Console(markup=False)
EngineOpt = Annotated[str, typer.Option("--engine", "-e", help=f"one of {', '.join(engine_names())}")]
PresetsFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--presets",
        help="your own presets file (the schema of compose/presets.yaml), merged over the packaged presets: "
        "new names added, a packaged name's keys changed (default: $MOE_STACK_PRESETS)",
    ),
]


def text_table(*headers: str) -> Table:
    """A borderless table whose long cells (image tags, paths) wrap onto more lines instead of being cut
    with an ellipsis at the terminal's width."""
    return Table(*(Column(header, overflow="fold") for header in headers), box=None)


def first_paragraph(doc: str | None) -> str | None:
    """A docstring's first paragraph on one line: the command list's entry (typer keeps its line breaks,
    which the list then breaks again at its own width)."""
    return " ".join(inspect.cleandoc(doc).split("\n\n")[0].split()) if doc else None


def raw_stderr(line: str) -> None:
    """Build output as is (no wrapping or markup), so it reads like `docker buildx build`."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def int_list(text: str | None, option: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",")) if text else ()
    except ValueError:
        raise SpecError(f"{option} {text!r} must be numbers separated by commas, e.g. 0,1") from None


def float_list(text: str | None, option: str) -> tuple[float, ...]:
    try:
        values = tuple(float(part) for part in text.split(",")) if text else ()
    except ValueError:
        raise SpecError(f"{option} {text!r} must be numbers separated by commas, e.g. 24 or 24,24") from None
    if any(not 0 < value < 1e6 for value in values):
        raise SpecError(f"{option} {text!r}: each value must be a positive size in GiB")
    return values
