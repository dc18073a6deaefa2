"""Speculative decoding served for real: `moe-stack compose --draft-model` on both llama.cpp engines'
CPU images and `--mtp` on mainline's, each stack emitted against its image's flag contract and brought
up with `up --wait`; the engine drafted (its timings or its log count drafted tokens). Random weights
accept no draft, so acceptance is not asserted; bench/speculative_cost.py measures what drafting costs.
ik_llama.cpp's loader stops at a deepseek2 file that carries the MTP layer (exit 139 at 007d640), which
compose refuses before any file is written."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml
from python_on_whales import DockerClient

from builder.errors import StackError
from builder.host.probe import probe
from builder.models.synth_moe import write_moe_gguf
from builder.models.synth_shapes import TINY_SHAPES
from builder.spec import EngineOptions
from builder.stackfile.host_checks import free_local_port
from builder.stacks.assemble import plan_stack
from builder.stacks.compose import compose_stack, write_stack
from builder.stacks.options import StackOptions
from tests.cli import run_cli
from tests.integration.conftest import budget_minutes, build_engine_image, serve_stack

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny qwen3moe, a one-layer draft of the same vocabulary (another seed), and a tiny deepseek2 with
    its MTP layer, readable by the engine's user."""
    directory = tmp_path_factory.mktemp("speculative")
    directory.chmod(0o755)
    written = {
        "model": write_moe_gguf(directory / "tiny-qwen3moe.gguf", TINY_SHAPES["qwen3moe"]),
        "draft": write_moe_gguf(
            directory / "draft-qwen3moe.gguf", dataclasses.replace(TINY_SHAPES["qwen3moe"], layers=1), seed=7
        ),
        "mtp": write_moe_gguf(
            directory / "tiny-deepseek2-mtp.gguf", dataclasses.replace(TINY_SHAPES["deepseek2"], mtp_layers=1)
        ),
    }
    for path in written.values():
        path.chmod(0o644)
    return written


def _completion(port: int) -> dict:
    body = json.dumps({"prompt": "hello the model", "n_predict": 24, "cache_prompt": False}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/completion", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as reply:
        return json.load(reply)


def _emitted(
    engine: str, model: Path, image: str, options: EngineOptions, tmp_path: Path
) -> tuple[Path, dict, int]:
    """The stack's file for a drafting `options`, checked against the image's flag contract; its
    document and port."""
    port = free_local_port()
    stack_options = StackOptions(
        model_path=model,
        engine=engine,
        image=image,
        port=port,
        threads=2,
        project=f"mst-spec-{uuid.uuid4().hex[:8]}",
        engine_options=options,
    )
    planned = plan_stack(stack_options, probe())
    assert planned.facts is not None, "checked against the image's flag contract"
    document = compose_stack(planned.stack, "pytest: compose --draft-model", planned.facts)
    return write_stack(document, tmp_path / "compose.yaml"), document, port


def _served(
    engine: str, model: Path, image: str, options: EngineOptions, tmp_path: Path
) -> tuple[dict, str, list]:
    compose_file, document, port = _emitted(engine, model, image, options, tmp_path)
    command = document.service("engine").args
    with contextlib.ExitStack() as running:
        serve_stack(running, compose_file, port, wait_s=180)
        reply = _completion(port)
        logs = DockerClient(compose_files=[compose_file]).compose.logs()
    return reply, logs, command


def test_mainline_drafts_with_a_draft_model(models: dict[str, Path], base_image: str, tmp_path: Path) -> None:
    image = build_engine_image("llama.cpp", "avx2", base_image).tag
    options = EngineOptions(draft_model=models["draft"], draft_max=4)
    reply, logs, command = _served("llama.cpp", models["model"], image, options, tmp_path)
    assert command[command.index("--model-draft") + 1] == "/models/draft-qwen3moe.gguf"
    assert command[command.index("--spec-type") + 1] == "draft-simple"
    assert command[command.index("--spec-draft-n-max") + 1] == "4"
    assert "loading draft model '/models/draft-qwen3moe.gguf'" in logs, logs[-2000:]
    assert reply["timings"]["predicted_n"] == 24 and reply["timings"]["draft_n"] > 0, reply["timings"]


def test_mainline_drafts_with_the_models_mtp_layer(
    models: dict[str, Path], base_image: str, tmp_path: Path
) -> None:
    image = build_engine_image("llama.cpp", "avx2", base_image).tag
    reply, logs, command = _served(
        "llama.cpp", models["mtp"], image, EngineOptions(mtp=True, draft_max=3), tmp_path
    )
    assert command[command.index("--spec-type") + 1] == "draft-mtp"
    assert "creating MTP draft context" in logs, logs[-2000:]
    assert reply["timings"]["draft_n"] > 0, reply["timings"]


def test_ik_drafts_with_a_draft_model_and_refuses_an_mtp_file(
    models: dict[str, Path], base_image: str, tmp_path: Path
) -> None:
    image = build_engine_image("ik_llama.cpp", "avx2", base_image).tag
    options = EngineOptions(draft_model=models["draft"], draft_max=4)
    reply, logs, command = _served("ik_llama.cpp", models["model"], image, options, tmp_path)
    # Its pinned tree drafts only in a --spec-type stage, which holds the length (its --draft-max exits).
    assert command[command.index("--spec-type") + 1] == "draft:n_max=4" and "--draft-max" not in command
    assert "speculative decoding context initialized" in logs, logs[-2000:]
    assert reply["timings"]["predicted_n"] == 24
    assert "draft acceptance rate" in logs, logs[-2000:]  # ik counts its drafts in the log, not timings
    refused = StackOptions(
        model_path=models["mtp"], engine="ik_llama.cpp", image=image, port=free_local_port()
    )
    with pytest.raises(StackError, match="multi-token-prediction layer .* stops ik's loader"):
        plan_stack(refused, probe())


def test_tune_times_a_drafting_stack_by_serving_it(
    models: dict[str, Path], base_image: str, tmp_path: Path
) -> None:
    """llama-bench has no speculative decoding: `tune --only draft-max` serves the stack from its tools
    image for each trial and times a completion; the draft proposed tokens in those trials."""
    image = build_engine_image("llama.cpp", "avx2", base_image).tag
    build_engine_image("llama.cpp", "avx2", base_image, tools=True)
    options = EngineOptions(draft_model=models["draft"], draft_max=4)
    compose_file, _, _ = _emitted("llama.cpp", models["model"], image, options, tmp_path)
    probe = run_cli("tune", str(compose_file), "--only", "draft-max", "--decode", "--budget", "3s")
    assert probe.returncode == 1 and "is too small" in probe.stderr, probe.stderr
    budget_s = max(240, 60 * budget_minutes(probe.stderr))  # a busy host's trials are slower
    result = run_cli(
        "tune",
        str(compose_file),
        "--only",
        "draft-max",
        "--decode",
        "--budget",
        f"{budget_s}s",
        "-p",
        "16",
        "-n",
        "32",
    )
    assert result.returncode == 0, result.stderr
    said = result.stdout + result.stderr
    assert "each trial serves it" in said and "the draft proposed" in said, said[-2000:]
    tuned = yaml.safe_load(compose_file.with_suffix(".tuned.yaml").read_text())
    record = tuned["x-moe-stack"]["tuned"]
    # Warm-ups, then at least two rounds over the four lengths (4, the stack's own, first; 2, 8, 16).
    assert set(record["settings"]) == {"draft-max"} and record["trials"] >= 2 + 2 * 4, record
    assert record["stack-tps"]["decode"] > 0
    command = tuned["services"]["engine"]["command"]
    assert command[command.index("--spec-draft-n-max") + 1] == record["settings"]["draft-max"]


def test_a_stack_with_a_draft_is_not_bundled(
    models: dict[str, Path], base_image: str, tmp_path: Path
) -> None:
    """A bundle carries the model's own files: a drafting stack is refused in one line, nothing written."""
    image = build_engine_image("llama.cpp", "avx2", base_image).tag
    options = StackOptions(
        model_path=models["model"],
        image=image,
        port=free_local_port(),
        threads=2,
        engine_options=EngineOptions(draft_model=models["draft"]),
    )
    planned = plan_stack(options, probe())
    compose_file = write_stack(
        compose_stack(planned.stack, "pytest", planned.facts), tmp_path / "compose.yaml"
    )
    archive = tmp_path / "stack.tar"
    result = run_cli("bundle", str(compose_file), "--out", str(archive))
    assert result.returncode == 1 and "serves with a draft model" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and not archive.exists()
