"""The llama.cpp images' prompt cache helper (dockerfiles/common/moe-stack-prompts) saving against a server
that writes its slot file slowly, or fails halfway (a full disk): the last whole save stays in place until a
new one is whole, and no partial file is left behind."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

HELPER = Path(__file__).parents[2] / "dockerfiles/common/moe-stack-prompts"
KEY, TOKEN = "key0", "0123456789abcdef0123456789abcdef"
SLOT_FILE = f"{KEY}-{TOKEN}-slot0.bin"


@dataclass
class SlowSaver:
    """A server whose slot save writes the named file in two halves, 0.5 s apart, and answers 200 (or, with
    `fail`, 500 after the first half); it notes what the slot's file held while the save was half done."""

    directory: Path
    fail: bool = False
    seen_midway: list[bytes | None] = field(default_factory=list)

    def handler(self) -> type[BaseHTTPRequestHandler]:
        saver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                name = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["filename"]
                with (saver.directory / name).open("wb") as out:
                    out.write(b"NEW-first-half;")
                    out.flush()
                    time.sleep(0.5)
                    slot_file = saver.directory / SLOT_FILE
                    saver.seen_midway.append(slot_file.read_bytes() if slot_file.exists() else None)
                    if not saver.fail:
                        out.write(b"NEW-second-half")
                status, body = (
                    (500, b'{"error": "failed to write"}') if saver.fail else (200, b'{"n_saved": 9}')
                )
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        return Handler


@pytest.fixture
def prompts_dir(tmp_path: Path) -> Path:
    """The volume as an earlier save left it: the helper's token and a whole slot file."""
    (tmp_path / ".moe-stack").mkdir(mode=0o700)
    (tmp_path / ".moe-stack/owner").write_text(TOKEN + "\n")
    (tmp_path / SLOT_FILE).write_bytes(b"OLD-whole-save")
    return tmp_path


def _save(saver: SlowSaver) -> subprocess.CompletedProcess[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), saver.handler())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {
        "PATH": "/usr/bin:/bin",
        "MOE_STACK_PROMPTS": KEY,
        "MOE_STACK_PROMPTS_DIR": str(saver.directory),
        "LLAMA_ARG_PORT": str(server.server_address[1]),
    }
    try:
        return subprocess.run(
            ["bash", str(HELPER), "save"], env=env, capture_output=True, text=True, timeout=60, check=False
        )
    finally:
        server.shutdown()
        server.server_close()


def test_a_save_replaces_the_slot_file_only_once_whole(prompts_dir: Path) -> None:
    saver = SlowSaver(prompts_dir)
    done = _save(saver)
    assert done.returncode == 0 and "save slot 0: done" in done.stderr, done.stderr
    assert saver.seen_midway == [b"OLD-whole-save"]  # halfway, the slot's file was still the last save
    assert (prompts_dir / SLOT_FILE).read_bytes() == b"NEW-first-half;NEW-second-half"
    assert sorted(p.name for p in prompts_dir.iterdir()) == [".moe-stack", SLOT_FILE]


def test_a_save_that_fails_halfway_keeps_the_last_whole_one(prompts_dir: Path) -> None:
    saver = SlowSaver(prompts_dir, fail=True)
    done = _save(saver)
    assert "the server refused (HTTP 500" in done.stderr, done.stderr
    assert (prompts_dir / SLOT_FILE).read_bytes() == b"OLD-whole-save"
    assert sorted(p.name for p in prompts_dir.iterdir()) == [".moe-stack", SLOT_FILE]  # the partial removed
