"""`compose --keep-prompts`: a restarted server answers a long prompt it had seen from its saved slot,
without prefilling it again; each engine's real server, its real slot files on the stack's volume.

On a model of full attention (the tiny Qwen3-MoE): a sliding-window model's restored slot (Gemma 3,
gpt-oss) holds only the window of its SWA layers, and mainline then prefills the prompt again unless the
server keeps their full cache (--swa-full), measured here with the demo model (docs/usage.md)."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from builder.contract import PROMPTS_DIR
from builder.errors import StackError
from builder.features.keep_prompts import PROMPTS_VOLUME
from builder.running.api import EngineApi
from tests.integration.conftest import (
    BuiltImage,
    RunningStack,
    StackFactory,
    answers_health,
    build_engine_image,
    emit_stack,
    need_root,
    serve_stack,
)
from tests.integration.starts import run_in

pytestmark = pytest.mark.integration

# About 2300 tokens of the tiny model's vocabulary: a prompt whose prefill a restored slot must spare.
LONG_PROMPT = " ".join(f"Record {i}: the value of item {i} is {i * 7 % 13}." for i in range(60))


def _sleeping(stack: RunningStack) -> bool:
    return bool(json.loads(EngineApi(stack.port).get("/props"))["is_sleeping"])


def _restarted(stack: RunningStack) -> None:
    """`docker compose restart` (SIGTERM to the entrypoint's helper), then healthy again."""
    stack.client.compose.restart()
    deadline = time.monotonic() + 120
    while not answers_health(stack.port) and time.monotonic() < deadline:
        time.sleep(1)


def _prefilled(stack: RunningStack, prompt: str = LONG_PROMPT) -> tuple[int, int]:
    """The tokens the server prefilled for `prompt` (its own timings) and those it took from cache."""
    reply = EngineApi(stack.port).post(
        "/completion", {"prompt": prompt, "n_predict": 1, "temperature": 0, "cache_prompt": True}
    )
    timings = reply["timings"]
    return int(timings["prompt_n"]), int(timings.get("cache_n", reply.get("tokens_cached", 0)))


def _said(logs: str) -> list[str]:
    """The helper's lines of an engine's log."""
    return [line for line in logs.splitlines() if "moe-stack-prompts:" in line]


def _logs_until(stack: RunningStack, line: str, times: int = 1, timeout_s: float = 120) -> str:
    """The engine's log once `line` is in it `times` times (AssertionError with its helper's lines if not)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        logs = str(stack.client.compose.logs())
        if logs.count(line) >= times:
            return logs
        time.sleep(1)
    raise AssertionError(f"no {line!r} ×{times} in the engine's log within {timeout_s:.0f} s: {_said(logs)}")


def test_a_restarted_server_takes_a_seen_prompt_from_its_saved_slot(
    engine_image: BuiltImage, moe_model: Path, start_stack: StackFactory
) -> None:
    stack = start_stack(engine_image, moe_model, keep_prompts=True)
    _logs_until(stack, "restore slot 0: nothing saved for this model and build yet")
    first, _ = _prefilled(stack)
    assert first > 500, first  # the whole prompt, prefilled
    again, _ = _prefilled(stack)
    assert again < 10, again  # the running server's own cache, as a baseline

    container = stack.client.compose.ps()[0]
    stray = f"{PROMPTS_DIR}/0123456789abcdef-slot0.bin"  # another model's or build's: removed on a save
    run_in(container, ["sh", "-c", f"echo other > {stray}; echo other > {stray}.tokens.json"])
    _restarted(stack)  # SIGTERM: the entrypoint saves slot 0, then stops the server
    # ik_llama.cpp at its pinned ref loses some replies to a save or restore it did (moe-stack-prompts)
    logs = _logs_until(stack, "moe-stack-prompts: restore slot 0: ", times=2)  # the first start's, then this
    said = _said(logs)
    assert any("save slot 0: done" in line or "save slot 0: written" in line for line in said), said
    after, cached = _prefilled(stack)
    assert after < 10 and cached > 500, (after, cached)  # from the restored slot, not prefilled again

    key = run_in(container, ["sh", "-c", "echo $MOE_STACK_PROMPTS"]).strip()
    token = run_in(container, ["cat", f"{PROMPTS_DIR}/.moe-stack/owner"]).strip()
    assert re.fullmatch(r"[0-9a-f]{32}", token), token
    mine = f"{key}-{token}-slot0.bin"
    saved = run_in(container, ["ls", PROMPTS_DIR]).split()  # ik_llama.cpp adds the slot's .tokens.json
    assert mine in saved and all(name.startswith(mine) for name in saved), saved

    # An API client drives the same slot actions under names it picks: it can't name the helper's file
    # (the token), nor reach the token (a directory no slot action can name); what it saves goes at the
    # helper's next save.
    api = EngineApi(stack.port, timeout_s=30)
    tried = [("save", "../x.bin"), ("save", ".moe-stack/owner")]
    if engine_image.engine == "llama.cpp":  # ik_llama.cpp at its pin never answers a missing file's restore
        tried += [("restore", f"{key}-slot0.bin"), ("restore", f"{key}-{'0' * 32}-slot0.bin")]
    for action, name in tried:
        with pytest.raises(StackError, match="answered HTTP"):
            api.post(f"/slots/0?action={action}", {"filename": name})
    try:
        api.post("/slots/0?action=save", {"filename": "a-clients.bin"})
    except StackError as lost:  # a reply ik_llama.cpp lost (above): the file tells whether it saved
        assert engine_image.engine == "ik_llama.cpp" and "timed out" in str(lost), lost
    assert "a-clients.bin" in run_in(container, ["ls", PROMPTS_DIR]).split()
    run_in(container, ["moe-stack-prompts", "save"])
    assert not [name for name in run_in(container, ["ls", PROMPTS_DIR]).split() if not name.startswith(mine)]


def test_an_idle_server_saves_its_slots_before_it_sleeps(
    base_image: str, moe_model: Path, start_stack: StackFactory
) -> None:
    """With `--idle-unload` (mainline): the helper saves the slots once the server is quiet, the server
    sleeps the whole idle unload after the prompt, and a restart while it sleeps neither wakes it to save
    nor loses the saved slot: the restarted server answers the prompt from it."""
    image = build_engine_image("llama.cpp", "avx2", base_image)
    stack = start_stack(image, moe_model, keep_prompts=True, idle_unload=8)  # saved after 2 s, asleep after 8
    _logs_until(stack, "restore slot 0: nothing saved for this model and build yet")
    first, _ = _prefilled(stack)
    assert first > 500, first
    asked = time.monotonic()
    _logs_until(stack, "quiet for 2 s: saving the slots before the server sleeps")
    _logs_until(stack, "save slot 0: done")
    assert not _sleeping(stack), "asleep before the idle unload's 8 s"
    deadline = time.monotonic() + 60
    while not _sleeping(stack) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _sleeping(stack) and time.monotonic() - asked >= 7, "not asleep 8 s after the prompt"

    _restarted(stack)  # asleep: not woken to be saved again
    logs = _logs_until(stack, "moe-stack-prompts: restore slot 0: ", times=2)
    assert "the server sleeps: its slots were saved before it slept" in logs, logs[-3000:]
    assert logs.count("exiting sleeping state") == 0, "the stop woke the server"
    after, cached = _prefilled(stack)
    assert after < 10 and cached > 500, (after, cached)


def _asked(port: int, number: int) -> str:
    """One long request of the load: how it ended ("answered", or the client's error), never waiting past
    the client's own limit (a request still open then is one that hung)."""
    try:
        EngineApi(port, timeout_s=150).post(
            "/completion",
            {"prompt": f"{LONG_PROMPT} Question {number}: which item is largest?", "n_predict": 48},
        )
    except StackError as err:
        return str(err)
    return "answered"


# ik_llama.cpp's run took 321 s here against mainline's 21 (its stops held by handlers waiting for replies
# it had dropped); since the helper sends a second signal 10 s into a stop, 22 s and 62 s in two runs. It
# stays in the slow tier (nightly), mainline's in every run.
@pytest.mark.parametrize(
    "engine_image", ["llama.cpp", pytest.param("ik_llama.cpp", marks=pytest.mark.slow)], indirect=True
)
def test_32_requests_in_flight_through_five_stops(
    engine_image: BuiltImage, moe_model: Path, start_stack: StackFactory
) -> None:
    """Issue 62: 32 long requests in flight, the stack stopped with SIGTERM (`compose restart`) five times in
    a row. Each time: every request ends (answered while the helper saves, or refused once the server
    stops), the server comes back healthy and restores its slots, no partial save is left beside the
    settled files, and the prompt the requests shared is served from the restored cache."""
    stack = start_stack(engine_image, moe_model, keep_prompts=True)
    _logs_until(stack, "restore slot 0: nothing saved for this model and build yet")
    container = stack.client.compose.ps()[0]
    for stop in range(1, 6):
        with ThreadPoolExecutor(max_workers=32) as clients:
            load = [clients.submit(_asked, stack.port, number) for number in range(32)]
            time.sleep(2)  # mid-flight: the first answered, most still queued
            _restarted(stack)
            ended = [request.result() for request in load]
        hung = [outcome for outcome in ended if "timed out" in outcome]
        assert not hung and "answered" in ended, (stop, ended)
        assert answers_health(stack.port), f"not healthy after stop {stop}"
        _logs_until(stack, "moe-stack-prompts: restore slot 0: ", times=stop + 1)
        files = run_in(container, ["ls", "-a", PROMPTS_DIR]).split()
        assert not [name for name in files if "saving" in name], (stop, files)
        after, cached = _prefilled(stack)
        assert cached > 500 and after < 100, (stop, after, cached)


@contextlib.contextmanager
def _small_disk(directory: Path, mib: int) -> Iterator[Path]:
    """An ext4 filesystem of `mib` MiB, loop-mounted at `directory` (writable by the image's user)."""
    image = directory.with_suffix(".img")
    subprocess.run(["truncate", "-s", f"{mib}M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    directory.mkdir()
    subprocess.run(["mount", "-o", "loop", str(image), str(directory)], check=True)
    try:
        directory.chmod(0o1777)
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False)
        image.unlink()


def test_a_save_that_fills_the_disk_keeps_the_last_whole_one(
    engine_image: BuiltImage, moe_model: Path, tmp_path: Path
) -> None:
    """Issue 62: the prompts volume a 64 MiB filesystem, filled to its last byte after a first save; the
    stop's save of another prompt then meets a full disk. The server still stops well within its grace
    period, the first save survives whole (the second was written under a temporary name), and the
    restarted server answers the first prompt from it."""
    need_root("loop-mount a small filesystem")
    compose_file, port = emit_stack(tmp_path, engine_image, moe_model, keep_prompts=True)
    with contextlib.ExitStack() as running:
        disk = running.enter_context(_small_disk(tmp_path / "prompts", 64))
        document = yaml.safe_load(compose_file.read_text())
        document["volumes"][PROMPTS_VOLUME] = {
            "driver_opts": {"type": "none", "o": "bind", "device": str(disk)}
        }
        compose_file.write_text(yaml.safe_dump(document))
        stack = serve_stack(running, compose_file, port, 180)
        _logs_until(stack, "restore slot 0: nothing saved for this model and build yet")
        container = stack.client.compose.ps()[0]
        assert _prefilled(stack)[0] > 500
        run_in(container, ["moe-stack-prompts", "save"])
        saved = run_in(container, ["ls", PROMPTS_DIR]).split()
        fill = f"dd if=/dev/zero of={PROMPTS_DIR}/filler bs=64k 2>/dev/null; df -k {PROMPTS_DIR} | tail -1"
        free_kib = int(run_in(container, ["sh", "-c", fill]).split()[3])
        assert free_kib < 64, free_kib  # a save here is 4.5 MB
        other = LONG_PROMPT.replace("Record", "Entry")
        assert _prefilled(stack, other)[0] > 500  # the slot now holds another prompt, not saved yet

        stopped = time.monotonic()
        _restarted(stack)  # SIGTERM: the save of `other` meets the full disk
        took = time.monotonic() - stopped
        assert took < 120 and answers_health(stack.port), (took, _said(str(stack.client.compose.logs())))
        logs = _logs_until(stack, "moe-stack-prompts: restore slot 0: ", times=2)
        said = _said(logs)
        assert run_in(container, ["ls", PROMPTS_DIR]).split() == saved, said  # the filler, the partial gone
        after, cached = _prefilled(stack)
        assert after < 10 and cached > 500, (after, cached, said)  # the first save, restored whole


def test_a_recurrent_models_checkpoints_move_with_its_save(
    base_image: str, tiny_models: dict[str, Path], start_stack: StackFactory
) -> None:
    """ik_llama.cpp keeps context checkpoints of a recurrent model's state (Qwen3-Next's can't be rolled
    back a token: a prompt seen again resumes from the last checkpoint before its end) and saves them
    beside the slot's file (`.checkpoints`). The helper settles them with the save, and the restarted
    server resumes the prompt from a checkpoint read back from that file, as the running one did."""
    image = build_engine_image("ik_llama.cpp", "avx2", base_image)
    stack = start_stack(image, tiny_models["qwen3next"], keep_prompts=True)
    _logs_until(stack, "restore slot 0: nothing saved for this model and build yet")
    first, _ = _prefilled(stack)
    again, _ = _prefilled(stack)
    assert first > 500 and again < 10, (first, again)  # the running server: from its last checkpoint
    _restarted(stack)
    logs = _logs_until(stack, "moe-stack-prompts: restore slot 0: ", times=2)
    container = stack.client.compose.ps()[0]
    settled = [name for name in run_in(container, ["ls", PROMPTS_DIR]).split() if "-slot0.bin" in name]
    assert any(name.endswith("-slot0.bin.checkpoints") for name in settled), settled
    assert not [name for name in settled if "saving" in name], settled
    after, cached = _prefilled(stack)
    assert after < 10 and cached > 500, (after, cached)
    restarted = str(stack.client.compose.logs())[len(logs) :]
    assert "restored context checkpoint" in restarted, restarted[-3000:]
