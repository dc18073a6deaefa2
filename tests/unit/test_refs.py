"""Pinned engine refs (dockerfiles/pins.yaml) and how the refs workflow moves them: upstream's
newest read from `git ls-remote` / PyPI answers, the pins file rewritten ref line by ref line, the
pull request's summary, and the nightly edge images' job matrix."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from builder.engines import engine_names, get_engine
from builder.errors import SpecError
from builder.images.build import build_plan
from builder.images.build_plan import Publishing
from builder.images.matrix import buildable, ci_rows, edge_specs
from builder.images.naming import image_spec
from builder.images.refs import edge_refs, plan_bumps
from builder.platform.pins import (
    Bump,
    branch_head,
    bump_pins,
    load_pins,
    newest_pypi_version,
    newest_release_tag,
    parse_pins,
    pins_path,
    summary,
)
from builder.spec import GitSource

IK_HEAD = "5f3c2a1b9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b"
MAINLINE_HEAD = "a1b2c3d4e5f60718293a4b5c6d7e8f9011223344"
# `git ls-remote --tags URL 'refs/tags/b*'` output in git's format: lightweight tags, and an annotated
# one whose peeled `^{}` line names the commit. b10000 sorts above b9999 by number, not text.
TAGS = (
    f"{'1' * 40}\trefs/tags/b9999\n"
    f"{'2' * 40}\trefs/tags/b10000\n"
    f"{'3' * 40}\trefs/tags/b10000^{{}}\n"
    f"{'4' * 40}\trefs/tags/b9998\n"
)


class RecordedUpstream:
    """Answers as git and PyPI would, and remembers what was asked."""

    def __init__(self, tags: str = TAGS, kt_version: str = "0.7.3") -> None:
        self.tags, self.kt_version, self.asked = tags, kt_version, []

    def ls_remote(self, url: str, *refs: str) -> str:
        self.asked.append(url)
        if "--tags" in refs:
            return self.tags
        head = IK_HEAD if "ik_llama" in url else MAINLINE_HEAD
        return f"{head}\t{refs[0]}\n"

    def pypi_json(self, project: str) -> dict:
        self.asked.append(f"pypi:{project}")
        return {"info": {"version": self.kt_version, "name": project}}


# A pins file as the bump tests start from (the real one moves weekly: these tests are of the bump).
PINS_TEXT = """\
llama.cpp:
  # a comment the bump keeps
  ref: 0c1e57098
  track: tags bNNNN
  edge: master
ik_llama.cpp:
  ref: 007d640098cbea95157d81846ada7fe50b9fed08
  track: branch main
  edge: main
ktransformers:
  ref: 0.7.2
  track: pypi kt-kernel
ktransformers-legacy:
  ref: v0.2.4
  track: frozen
"""


def test_every_engine_builds_its_pinned_ref_by_default() -> None:
    pins = load_pins()
    assert set(pins) == set(engine_names())
    for name in engine_names():
        assert get_engine(name).default_ref == pins[name].ref
    assert re.fullmatch(r"[0-9a-f]{40}", pins["ik_llama.cpp"].ref), "a branch is pinned by its full commit"
    assert image_spec(get_engine("ik_llama.cpp")).ref == pins["ik_llama.cpp"].ref


def test_newest_release_tag_by_number_with_the_peeled_commit() -> None:
    assert newest_release_tag(TAGS) == ("b10000", "3" * 40)
    with pytest.raises(SpecError, match="no bNNNN release tag"):
        newest_release_tag(f"{'1' * 40}\trefs/tags/v1.0\n")


def test_branch_head() -> None:
    assert branch_head(f"{IK_HEAD}\trefs/heads/main\n", "main") == IK_HEAD
    with pytest.raises(SpecError, match="no branch main"):
        branch_head(f"{IK_HEAD}\trefs/heads/master\n", "main")


def test_bumps_follow_each_pins_tracking_and_leave_frozen_ones_alone() -> None:
    upstream = RecordedUpstream()
    bumps = plan_bumps(parse_pins(PINS_TEXT), upstream)
    assert [(b.engine, b.old, b.new) for b in bumps] == [
        ("llama.cpp", "0c1e57098", "b10000"),
        ("ik_llama.cpp", "007d640098cbea95157d81846ada7fe50b9fed08", IK_HEAD),
        ("ktransformers", "0.7.2", "0.7.3"),
    ]
    assert bumps[0].note == "release b10000, commit 333333333333"
    assert "pypi:kt-kernel" in upstream.asked and len(upstream.asked) == 3  # legacy is frozen: not asked


def test_a_pin_already_at_the_newest_commit_stays() -> None:
    text = PINS_TEXT.replace("ref: 0c1e57098", "ref: 333333333")
    same = RecordedUpstream(kt_version="0.7.2")
    assert [b.engine for b in plan_bumps(parse_pins(text), same)] == ["ik_llama.cpp"]


def test_the_pins_file_changes_only_in_its_ref_lines() -> None:
    assert parse_pins(pins_path().read_text()).keys() >= parse_pins(PINS_TEXT).keys()  # a new engine may join
    text = PINS_TEXT
    bumps = plan_bumps(parse_pins(text), RecordedUpstream())
    moved = bump_pins(text, bumps)
    changed = [(a, b) for a, b in zip(text.splitlines(), moved.splitlines(), strict=True) if a != b]
    assert changed == [
        ("  ref: 0c1e57098", "  ref: b10000"),
        ("  ref: 007d640098cbea95157d81846ada7fe50b9fed08", f"  ref: {IK_HEAD}"),
        ("  ref: 0.7.2", "  ref: 0.7.3"),
    ]
    assert {name: pin.ref for name, pin in parse_pins(moved).items()} == {
        "llama.cpp": "b10000",
        "ik_llama.cpp": IK_HEAD,
        "ktransformers": "0.7.3",
        "ktransformers-legacy": "v0.2.4",
    }
    with pytest.raises(SpecError, match="no `ref: 1.0` under ktransformers"):
        bump_pins(text, [Bump("ktransformers", "1.0", "1.1", "")])


def test_summary_is_the_pull_requests_body() -> None:
    body = summary([Bump("ik_llama.cpp", "007d640", IK_HEAD, "main head")])
    assert f"| ik_llama.cpp | `007d640` | `{IK_HEAD}` (main head) |" in body
    assert "moe-stack build --engine ENGINE" in body
    assert summary([]) == "Every pinned ref is current.\n"


def test_unknown_tracking_is_refused() -> None:
    with pytest.raises(SpecError, match="tracks 'nightly'"):
        parse_pins("llama.cpp:\n  ref: b1\n  track: nightly\n")


def test_edge_images_build_upstream_heads_under_the_edge_alias(tmp_path: Path) -> None:
    heads = edge_refs(load_pins(), RecordedUpstream())
    assert heads == {"llama.cpp": MAINLINE_HEAD, "ik_llama.cpp": IK_HEAD}
    specs = edge_specs(heads)
    assert {(s.engine.name, s.cuda.version, s.cpu.name) for s in specs} == {
        (engine, cuda, cpu)
        for engine in heads
        for cuda in (None, "13.0")
        for cpu in ("avx2", "zen4", "sapphirerapids")
    }
    rows = ci_rows(specs)
    assert {row["ref"] for row in rows} == {MAINLINE_HEAD, IK_HEAD} and {row["tools"] for row in rows} == {
        "true"
    }
    assert rows[0]["tag"] == f"ghcr.io/moe-stack/llama-cpp:{MAINLINE_HEAD[:12]}-cpu-avx2"
    plan = build_plan(specs[0], tmp_path, None, Publishing(channel="edge"))
    assert plan.tags == (
        f"ghcr.io/moe-stack/llama-cpp:{MAINLINE_HEAD[:12]}-cpu-avx2",
        "ghcr.io/moe-stack/llama-cpp:edge-cpu-avx2",
    )
    # The published matrix says which rows get a tools image beside them.
    published = ci_rows(buildable())
    assert (
        {row["engine"] for row in published if row["tools"] == "true"}
        == {name for name in engine_names() if get_engine(name).tool_targets}
        >= {"llama.cpp", "ik_llama.cpp"}
    )


@pytest.mark.parametrize("version", ["0.7.3\nrm -rf /", "0.7.3; echo", "`id`", "0.7.3 ", "../0.7.3", ""])
def test_a_hostile_index_version_never_reaches_the_pins(version: str) -> None:
    """What a (hostile) index names as its latest release goes into pins.yaml and the PR body: a release
    version only."""
    with pytest.raises(SpecError, match="names no version|not a release version: refused"):
        newest_pypi_version({"info": {"version": version}})
    assert newest_pypi_version({"info": {"version": "0.7.3.post1"}}) == "0.7.3.post1"


def test_anchored_checks_take_no_trailing_newline() -> None:
    """`re.match` with `$` accepted "b123\\n" and a commit with a newline; every anchored check
    full-matches."""
    tag, _ = newest_release_tag("a" * 40 + "\trefs/tags/b9000\n" + "b" * 40 + "\trefs/tags/b9001\\n\n")
    assert tag == "b9000"
    with pytest.raises(SpecError, match="no branch main"):
        branch_head("c" * 40 + "\n\trefs/heads/main\n", "main")
    with pytest.raises(ValueError, match="must be 1-101 characters"):
        GitSource(url="https://example.org/x.git", ref="main\n")
