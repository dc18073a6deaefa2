"""The chat page's way into mainline's image: the build context it travels in, when there is none, the
cache keyed by the page's sources, and what of the engine tree's runs where: on the host npm only
downloads (run for real here), the build's container is a plain value (the build itself runs for real in
the integration suite: tests/integration/test_chat_page.py and test_chat_page_sandbox.py)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from builder.contract import CHAT_PAGE_CONTEXT
from builder.engines import get_engine
from builder.images.build import page_for, plan_build
from builder.images.chat_page import (
    NoPage,
    SandboxRun,
    builder_dockerfile,
    chat_page,
    copy_output,
    copy_sources,
    fetched_ui,
    install_argv,
    install_packages,
    lock_problem,
    sources_hash,
)
from builder.images.matrix import default_image_spec
from builder.spec import GitSource
from tests.tools import dependency_command


def _ui(root: Path) -> Path:
    ui = root / "tools/ui"
    (ui / "src").mkdir(parents=True)
    (ui / "package-lock.json").write_text("{}")
    (ui / "src/app.svelte").write_text("<p>hello</p>")
    return ui


def test_the_built_page_travels_as_its_own_context(tmp_path: Path) -> None:
    page = tmp_path / "page"
    plan = plan_build(default_image_spec(get_engine("llama.cpp"), gpu=False), tmp_path, None, page=page)
    assert plan.kwargs()["build_contexts"] == {CHAT_PAGE_CONTEXT: str(page)}


def test_no_page_for_ik(tmp_path: Path) -> None:
    said: list[str] = []
    assert page_for(default_image_spec(get_engine("ik_llama.cpp"), gpu=False), tmp_path, said.append) is None
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
    spec = default_image_spec(get_engine("llama.cpp"), gpu=False)
    monkeypatch.setenv("PATH", f"{tmp_path / 'no-npm-here'}:/usr/bin:/bin")
    git_spec = spec.model_copy(update={"source": GitSource(url=f"file://{repo}", ref=short.stdout.strip())})
    if shutil.which("npm") is None:  # the fetched sources reach the npm step, which says it is missing
        assert page_for(git_spec, None, said.append) is None and "npm is not installed" in said[-1]


def _app(ui: Path, packages: dict[str, object] | None = None) -> Path:
    """An app whose every npm lifecycle script (and build) would leave a file beside it, with a lock of
    `packages` and a project .npmrc that turns scripts on."""
    ui.mkdir(parents=True)
    ran = ui.parent / "ran"
    events = ["preinstall", "install", "postinstall", "preprepare", "prepare", "postprepare", "build"]
    scripts = {
        event: f"node -e \"require('fs').mkdirSync('{ran}/{event}', {{recursive: true}})\""
        for event in events
    }
    manifest = {"name": "app", "version": "1.0.0", "private": True}
    (ui / "package.json").write_text(json.dumps({**manifest, "scripts": scripts}))
    lock = {
        **manifest,
        "lockfileVersion": 3,
        "requires": True,
        "packages": {"": manifest, **(packages or {})},
    }
    (ui / "package-lock.json").write_text(json.dumps(lock))
    (ui / ".npmrc").write_text("ignore-scripts=false\n")
    return ui


def _recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """npm, npx and node on PATH as the real ones behind a shim that records each call (program and
    arguments) in the returned log: whatever npm starts on the host shows there."""
    log, shims = tmp_path / "calls.log", tmp_path / "shims"
    shims.mkdir()
    for name in ("npm", "npx", "node"):
        real = shutil.which(name)
        run = f'exec {real} "$@"' if real else "exit 127"
        (shims / name).write_text(f'#!/bin/sh\nprintf "%s\\n" "{name} $*" >> {log}\n{run}\n')
        (shims / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{shims}:{os.environ['PATH']}")
    log.touch()
    return log


@pytest.mark.skipif(
    shutil.which("npm") is None, reason="npm is not installed here (prepare-host.sh installs it)"
)
def test_on_the_host_npm_only_downloads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The host's one npm command, run for real: it starts nothing but npm itself (no lifecycle script of
    the app, though its .npmrc asks for them; no `npm run`, no npx), from the app's package.json and
    lock file alone."""
    log = _recorded(tmp_path, monkeypatch)
    ui = _app(tmp_path / "tree/tools/ui")
    npm = shutil.which("npm")
    assert npm is not None and npm.startswith(str(tmp_path))
    modules = install_packages(npm, ui, tmp_path / "install")
    assert modules == tmp_path / "install/node_modules" and modules.is_dir()
    assert sorted(p.name for p in (tmp_path / "install").iterdir()) == [
        "node_modules",
        "package-lock.json",
        "package.json",
    ]
    calls = log.read_text().splitlines()
    real_npm = shutil.which("npm", path=os.environ["PATH"].split(":", 1)[1])
    assert calls == [
        f"npm {' '.join(install_argv(npm)[1:])}",
        f"node {real_npm} {' '.join(install_argv(npm)[1:])}",
    ]
    assert install_argv(npm) == [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--prefer-offline"]
    assert not (tmp_path / "tree/ran").exists(), "a script of the app ran on the host"


@pytest.mark.skipif(
    shutil.which("npm") is None, reason="npm is not installed here (prepare-host.sh installs it)"
)
def test_a_lock_with_a_git_dependency_is_not_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """npm clones a git dependency and runs its install and prepare scripts even under --ignore-scripts:
    such a lock never reaches npm here."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    log = _recorded(tmp_path, monkeypatch)
    git = {"resolved": "git+ssh://git@github.com/someone/thing.git#0123abcd", "version": "1.0.0"}
    ui = _app(tmp_path / "tree/tools/ui", {"node_modules/thing": git})
    said: list[str] = []
    assert chat_page(ui, said.append) is None
    assert said[-1] == (
        f"no chat page in this image: {ui}/package-lock.json takes node_modules/thing from "
        "git+ssh://git@github.com/someone/thing.git#0123abcd: only registry tarballs with an integrity "
        "hash are installed on this host (a git or directory dependency runs its code)"
    )
    assert log.read_text() == "", "npm ran"


def test_what_a_lock_may_install(tmp_path: Path) -> None:
    lock = tmp_path / "package-lock.json"

    def problem(packages: dict[str, object], version: int = 3) -> str | None:
        lock.write_text(json.dumps({"lockfileVersion": version, "packages": {"": {}, **packages}}))
        return lock_problem(lock)

    tarball = {"resolved": "https://registry.npmjs.org/a/-/a-1.0.0.tgz", "integrity": "sha512-AAAA"}
    assert problem({"node_modules/a": tarball, "node_modules/a/node_modules/b": tarball}) is None
    # Bundled or not: npm ci fetched an `inBundle` entry's git URL (with the user's credentials) before
    # any sandbox ran.
    git = {"resolved": "git+https://github.com/x/b.git#abc", "inBundle": True}
    assert "node_modules/a/node_modules/b from git+https://" in str(
        problem({"node_modules/a": tarball, "node_modules/a/node_modules/b": git})
    )
    assert "from no registry" in str(problem({"node_modules/a/node_modules/b": {"inBundle": True}}))
    assert "from https://example.com/b" in str(
        problem({"node_modules/b": {**tarball, "resolved": "https://example.com/b"}})  # not a tarball
    )
    assert "node_modules/a from https://" in str(problem({"node_modules/a": {**tarball, "integrity": None}}))
    assert "node_modules/l from ../lib" in str(
        problem({"node_modules/l": {"resolved": "../lib", "link": True}})
    )
    assert "node_modules/g from git+https://" in str(
        problem({"node_modules/g": {**tarball, "resolved": "git+https://github.com/x/g.git#abc"}})
    )
    assert "from no registry" in str(problem({"node_modules/n": {"version": "1.0.0"}}))
    lock.write_text(json.dumps({"lockfileVersion": 1, "dependencies": {}}))
    assert lock_problem(lock) == "lists no packages (lockfileVersion 1?): regenerate it with npm 7 or newer"
    lock.write_text("{")
    assert str(lock_problem(lock)).startswith("can't be read as JSON")


def test_the_build_runs_in_a_closed_container() -> None:
    """The whole `docker run` of the build: no network, the caller's or the images' unprivileged user, a
    read-only root with a private /tmp, no capability nor a way to gain one, bounded processes, memory and
    CPUs (one core of the host's left to it: SandboxRun.cpus), the copy of tools/ui its only
    mount, an environment of moe-stack's three variables (Docker passes nothing of the caller's), the
    image never pulled; and `npm run build` runs there, after the image's name."""
    run = SandboxRun(
        image="moe-stack/chat-page-builder:0123456789ab",
        work=Path("/cache/moe-stack/chat-page/.build-x/ui"),
        uid=10001,
        gid=10001,
        name="moe-stack-chat-page-test",
        cpus=3,
    )
    assert run.argv() == [
        "docker",
        "run",
        "--rm",
        "--read-only",
        "--pull",
        "never",
        "--name",
        "moe-stack-chat-page-test",
        "--network",
        "none",
        "--user",
        "10001:10001",
        "--tmpfs",
        "/tmp:rw,nosuid,nodev,size=1g",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--pids-limit",
        "1024",
        "--memory",
        "4g",
        "--memory-swap",
        "4g",
        "--cpus",
        "3",
        "--mount",
        "type=bind,source=/cache/moe-stack/chat-page/.build-x/ui,target=/ui",
        "--workdir",
        "/ui",
        "--env",
        "HOME=/tmp",
        "--env",
        "LLAMA_UI_OUT_DIR=/ui/dist",
        "--env",
        "NPM_CONFIG_UPDATE_NOTIFIER=false",
        "moe-stack/chat-page-builder:0123456789ab",
        "npm",
        "run",
        "build",
    ]
    assert SandboxRun("i", Path("/w"), 1000, 1000).name != SandboxRun("i", Path("/w"), 1000, 1000).name
    assert SandboxRun("i", Path("/w"), 1, 1).cpus == max(1, (os.cpu_count() or 1) - 1)


def test_the_builds_output_comes_back_as_plain_files(tmp_path: Path) -> None:
    out = tmp_path / "dist"
    (out / "assets").mkdir(parents=True)
    (out / "index.html").write_text("<html></html>")
    (out / "assets/app.js").write_text("console.log(1)")
    (out / "assets/app.js").chmod(0o4777)
    page = copy_output(out, tmp_path / "page")
    assert (page / "assets/app.js").read_text() == "console.log(1)"
    assert stat.S_IMODE((page / "assets/app.js").stat().st_mode) & 0o7133 == 0, (
        "no set-id, exec or others' write"
    )
    for leftover, kind in (("passwd", "a link"), ("pipe", "not a file or directory")):
        bad = tmp_path / f"bad-{leftover}"
        shutil.copytree(out, bad / "dist")
        if leftover == "passwd":
            (bad / "dist/assets/passwd").symlink_to("/etc/passwd")
        else:
            os.mkfifo(bad / "dist/assets/pipe")
        with pytest.raises(NoPage, match=f"wrote dist/assets/{leftover}, {kind}: its output is refused"):
            copy_output(bad / "dist", bad / "page")
    (tmp_path / "linked").symlink_to(out)
    with pytest.raises(NoPage, match="something other than a directory"):
        copy_output(tmp_path / "linked", tmp_path / "page2")
    (tmp_path / "empty").mkdir()
    with pytest.raises(NoPage, match="wrote no index.html"):
        copy_output(tmp_path / "empty", tmp_path / "page3")


def test_the_builds_copy_of_the_tree_keeps_links_and_refuses_devices(tmp_path: Path) -> None:
    """A link out of the tree is copied as a link (in the container it reaches nothing of the host's),
    never as the file it names; a pipe would be read without end: no page."""
    ui = _ui(tmp_path / "tree")
    (tmp_path / "secret").write_text("the host's")
    (ui / "src/secret").symlink_to(tmp_path / "secret")
    (ui / "node_modules").mkdir()
    copy_sources(ui, tmp_path / "work")
    assert os.readlink(tmp_path / "work/src/secret") == str(tmp_path / "secret")
    assert not (tmp_path / "work/node_modules").exists()
    os.mkfifo(ui / "src/pipe")
    with pytest.raises(NoPage, match=f"{ui} can't be copied for its build"):
        copy_sources(ui, tmp_path / "work2")


@pytest.mark.lint
def test_the_builds_image_is_hadolint_clean(tmp_path: Path) -> None:
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(builder_dockerfile("moe-stack/debian:trixie"))
    assert "apt-get install -y --no-install-recommends nodejs npm" in dockerfile.read_text()
    result = subprocess.run(
        [dependency_command("hadolint"), "--no-color", str(dockerfile)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
