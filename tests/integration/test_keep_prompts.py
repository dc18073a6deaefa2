"""`compose --keep-prompts`: a restarted server answers a long prompt it had seen from its saved slot,
without prefilling it again; each engine's real server, its real slot files on the stack's volume.

On a model of full attention (the tiny Qwen3-MoE): a sliding-window model's restored slot (Gemma 3,
gpt-oss) holds only the window of its SWA layers, and mainline then prefills the prompt again unless the
server keeps their full cache (--swa-full), measured here with the demo model (docs/usage.md)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from builder.contract import PROMPTS_DIR
from builder.stacks.api import EngineApi
from tests.integration.conftest import BuiltImage, RunningStack, StackFactory, answers_health

pytestmark = pytest.mark.integration

# About 2300 tokens of the tiny model's vocabulary: a prompt whose prefill a restored slot must spare.
LONG_PROMPT = " ".join(f"Record {i}: the value of item {i} is {i * 7 % 13}." for i in range(60))


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
    stack.client.compose.restart()  # SIGTERM: the entrypoint saves slot 0, then stops the server
    deadline = time.monotonic() + 120
    while not answers_health(stack.port) and time.monotonic() < deadline:
        time.sleep(1)
    # ik_llama.cpp at its pinned ref loses some replies to a save or restore it did (moe-stack-prompts)
    logs = _logs_until(stack, "moe-stack-prompts: restore slot 0: ", times=2)  # the first start's, then this
    said = [line for line in logs.splitlines() if "moe-stack-prompts:" in line]
    assert any("save slot 0: done" in line or "save slot 0: written" in line for line in said), said
    after, cached = _prefilled(stack)
    assert after < 10 and cached > 500, (after, cached)  # from the restored slot, not prefilled again

    key = container.execute(["sh", "-c", "echo $MOE_STACK_PROMPTS"]).strip()
    saved = container.execute(["ls", PROMPTS_DIR]).split()  # ik_llama.cpp adds the slot's .tokens.json
    assert f"{key}-slot0.bin" in saved and all(name.startswith(f"{key}-slot0.bin") for name in saved), saved
