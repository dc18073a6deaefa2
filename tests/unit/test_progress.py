"""A build's live line in a terminal, plain BuildKit lines otherwise."""

from __future__ import annotations

import io

from rich.console import Console

from builder.cli.common import raw_stderr
from builder.cli.progress import LiveBuild, Step, build_display, parse_step

LINES = [
    '#0 building with "default" instance using docker driver',
    "#5 [internal] load metadata for docker.io/moe-stack/debian:trixie",
    (
        "#12 [configure 4/6] RUN --mount=type=cache,id=moe-stack-ccache-llama-cpp-cpu-avx2,target=/ccache "
        "cmake -S /src"
    ),
    "#12 0.512 -- The C compiler identification is GNU 14.2.0",
    "#14 [build 1/1] RUN --mount=type=cache,id=x,target=/ccache cmake --build /build --target llama-server",
    "#14 201.3 [93/212] Building CXX object src/CMakeFiles/llama.dir/llama-model.cpp.o",
]


def test_step_lines_are_recognised() -> None:
    steps = [parse_step(line) for line in LINES]
    assert steps[0] is None and steps[3] is None and steps[5] is None  # output lines, not steps
    assert steps[1] == Step("internal", None, None, "load metadata for docker.io/moe-stack/debian:trixie")
    assert steps[2] is not None and (steps[2].stage, steps[2].number, steps[2].of) == ("configure", 4, 6)


def test_the_live_line_follows_the_steps() -> None:
    live = LiveBuild(Console(file=io.StringIO(), force_terminal=True))
    for line in LINES[:3]:
        live.show(line)
    assert live.description.startswith("configure: RUN --mount") and live.description.endswith("…")
    task = live.progress.tasks[0]
    assert (task.completed, task.total) == (3, 6)
    live.show(LINES[4])
    assert live.description.startswith("build: RUN") and live.progress.tasks[0].total == 1


def test_plain_where_there_is_no_terminal() -> None:
    with build_display("plain") as show:
        assert show is raw_stderr
    with build_display("auto") as show:  # pytest's stderr is not a terminal
        assert show is raw_stderr
