"""Run the real `moe-stack` command line: in a subprocess, as a user would, or in this process."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

from builder.cli.main import main


def run_cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: int = 3600
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "builder", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        timeout=timeout,
        check=False,
    )


def run_cli_in_process(*args: str) -> subprocess.CompletedProcess[str]:
    """The same entry point in this process (fast enough for property-based tests): exit status,
    stdout and stderr as a subprocess would give them."""
    out, err = io.StringIO(), io.StringIO()
    status = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as exit_:
            status = exit_.code if isinstance(exit_.code, int) else 1
    return subprocess.CompletedProcess(["moe-stack", *args], status, out.getvalue(), err.getvalue())
