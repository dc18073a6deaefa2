"""The chat page's build runs the engine tree's code (its build script, its devDependencies) in a container,
never on the host: a tools/ui whose build script tries what an attacker's would (write outside its
directory, read the caller's environment and files, reach the host's network, keep privileges) finds each
closed, and a build that leaves a link in its output gets no page."""

from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path

import pytest

from builder.contract import IMAGE_UID
from builder.engines import get_engine
from builder.images.build import page_for
from builder.images.chat_page import SANDBOX_ENV
from builder.images.matrix import default_image_spec
from builder.spec import BaseImages

pytestmark = pytest.mark.integration
SECRET = "moe-stack-probe-secret-7d1f"
# The build's whole environment: moe-stack's few variables (SANDBOX_ENV), Docker's, the shell's and npm's
# (beside its npm_* ones).
SANDBOX_NAMES = {*SANDBOX_ENV, "PATH", "HOSTNAME", "PWD", "NODE", "INIT_CWD", "COLOR", "EDITOR"}

# The build script: each attempt's outcome goes into the page's report.json, the page's only way back.
PROBE = """\
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';

const out = process.env.LLAMA_UI_OUT_DIR ?? 'dist';
const report = { uid: process.getuid(), env: process.env, interfaces: Object.keys(os.networkInterfaces()) };
const attempt = (fn) => { try { return fn() ?? 'done'; } catch (e) { return e.code ?? String(e); } };
report.writeHost = attempt(() => fs.writeFileSync(HOST_MARKER, 'written by the build'));
report.writeParent = attempt(() => fs.writeFileSync('../escaped', 'written by the build'));
report.writeRoot = attempt(() => fs.accessSync('/', fs.constants.W_OK));
report.writeOwn = attempt(() => fs.writeFileSync('touched', 'written by the build'));
report.readHost = attempt(() => fs.readFileSync(HOST_SECRET, 'utf8'));
report.readLink = attempt(() => fs.readFileSync('src/secret', 'utf8'));
report.status = fs.readFileSync('/proc/self/status', 'utf8');
report.connect = await new Promise((resolve) => {
  const socket = net.connect({ host: '127.0.0.1', port: HOST_PORT, timeout: 5000 });
  socket.on('connect', () => { socket.destroy(); resolve('connected'); });
  socket.on('error', (e) => resolve(e.code));
  socket.on('timeout', () => { socket.destroy(); resolve('timeout'); });
});
report.connectOut = await new Promise((resolve) => {
  const socket = net.connect({ host: '1.1.1.1', port: 53, timeout: 5000 });
  socket.on('connect', () => { socket.destroy(); resolve('connected'); });
  socket.on('error', (e) => resolve(e.code));
  socket.on('timeout', () => { socket.destroy(); resolve('timeout'); });
});
fs.mkdirSync(out, { recursive: true });
fs.writeFileSync(`${out}/index.html`, '<html>probe</html>');
fs.writeFileSync(`${out}/report.json`, JSON.stringify(report));
"""


def _tree(root: Path, script: str) -> Path:
    """An engine tree whose tools/ui is an app with no packages and `script` as its build."""
    ui = root / "tools/ui"
    (ui / "src").mkdir(parents=True)
    manifest = {"name": "probe", "version": "1.0.0", "private": True, "type": "module"}
    scripts = {"build": "node build.mjs"}
    # The app's own lifecycle scripts: npm runs none of them on the host (or anywhere).
    for event in ("preinstall", "install", "postinstall", "prepare"):
        scripts[event] = f"node -e \"require('fs').writeFileSync('{root}/ran-{event}', '')\""
    (ui / "package.json").write_text(json.dumps({**manifest, "scripts": scripts}))
    lock = {**manifest, "lockfileVersion": 3, "requires": True, "packages": {"": manifest}}
    (ui / "package-lock.json").write_text(json.dumps(lock))
    (ui / ".npmrc").write_text("ignore-scripts=false\n")  # the tree's npm config: not read on the host
    (ui / "build.mjs").write_text(script)
    return root


def _listener() -> tuple[socket.socket, list[str]]:
    """A TCP listener on the host's loopback; what connects to it is recorded."""
    server = socket.create_server(("127.0.0.1", 0))
    connected: list[str] = []

    def accept() -> None:
        try:
            while True:
                peer, address = server.accept()
                connected.append(str(address))
                peer.close()
        except OSError:
            return

    threading.Thread(target=accept, daemon=True).start()
    return server, connected


def _page(tree: Path, base_image: str, said: list[str]) -> Path | None:
    spec = default_image_spec(get_engine("llama.cpp"), gpu=False)
    spec = spec.model_copy(update={"base": BaseImages(build=base_image, runtime=base_image)})
    return page_for(spec, tree, said.append)


def test_the_page_build_runs_sandboxed(
    base_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("MOE_STACK_PROBE", SECRET)  # the caller's environment
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    marker = tmp_path / "marker"  # a directory of the host's the build is told about
    server, connected = _listener()
    script = (
        PROBE.replace("HOST_MARKER", json.dumps(str(marker)))
        .replace("HOST_SECRET", json.dumps(str(secret)))
        .replace("HOST_PORT", str(server.getsockname()[1]))
    )
    tree = _tree(tmp_path / "tree", script)
    (tree / "tools/ui/src/secret").symlink_to(secret)  # a link out of the tree, to a file of the host's
    before = sorted(p.relative_to(tree) for p in tree.rglob("*"))
    said: list[str] = []
    try:
        page = _page(tree, base_image, said)
    finally:
        server.close()
    assert page is not None, said
    report = json.loads((page / "report.json").read_text())
    # Nothing was written on the host, nor in the caller's tree: the build had a copy of tools/ui.
    assert not marker.exists() and report["writeHost"] == "ENOENT"
    assert report["writeParent"] in {"EROFS", "EACCES"} and report["writeRoot"] in {"EROFS", "EACCES"}
    assert report["writeOwn"] == "done"
    assert sorted(p.relative_to(tree) for p in tree.rglob("*")) == before
    assert not list(tmp_path.glob("tree/ran-*")), "an npm lifecycle script of the app ran"
    # Nothing of the caller's to read: no file of the host, no variable.
    assert report["readHost"] == "ENOENT" and report["readLink"] == "ENOENT"
    env = report["env"]
    assert SECRET not in json.dumps(env) and not any(key.startswith("MOE_STACK") for key in env)
    assert env["HOME"] == "/tmp"
    assert {key for key in env if not key.startswith("npm_")} <= SANDBOX_NAMES, sorted(env)
    # No network at all, the host's loopback included; no capability, no way to gain one; not root.
    assert report["interfaces"] == ["lo"]
    assert report["connect"] == "ECONNREFUSED" and connected == []
    assert report["connectOut"] in {"ENETUNREACH", "EHOSTUNREACH"}
    status = dict(line.split(":\t", 1) for line in report["status"].splitlines() if ":\t" in line)
    assert status["CapEff"].strip() == status["CapPrm"].strip() == "0000000000000000"
    assert status["NoNewPrivs"].strip() == "1"
    assert report["uid"] == (os.getuid() or IMAGE_UID)


def test_a_link_in_the_builds_output_is_no_page(
    base_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    script = (
        "import fs from 'node:fs';\n"
        "const out = process.env.LLAMA_UI_OUT_DIR ?? 'dist';\n"
        "fs.mkdirSync(out, { recursive: true });\n"
        "fs.writeFileSync(`${out}/index.html`, '<html>probe</html>');\n"
        "fs.symlinkSync('/etc/passwd', `${out}/passwd`);\n"
    )
    said: list[str] = []
    assert _page(_tree(tmp_path / "tree", script), base_image, said) is None
    assert (
        said[-1] == "no chat page in this image: npm's build wrote dist/passwd, a link: its output is refused"
    )
    assert not list((tmp_path / "cache/moe-stack/chat-page").glob("[!.]*")), "nothing cached"
