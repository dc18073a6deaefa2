"""`compose --keep-prompts`: a restarted server answers a long prompt it had seen from its saved slot,
without prefilling it again; each engine's real server, its real slot files on the stack's volume.

On a model of full attention (the tiny Qwen3-MoE): a sliding-window model's restored slot (Gemma 3,
gpt-oss) holds only the window of its SWA layers, and mainline then prefills the prompt again unless the
server keeps their full cache (--swa-full), measured here with the demo model (docs/usage.md)."""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from builder.contract import PROMPTS_DIR
from builder.errors import StackError
from builder.running.api import EngineApi
from tests.integration.conftest import (
    BuiltImage,
    RunningStack,
    StackFactory,
    answers_health,
    build_engine_image,
)

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


def _prefilled(stack: RunningStack) -> tuple[int, int]:
    """The tokens the server prefilled for LONG_PROMPT (its own timings) and those it took from cache."""
    reply = EngineApi(stack.port).post(
        "/completion", {"prompt": LONG_PROMPT, "n_predict": 1, "temperature": 0, "cache_prompt": True}
    )
    timings = reply["timings"]
    return int(timings["prompt_n"]), int(timings.get("cache_n", reply.get("tokens_cached", 0)))


def _logs_until(stack: RunningStack, line: str, times: int = 1, timeout_s: float = 120) -> str:
    """The engine's log once `line` is in it `times` times (AssertionError with its helper's lines if not)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        logs = str(stack.client.compose.logs())
        if logs.count(line) >= times:
            return logs
        time.sleep(1)
    said = [entry for entry in logs.splitlines() if "moe-stack-prompts:" in entry]
    raise AssertionError(f"no {line!r} ×{times} in the engine's log within {timeout_s:.0f} s: {said}")


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
    container.execute(["sh", "-c", f"echo other > {stray}; echo other > {stray}.tokens.json"])
    _restarted(stack)  # SIGTERM: the entrypoint saves slot 0, then stops the server
    # ik_llama.cpp at its pinned ref loses some replies to a save or restore it did (moe-stack-prompts)
    logs = _logs_until(stack, "moe-stack-prompts: restore slot 0: ", times=2)  # the first start's, then this
    said = [line for line in logs.splitlines() if "moe-stack-prompts:" in line]
    assert any("save slot 0: done" in line or "save slot 0: written" in line for line in said), said
    after, cached = _prefilled(stack)
    assert after < 10 and cached > 500, (after, cached)  # from the restored slot, not prefilled again

    key = container.execute(["sh", "-c", "echo $MOE_STACK_PROMPTS"]).strip()
    token = container.execute(["cat", f"{PROMPTS_DIR}/.moe-stack/owner"]).strip()
    assert re.fullmatch(r"[0-9a-f]{32}", token), token
    mine = f"{key}-{token}-slot0.bin"
    saved = container.execute(["ls", PROMPTS_DIR]).split()  # ik_llama.cpp adds the slot's .tokens.json
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
    assert "a-clients.bin" in container.execute(["ls", PROMPTS_DIR]).split()
    container.execute(["moe-stack-prompts", "save"])
    assert not [name for name in container.execute(["ls", PROMPTS_DIR]).split() if not name.startswith(mine)]


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
        files = container.execute(["ls", "-a", PROMPTS_DIR]).split()
        assert not [name for name in files if "saving" in name], (stop, files)
        after, cached = _prefilled(stack)
        assert cached > 500 and after < 100, (stop, after, cached)
