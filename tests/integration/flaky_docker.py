"""A `docker` first on PATH that fails the first container start it is asked for the way runc does on a
loaded host ("read init-p: connection reset by peer") and hands everything else to Docker: the fault the
one start path (builder/container_start.py) must survive, injected for any caller."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from builder.container_start import RUNTIME_LOST_INIT

LOST = (
    "docker: Error response from daemon: failed to create task for container: failed to create shim task: "
    "OCI runtime create failed: runc create failed: unable to start container process: error during "
    f"container init: {RUNTIME_LOST_INIT}: unknown"
)


@dataclass(frozen=True)
class FlakyDocker:
    path: str  # PATH with the stand-in first
    lost: Path  # exists once the stand-in failed a start
    starts: Path  # a line per container start asked of it

    def started(self) -> int:
        return len(self.starts.read_text().splitlines()) if self.starts.exists() else 0


def flaky_docker(directory: Path, lose_first: bool, builds: bool = False) -> FlakyDocker:
    """The stand-in in `directory`; with `builds`, a `buildx build` counts as a start too (BuildKit starts
    a container per step through the same runtime) and fails the way buildx reports a lost step."""
    real = shutil.which("docker")
    assert real is not None
    bin_dir = directory / "bin"
    bin_dir.mkdir(parents=True)
    flaky = FlakyDocker(f"{bin_dir}:{os.environ['PATH']}", directory / "lost", directory / "starts")
    if not lose_first:
        flaky.lost.touch()
    script = bin_dir / "docker"
    script.write_text(
        "#!/bin/sh\n"
        "starts=no\n"
        'case "$1" in\n'
        "  run|exec) starts=yes ;;\n"
        '  container) case "$2" in run|exec|start) starts=yes ;; esac ;;\n'
        '  compose) for word in "$@"; do case "$word" in up|run) starts=yes ;; esac; done ;;\n'
        + ('  buildx) [ "$2" = build ] && starts=yes ;;\n' if builds else "")
        + "esac\n"
        f'if [ "$starts" = yes ]; then echo "$1" >>{flaky.starts}; fi\n'
        f'if [ "$starts" = yes ] && [ ! -e {flaky.lost} ]; then\n'
        f"  : >{flaky.lost}\n"
        f'  echo "{LOST}" >&2\n'
        "  exit 125\n"
        "fi\n"
        f'exec {real} "$@"\n'
    )
    script.chmod(0o755)
    return flaky
