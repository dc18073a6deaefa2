"""A source mirror: each pinned engine tree as a tarball and a manifest of its files, the air-gapped way to
build from source. `moe-stack sources` writes one on a host that reaches the engines' git repositories;
`build --sources DIR` (or MOE_STACK_SOURCES) builds from it and fetches no engine source from anywhere.

A mirror is a directory of pairs, named by engine and the ref's first 12 characters:
  ik_llama.cpp-8337e4cd3861.tar.xz   the tree (`git archive` of the ref), under one directory `ik_llama.cpp/`
  ik_llama.cpp-8337e4cd3861.sha256   `sha256sum` lines: every regular file of it, paths under that directory
A tree is used only once every file it holds hashes to its manifest's line and the manifest lists no
file it lacks: a changed, truncated or swapped tarball is refused in one line.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from builder.engines import Engine
from builder.errors import SourceError
from builder.files import cache_dir, file_sha256, user_path
from builder.safe_tar import UnsafeArchive, extract_tree

SOURCES_ENV = "MOE_STACK_SOURCES"
_LINE = re.compile(r"([0-9a-f]{64})  (\S.*)")


@dataclass(frozen=True)
class MirroredTree:
    """One engine tree of a mirror: its tarball and its manifest."""

    engine: Engine
    ref: str
    tarball: Path
    manifest: Path

    @property
    def name(self) -> str:
        return self.tarball.name


def tree_stem(engine: Engine, ref: str) -> str:
    return f"{engine.name}-{ref[:12]}"


def mirror_dir(given: Path | None) -> Path | None:
    """The mirror `--sources` names, else MOE_STACK_SOURCES's; None for neither. SourceError when the one
    named is not a directory."""
    named = (
        given
        if given is not None
        else (Path(os.environ[SOURCES_ENV]) if os.environ.get(SOURCES_ENV) else None)
    )
    if named is None:
        return None
    directory = user_path(named)
    if not directory.is_dir():
        how = "--sources" if given is not None else SOURCES_ENV
        raise SourceError(f"{how} {named}: no such directory; give the directory `moe-stack sources` wrote")
    return directory.resolve()


def mirrored(directory: Path, engine: Engine, ref: str) -> MirroredTree | None:
    """The tree of `engine` at `ref` in the mirror `directory`, None where it holds none."""
    stem = tree_stem(engine, ref)
    tarball, manifest = directory / f"{stem}.tar.xz", directory / f"{stem}.sha256"
    if not tarball.is_file():
        return None
    if not manifest.is_file():
        raise SourceError(
            f"source mirror {directory}: {tarball.name} has no manifest {manifest.name}; write the mirror "
            "again with `moe-stack sources`"
        )
    return MirroredTree(engine, ref, tarball, manifest)


def verified_tree(tree: MirroredTree) -> Path:
    """The engine tree, extracted into the cache (once per tarball) and held to its manifest, file by file:
    SourceError naming the first file that differs, is missing or is not listed."""
    listed = read_manifest(tree.manifest)
    root = _extracted(tree)
    held: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            held[path.relative_to(root).as_posix()] = file_sha256(path)
    problem = manifest_mismatch(listed, held)
    if problem is not None:
        raise SourceError(
            f"source mirror: {tree.name} doesn't match its manifest {tree.manifest.name} ({problem}); the "
            "mirror is corrupt or was changed: don't build it, write the mirror again (`moe-stack sources`)"
        )
    top = root / tree.engine.name
    if not (top.is_dir() and tree.engine.is_source_tree(top)):
        raise SourceError(
            f"source mirror: {tree.name} holds no {tree.engine.name} tree under {tree.engine.name}/"
        )
    return top


def manifest_mismatch(listed: dict[str, str], held: dict[str, str]) -> str | None:
    """What differs between a manifest (path → sha256) and a tree's files, or None."""
    for path in sorted(set(listed) | set(held)):
        if path not in held:
            return f"{path} is missing"
        if path not in listed:
            return f"{path} is not in the manifest"
        if held[path] != listed[path]:
            return f"{path} is sha256:{held[path][:16]}…, the manifest says {listed[path][:16]}…"
    return None


def read_manifest(path: Path) -> dict[str, str]:
    """A manifest's lines as path → sha256; SourceError for a line that isn't `HEX  PATH`."""
    listed: dict[str, str] = {}
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        match = _LINE.fullmatch(line)
        if match is None or match[2] in listed:
            raise SourceError(
                f"source mirror: {path.name} line {number} is not `SHA256  PATH` (or names a path twice)"
            )
        listed[match[2]] = match[1]
    return listed


def manifest_text(root: Path) -> str:
    """The manifest of the tree under `root`: every regular file, sorted, in `sha256sum` form."""
    files = sorted(
        (p for p in root.rglob("*") if p.is_file() and not p.is_symlink()),
        key=lambda p: p.relative_to(root).as_posix().encode(),  # as `sort` orders them in the C locale
    )
    return "".join(f"{file_sha256(p)}  {p.relative_to(root).as_posix()}\n" for p in files)


def _extracted(tree: MirroredTree) -> Path:
    target = cache_dir() / "mirror" / file_sha256(tree.tarball)[:16]
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=target.parent))
    try:
        extract_tree(tree.tarball, staging)
        staging.rename(target)
    except (UnsafeArchive, tarfile.TarError, OSError, EOFError) as err:
        shutil.rmtree(staging, ignore_errors=True)
        raise SourceError(
            f"source mirror: {tree.name} can't be unpacked ({err}); write the mirror again"
        ) from None
    return target


# -- writing a mirror (on a host that reaches the engines' repositories) ------------------------------
def write_tree(engine: Engine, ref: str, url: str, dest: Path) -> MirroredTree:
    """`git archive` of `ref` from `url` as `dest`/<engine>-<ref12>.tar.xz (reproducible: sorted, owner
    0, the commit's time) and its manifest; both written to temporary names first, then moved."""
    stem = tree_stem(engine, ref)
    with tempfile.TemporaryDirectory(prefix=".moe-stack-sources-", dir=dest) as tmp:
        work = Path(tmp)
        _git(["init", "--quiet", str(work / "repo")], work)
        repo = work / "repo"
        _git(["fetch", "--quiet", "--depth", "1", url, ref], repo)
        when = _git(["log", "-1", "--format=%cI", "FETCH_HEAD"], repo).strip()
        tree = work / "tree"
        tree.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(repo), "archive", f"--prefix={engine.name}/", "FETCH_HEAD"],
            capture_output=True,
            check=False,
        )
        if archive.returncode != 0:
            raise SourceError(
                f"git archive {ref} of {url} failed: {archive.stderr.decode(errors='replace')[-200:]}"
            )
        (work / "tree.tar").write_bytes(archive.stdout)
        extract_tree(work / "tree.tar", tree)
        (work / f"{stem}.sha256").write_text(manifest_text(tree))
        subprocess.run(
            [
                "tar", "--sort=name", "--owner=0", "--group=0", "--numeric-owner", f"--mtime={when}",
                "-C", str(tree), "-cJf", str(work / f"{stem}.tar.xz"), engine.name,
            ],
            check=True,
            capture_output=True,
        )  # fmt: skip
        for suffix in (".tar.xz", ".sha256"):
            os.replace(work / f"{stem}{suffix}", dest / f"{stem}{suffix}")
    return MirroredTree(engine, ref, dest / f"{stem}.tar.xz", dest / f"{stem}.sha256")


def _git(args: list[str], cwd: Path) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0:
        raise SourceError(f"git {' '.join(args[:2])} failed: {(done.stderr.strip() or 'no output')[-200:]}")
    return done.stdout


def digest_of(tree: MirroredTree) -> str:
    """The manifest's own sha256: what names the tree's content, whatever the tarball's bytes."""
    return hashlib.sha256(tree.manifest.read_bytes()).hexdigest()


def mirror_tree(engine: Engine, ref: str, directory: Path) -> Path:
    """The verified tree of `engine` at `ref` in the mirror `directory`; SourceError when it holds none."""
    found = mirrored(directory, engine, ref)
    if found is None:
        raise SourceError(
            f"source mirror {directory} holds no {tree_stem(engine, ref)}.tar.xz; write it with `moe-stack "
            f"sources --dest {directory}` on a host that reaches {engine.upstream_url}"
        )
    return verified_tree(found)
