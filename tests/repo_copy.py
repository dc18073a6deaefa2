"""A copy of the repository's tracked files (what a workflow checks out), committed in a fresh git
repository, for tests that change the project itself and run it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from builder.images.mirror import SOURCES_ENV
from tests.sources import source_mirror

ROOT = Path(__file__).resolve().parents[1]
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]


def tracked_copy(into: Path) -> Path:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        source, target = ROOT / name, into / name
        if source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    subprocess.run([*GIT, "init", "-q"], cwd=into, check=True)
    subprocess.run([*GIT, "add", "-A"], cwd=into, check=True)
    subprocess.run([*GIT, "commit", "-qm", "as checked out"], cwd=into, check=True)
    return into


def unit_suite(repo: Path, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    """The pure unit tests (no cli, no lint) run in `repo`, as a changed copy would be checked."""
    command = [sys.executable, "-m", "pytest", "-q", "tests/unit", "-m", "not cli and not lint"]
    mirror = source_mirror()  # the copy has no ../shared beside it: the checkout's mirror, by name
    return subprocess.run(
        [*command, "-p", "no:cacheprovider", *extra],
        cwd=repo,
        env={SOURCES_ENV: str(mirror), **env} if mirror is not None else env,
        capture_output=True,
        text=True,
        check=False,
    )
