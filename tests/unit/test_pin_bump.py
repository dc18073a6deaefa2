"""The weekly refs workflow's pull request: after a bump, its re-render step brings every file the pins
reach up to date, and the unit suite stays green (tests of the tag format pass refs explicitly; tests of
the pins read them) but for one test, which says the pin has left the tree the suite builds."""

from __future__ import annotations

import fnmatch
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from builder.platform.pins import Bump, bump_pins, load_pins
from tests.repo_copy import tracked_copy, unit_suite

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github/workflows/refs.yml"
PARTED = "tests/unit/test_published.py::test_the_pinned_ref_is_the_tree_the_suite_builds"


def _step(name: str) -> dict:
    steps = yaml.safe_load(WORKFLOW.read_text())["jobs"]["bump"]["steps"]
    return next(step for step in steps if step.get("name") == name)


@pytest.mark.lint  # slow: it runs the unit suite again, in the copy
def test_a_pin_bump_keeps_the_suite_green(tmp_path: Path) -> None:
    repo = tracked_copy(tmp_path / "repo")
    pins_file = repo / "dockerfiles/pins.yaml"
    pins = load_pins()
    new = {"llama.cpp": "b99999", "ik_llama.cpp": "a" * 40, "ktransformers": "0.9.9"}
    pins_file.write_text(
        bump_pins(
            pins_file.read_text(),
            [Bump(engine, pins[engine].ref, ref, "test") for engine, ref in new.items()],
        )
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONDONTWRITEBYTECODE": "1"}
    step = _step("Re-render the golden files for the new refs")
    rerender = subprocess.run(
        [sys.executable, *step["run"].split()[1:], "-p", "no:cacheprovider"],
        cwd=repo,
        env={**env, **step["env"]},
        capture_output=True,
        text=True,
        check=False,
    )
    assert step["run"].startswith("python "), step["run"]
    assert rerender.returncode == 0, rerender.stdout[-3000:] + rerender.stderr[-1000:]
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    moved = [line[3:] for line in status.splitlines()]
    committed = _step_paths()
    assert moved and all(any(fnmatch.fnmatch(path, pattern) for pattern in committed) for path in moved), (
        moved
    )
    assert any(path.startswith("compose/") for path in moved), "the example stacks name the pinned images"
    suite = unit_suite(repo, env, "-x", "--deselect", PARTED)
    assert suite.returncode == 0, suite.stdout[-3000:]
    # The one test a bump fails by design: the pin has left the tree the suite builds (the sdists), so the
    # pull request stays red until the tested tree follows it (a newer sdist) or the pin goes back.
    parted = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", PARTED, "-p", "no:cacheprovider"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert parted.returncode == 1 and "1 failed" in parted.stdout, parted.stdout[-2000:]


def _step_paths() -> list[str]:
    """The paths the workflow's pull request commits (create-pull-request's add-paths)."""
    steps = yaml.safe_load(WORKFLOW.read_text())["jobs"]["bump"]["steps"]
    pull_request = next(
        step for step in steps if str(step.get("uses", "")).startswith("peter-evans/create-pull-request")
    )
    return [
        line.strip().replace("/**", "/*")
        for line in pull_request["with"]["add-paths"].splitlines()
        if line.strip()
    ]
