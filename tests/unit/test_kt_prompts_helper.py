"""The KTransformers image's prompt cache helper (dockerfiles/ktransformers/moe-stack-prompts): the keyed
directory it gives SGLang, what it removes at start, the bound it keeps, and the last prompt's pages
written at a stop.

SGLang itself cannot run here (its server needs the GPU): the helper serves a stand-in with the two
behaviours it relies on, as sglang-kt 0.7.2 has them: a page file per 64 tokens written under
SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR, and a prompt's pages written only when the next request is
scheduled. The real server under the helper ran on the H200 (bench/results/kt-hicache-2026-12-05). The
stand-in's interpreter reads the image's moe-stack-switch-interval.pth as SGLang's would."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HELPER = Path(__file__).parents[2] / "dockerfiles/ktransformers/moe-stack-prompts"
PAGE = 512 * 1024  # a page file's bytes in the stand-in (a real one: 64 tokens of every layer's KV)
KEY = "0123456789abcdef"
SWITCH_PTH = HELPER.with_name("moe-stack-switch-interval.pth")
STAND_IN = """
import hashlib, http.server, json, os, pathlib, signal, site, sys
site.addsitedir(sys.argv[1])  # the image's site-packages, with its .pth files, as an interpreter starts
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # SGLang drains and exits 0
directory = pathlib.Path(os.environ["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"])
(directory.parent / "switch-interval").write_text(str(sys.getswitchinterval()))
pending = []

class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        global pending
        text = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["text"]
        for name in pending:  # the previous prompt's pages, written as this request is scheduled
            (directory / name).write_bytes(b"k" * PAGE)
        words = text.split()
        pending = [hashlib.sha256(" ".join(words[: i + 64]).encode()).hexdigest() + "_m.bin"
                   for i in range(0, len(words) - 63, 64)]
        (directory.parent / "asked.log").open("a").write(self.headers.get("Authorization", "-") + "\\n")
        body = json.dumps({"text": "x"}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

server = http.server.HTTPServer(("127.0.0.1", int(sys.argv[sys.argv.index("--port") + 1])), Handler)
server.serve_forever()
""".replace("PAGE", str(PAGE))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _post(port: int, prompt: str, words: int) -> None:
    body = json.dumps({"text": " ".join(f"{prompt}{i}" for i in range(words))}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/generate", body, method="POST")
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(request, timeout=10) as reply:
                reply.read()
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _page(path: Path, size: int, used: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"k" * size)
    os.utime(path, (used, used))
    return path


def test_the_helper_keys_bounds_and_writes_the_last_prompt_at_the_stop(tmp_path: Path) -> None:
    root, port = tmp_path / "prompts", _free_port()
    (tmp_path / "stand-in.py").write_text(STAND_IN)
    site_packages = tmp_path / "site-packages"
    site_packages.mkdir()
    (site_packages / SWITCH_PTH.name).write_text(SWITCH_PTH.read_text())
    other = _page(root / "fedcba9876543210" / "old_m.bin", PAGE, 1)  # another model's or build's cache
    stray = _page(root / "stray.bin", 10, 1)
    cut = _page(root / KEY / "cut_m.bin", 100, 5)  # a write a kill cut short
    # Six whole pages (3 MiB) over a bound of 2: pruned to 1.8 MiB, the least recently used first.
    kept = [_page(root / KEY / f"p{i}_m.bin", PAGE, 1000 + i) for i in range(6)]
    key_file = tmp_path / "api-key"
    key_file.write_text("sk-test\n")
    env = {
        **os.environ,
        "MOE_STACK_PROMPTS": KEY,
        "MOE_STACK_PROMPTS_DIR": str(root),
        "MOE_STACK_PROMPTS_MAX_MIB": "2",
        "MOE_STACK_API_KEY_FILE": str(key_file),
    }
    helper = subprocess.Popen(
        [sys.executable, str(HELPER), "serve", sys.executable, str(tmp_path / "stand-in.py"),
         str(site_packages), "--port", str(port)],
        env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _post(port, "a", 130)  # two pages, kept pending by the server
        _post(port, "b", 200)  # three pages; the first prompt's two are written now
        directory = root / KEY
        assert len(list(directory.glob("*_m.bin"))) == 3 + 2
        helper.send_signal(signal.SIGTERM)  # as `docker stop` does to the container's first process
        _, log = helper.communicate(timeout=60)
    finally:
        helper.kill()
    assert helper.returncode == 0, log
    assert not other.exists() and not stray.exists() and not cut.exists()
    assert [p.exists() for p in kept] == [False] * 3 + [True] * 3
    # The last prompt's three pages were written by the helper's request before the server stopped.
    assert len(list(directory.glob("*_m.bin"))) == 3 + 2 + 3
    assert (tmp_path / "prompts" / "asked.log").read_text().splitlines()[-1] == "Bearer sk-test"
    assert "removed fedcba9876543210: the prompts of another model or engine build" in log
    assert "removed 1 page(s) cut short by a kill" in log
    assert "removed 3 least recently used page(s) to keep within 2 MiB" in log
    assert "3 page(s) written at the stop" in log
    # SGLang's interpreters run with the helper's GIL switch interval (the image's .pth applies it).
    assert (root / "switch-interval").read_text() == "0.0005"


def test_the_helper_refuses_a_stack_that_names_no_cache(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOE_STACK_PROMPTS")}
    done = subprocess.run(
        [sys.executable, str(HELPER), "serve", "true"],
        env=env, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 64
    assert (
        done.stderr.strip()
        == "moe-stack-prompts: MOE_STACK_PROMPTS is not set: the stack names no prompt cache"
    )


def test_the_images_pth_changes_nothing_where_the_interval_is_not_set(tmp_path: Path) -> None:
    (tmp_path / SWITCH_PTH.name).write_text(SWITCH_PTH.read_text())
    env = {k: v for k, v in os.environ.items() if k != "MOE_STACK_SWITCH_INTERVAL_S"}
    code = f"import site, sys; site.addsitedir({str(tmp_path)!r}); print(sys.getswitchinterval())"
    printed = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30, check=True
    ).stdout
    assert float(printed) == 0.005  # Python's default
