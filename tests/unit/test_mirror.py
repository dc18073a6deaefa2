"""A source mirror (images/mirror.py): `moe-stack sources` writes each pinned tree as `git archive` of its
ref and a manifest of its files, and `build --sources` builds from it only once every file hashes to its
manifest; a tree changed, cut or padded is one line, before Docker runs."""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from builder.engines import get_engine
from builder.errors import SourceError
from builder.images.mirror import (
    MirroredTree,
    manifest_text,
    mirror_tree,
    mirrored,
    verified_tree,
    write_tree,
)
from builder.images.recorded_contracts import recorded_contract
from builder.platform.pins import pinned_ref
from tests.cli import run_cli_in_process
from tests.sources import source_mirror

IK = get_engine("ik_llama.cpp")
MIRROR = source_mirror()


FILES = {
    "CMakeLists.txt": "project(x)\n",
    "ggml/src/iqk/iqk.c": "int iqk;\n",
    "examples/server/server.cpp": "int main() {}\n",
    "include/llama.h": "// llama\n",
}


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _upstream(tmp_path: Path) -> tuple[str, str]:
    """A git repository holding a small ik_llama.cpp-shaped tree (with a link, as the real one has): its
    URL and the commit."""
    repo = tmp_path / "upstream"
    for name, text in FILES.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    (repo / "spm-headers").mkdir()
    (repo / "spm-headers/llama.h").symlink_to("../include/llama.h")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "tree", "--date=2026-08-15T00:00:00Z"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout
    return f"file://{repo}", commit.strip()


@pytest.mark.cli  # git
def test_a_mirror_is_git_archive_of_the_ref_and_a_manifest_of_every_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    url, commit = _upstream(tmp_path)
    (tmp_path / "mirror").mkdir()
    tree = write_tree(IK, commit, url, tmp_path / "mirror")
    assert tree.tarball.name == f"ik_llama.cpp-{commit[:12]}.tar.xz"
    assert tree.manifest.read_text().splitlines() == [
        f"{_sha256(text)}  ik_llama.cpp/{name}" for name, text in sorted(FILES.items())
    ]  # every regular file, sorted; the link is checked to stay in the tree when it is unpacked
    first = tree.tarball.read_bytes()
    again = write_tree(IK, commit, url, tmp_path / "mirror")
    assert again.tarball.read_bytes() == first  # reproducible: sorted, owner 0, the commit's time
    built = mirror_tree(IK, commit, tmp_path / "mirror")
    assert (built / "ggml/src/iqk/iqk.c").read_text() == "int iqk;\n"
    assert (built / "spm-headers/llama.h").read_text() == "// llama\n"
    assert mirrored(tmp_path / "mirror", IK, "0" * 40) is None
    with pytest.raises(SourceError, match="holds no ik_llama.cpp-000000000000.tar.xz; write it with"):
        mirror_tree(IK, "0" * 40, tmp_path / "mirror")


def _rewritten(tree: MirroredTree, change: dict[str, bytes | None]) -> None:
    """The tarball again with members changed (bytes), dropped (None) or added."""
    with tarfile.open(tree.tarball) as old:
        members = [(m, old.extractfile(m).read() if m.isreg() else None) for m in old.getmembers()]  # type: ignore[union-attr]
    with tarfile.open(tree.tarball, "w:xz") as new:
        for member, data in members:
            if member.name in change:
                data = change.pop(member.name)
                if data is None:
                    continue
                member.size = len(data)
            new.addfile(member, io.BytesIO(data) if data is not None else None)
        for name, data in change.items():
            info = tarfile.TarInfo(name)
            info.size = len(data or b"")
            new.addfile(info, io.BytesIO(data or b""))


@pytest.mark.cli  # git
@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"ik_llama.cpp/ggml/src/iqk/iqk.c": b"int iqk; /* changed */\n"}, "ggml/src/iqk/iqk.c is sha256:"),
        ({"ik_llama.cpp/include/llama.h": None}, "ik_llama.cpp/include/llama.h is missing"),
        ({"ik_llama.cpp/ggml/src/extra.c": b"int planted;\n"}, "ggml/src/extra.c is not in the manifest"),
    ],
)
def test_a_tree_that_does_not_match_its_manifest_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: dict[str, bytes | None], said: str
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    url, commit = _upstream(tmp_path)
    (tmp_path / "mirror").mkdir()
    tree = write_tree(IK, commit, url, tmp_path / "mirror")
    _rewritten(tree, change)
    with pytest.raises(SourceError, match=f"doesn't match its manifest .*{said}") as refused:
        verified_tree(tree)
    assert "don't build it" in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.cli  # git
def test_build_takes_the_mirror_and_refuses_a_changed_tree_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`build --sources` (and MOE_STACK_SOURCES): the pinned ref's tree from the mirror, or one line; a
    dry run shows the build takes the mirror's tree as its context and clones nothing."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    url, commit = _upstream(tmp_path)
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    tree = write_tree(IK, commit, url, mirror)
    shown = run_cli_in_process(
        "build", "--engine", "ik_llama.cpp", "--ref", commit, "--sources", str(mirror), "--dry-run"
    )
    assert shown.returncode == 0, shown.stderr
    assert "git clone" not in shown.stdout and "engine-src=" in shown.stdout, shown.stdout
    assert commit[:12] in shown.stdout
    monkeypatch.setenv("MOE_STACK_SOURCES", str(mirror))
    pinned = run_cli_in_process("build", "--engine", "ik_llama.cpp", "--dry-run")
    assert (
        pinned.returncode == 1
        and f"holds no ik_llama.cpp-{pinned_ref('ik_llama.cpp')[:12]}.tar.xz" in pinned.stderr
    )
    _rewritten(tree, {"ik_llama.cpp/CMakeLists.txt": b"project(x) # and more\n"})
    changed = run_cli_in_process("build", "--engine", "ik_llama.cpp", "--ref", commit, "--dry-run")
    assert changed.returncode == 1 and len(changed.stderr.splitlines()) == 1, changed.stderr
    assert "ik_llama.cpp/CMakeLists.txt is sha256:" in changed.stderr
    both = run_cli_in_process(
        "build", "--engine", "ik_llama.cpp", "--source", str(tmp_path), "--sources", str(mirror)
    )
    assert both.returncode == 1 and "give one" in both.stderr
    wheels = run_cli_in_process("build", "--engine", "ktransformers", "--sources", str(mirror), "--dry-run")
    assert wheels.returncode == 1 and "installs wheels" in wheels.stderr, wheels.stderr


@pytest.mark.skipif(MIRROR is None, reason="no source mirror here (MOE_STACK_SOURCES, ../shared/sources)")
def test_the_mirrors_ik_tree_is_the_one_the_contract_was_recorded_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tree the suite built ik_llama.cpp from (its recorded contract names it) is the mirror's: every
    file of the tarball hashes to the manifest's line, and the manifest lists no other (that the pin is
    that tree: tests/unit/test_published.py)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    contract = recorded_contract(IK)
    assert MIRROR is not None and contract is not None
    found = mirrored(MIRROR, IK, contract.ref)
    assert found is not None and contract.source == f"mirror:{found.name}", contract.source
    top = verified_tree(found)
    assert manifest_text(top.parent) == found.manifest.read_text()  # the same lines, in the same order
