"""smoke's client checks, through the official `openai` and `anthropic` clients, on the replies a server
gives (a local HTTP server answering as an engine would): only a parsed call of the tool passes; an API
the engine lacks is one line; a server that answers nothing is a failed check, not a traceback."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from builder.engines import engine_names, get_engine
from builder.engines.base import API_ROUTES
from builder.running.api import EngineApi
from builder.running.client_checks import (
    REPLY_SCHEMA,
    TOOL_NAME,
    Clients,
    _image,
    _messages_image,
    _messages_tool_use,
    _structured_output,
    _tool_call,
    client_checks,
    clients_for,
    fits_reply_schema,
)
from builder.running.smoke import StackUnderTest, _run_checks, _through_clients
from builder.stackfile.record import Record, Served


class Engine:
    """A server answering /v1/chat/completions and /v1/messages with the replies given; what was asked
    is kept."""

    def __init__(self) -> None:
        self.replies: dict[str, dict[str, Any]] = {}
        self.asked: list[dict[str, Any]] = []
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                engine.asked.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                body = json.dumps(engine.replies[self.path]).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]

    def chat_reply(self, message: dict[str, Any]) -> None:
        self.replies["/v1/chat/completions"] = {
            "id": "c1",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14},
        }

    def messages_reply(self, content: list[dict[str, Any]], stop_reason: str) -> None:
        self.replies["/v1/messages"] = {
            "id": "m1",
            "type": "message",
            "role": "assistant",
            "model": "m",
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {"input_tokens": 5, "output_tokens": 9},
        }


@pytest.fixture
def engine() -> Iterator[Engine]:
    served = Engine()
    thread = threading.Thread(target=served.server.serve_forever, daemon=True)
    thread.start()
    yield served
    served.server.shutdown()
    served.server.server_close()


def clients(engine: Engine, tool_calls: bool = True) -> Clients:
    return clients_for(EngineApi(engine.port, timeout_s=10), "m", tool_calls)


PARIS = json.dumps({"city": "Paris", "days": 2})
USE = {"type": "tool_use", "id": "t1", "name": TOOL_NAME, "input": {"city": "Paris", "days": 2}}


def call(name: str, arguments: str) -> dict[str, Any]:
    function = {"name": name, "arguments": arguments}
    return {"role": "assistant", "tool_calls": [{"id": "t1", "type": "function", "function": function}]}


@pytest.mark.parametrize(
    ("message", "passed", "seen"),
    [
        (call(TOOL_NAME, PARIS), True, 'get_weather({"city": "Paris", "days": 2})'),
        ({"role": "assistant", "content": "Hi"}, False, "no call of get_weather in the reply (0 tool"),
        (call("other", "{}"), False, "no call of get_weather in the reply (1 tool calls)"),
        (call(TOOL_NAME, '{"city": "Par'), False, "get_weather called with arguments that are not JSON"),
        (call(TOOL_NAME, '["Paris"]'), False, "get_weather called with arguments its schema does not admit"),
        (call(TOOL_NAME, '{"city": "Oslo", "days": 2}'), False, "get_weather called with arguments its"),
    ],
)
def test_only_a_chat_call_of_the_tool_passes(
    engine: Engine, message: dict[str, Any], passed: bool, seen: str
) -> None:
    engine.chat_reply(message)
    result, said = _tool_call(clients(engine))
    assert result is passed and said.startswith(seen)
    asked = engine.asked[0]
    assert asked["tool_choice"] == "required" and asked["tools"][0]["function"]["name"] == TOOL_NAME
    assert asked["temperature"] == 0 and asked["parallel_tool_calls"] is False
    # As an agent asks: after one earlier call of the tool and its result.
    roles = [message["role"] for message in asked["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant", "user"]
    assert asked["messages"][1]["tool_calls"][0]["function"]["name"] == TOOL_NAME


@pytest.mark.parametrize(
    ("content", "stop_reason", "passed", "seen"),
    [
        ([USE], "tool_use", True, 'get_weather({"city": "Paris", "days": 2}), tool_use'),
        # mainline takes no disable_parallel_tool_use: calls alone that ran out of tokens
        ([USE, USE], "max_tokens", True, 'get_weather({"city": "Paris", "days": 2}), max_tokens'),
        ([{"type": "text", "text": "Well"}, USE], "max_tokens", False, "get_weather("),
        ([USE | {"input": {"city": "Oslo", "days": 2}}], "tool_use", False, 'get_weather({"city": "Oslo"'),
        (
            [{"type": "text", "text": "Sunny."}],
            "end_turn",
            False,
            "no tool_use of get_weather in the reply (0",
        ),
        (
            [{"type": "tool_use", "id": "t1", "name": "other", "input": {}}],
            "tool_use",
            False,
            "no tool_use of get_weather in the reply (1 tool uses, tool_use)",
        ),
    ],
)
def test_only_a_tool_use_of_the_tool_passes(
    engine: Engine, content: list[dict[str, Any]], stop_reason: str, passed: bool, seen: str
) -> None:
    engine.messages_reply(content, stop_reason)
    result, said = _messages_tool_use(clients(engine))
    assert result is passed and said.startswith(seen)
    asked = engine.asked[0]
    assert asked["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    assert asked["tools"][0]["name"] == TOOL_NAME
    assert asked["messages"][1]["content"][0]["type"] == "tool_use"
    # Greedy, though the anthropic client takes no temperature: one model answers one way.
    assert asked["temperature"] == 0


def test_a_stack_without_tool_calls_is_not_asked_for_one(engine: Engine) -> None:
    for check in (_tool_call, _messages_tool_use):
        passed, seen = check(clients(engine, tool_calls=False))
        assert passed and seen.startswith("not asked")
    assert engine.asked == []


def test_an_image_must_reach_the_prompt(engine: Engine) -> None:
    """The image goes as a data: URL beside the same turn without it; a server whose prompt does not grow
    with it (here one answering 5 prompt tokens to both) dropped it. A stack without a projector is not
    asked (the suite's tests/integration/test_vision.py serves one that passes)."""
    engine.chat_reply({"role": "assistant", "content": "A picture."})
    passed, seen = _image(dataclasses.replace(clients(engine), images=True))
    assert not passed and seen == "the image took 0 prompt tokens (5 in all): 'A picture.'"
    plain, with_image = engine.asked
    assert [part["type"] for part in plain["messages"][0]["content"]] == ["text"]
    part = with_image["messages"][0]["content"][1]
    assert part["type"] == "image_url" and part["image_url"]["url"].startswith(
        "data:image/png;base64,iVBORw0KGgo"
    )
    assert _image(clients(engine)) == (True, "not asked: the stack loads no vision projector (--mmproj)")
    assert len(engine.asked) == 2


def test_an_image_block_must_reach_the_prompt_through_messages(engine: Engine) -> None:
    """An Anthropic image block (base64 PNG) beside the same turn without it: the prompt (fresh and
    cached input tokens) must grow; here the server answers 5 to both, so the image was dropped."""
    engine.messages_reply([{"type": "text", "text": "A picture."}], "end_turn")
    passed, seen = _messages_image(dataclasses.replace(clients(engine), images=True))
    assert not passed and seen == "the image took 0 input tokens (5 in all): 'A picture.'"
    plain, with_image = engine.asked
    assert [block["type"] for block in plain["messages"][0]["content"]] == ["text"]
    block = with_image["messages"][0]["content"][1]
    assert block["type"] == "image" and block["source"]["media_type"] == "image/png"
    assert block["source"]["data"].startswith("iVBORw0KGgo") and with_image["temperature"] == 0
    assert _messages_image(clients(engine)) == (
        True,
        "not asked: the stack loads no vision projector (--mmproj)",
    )


def test_an_engine_is_checked_on_each_api_it_serves_and_one_line_for_each_it_lacks() -> None:
    names = [name for name, _ in client_checks(get_engine("llama.cpp"))]
    assert names == [
        "chat", "chat-stream", "tool-call", "structured-output", "image", "responses",
        "messages", "messages-stream", "messages-tool-use", "messages-image", "count-tokens",
    ]  # fmt: skip
    legacy = get_engine("ktransformers-legacy")
    checks = client_checks(legacy)
    lacking = [(name, check) for name, check in checks if name in API_ROUTES]
    assert [name for name, _ in checks] == [
        "chat",
        "chat-stream",
        "tool-call",
        "structured-output",
        "image",
        *(n for n, _ in lacking),
    ]
    assert [name for name, _ in lacking] == [
        "openai-responses",
        "anthropic-messages",
        "anthropic-count-tokens",
    ]
    passed, seen = lacking[1][1](clients_for(EngineApi(1), "m", False))
    assert passed and seen == "not served: ktransformers-legacy has no /v1/messages at its pin"


def test_a_server_that_answers_nothing_fails_the_check_in_one_line(engine: Engine) -> None:
    """The clients' own errors (here a refused connection) are a failed check naming them."""
    port = engine.port
    engine.server.shutdown()
    engine.server.server_close()
    stack = Closed(
        stack_file=None, name="engine", service=None, api=EngineApi(port, timeout_s=5), container=None
    )  # type: ignore[arg-type]
    messages = dict(client_checks(get_engine("llama.cpp")))["messages"]
    [check] = _run_checks(stack, [("messages", _through_clients(messages))])
    assert check.name == "messages" and not check.passed
    assert check.seen.startswith("APIConnectionError: ") and "\n" not in check.seen


class Closed(StackUnderTest):
    """A stack whose file records llama.cpp with tool calls, on a port nothing answers."""

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


def test_the_engines_page_says_what_each_adapter_declares() -> None:
    """docs/engines.md's table of APIs, row by row, is the named adapter's `apis` (a route added to an
    adapter and not to the page, or the other way round, fails here)."""
    page = (Path(__file__).resolve().parents[2] / "docs/engines.md").read_text()
    section = page.split("## The APIs agents speak", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:-1] for line in section.splitlines() if line.startswith("| ") and "yes" in line]
    said = {cells[0].strip(): [cell.strip() for cell in cells[1:5]] for cells in rows}
    assert said and set(said) <= set(engine_names())  # a fork's new engine may not be on the page yet
    for name, cells in said.items():
        served = [api for api, cell in zip(API_ROUTES, cells, strict=True) if cell == "yes"]
        assert served == list(get_engine(name).apis), name


class Proxy(Engine):
    """A proxy that answers every request itself, with figures of its own (what a hostile proxy on the
    network path could do: fake bench's timings, read the stack's key)."""

    def __init__(self) -> None:
        super().__init__()
        self.chat_reply(call(TOOL_NAME, json.dumps({"city": "Paris"})))
        self.replies["/completion"] = {"timings": {"predicted_per_second": 1e9}}
        handler = self.server.RequestHandlerClass
        handler.do_GET = handler.do_POST  # type: ignore[attr-defined]


@pytest.fixture
def proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[Proxy]:
    served = Proxy()
    thread = threading.Thread(target=served.server.serve_forever, daemon=True)
    thread.start()
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{served.port}")
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    yield served
    served.server.shutdown()
    served.server.server_close()


def test_the_clients_talk_to_the_stack_directly_whatever_the_proxy_settings(
    engine: Engine, proxy: Proxy
) -> None:
    """httpx (the official clients') honours HTTP_PROXY for loopback too: the stack's key and its answers
    would go through whatever proxy the environment names."""
    engine.chat_reply(call(TOOL_NAME, json.dumps({"city": "London", "days": 3})))
    passed, said = _tool_call(clients(engine))
    assert passed and "London" in said, said
    assert len(engine.asked) == 1 and proxy.asked == []


@pytest.mark.cli
def test_the_engine_api_talks_to_the_stack_directly_whatever_the_proxy_settings(
    engine: Engine, proxy: Proxy
) -> None:
    """bench's and smoke's own requests (urllib, whose proxy handler reads the environment when the module
    is imported: so in a process of its own here) never go through a proxy."""
    engine.replies["/completion"] = {"timings": {"predicted_per_second": 12.5}}
    asked = (
        "from builder.running.api import EngineApi; "
        f"print(EngineApi({engine.port}, api_key='k', timeout_s=10).post('/completion', {{}})['timings'])"
    )
    result = subprocess.run(
        [sys.executable, "-c", asked], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0 and "12.5" in result.stdout, result.stderr
    assert len(engine.asked) == 1 and proxy.asked == []


@pytest.mark.parametrize(
    ("content", "passed", "seen"),
    [
        ('{"city": "London", "days": 2}', True, '{"city": "London", "days": 2}'),
        ("The weather in Paris is sunny.", False, "not JSON, so the schema was not applied"),
        ('{"city": "Rome", "days": 2}', False, "JSON the schema does not admit"),
        ('{"city": "Paris", "days": 2, "note": "x"}', False, "JSON the schema does not admit"),
        ('{"city": "Paris", "days": 2.0}', False, "JSON the schema does not admit"),
        ("{}", False, "JSON the schema does not admit"),
    ],
)
def test_structured_output_passes_only_json_the_schema_admits(
    engine: Engine, content: str, passed: bool, seen: str
) -> None:
    """The reply to a `response_format` JSON schema: an engine that ignores the format (prose, or JSON of
    its own shape, as ik_llama.cpp answers a `json_object` format) fails; the schema travels as asked."""
    engine.chat_reply({"role": "assistant", "content": content})
    ok, said = _structured_output(clients(engine))
    assert (ok, said.startswith(seen)) == (passed, True), said
    asked = engine.asked[-1]["response_format"]
    assert asked["type"] == "json_schema" and asked["json_schema"]["schema"]["additionalProperties"] is False


def test_the_reply_schema_admits_six_objects_and_nothing_else() -> None:
    admitted = [{"city": city, "days": days} for city in ("Paris", "London") for days in (1, 2, 3)]
    assert all(fits_reply_schema(value) for value in admitted)
    refused = [{"city": "Paris", "days": 0}, {"city": "Paris", "days": 4}, {"city": "Paris", "days": True},
               {"city": "paris", "days": 1}, {"city": "Paris"}, ["Paris", 1], "Paris"]  # fmt: skip
    assert not any(fits_reply_schema(value) for value in refused)
    schema = jsonschema.Draft202012Validator(REPLY_SCHEMA)  # the check agrees with the schema it sends
    assert all(schema.is_valid(value) for value in admitted) and not any(map(schema.is_valid, refused))
