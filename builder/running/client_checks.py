"""What a coding agent or chat client sees of a stack, asked through the official `openai` and `anthropic`
clients: each API the stack's engine serves (Engine.apis) with its chat, streaming, tools and structured
output, and one line for an API the engine lacks. A server that answers plain HTTP but not the client's own
parsing (a missing field, an event out of order in a stream) fails here as it would fail the agent."""

from __future__ import annotations

import base64
import json
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import anthropic
import openai
from anthropic.types import ImageBlockParam, MessageParam, TextBlockParam, ToolParam
from openai.types.chat import (
    ChatCompletionContentPartParam,
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageParam,
)

from builder.engines.base import API_ROUTES, ClientApi, Engine
from builder.running.api import EngineApi

TOOL_NAME = "get_weather"
_TOOL_DESCRIPTION = "The weather in a city now"
# A closed shape for structured output: one of two cities and a day count of 1 to 3, nothing else. A
# server that holds its reply to the schema can only answer one of six objects, whatever its weights.
REPLY_SCHEMA: dict[str, object] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "London"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 3},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}


# The one tool, as each API spells it: its arguments are REPLY_SCHEMA's closed shape, so a call the
# engine's grammar holds to the schema can only be one of six argument objects.
TOOL: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {"name": TOOL_NAME, "description": _TOOL_DESCRIPTION, "parameters": REPLY_SCHEMA},
}
ANTHROPIC_TOOL: ToolParam = {
    "name": TOOL_NAME,
    "description": _TOOL_DESCRIPTION,
    "input_schema": REPLY_SCHEMA,
}
_HELLO = "Say hello."
_WEATHER = "What is the weather in Paris?"
# The tool checks ask as an agent does, in a conversation: one earlier call of the tool and its result,
# then the question. A model learns the call's shape from it as from its template's instructions (Gemma 3
# 270M, a base model, calls the tool after it and answers prose without it; tests/integration/test_engines).
_EARLIER_ASKED = "What is the weather in London tomorrow?"
_EARLIER_CALL = {"city": "London", "days": 1}
_EARLIER_RESULT = "Rain, 12 C"
_EARLIER_ANSWER = "Rain in London tomorrow, 12 C."
_FORECAST = "What is the weather in Paris for the next two days?"
_CHAT_CONVERSATION: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": _EARLIER_ASKED},
    {
        "role": "assistant",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": TOOL_NAME, "arguments": json.dumps(_EARLIER_CALL)},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": _EARLIER_RESULT},
    {"role": "assistant", "content": _EARLIER_ANSWER},
    {"role": "user", "content": _FORECAST},
]
_MESSAGES_CONVERSATION: list[MessageParam] = [
    {"role": "user", "content": _EARLIER_ASKED},
    {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "toolu_1", "name": TOOL_NAME, "input": _EARLIER_CALL}],
    },
    {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": _EARLIER_RESULT}],
    },
    {"role": "assistant", "content": _EARLIER_ANSWER},
    {"role": "user", "content": _FORECAST},
]
# What the clients raise for an answer they can't take (HTTP errors, refused connections, bad JSON).
CLIENT_ERRORS = (openai.OpenAIError, anthropic.AnthropicError)
_RETRIES = 1
_NO_PROJECTOR = "not asked: the stack loads no vision projector (--mmproj)"
# Every check samples greedily, so one model answers one way: at the server's default temperature a
# random-weight model's tool_use came and went between runs. anthropic 2.16's client takes no
# `temperature` (its models fix it), so it travels in the body, where llama-server reads it.
_GREEDY: dict[str, object] = {"temperature": 0}


@dataclass(frozen=True)
class Clients:
    """Both official clients pointed at one stack, the model they ask for, and whether the stack renders
    tools (its Jinja template: without one the tool checks are not asked) and images (its projector)."""

    openai: openai.OpenAI
    anthropic: anthropic.Anthropic
    model: str
    tool_calls: bool
    images: bool = False


def clients_for(api: EngineApi, model: str, tool_calls: bool, images: bool = False) -> Clients:
    """The clients as an agent configures them (a base URL and a key), following no redirect and through
    no proxy, whatever the environment says (neither gets the key, nor answers for the stack), and
    retrying once where agents' clients retry twice: both
    llama.cpp engines at times close a kept-alive connection after a streamed Messages reply, and the
    next request on it meets "Server disconnected without sending a response" (0c1e57098 and 55d3c05,
    anthropic 2.16); a server that is down or refuses fails the retry too."""
    root = f"http://{api.host}:{api.port}"
    key = api.api_key or "none"  # both clients insist on a key; a server without one ignores it
    return Clients(
        openai=openai.OpenAI(
            base_url=f"{root}/v1",
            api_key=key,
            timeout=api.timeout_s,
            max_retries=_RETRIES,
            http_client=openai.DefaultHttpxClient(follow_redirects=False, trust_env=False),
        ),
        anthropic=anthropic.Anthropic(
            base_url=root,
            api_key=key,
            timeout=api.timeout_s,
            max_retries=_RETRIES,
            http_client=anthropic.DefaultHttpxClient(follow_redirects=False, trust_env=False),
        ),
        model=model,
        tool_calls=tool_calls,
        images=images,
    )


ClientCheck = Callable[[Clients], tuple[bool, str]]


def client_checks(engine: Engine) -> list[tuple[str, ClientCheck]]:
    """The checks of every API `engine` serves, in API_ROUTES' order; an API it lacks is one check that
    passes and says so (a client of that API can't use the stack, which is the engine's, not a fault)."""
    checks: list[tuple[str, ClientCheck]] = []
    for api, route in API_ROUTES.items():
        if api in engine.apis:
            checks += _BY_API[api]
        else:
            checks.append((api, _not_served(f"not served: {engine.name} has no {route} at its pin")))
    return checks


def _not_served(seen: str) -> ClientCheck:
    return lambda clients: (True, seen)


def _chat(clients: Clients) -> tuple[bool, str]:
    reply = clients.openai.chat.completions.create(
        model=clients.model, max_tokens=8, extra_body=_GREEDY, messages=[{"role": "user", "content": _HELLO}]
    )
    choice = reply.choices[0]
    tokens = reply.usage.completion_tokens if reply.usage else 0
    return (
        choice.message.role == "assistant" and choice.finish_reason is not None,
        f"{tokens} tokens, {choice.finish_reason}: {choice.message.content!r}",
    )


def _chat_stream(clients: Clients) -> tuple[bool, str]:
    """Streamed (server-sent events): text arrives in pieces, and the last says why it stopped."""
    pieces: list[str] = []
    finish: str | None = None
    for chunk in clients.openai.chat.completions.create(
        model=clients.model,
        max_tokens=8,
        temperature=0,
        stream=True,
        messages=[{"role": "user", "content": _HELLO}],
    ):
        for choice in chunk.choices:
            pieces += [choice.delta.content] if choice.delta.content else []
            finish = choice.finish_reason or finish
    text = "".join(pieces)
    return bool(pieces) and finish is not None, f"{len(pieces)} pieces, {finish}: {text!r}"


def _tool_call(clients: Clients) -> tuple[bool, str]:
    """A call of the tool, its arguments JSON its schema admits, must be in the reply (`tool_choice:
    required`, one call): a server that renders no tools, drops them or can't parse its model's call
    fails, and so does a model that answers in prose. A random-weight model fails it: the llama.cpp
    engines' grammar for a required call still lets content come first (their autoparser's `until` the
    call's marker, 0c1e57098 and 8337e4c), and such a model never writes the marker."""
    if not clients.tool_calls:
        return True, "not asked: the stack renders chat without the model's Jinja template (no tool calls)"
    reply = clients.openai.chat.completions.create(
        model=clients.model,
        max_tokens=64,
        temperature=0,
        tools=[TOOL],
        tool_choice="required",
        parallel_tool_calls=False,
        messages=_CHAT_CONVERSATION,
    )
    calls = reply.choices[0].message.tool_calls or []
    named = [
        call.function.arguments
        for call in calls
        if call.type == "function" and call.function.name == TOOL_NAME
    ]
    if not named:
        return False, f"no call of {TOOL_NAME} in the reply ({len(calls)} tool calls)"
    try:
        arguments = json.loads(named[0])
    except json.JSONDecodeError:
        return False, f"{TOOL_NAME} called with arguments that are not JSON: {named[0]!r}"
    if not fits_reply_schema(arguments):
        return False, f"{TOOL_NAME} called with arguments its schema does not admit: {named[0]!r}"
    return True, f"{TOOL_NAME}({json.dumps(arguments)})"


def fits_reply_schema(value: object) -> bool:
    """Whether `value` is one of the objects REPLY_SCHEMA admits."""
    if not isinstance(value, dict) or set(value) != {"city", "days"}:
        return False
    days = value["days"]
    return value["city"] in ("Paris", "London") and type(days) is int and 1 <= days <= 3


def _structured_output(clients: Clients) -> tuple[bool, str]:
    """`response_format` with a JSON schema: the reply must be JSON the schema admits. An engine that
    ignores the format answers in prose (even a real model rarely lands on the exact shape), so this
    fails where users found structured output silently dropped."""
    reply = clients.openai.chat.completions.create(
        model=clients.model,
        # Room for the longest reply the grammar allows: nine runs of up to 22 blanks around ~30 characters
        # (Gemma 270M filled 64 tokens with blanks before "Paris").
        max_tokens=256,
        temperature=0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "forecast", "schema": REPLY_SCHEMA, "strict": True},
        },
        messages=[{"role": "user", "content": _WEATHER}],
    )
    text = reply.choices[0].message.content or ""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return False, f"not JSON, so the schema was not applied: {text[:80]!r}"
    if not fits_reply_schema(value):
        return False, f"JSON the schema does not admit: {text[:80]!r}"
    return True, json.dumps(value)


def sample_png(side: int = 64) -> bytes:
    """A `side`-pixel RGB PNG (a diagonal gradient), as a client sends a screenshot."""
    rows = b"".join(
        b"\x00" + bytes(channel for x in range(side) for channel in (x * 4 % 256, y * 4 % 256, 128))
        for y in range(side)
    )

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def _image(clients: Clients) -> tuple[bool, str]:
    """A chat turn that carries an image (a data: URL, as agents send a screenshot) beside the same turn
    without it: the image must reach the model, its tokens counted in the prompt. A server that drops
    the image part answers the same count and fails; one without a projector refuses the request."""
    if not clients.images:
        return True, _NO_PROJECTOR
    url = "data:image/png;base64," + base64.b64encode(sample_png()).decode()

    def prompt_tokens(with_image: bool) -> tuple[int, str]:
        text: ChatCompletionContentPartParam = {"type": "text", "text": "Describe the image."}
        image: ChatCompletionContentPartParam = {"type": "image_url", "image_url": {"url": url}}
        reply = clients.openai.chat.completions.create(
            model=clients.model,
            max_tokens=8,
            temperature=0,
            messages=[{"role": "user", "content": [text, image] if with_image else [text]}],
        )
        return (reply.usage.prompt_tokens if reply.usage else 0), str(reply.choices[0].message.content)

    plain, _ = prompt_tokens(with_image=False)
    seen, answer = prompt_tokens(with_image=True)
    return seen > plain, f"the image took {seen - plain} prompt tokens ({seen} in all): {answer!r}"


def _messages_image(clients: Clients) -> tuple[bool, str]:
    """The same through the Messages API: an image block (base64, as Claude Code sends a screenshot),
    which both servers turn into the chat's image part; the prompt's input tokens must grow with it."""
    if not clients.images:
        return True, _NO_PROJECTOR
    data = base64.b64encode(sample_png()).decode()

    def input_tokens(with_image: bool) -> tuple[int, str]:
        text: TextBlockParam = {"type": "text", "text": "Describe the image."}
        image: ImageBlockParam = {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": data},
        }
        reply = clients.anthropic.messages.create(
            model=clients.model,
            max_tokens=8,
            extra_body=_GREEDY,
            messages=[{"role": "user", "content": [text, image] if with_image else [text]}],
        )
        # The prompt whole: what the server read fresh and what it found in its prompt cache.
        prompt = reply.usage.input_tokens + (reply.usage.cache_read_input_tokens or 0)
        return prompt, "".join(b.text for b in reply.content if b.type == "text")

    plain, _ = input_tokens(with_image=False)
    seen, answer = input_tokens(with_image=True)
    return seen > plain, f"the image took {seen - plain} input tokens ({seen} in all): {answer!r}"


def _responses(clients: Clients) -> tuple[bool, str]:
    reply = clients.openai.responses.create(
        model=clients.model, input=_HELLO, max_output_tokens=8, temperature=0
    )
    tokens = reply.usage.output_tokens if reply.usage else 0
    return tokens > 0, f"{tokens} tokens, {reply.status}: {reply.output_text!r}"


def _messages(clients: Clients) -> tuple[bool, str]:
    reply = clients.anthropic.messages.create(
        model=clients.model, max_tokens=8, extra_body=_GREEDY, messages=[{"role": "user", "content": _HELLO}]
    )
    text = "".join(block.text for block in reply.content if block.type == "text")
    return (
        reply.role == "assistant" and reply.stop_reason is not None and reply.usage.output_tokens > 0,
        f"{reply.usage.output_tokens} tokens, {reply.stop_reason}: {text!r}",
    )


def _messages_stream(clients: Clients) -> tuple[bool, str]:
    """Streamed as Anthropic's events (message_start, content_block_delta ..., message_stop), which
    the client assembles into the final message."""
    with clients.anthropic.messages.stream(
        model=clients.model, max_tokens=8, extra_body=_GREEDY, messages=[{"role": "user", "content": _HELLO}]
    ) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    text = "".join(pieces)
    return bool(pieces) and final.stop_reason is not None, (
        f"{len(pieces)} pieces, {final.stop_reason}: {text!r}"
    )


def _messages_tool_use(clients: Clients) -> tuple[bool, str]:
    """The Messages API's tool call (`tool_choice: any`): a tool_use block naming the tool, its input an
    object its schema admits, and the turn ended for it; what fails the chat's tool call fails this one.
    A reply of calls alone that ran out of tokens passes too: llama.cpp 0c1e57098 takes no
    `disable_parallel_tool_use` and calls again until max_tokens."""
    if not clients.tool_calls:
        return True, "not asked: the stack renders chat without the model's Jinja template (no tool calls)"
    reply = clients.anthropic.messages.create(
        model=clients.model,
        max_tokens=64,
        extra_body=_GREEDY,
        tools=[ANTHROPIC_TOOL],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        messages=_MESSAGES_CONVERSATION,
    )
    uses = [block for block in reply.content if block.type == "tool_use"]
    named = [block.input for block in uses if block.name == TOOL_NAME]
    if not named:
        return False, f"no tool_use of {TOOL_NAME} in the reply ({len(uses)} tool uses, {reply.stop_reason})"
    calls_alone = len(uses) == len(reply.content) and reply.stop_reason == "max_tokens"
    said = f"{TOOL_NAME}({json.dumps(named[0])}), {reply.stop_reason}"
    return fits_reply_schema(named[0]) and (reply.stop_reason == "tool_use" or calls_alone), said


def _count_tokens(clients: Clients) -> tuple[bool, str]:
    counted = clients.anthropic.messages.count_tokens(
        model=clients.model, messages=[{"role": "user", "content": _HELLO}]
    )
    return counted.input_tokens > 0, f"{counted.input_tokens} input tokens"


# Each API's checks, by the names smoke prints.
_BY_API: dict[ClientApi, list[tuple[str, ClientCheck]]] = {
    "openai-chat": [
        ("chat", _chat),
        ("chat-stream", _chat_stream),
        ("tool-call", _tool_call),
        ("structured-output", _structured_output),
        ("image", _image),
    ],
    "openai-responses": [("responses", _responses)],
    "anthropic-messages": [
        ("messages", _messages),
        ("messages-stream", _messages_stream),
        ("messages-tool-use", _messages_tool_use),
        ("messages-image", _messages_image),
    ],
    "anthropic-count-tokens": [("count-tokens", _count_tokens)],
}
