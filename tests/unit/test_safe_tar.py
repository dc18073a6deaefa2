"""Hostile archives: source tarballs and bundles that try to write outside their destination, or hold
what they shouldn't, are refused by name, and nothing lands outside (issue: security, high items)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from builder.distribute.bundle import COMPOSE, IMAGES, MANIFEST, BundleError, LoadOptions, load_bundle
from builder.engines import get_engine
from builder.errors import SourceError
from builder.images.source import resolve_local
from builder.safe_tar import UnsafeArchive, extract_tree


def _tar(path: Path, members: list[tuple[str, str, bytes | str]]) -> Path:
    """Members as (kind, name, data): kind file (data = bytes), sym/hard (data = link target), dir, fifo."""
    with tarfile.open(path, "w") as tar:
        for kind, name, data in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                assert isinstance(data, bytes)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                continue
            info.type = {
                "sym": tarfile.SYMTYPE,
                "hard": tarfile.LNKTYPE,
                "dir": tarfile.DIRTYPE,
                "fifo": tarfile.FIFOTYPE,
            }[kind]
            info.linkname = data if isinstance(data, str) else ""
            tar.addfile(info)
    return path


@pytest.mark.parametrize(
    ("members", "why"),
    [
        ([("file", "../evil", b"x")], "not a plain relative path"),
        ([("file", "/etc/evil", b"x")], "not a plain relative path"),
        ([("sym", "l", "/etc"), ("file", "l/evil", b"x")], "absolute path"),
        ([("sym", "l", "../.."), ("file", "l/evil", b"x")], "leaves the tree"),
        ([("dir", "d", ""), ("sym", "d/l", "../../x")], "leaves the tree"),
        # `a -> .` is inside; `b -> a/..` would be too, lexically, but really is the tree's parent.
        ([("sym", "a", "."), ("sym", "b", "a/..")], "climbs after descending"),
        # A link written first, then a file through it: never written through a link.
        ([("dir", "d", ""), ("sym", "d/up", ".."), ("file", "d/up/x", b"x")], "through the link"),
        ([("hard", "h", "/etc/passwd")], "not a plain relative path"),
        ([("hard", "h", "missing")], "not to a file of the tree"),
        ([("hard", "h", "nodir/x")], "link target 'nodir/x' is not in the tree"),
        ([("fifo", "f", "")], "special file"),
        ([("file", "x", b"1"), ("file", "x", b"2")], "appears twice"),
    ],
)
def test_source_tarball_refusals(tmp_path: Path, members: list, why: str) -> None:
    archive = _tar(tmp_path / "src.tar", members)
    (tmp_path / "tree").mkdir()
    with pytest.raises(UnsafeArchive, match=why):
        extract_tree(archive, tmp_path / "tree")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src.tar", "tree"], (
        "nothing written beside the tree"
    )


def test_a_long_link_chain_is_judged_without_realpath(tmp_path: Path) -> None:
    """CVE-2025-4517's shape: a chain of links whose expansion passes PATH_MAX, then a link climbing
    out through it. Judged on the archive's own names, it is refused whatever the Python."""
    members: list = []
    step = "d" * 200
    path = ""
    for i in range(30):  # 30 × 201 characters: past PATH_MAX (4096) once expanded
        members += [("dir", f"{path}{step}", ""), ("sym", f"{path}l{i}", step)]
        path += f"l{i}/"
    members.append(("sym", "escape", path + "../" * 31 + "etc"))
    archive = _tar(tmp_path / "chain.tar", members)
    (tmp_path / "tree").mkdir()
    with pytest.raises(UnsafeArchive, match="climbs after descending|leaves the tree|through the link"):
        extract_tree(archive, tmp_path / "tree")


def test_an_honest_tree_with_inner_links_extracts(tmp_path: Path) -> None:
    archive = _tar(
        tmp_path / "ok.tar",
        [
            ("dir", "pkg", ""),
            ("dir", "pkg/include", ""),
            ("file", "pkg/include/a.h", b"int a;"),
            ("sym", "pkg/b.h", "include/a.h"),
            ("dir", "pkg/sub", ""),
            ("sym", "pkg/sub/c.h", "../include/a.h"),
            ("hard", "pkg/d.h", "pkg/include/a.h"),
        ],
    )
    (tmp_path / "tree").mkdir()
    extract_tree(archive, tmp_path / "tree")
    for name in ("b.h", "sub/c.h", "d.h"):
        assert (tmp_path / "tree/pkg" / name).read_text() == "int a;"


def test_source_cli_path_names_the_refusal(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "src.tar", [("sym", "l", "/etc"), ("file", "l/evil", b"x")])
    with pytest.raises(SourceError, match=r"refused, link 'l' points at the absolute path '/etc'"):
        resolve_local(get_engine("llama.cpp"), str(archive))


MODEL = {"name": "m.gguf", "bytes": 1, "sha256": "s", "included": False}


def _bundle(path: Path, manifest: dict | None, extra: list | None = None) -> Path:
    manifest = (
        manifest
        if manifest is not None
        else {
            "format": 1,
            "files": {COMPOSE: "sha256:0", IMAGES: "sha256:0"},
            "images": {},
            "models": [MODEL],
        }
    )
    members = [
        ("file", MANIFEST, json.dumps(manifest).encode()),
        ("file", COMPOSE, b"services: {}\n"),
        ("file", IMAGES, b""),
    ]
    return _tar(path, members + (extra or []))


@pytest.mark.parametrize(
    ("manifest", "extra", "why"),
    [
        # The reported attack: a model name of ../ steps (and a models/ member that is a link).
        (
            {
                "format": 1,
                "files": {COMPOSE: "s", IMAGES: "s"},
                "images": {},
                "models": [
                    {"name": "../../../../tmp/owned.gguf", "bytes": 1, "sha256": "s", "included": True}
                ],
            },
            [],
            "not a plain model file name \\(\\*.gguf\\)",
        ),
        (None, [("sym", "models/a.gguf", "/etc/passwd")], "is a link or special file"),
        (None, [("dir", "models", ""), ("sym", "models/x", "..")], "not one a moe-stack bundle holds"),
        (None, [("file", "run-me.sh", b"#!/bin/sh\n")], "'run-me.sh' is not one a moe-stack bundle holds"),
        (None, [("file", "models/../../x.gguf", b"")], "not a plain relative path"),
        (None, [("file", MANIFEST, b"{}")], "appears twice"),
        (None, [("file", "models/big.gguf", b"")], None),  # fine so far: fails later, on its checksum
        (
            {
                "format": 1,
                "files": {"/etc/shadow": "s", COMPOSE: "s", IMAGES: "s"},
                "images": {},
                "models": [MODEL],
            },
            [],
            "must list exactly compose.yaml and images.tar",
        ),
        (
            {"format": 1, "files": {COMPOSE: "s", IMAGES: "s"}, "images": ["x"], "models": [MODEL]},
            [],
            "map each image",
        ),
        # `models: []` would leave /models to whatever the record points at.
        (
            {"format": 1, "files": {COMPOSE: "s", IMAGES: "s"}, "images": {}, "models": []},
            [],
            "lists no model file",
        ),
        (
            {
                "format": 1,
                "files": {COMPOSE: "s", IMAGES: "s"},
                "images": {},
                "models": [{"name": "m.gguf", "included": True}],
            },
            [],
            "lacks bytes, sha256 or included",
        ),
    ],
)
def test_bundle_refusals(tmp_path: Path, manifest: dict | None, extra: list, why: str | None) -> None:
    bundle = _bundle(tmp_path / "b.tar", manifest, extra)
    dest = tmp_path / "dest"
    with pytest.raises(BundleError) as refused:
        load_bundle(bundle, dest, LoadOptions(expect_sha256=None))
    if why is not None:
        assert refused.match(why)
        assert "truncated" not in str(refused.value), "a refused member is named, not called truncated"
    assert not dest.exists(), "nothing is written to --dest"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["b.tar"], "nor beside it"
    assert not (tmp_path.parent / "owned.gguf").exists()


def test_oversized_manifest_is_refused(tmp_path: Path) -> None:
    bundle = _tar(tmp_path / "b.tar", [("file", MANIFEST, b" " * ((1 << 20) + 1))])
    with pytest.raises(BundleError, match="larger than 1048576 bytes"):
        load_bundle(bundle, tmp_path / "dest", LoadOptions(expect_sha256=None))
