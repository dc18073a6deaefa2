"""smoke's tool-call check on the replies a server gives: only a parsed call of the tool passes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from builder.stacks.record import Record, Served
from builder.stacks.smoke import TOOL_NAME, StackUnderTest, _tool_call


class Replies:
    """An engine's /v1/chat/completions reply, as given; what was asked is kept."""

    def __init__(self, message: dict[str, Any]) -> None:
        self.message = message
        self.asked: list[dict[str, Any]] = []

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.asked.append(body)
        return {"choices": [{"message": self.message}], "usage": {"completion_tokens": 9}}


class ToolStack(StackUnderTest):
    """A stack whose file records tool calls (the Jinja template), its API the replies above."""

    @property
    def record(self) -> Record:
        return Record(
            generated_by="moe-stack compose",
            engine="llama.cpp",
            image="img",
            model=Path("m.gguf"),
            served_name="m",
            engine_options={},
            flags_checked=True,
        )

    @property
    def served(self) -> Served:
        return Served(threads=2, gpu_layers=None, metrics=False, tool_calls=True)


def call(name: str, arguments: object) -> dict[str, Any]:
    function = {"name": name, "arguments": arguments}
    return {"role": "assistant", "tool_calls": [{"type": "function", "function": function}]}


@pytest.mark.parametrize(
    ("message", "passed", "seen"),
    [
        (call(TOOL_NAME, json.dumps({"city": "Paris"})), True, 'get_weather({"city": "Paris"})'),
        (call(TOOL_NAME, {"city": "London"}), True, 'get_weather({"city": "London"})'),
        ({"role": "assistant", "content": "Hi"}, False, "no call of get_weather in the reply (0 tool"),
        (call("other", "{}"), False, "no call of get_weather in the reply (1 tool calls)"),
        (call(TOOL_NAME, '{"city": "Par'), False, "get_weather called with arguments that are not JSON"),
    ],
)
def test_only_a_call_of_the_tool_passes(message: dict[str, Any], passed: bool, seen: str) -> None:
    api = Replies(message)
    stack = ToolStack(stack_file=None, name="engine", service=None, api=api, container=None)  # type: ignore[arg-type]
    result, said = _tool_call(stack)
    assert result is passed and said.startswith(seen)
    asked = api.asked[0]
    assert asked["tool_choice"] == "required" and asked["tools"][0]["function"]["name"] == TOOL_NAME
