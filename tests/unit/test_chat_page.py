"""The chat page's way into mainline's image: the build context it travels in, when there is none, and
the cache keyed by the page's sources (the npm build itself runs for real in the integration suite:
tests/integration/test_chat_page.py)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from builder.contract import CHAT_PAGE_CONTEXT
from builder.images.build import page_for, plan_build
from builder.images.chat_page import chat_page, fetched_ui, sources_hash
from builder.images.matrix import default_image_spec
from builder.spec import GitSource


def _ui(root: Path) -> Path:
    ui = root / "tools/ui"
    (ui / "src").mkdir(parents=True)
    (ui / "package-lock.json").write_text("{}")
    (ui / "src/app.svelte").write_text("<p>hello</p>")
    return ui


def test_the_built_page_travels_as_its_own_context(tmp_path: Path) -> None:
    page = tmp_path / "page"
    plan = plan_build(default_image_spec("llama.cpp", gpu=False), tmp_path, None, page=page)
    assert plan.kwargs()["build_contexts"] == {CHAT_PAGE_CONTEXT: str(page)}


def test_no_page_for_ik(tmp_path: Path) -> None:
    said: list[str] = []
    assert page_for(default_image_spec("ik_llama.cpp", gpu=False), tmp_path, said.append) is None
    assert said == []


def test_the_page_is_cached_by_its_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    ui = _ui(tmp_path / "tree")
    key = sources_hash(ui)
    (ui / "node_modules/x").mkdir(parents=True)
    (ui / "node_modules/x/index.js").write_text("installed, not a source")
    (ui / "dist").mkdir()
    (ui / "dist/index.html").write_text("an earlier build")
    assert sources_hash(ui) == key
    (ui / "src/app.svelte").write_text("<p>changed</p>")
    assert sources_hash(ui) != key
    key = sources_hash(ui)
    (ui / "src/build").mkdir()  # a source directory that happens to be named like an output
    (ui / "src/build/step.ts").write_text("export const step = 1")
    assert sources_hash(ui) != key
    built = tmp_path / "cache/moe-stack/chat-page" / sources_hash(ui)
    built.mkdir(parents=True)
    (built / "index.html").write_text("<html></html>")
    monkeypatch.setenv("PATH", str(tmp_path / "no-npm-here"))
    assert chat_page(ui, print) == built  # from the cache: npm is not needed again


def test_without_npm_the_image_goes_without_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "no-npm-here"))
    said: list[str] = []
    assert chat_page(_ui(tmp_path / "tree"), said.append) is None
    assert said == ["no chat page in this image: npm is not installed here (Debian: apt-get install npm)"]
    assert chat_page(tmp_path / "no-ui", said.append) is None and len(said) == 1


def test_a_git_build_fetches_the_pages_directory_at_its_ref(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    repo = tmp_path / "upstream"
    _ui(repo)
    (repo / "src.c").write_text("int main(void) { return 0; }")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "ui"], check=True)
    short = subprocess.run(
        [*git, "rev-parse", "--short=9", "HEAD"], capture_output=True, text=True, check=True
    )
    said: list[str] = []
    fetched = fetched_ui(f"file://{repo}", short.stdout.strip(), "tools/ui", said.append)
    assert fetched is not None and (fetched / "src/app.svelte").read_text() == "<p>hello</p>"
    assert not (fetched.parent.parent / "src.c").exists(), "only the page's directory is checked out"
    assert fetched_ui(f"file://{repo}", short.stdout.strip(), "tools/ui", said.append) == fetched  # cached
    assert fetched_ui(f"file://{repo}", "no-such-ref", "tools/ui", said.append) is None
    assert said and said[-1].startswith(
        f"no chat page in this image: git could not fetch tools/ui of file://{repo}"
    )
    spec = default_image_spec("llama.cpp", gpu=False)
    monkeypatch.setenv("PATH", f"{tmp_path / 'no-npm-here'}:/usr/bin:/bin")
    git_spec = spec.model_copy(update={"source": GitSource(url=f"file://{repo}", ref=short.stdout.strip())})
    if shutil.which("npm") is None:  # the fetched sources reach the npm step, which says it is missing
        assert page_for(git_spec, None, said.append) is None and "npm is not installed" in said[-1]
