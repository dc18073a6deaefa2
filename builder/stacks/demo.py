"""The demo stack and the question it is asked: the last two steps of `moe-stack demo`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.engines import Engine
from builder.engines.base import StackSpec
from builder.files import cache_dir
from builder.host.probe import read_cpu
from builder.models.model_files import DEMO_CHAT_TEMPLATE, DEMO_JINJA_TEMPLATE, fetch_demo_model
from builder.running.api import EngineApi
from builder.running.run import up
from builder.stacks.assemble import served_name_for
from builder.stacks.compose import compose_stack, write_stack
from builder.stacks.document import start_period_for

DEMO_PROMPT = "Paris is the capital of"


@dataclass(frozen=True)
class Answer:
    text: str
    completion_tokens: int
    decode_tokens_per_s: float | None


def demo_project(engine: Engine) -> str:
    """The demo stack's compose project (and its folder in the cache) unless `demo --project` names one."""
    return f"moe-stack-demo-{engine.slug}"


def start_demo(engine: Engine, image: str, port: int, generated_by: str, project: str | None = None) -> Path:
    """Emit the demo stack (demo model, all physical cores) into the cache, bring it up healthy."""
    model = engine.open_model(fetch_demo_model())
    stack = StackSpec(
        project_name=project or demo_project(engine),
        engine=engine,
        image_ref=image,
        model=model,
        served_name=served_name_for(model.stem),
        port=port,
        cpu_threads=read_cpu().physical_cores,
        # Where the image has the chat page, the template that lets it send its tools.
        chat_template=DEMO_JINJA_TEMPLATE if engine.chat_page_dir else DEMO_CHAT_TEMPLATE,
        start_period_s=start_period_for(model.size),
    )
    compose_file = write_stack(
        compose_stack(stack, generated_by), cache_dir() / "demo" / stack.project_name / "compose.yaml"
    )
    up(compose_file, timeout_s=300)
    return compose_file


def complete(port: int, prompt: str = DEMO_PROMPT, max_tokens: int = 24, host: str = "127.0.0.1") -> Answer:
    """One OpenAI-style text completion (greedy): the demo model is a base model, not a chat model."""
    reply = EngineApi(port, host).post(
        "/v1/completions", {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    )
    return _answer(reply, reply["choices"][0].get("text") or "")


def chat(port: int, prompt: str, max_tokens: int = 64, host: str = "127.0.0.1") -> Answer:
    """One OpenAI-style chat completion (greedy)."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0}
    reply = EngineApi(port, host).post("/v1/chat/completions", body)
    return _answer(reply, reply["choices"][0]["message"].get("content") or "")


def _answer(reply: dict[str, Any], text: str) -> Answer:
    timings = reply.get("timings") or {}
    return Answer(
        text=text,
        completion_tokens=int(reply.get("usage", {}).get("completion_tokens", 0)),
        decode_tokens_per_s=timings.get("predicted_per_second"),
    )
