"""The CI workflows as a supply chain: every action pinned by commit (a tag can be moved to other code),
no checkout leaving its token in .git/config for the steps after it (test extras, npm builds and engine
builds run there), and each token with no more scope than its job uses. Schema and actionlint:
test_schemas.py."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / ".github/workflows").glob("*.yml"))
# `uses: owner/repo@<40-hex commit>  # vX.Y.Z`: the commit runs, the comment says which release it is.
PINNED = re.compile(r"^\s*(?:-\s+)?uses:\s+[\w.-]+/[\w./-]+@[0-9a-f]{40}\s+#\s+v\d+\.\d+\.\d+\s*$")
USES_LINE = re.compile(r"^\s*(?:-\s+)?uses:")


def _load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def _jobs() -> Iterator[tuple[str, dict[str, Any], Any]]:
    """Every job as `workflow/job`, the job, and the permissions its GITHUB_TOKEN gets (the job's own,
    else the workflow's)."""
    for path in WORKFLOWS:
        workflow = _load(path)
        for name, job in workflow["jobs"].items():
            yield f"{path.name}/{name}", job, job.get("permissions", workflow.get("permissions"))


def _writes(permissions: Any) -> bool:
    """Whether a `permissions:` value grants any write scope (absent: the repository's default, which
    may be write-all)."""
    if permissions is None or permissions == "write-all":
        return True
    return isinstance(permissions, dict) and "write" in permissions.values()


def test_every_action_is_pinned_by_commit_with_its_release_beside_it() -> None:
    lines = [
        (path.name, line)
        for path in WORKFLOWS
        for line in path.read_text().splitlines()
        if USES_LINE.match(line)
    ]
    steps = [step for _, job, _ in _jobs() for step in job.get("steps", []) if "uses" in step]
    assert len(lines) == len(steps) > 10  # every step's `uses:` is on a line of its own, so checked here
    unpinned = [f"{name}: {line.strip()}" for name, line in lines if not PINNED.match(line)]
    assert not unpinned, unpinned


def test_no_checkout_leaves_its_token_for_later_steps() -> None:
    checkouts = [
        (name, step)
        for name, job, _ in _jobs()
        for step in job.get("steps", [])
        if str(step.get("uses", "")).startswith("actions/checkout@")
    ]
    assert len(checkouts) >= 7
    persisted = [
        name for name, step in checkouts if (step.get("with") or {}).get("persist-credentials") is not False
    ]
    assert not persisted, f"checkouts without persist-credentials: false in {persisted}"
    # Those with a write scope above all (the publishing jobs: packages:write).
    assert any(_writes(permissions) for _, _, permissions in _jobs())


def test_the_refs_job_reads_and_its_app_token_asks_for_what_the_pull_request_needs() -> None:
    workflow = _load(ROOT / ".github/workflows/refs.yml")
    job = workflow["jobs"]["bump"]
    assert workflow["permissions"] == {"contents": "read"}
    assert job.get("permissions", workflow["permissions"]) == {"contents": "read"}
    app = next(step for step in job["steps"] if step.get("id") == "app-token")
    asked = {key: value for key, value in app["with"].items() if key.startswith("permission-")}
    assert asked == {"permission-contents": "write", "permission-pull-requests": "write"}
    opened = next(step for step in job["steps"] if "create-pull-request" in str(step.get("uses")))
    assert opened["with"]["token"] == "${{ steps.app-token.outputs.token }}"


def test_every_job_names_its_token_scope() -> None:
    """No job falls back to the repository's default token permissions (possibly write-all)."""
    unscoped = [name for name, _, permissions in _jobs() if permissions is None]
    assert not unscoped, unscoped


def test_no_publishing_job_takes_a_compile_cache_other_jobs_can_write() -> None:
    """GitHub's Actions cache is scoped to the branch, not the job: any job on main (the tests' unpinned
    extras, the npm build) can save an entry a publishing job would restore, and its objects (or a
    ccache.conf) would end up in a signed image. Publishing jobs restore none and carry no `--ccache-dir`."""
    publishing = [
        (name, job) for name, job, permissions in _jobs() if (permissions or {}).get("packages") == "write"
    ]
    assert {name for name, _ in publishing} == {"images.yml/build", "edge.yml/build"}
    for name, job in publishing:
        for step in job["steps"]:
            assert not str(step.get("uses", "")).startswith("actions/cache"), f"{name}: {step}"
            assert "COMPILE_CACHE" not in (step.get("env") or {}), f"{name}: {step.get('name')}"
            assert "--ccache-dir" not in str(step.get("run", "")), f"{name}: {step.get('name')}"
