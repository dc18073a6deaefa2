"""The pinned engine refs (dockerfiles/pins.yaml), and how the refs workflow moves them: what each
pin tracks upstream, the newest ref read from `git ls-remote` or PyPI's JSON, and the file rewritten
line by line (its comments, which say why each pin is what it is, stay)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from builder.errors import SpecError
from builder.files import templates_root

PINS_FILE = "pins.yaml"
_RELEASE_TAG = re.compile(r"^b(\d+)$")
_FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
# A PEP 440 release as PyPI's latest names it (N.N[.N…], an optional pre/post/dev part).
_RELEASE_VERSION = re.compile(
    r"[0-9]+(?:\.[0-9]+){0,5}(?:(?:a|b|rc)[0-9]+)?(?:\.post[0-9]+)?(?:\.dev[0-9]+)?"
)


@dataclass(frozen=True)
class Pin:
    engine: str
    ref: str
    track: str  # "tags bNNNN" | "branch NAME" | "pypi PACKAGE" | "frozen"
    edge: str | None = None  # the branch nightly edge images build

    @property
    def kind(self) -> str:
        return self.track.split()[0]

    @property
    def target(self) -> str:
        """What the tracking follows: the tag pattern, branch or PyPI package."""
        return self.track.partition(" ")[2]


def pins_path() -> Path:
    return templates_root() / PINS_FILE


def parse_pins(text: str) -> dict[str, Pin]:
    pins = {}
    for engine, entry in (yaml.safe_load(text) or {}).items():
        pin = Pin(engine=engine, ref=str(entry["ref"]), track=str(entry["track"]), edge=entry.get("edge"))
        if pin.kind not in ("tags", "branch", "pypi", "frozen"):
            raise SpecError(
                f"{PINS_FILE}: {engine} tracks {pin.track!r}: use tags bNNNN, branch NAME, pypi PACKAGE "
                "or frozen"
            )
        pins[engine] = pin
    return pins


@cache
def load_pins() -> dict[str, Pin]:
    return parse_pins(pins_path().read_text())


def pinned_ref(engine: str) -> str:
    """The ref `engine` builds without --ref."""
    try:
        return load_pins()[engine].ref
    except KeyError:
        raise SpecError(f"{PINS_FILE} pins no ref for {engine}") from None


# -- reading upstream -------------------------------------------------------------------------------
def newest_release_tag(ls_remote: str) -> tuple[str, str]:
    """(tag, commit) of the highest-numbered bNNNN tag in `git ls-remote --tags` output (an annotated
    tag's peeled `^{}` line gives its commit)."""
    commits: dict[str, str] = {}
    for line in ls_remote.splitlines():
        sha, _, name = line.strip().partition("\t")
        tag = name.removeprefix("refs/tags/")
        peeled = tag.endswith("^{}")
        tag = tag.removesuffix("^{}")
        if _RELEASE_TAG.fullmatch(tag) and (peeled or tag not in commits):
            commits[tag] = sha
    if not commits:
        raise SpecError("upstream lists no bNNNN release tag")
    tag = max(commits, key=lambda name: int(name[1:]))
    return tag, commits[tag]


def branch_head(ls_remote: str, branch: str) -> str:
    """The commit `refs/heads/<branch>` points at, in `git ls-remote` output."""
    for line in ls_remote.splitlines():
        sha, _, name = line.strip().partition("\t")
        if name == f"refs/heads/{branch}" and _FULL_SHA.fullmatch(sha):
            return sha
    raise SpecError(f"upstream has no branch {branch}")


def newest_pypi_version(project_json: dict[str, Any]) -> str:
    """The newest release in PyPI's JSON API answer (`info.version`: the latest non-prerelease)."""
    version = (project_json.get("info") or {}).get("version")
    if not version:
        raise SpecError("PyPI's answer names no version")
    if not _RELEASE_VERSION.fullmatch(str(version)):  # it goes into pins.yaml and a pull request's body
        raise SpecError(f"PyPI's answer names version {str(version)[:40]!r}, not a release version: refused")
    return str(version)


# -- moving the pins --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Bump:
    engine: str
    old: str
    new: str
    note: str  # what the new ref is: "b7890 (commit …)", "main at …", "kt-kernel 0.7.3"


def bump_pins(text: str, bumps: list[Bump]) -> str:
    """`text` (pins.yaml) with each bumped engine's `ref:` line rewritten; everything else as it was."""
    for bump in bumps:
        section = re.search(
            rf"^{re.escape(bump.engine)}:\n((?:[ #].*\n|\n)*?)  ref: (\S+)\n", text, re.MULTILINE
        )
        if section is None or section.group(2) != bump.old:
            raise SpecError(f"{PINS_FILE}: no `ref: {bump.old}` under {bump.engine}")
        start, end = section.span(2)
        text = text[:start] + bump.new + text[end:]
    moved = parse_pins(text)
    for bump in bumps:
        if moved[bump.engine].ref != bump.new:
            raise SpecError(f"{PINS_FILE}: {bump.engine}'s ref did not become {bump.new}")
    return text


def summary(bumps: list[Bump]) -> str:
    """The pull request's body: each move, and what the reviewer checks."""
    if not bumps:
        return "Every pinned ref is current.\n"
    lines = ["Pinned engine refs moved to upstream's newest:", "", "| engine | from | to |", "|---|---|---|"]
    lines += [f"| {b.engine} | `{b.old}` | `{b.new}` ({b.note}) |" for b in bumps]
    lines += [
        "",
        "The golden renders under `tests/golden/` are re-rendered for the new refs. The tests build the",
        "engines from their PyPI sdists, not from these refs: before merging, build one image per bumped",
        "engine (`moe-stack build --engine ENGINE`) and check its flag contract still has what the",
        "stacks use.",
    ]
    return "\n".join(lines) + "\n"
