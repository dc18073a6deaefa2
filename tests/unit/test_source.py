"""Engine sources: clone commands per ref kind; local trees, tarballs and sdists are found and checked."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from builder.engines import get_engine
from builder.errors import SourceError
from builder.images.source import resolve_local
from builder.platform.clone import clone_commands
from tests.specs import ik_tree, mainline_tree


def test_clone_commands_per_ref_kind() -> None:
    url = "https://example.org/e.git"
    assert clone_commands(url, "b4810") == [f"git clone --quiet --depth 1 --branch b4810 {url} /src"]
    short = clone_commands(url, "9c4e21a")
    assert short[0] == f"git clone --quiet {url} /src" and "checkout --quiet --detach 9c4e21a" in short[1]
    full = clone_commands(url, "a" * 40)
    assert f"fetch --quiet --depth 1 {url} {'a' * 40}" in full[1] and full[2].endswith("FETCH_HEAD")


def test_engine_trees_are_told_apart(tmp_path: Path) -> None:
    mainline = mainline_tree(tmp_path / "m")
    ik = ik_tree(tmp_path / "ik")
    assert resolve_local(get_engine("llama.cpp"), str(mainline)) == mainline
    assert resolve_local(get_engine("ik_llama.cpp"), str(ik)) == ik
    with pytest.raises(SourceError, match="is not a llama.cpp source tree"):
        resolve_local(get_engine("llama.cpp"), str(ik))


def test_sdist_layout_and_tarball(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    sdist = tmp_path / "llama_cpp_python-9.9"
    mainline_tree(sdist / "vendor/llama.cpp")
    assert resolve_local(get_engine("llama.cpp"), str(sdist)) == sdist / "vendor/llama.cpp"
    archive = tmp_path / "sdist.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(sdist, arcname=sdist.name)
    tree = resolve_local(get_engine("llama.cpp"), str(archive))
    assert tree.parts[-3:] == ("llama_cpp_python-9.9", "vendor", "llama.cpp")
    assert resolve_local(get_engine("llama.cpp"), str(archive)) == tree, "unpacked once, then reused"


def test_missing_and_bad_sources(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="no such file or directory"):
        resolve_local(get_engine("llama.cpp"), str(tmp_path / "nope"))
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not a tarball")
    with pytest.raises(SourceError, match="not a tar archive"):
        resolve_local(get_engine("llama.cpp"), str(junk))
