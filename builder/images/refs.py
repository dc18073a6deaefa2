"""Where each pinned engine stands against upstream: the bumps `moe-stack refs --bump` writes into
pins.yaml, and the heads the nightly edge images build. Reading upstream is `Upstream`'s job (git
ls-remote and PyPI's JSON API over the network, or recorded answers in tests)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.request
from dataclasses import dataclass
from typing import Any, Protocol

from builder.engines import get_engine
from builder.errors import SpecError
from builder.platform.pins import Bump, Pin, branch_head, newest_pypi_version, newest_release_tag

_HEX = re.compile(r"^[0-9a-f]{7,40}$")


class Upstream(Protocol):
    def ls_remote(self, url: str, *refs: str) -> str:
        """`git ls-remote URL REFS...` output."""

    def pypi_json(self, project: str) -> dict[str, Any]:
        """PyPI's JSON API answer for `project`."""


class NetworkUpstream:
    """The real upstream: git over HTTPS, PyPI (or the index in MOE_STACK_PYPI_URL)."""

    def ls_remote(self, url: str, *refs: str) -> str:
        done = subprocess.run(
            ["git", "ls-remote", url, *refs], capture_output=True, text=True, timeout=120, check=False
        )
        if done.returncode != 0:
            raise SpecError(f"git ls-remote {url} failed: {done.stderr.strip()[-200:] or 'no output'}")
        return done.stdout

    def pypi_json(self, project: str) -> dict[str, Any]:
        base = os.environ.get("MOE_STACK_PYPI_URL", "https://pypi.org").rstrip("/")
        try:
            with urllib.request.urlopen(f"{base}/pypi/{project}/json", timeout=60) as answer:
                project_json: dict[str, Any] = json.load(answer)
                return project_json
        except OSError as err:
            raise SpecError(f"can't read {project} from {base}: {err}") from None


@dataclass(frozen=True)
class Newest:
    ref: str
    commit: str | None  # the commit a tag or branch head names (None for a PyPI version)
    note: str


def newest(pin: Pin, upstream: Upstream) -> Newest | None:
    """Upstream's newest for `pin`'s tracking; None for a frozen pin."""
    url = get_engine(pin.engine).upstream_url
    if pin.kind == "tags":
        tag, commit = newest_release_tag(upstream.ls_remote(url, "--tags", "refs/tags/b*"))
        return Newest(tag, commit, f"release {tag}, commit {commit[:12]}")
    if pin.kind == "branch":
        head = branch_head(upstream.ls_remote(url, f"refs/heads/{pin.target}"), pin.target)
        return Newest(head, head, f"{pin.target} head")
    if pin.kind == "pypi":
        version = newest_pypi_version(upstream.pypi_json(pin.target))
        return Newest(version, None, f"{pin.target} {version} on PyPI")
    return None


def plan_bumps(pins: dict[str, Pin], upstream: Upstream) -> list[Bump]:
    """The pins upstream has moved past (a pin naming the newest ref's commit, in full or short, stays)."""
    bumps = []
    for pin in pins.values():
        found = newest(pin, upstream)
        if found is None or found.ref == pin.ref:
            continue
        if found.commit is not None and _HEX.fullmatch(pin.ref) and found.commit.startswith(pin.ref):
            continue
        bumps.append(Bump(engine=pin.engine, old=pin.ref, new=found.ref, note=found.note))
    return bumps


def edge_refs(pins: dict[str, Pin], upstream: Upstream) -> dict[str, str]:
    """Each engine with an edge branch → that branch's head commit."""
    return {
        pin.engine: branch_head(
            upstream.ls_remote(get_engine(pin.engine).upstream_url, f"refs/heads/{pin.edge}"), pin.edge
        )
        for pin in pins.values()
        if pin.edge
    }
