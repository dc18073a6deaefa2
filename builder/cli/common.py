"""What the command-line modules share: the console, tables, a docstring's first paragraph, raw output."""

from __future__ import annotations

import inspect
import sys

from rich.console import Console
from rich.table import Column, Table

# Markup off: paths, model names and engine output printed here may hold `[...]` (rich would read `x[/]`
# as a tag and fail); the few styled cells build their Text explicitly (Text.from_markup + escape).
out = Console(markup=False)


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
