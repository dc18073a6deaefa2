"""The llama.cpp images' prompt cache helper (dockerfiles/common/moe-stack-prompts) against a stand-in server
that writes its slot file slowly, fails halfway (a full disk), or takes its time restoring (clients holding
the slots): the last whole save stays in place until a new one is whole, no partial file is left behind,
and a stop before the restore ended keeps the saved slots rather than saving the emptier ones over them."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
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
    `fail`, 500 after the first half); it notes what the slot's file held while the save was half done.
    A restore answers after `restore_s`; /health answers 200."""

    directory: Path
    fail: bool = False
    short: bool = False  # as ik_llama.cpp 8337e4c on a full disk: half the file, "n_written": 0 and HTTP 200
    unanswered: bool = False  # as ik_llama.cpp when it drops the reply: the file written, no answer ever
    fill: bool = False  # the second half as big as the disk (it writes what fits)
    checkpoints: bool = False  # as ik_llama.cpp for a model with checkpoints: a .checkpoints file beside it
    stall_s: float = 0.0  # as storage that stalls a write: the file held open, not growing, before its end
    restore_s: float = 0.0
    seen_midway: list[bytes | None] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)

    def handler(self) -> type[BaseHTTPRequestHandler]:
        saver = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def do_POST(self) -> None:
                name = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["filename"]
                saver.actions.append(self.path.rpartition("=")[2])
                if self.path.endswith("action=restore"):
                    time.sleep(saver.restore_s)
                    self.send_response(200)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"{}")
                    return
                with (saver.directory / name).open("wb") as out:
                    out.write(b"NEW-first-half;")
                    out.flush()
                    time.sleep(0.5)
                    slot_file = saver.directory / SLOT_FILE
                    saver.seen_midway.append(slot_file.read_bytes() if slot_file.exists() else None)
                    if saver.fill:
                        with contextlib.suppress(OSError):  # the disk is full
                            out.write(b"x" * (8 << 20))
                            out.flush()
                    elif not (saver.fail or saver.short):
                        time.sleep(saver.stall_s)
                        out.write(b"NEW-second-half")
                if saver.checkpoints:
                    (saver.directory / f"{name}.checkpoints").write_bytes(b"NEW-checkpoints")
                if saver.unanswered:
                    time.sleep(300)  # the client gives up first
                    return
                written = 0 if saver.short else 30 + 15 * saver.checkpoints  # the whole file: both halves
                status, body = (
                    (500, b'{"error": "failed to write"}')
                    if saver.fail
                    else (200, b'{"n_saved": 9, "n_written": %d}' % written)
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
    """The volume as an earlier save left it: the helper's token and a whole slot file; beside it, the
    image's healthcheck as a program on PATH (the image installs it so)."""
    volume = tmp_path / "prompts"
    (volume / ".moe-stack").mkdir(mode=0o700, parents=True)
    (volume / ".moe-stack/owner").write_text(TOKEN + "\n")
    (volume / SLOT_FILE).write_bytes(b"OLD-whole-save")
    (tmp_path / "bin").mkdir()
    health = tmp_path / "bin/moe-stack-health"
    health.write_text(f"#!/bin/sh\nexec bash {HELPER.parent / 'moe-stack-health'}\n")
    health.chmod(0o755)
    return volume


def _env(saver: SlowSaver, server: ThreadingHTTPServer) -> dict[str, str]:
    return {
        "PATH": f"{saver.directory.parent / 'bin'}:/usr/bin:/bin",
        "MOE_STACK_PROMPTS": KEY,
        "MOE_STACK_PROMPTS_DIR": str(saver.directory),
        "LLAMA_ARG_PORT": str(server.server_address[1]),
    }


def _served(saver: SlowSaver) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), saver.handler())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _save(saver: SlowSaver) -> subprocess.CompletedProcess[str]:
    server = _served(saver)
    env = _env(saver, server)
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


def test_a_save_answered_but_cut_short_keeps_the_last_whole_one(prompts_dir: Path) -> None:
    """ik_llama.cpp 8337e4c on a full disk answers the save with 200 and writes a short file: kept, it
    would have replaced the last whole save (tests/integration/test_keep_prompts.py meets it for real)."""
    saver = SlowSaver(prompts_dir, short=True)
    done = _save(saver)
    assert "save slot 0: not written whole" in done.stderr and "done" not in done.stderr, done.stderr
    assert (prompts_dir / SLOT_FILE).read_bytes() == b"OLD-whole-save"
    assert sorted(p.name for p in prompts_dir.iterdir()) == [".moe-stack", SLOT_FILE]  # the short one removed


def _stopped_while_serving(saver: SlowSaver, *command: str, timeout_s: float = 30) -> tuple[str, float]:
    """`serve COMMAND` against `saver`, stopped (SIGTERM) a second after it asked for the restore: what it
    said, and how long the stop took. A helper not ended within `timeout_s` is killed with its server."""
    server = _served(saver)
    helper = subprocess.Popen(
        ["bash", str(HELPER), "serve", *command],
        env=_env(saver, server),
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the helper and its server
    )
    try:
        deadline = time.monotonic() + 20
        while "restore" not in saver.actions and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1)  # the restore answered, or still waits
        stopped = time.monotonic()
        helper.terminate()
        _, said = helper.communicate(timeout=timeout_s)
        return said, time.monotonic() - stopped
    finally:
        server.shutdown()
        server.server_close()
        if helper.poll() is None:  # the helper never ended its server (the failure): neither is left running
            os.killpg(helper.pid, signal.SIGKILL)
            helper.wait()


@pytest.mark.parametrize("restore_s", [0.0, 20.0])
def test_a_stop_before_the_restore_ended_keeps_the_saved_slots(prompts_dir: Path, restore_s: float) -> None:
    """`serve`: stopped while the restore still waits (20 s: clients hold the slot), the helper saves
    nothing; stopped after it, it saves as ever (the control)."""
    saver = SlowSaver(prompts_dir, restore_s=restore_s)
    said, _ = _stopped_while_serving(saver, "sleep", "60")
    if restore_s:
        assert saver.actions == ["restore"], saver.actions
        assert "stopped before the slots were restored: the saved ones are kept as they were" in said, said
        assert (prompts_dir / SLOT_FILE).read_bytes() == b"OLD-whole-save"
    else:
        assert saver.actions == ["restore", "save"], (saver.actions, said)
        assert (prompts_dir / SLOT_FILE).read_bytes() == b"NEW-first-half;NEW-second-half"


# A server that a stop's SIGTERM doesn't end (ik_llama.cpp 8337e4c waits for the handler of a request whose
# reply it dropped): one that a second signal ends (both engines exit on it), and one that takes SIGKILL.
STUCK_SERVERS = {
    "second signal": 'echo $$ >"$1"; n=0; trap "n=\\$((n + 1)); [ \\$n -ge 2 ] && exit 3" TERM; '
    "while :; do sleep 0.1; done",
    "SIGKILL": 'echo $$ >"$1"; trap "" TERM; while :; do sleep 0.1; done',
}


@pytest.mark.parametrize("server", STUCK_SERVERS, ids=list(STUCK_SERVERS))
def test_a_server_that_does_not_stop_on_sigterm_is_ended(prompts_dir: Path, server: str) -> None:
    """`serve`: the slots saved and the server signalled, it is still up 10 s later: a second SIGTERM, then
    SIGKILL 5 s after that, so a stop ends well within the stack's grace period."""
    saver, pid_file = SlowSaver(prompts_dir), prompts_dir.parent / "server.pid"
    command = ("bash", "-c", STUCK_SERVERS[server], "server", str(pid_file))
    said, took = _stopped_while_serving(saver, *command, timeout_s=60)
    assert saver.actions == ["restore", "save"], (saver.actions, said)
    assert "the server did not stop within 10 s of SIGTERM: a second signal ends it" in said, said
    assert 10 <= took < (13 if server == "second signal" else 18), (took, said)
    assert not Path(f"/proc/{pid_file.read_text().strip()}").exists(), said  # ended, and reaped


def test_a_save_keeps_the_checkpoints_beside_its_file(prompts_dir: Path) -> None:
    """ik_llama.cpp writes a model's checkpoints beside the slot's file and counts them in its n_written:
    they move with the file (else the next save removes them, and the count says the file is short)."""
    (prompts_dir / f"{SLOT_FILE}.checkpoints").write_bytes(b"OLD-checkpoints")
    done = _save(SlowSaver(prompts_dir, checkpoints=True))
    assert "save slot 0: done" in done.stderr, done.stderr
    assert (prompts_dir / f"{SLOT_FILE}.checkpoints").read_bytes() == b"NEW-checkpoints"
    assert sorted(p.name for p in prompts_dir.iterdir()) == [
        ".moe-stack",
        SLOT_FILE,
        f"{SLOT_FILE}.checkpoints",
    ]


def test_an_unanswered_save_is_judged_on_disk_once_its_file_stops_growing(prompts_dir: Path) -> None:
    """ik_llama.cpp sometimes drops a save's reply: the helper stops waiting once the file has settled
    (not after its 4-minute limit) and keeps it, the disk having room."""
    started = time.monotonic()
    done = _save(SlowSaver(prompts_dir, unanswered=True))
    assert "save slot 0: written, no reply" in done.stderr, done.stderr
    assert time.monotonic() - started < 30
    assert (prompts_dir / SLOT_FILE).read_bytes() == b"NEW-first-half;NEW-second-half"


def test_an_unanswered_save_is_not_judged_while_its_file_is_open(prompts_dir: Path) -> None:
    """A write that stalls longer than the 10 s the helper waits for growth (slow storage): the server still
    holds the file open, so the helper waits for it to close rather than keep half a save."""
    done = _save(SlowSaver(prompts_dir, unanswered=True, stall_s=20))
    assert "save slot 0: written, no reply" in done.stderr, done.stderr
    assert (prompts_dir / SLOT_FILE).read_bytes() == b"NEW-first-half;NEW-second-half"


@pytest.fixture
def full_prompts_dir(prompts_dir: Path) -> Iterator[Path]:
    """The volume on a 4 MiB tmpfs of its own, holding what `prompts_dir` held."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    held = {
        path.relative_to(prompts_dir): path.read_bytes() for path in prompts_dir.rglob("*") if path.is_file()
    }
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(prompts_dir)], check=True)
    try:
        for name, content in held.items():
            (prompts_dir / name).parent.mkdir(mode=0o700, exist_ok=True)
            (prompts_dir / name).write_bytes(content)
        yield prompts_dir
    finally:
        subprocess.run(["umount", "-l", str(prompts_dir)], check=False)


def test_an_unanswered_save_that_filled_the_disk_keeps_the_last_whole_one(full_prompts_dir: Path) -> None:
    """The reply dropped and the disk full after the write (ik_llama.cpp drops most the reply of a save that
    ends at once, as one meeting a full disk): the file may be cut short, so the last whole save stays."""
    started = time.monotonic()
    done = _save(SlowSaver(full_prompts_dir, unanswered=True, fill=True))
    assert "no reply, and its file is not a whole save (the disk is full" in done.stderr, done.stderr
    assert time.monotonic() - started < 30
    assert (full_prompts_dir / SLOT_FILE).read_bytes() == b"OLD-whole-save"
    assert sorted(p.name for p in full_prompts_dir.iterdir()) == [".moe-stack", SLOT_FILE]
