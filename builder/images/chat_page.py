"""The chat page mainline llama.cpp's server embeds (`http://127.0.0.1:8080/`): its tree's `tools/ui`, a
Svelte app, built here with npm from the tree's own sources and lock file (packages from the npm registry,
or npm's cache on a host without network), kept in the cache by the sources' hash, and handed to the image
build as the `chat-page` context (contract.CHAT_PAGE_CONTEXT), which the build puts where the tree's CMake
looks first for prebuilt assets (`tools/ui/dist`).

Left to itself the pinned tree fetches prebuilt assets from a Hugging Face bucket at build time (an
offline build then has no page: "UI: no assets available"), or runs npm inside the build; the images
configure with LLAMA_USE_PREBUILT_UI=OFF, so what they embed is what was built here. A build from a git
ref fetches the page's directory at that ref first (`fetched_ui`). A host without npm, or one that can't
reach the repository, gets an image without the page, and says so.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from builder.files import cache_dir

# What the build step leaves out of the sources' hash and copy, at the app's top level: npm's install
# and earlier outputs.
_NOT_SOURCES = {"node_modules", "dist", ".svelte-kit", "build"}
NPM_TIMEOUT_S = 1200


def chat_page(ui: Path, show: Callable[[str], None]) -> Path | None:
    """The built page of the app in `ui` (a directory holding index.html), from the cache or built now;
    None where `ui` holds no app or npm can't build it (`show` says why)."""
    if not (ui / "package-lock.json").is_file():
        return None
    built = cache_dir() / "chat-page" / sources_hash(ui)
    if (built / "index.html").is_file():
        return built
    npm = shutil.which("npm")
    if npm is None:
        show("no chat page in this image: npm is not installed here (Debian: apt-get install npm)")
        return None
    built.parent.mkdir(parents=True, exist_ok=True)
    show(f"building the chat page from {ui} with npm")
    with tempfile.TemporaryDirectory(prefix=".build-", dir=built.parent) as tmp:
        work = Path(tmp) / "ui"
        shutil.copytree(
            ui, work, ignore=lambda where, names: _NOT_SOURCES & set(names) if Path(where) == ui else set()
        )
        dist = Path(tmp) / "dist"
        try:
            # No install scripts: the page needs none (sharp's binary is an npm package of its own), and
            # @playwright/test's would fetch browsers.
            _npm(npm, ["ci", "--ignore-scripts", "--no-audit", "--no-fund", "--prefer-offline"], work, {})
            _npm(npm, ["run", "build"], work, {"LLAMA_UI_OUT_DIR": str(dist)})
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as err:
            show(f"no chat page in this image: npm failed in {ui} ({_why(err)})")
            return None
        if not (dist / "index.html").is_file():
            show(f"no chat page in this image: npm's build of {ui} wrote no index.html")
            return None
        try:
            dist.rename(built)
        except OSError:  # another build finished it first: theirs is the same page
            pass
    return built


def fetched_ui(url: str, ref: str, ui_dir: str, show: Callable[[str], None]) -> Path | None:
    """`ui_dir` of the git repository `url` at `ref`, fetched into the cache for a build from a git ref
    (whose tree is cloned inside the build, out of reach here): a partial clone that fetches the
    history's commits and trees but only that directory's files. None (and why, to `show`) when git
    can't reach `url` or has no such ref."""
    digest = hashlib.sha256(f"{url}\0{ref}".encode()).hexdigest()[:16]
    checkout = cache_dir() / "chat-page" / "git" / digest
    if (checkout / ui_dir / "package-lock.json").is_file():
        return checkout / ui_dir
    git = shutil.which("git")
    if git is None:
        show("no chat page in this image: git is not installed here, to fetch its sources")
        return None
    checkout.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=checkout.parent) as tmp:
        work = Path(tmp) / "repo"
        steps = [
            ["clone", "--quiet", "--filter=blob:none", "--no-checkout", url, str(work)],
            ["-C", str(work), "checkout", "--quiet", ref, "--", ui_dir],
        ]
        try:
            for step in steps:
                subprocess.run(
                    [git, *step], check=True, capture_output=True, text=True, timeout=NPM_TIMEOUT_S
                )
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as err:
            show(f"no chat page in this image: git could not fetch {ui_dir} of {url} at {ref} ({_why(err)})")
            return None
        try:
            work.rename(checkout)
        except OSError:  # fetched by another build meanwhile
            pass
    return checkout / ui_dir


def sources_hash(ui: Path) -> str:
    """A hash of the page's sources (paths and bytes), so a tree with other sources builds anew."""
    digest = hashlib.sha256()
    for path in sorted(
        p for p in ui.rglob("*") if p.is_file() and p.relative_to(ui).parts[0] not in _NOT_SOURCES
    ):
        digest.update(str(path.relative_to(ui)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _npm(npm: str, args: list[str], cwd: Path, env: dict[str, str]) -> None:
    subprocess.run(
        [npm, *args],
        cwd=cwd,
        env={**os.environ, **env},
        check=True,
        capture_output=True,
        text=True,
        timeout=NPM_TIMEOUT_S,
    )


def _why(err: Exception) -> str:
    if isinstance(err, subprocess.CalledProcessError):
        lines = [line for line in (err.stderr or err.stdout or "").splitlines() if line.strip()]
        return lines[-1][-200:] if lines else f"exit {err.returncode}"
    return str(err)
