"""How a long build shows itself: in a terminal, one live line (the stage, BuildKit's step n/m, what it
runs, the time so far) instead of a thousand raw lines; plain BuildKit lines when stderr is not a
terminal (CI, logs) or with --progress plain. The full log is always kept in a file (named at the
end), and a failure prints its last lines (cli.main)."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from builder.cli.common import raw_stderr
from builder.images.options import ProgressMode

# `#12 [build 3/7] RUN cmake --build ...` (a stage's step) or `#5 [internal] load metadata ...`
_STEP = re.compile(r"^#\d+ \[(?P<stage>[\w.-]+)(?: (?P<n>\d+)/(?P<m>\d+))?\] (?P<what>.+)$")


@dataclass(frozen=True)
class Step:
    stage: str
    number: int | None
    of: int | None
    what: str


def parse_step(line: str) -> Step | None:
    """The step a BuildKit plain-progress line starts, or None for its other lines."""
    match = _STEP.match(line.strip())
    if match is None:
        return None
    number, of = match["n"], match["m"]
    return Step(match["stage"], int(number) if number else None, int(of) if of else None, match["what"])


class LiveBuild:
    """One live line for a build: the latest step's stage, n/m and command, the elapsed time."""

    def __init__(self, console: Console) -> None:
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(bar_width=20),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=console,
        )
        self.task = self.progress.add_task("starting the build", total=None)

    def show(self, line: str) -> None:
        step = parse_step(line)
        if step is None:
            return
        what = step.what if len(step.what) <= 70 else step.what[:69] + "…"
        if step.number is not None:
            self.progress.update(
                self.task, description=f"{step.stage}: {what}", completed=step.number - 1, total=step.of
            )
        else:
            self.progress.update(self.task, description=f"{step.stage}: {what}")

    @property
    def description(self) -> str:
        return self.progress.tasks[0].description


@contextmanager
def build_display(mode: ProgressMode = "auto") -> Iterator[Callable[[str], None]]:
    """A `show` for build lines: live in a terminal, plain otherwise (or when asked)."""
    if mode == "plain" or (mode == "auto" and not sys.stderr.isatty()):
        yield raw_stderr
        return
    live = LiveBuild(Console(stderr=True))
    with live.progress:
        yield live.show
