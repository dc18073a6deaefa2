"""Images served for real: `moe-stack compose --mmproj` on both llama.cpp engines' CPU images, the stack
brought up with `up --wait`, an image sent through the official `openai` client as agents send a
screenshot (a data: URL in a chat turn), and `smoke` checking the same. The model is synth-moe's tiny
qwen3moe and the projector synth_mmproj's tiny InternVL one (InternVL3.5's MoE models pair the two
kinds): random weights say nothing of what the image shows, so what is asserted is that the image reached
the model, as the projector's 16 tokens in the prompt."""

from __future__ import annotations

import base64
import contextlib
import json
from pathlib import Path

import openai
import pytest

from builder.models.synth_mmproj import write_mmproj_gguf
from builder.models.synth_moe import write_moe_gguf
from builder.models.synth_shapes import TINY_SHAPES
from builder.running.client_checks import sample_png
from builder.stackfile.host_checks import free_local_port
from tests.cli import run_cli
from tests.integration.conftest import build_engine_image, serve_stack

pytestmark = pytest.mark.integration
IMAGE_TOKENS = 16  # a 64-pixel image: 8 x 8 patches merged 2 x 2 (builder/models/synth_mmproj.py)


@pytest.fixture(scope="module")
def model_and_projector(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp("vision")
    directory.chmod(0o755)  # the engine runs as uid 10001
    model = write_moe_gguf(directory / "tiny-qwen3moe.gguf", TINY_SHAPES["qwen3moe"])
    projector = write_mmproj_gguf(directory / "mmproj-tiny-qwen3moe.gguf", TINY_SHAPES["qwen3moe"].hidden)
    for path in (model, projector):
        path.chmod(0o644)
    return model, projector


def _prompt_tokens(client: openai.OpenAI, with_image: bool) -> int:
    url = "data:image/png;base64," + base64.b64encode(sample_png()).decode()
    content: list = [{"type": "text", "text": "What is in this picture?"}]
    reply = client.chat.completions.create(
        model="tiny",
        max_tokens=4,
        temperature=0,
        messages=[
            {
                "role": "user",
                "content": content
                + ([{"type": "image_url", "image_url": {"url": url}}] if with_image else []),
            }
        ],
    )
    assert reply.choices[0].finish_reason is not None and reply.usage is not None
    return reply.usage.prompt_tokens


@pytest.mark.parametrize("engine", ["llama.cpp", "ik_llama.cpp"])
def test_an_image_reaches_the_model_through_the_projector(
    engine: str, model_and_projector: tuple[Path, Path], base_image: str, tmp_path: Path
) -> None:
    model, projector = model_and_projector
    image = build_engine_image(engine, "avx2", base_image).tag
    port, compose_file = free_local_port(), tmp_path / "compose.yaml"
    made = run_cli(
        "compose",
        "--model",
        str(model),
        "--mmproj",
        str(projector),
        "--engine",
        engine,
        "--image",
        image,
        "--served-name",
        "tiny",
        "--threads",
        "2",
        "--port",
        str(port),
        "--out",
        str(compose_file),
    )
    assert made.returncode == 0, made.stderr
    with contextlib.ExitStack() as running:
        stack = serve_stack(running, compose_file, port, wait_s=180)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=1)
        plain, seen = _prompt_tokens(client, with_image=False), _prompt_tokens(client, with_image=True)
        # The projector's tokens, and the markers around them (`<img>`, `</img>` as text).
        assert seen - plain >= IMAGE_TOKENS, (plain, seen)
        smoked = run_cli("smoke", str(compose_file), "--json")
        checks = {check["name"]: check for check in json.loads(smoked.stdout)}
        assert checks["image"]["passed"], checks["image"]
        assert checks["image"]["seen"].startswith(f"the image took {seen - plain} prompt tokens")
        # The same image as an Anthropic image block (Claude Code's screenshots): both servers turn it
        # into the chat's image part, so it costs the prompt as many tokens.
        assert checks["messages-image"]["passed"], checks["messages-image"]
        assert checks["messages-image"]["seen"].startswith(f"the image took {seen - plain} input tokens")
        logs = stack.client.compose.logs()
    assert "mmproj-tiny-qwen3moe.gguf" in logs, logs[-2000:]
