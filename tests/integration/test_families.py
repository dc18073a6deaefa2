"""The MoE families beyond the seed's three (GLM-4.x, gpt-oss, MiniMax-M2, GLM-5, Qwen3.5, DeepSeek-V4,
DeepSeek-V3.2), each as `synth-moe --tiny` writes it, served by the llama.cpp engines' CPU images whose
tree has its architecture, through `compose` with no preset (what a user of such a model gets today):
healthy, a completion and a chat answered, the plan's KV cache what the engine allocated."""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path

import pytest
from python_on_whales import DockerClient

from builder.engines import get_engine
from builder.host.probe import probe
from builder.images.image_facts import read_image_facts
from builder.images.recorded_contracts import recorded_contract
from builder.models.gguf_facts import read_facts
from builder.models.synth_catalog import FAMILY_TINY_SHAPES
from builder.spec import EngineOptions
from builder.stackfile.host_checks import free_local_port
from builder.stacks.assemble import plan_stack
from builder.stacks.compose import compose_stack, write_stack
from builder.stacks.demo import chat, complete
from builder.stacks.options import StackOptions
from tests.cli import run_cli
from tests.integration.conftest import ENGINES, build_engine_image, check_kv_as_planned, serve_stack

pytestmark = pytest.mark.integration


def _loads(engine: str, arch: str) -> bool:
    """Whether the engine's pinned tree names `arch` (its recorded contract: DeepSeek-V3.2 mainline's alone)
    and its adapter doesn't refuse that architecture's files (ik_llama.cpp's MiniMax-M3)."""
    adapter = get_engine(engine)
    contract = recorded_contract(adapter)
    assert contract is not None, engine
    return arch in contract.architectures and arch not in adapter.refused_architectures


CASES = [(arch, engine) for arch in FAMILY_TINY_SHAPES for engine in ENGINES if _loads(engine, arch)]


@pytest.mark.parametrize(("arch", "engine"), CASES, ids=[f"{a}-{e}" for a, e in CASES])
def test_family_serves_without_a_preset(
    arch: str, engine: str, base_image: str, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    image = build_engine_image(engine, "avx2", base_image)
    port = free_local_port()
    verbose = ("-lv", "4") if "-lv" in read_image_facts(image.tag).server_flags else ()  # mainline's KV log
    options = StackOptions(
        model_path=tiny_models[arch],
        engine=engine,
        image=image.tag,
        port=port,
        threads=2,
        project=f"mst-family-{uuid.uuid4().hex[:8]}",
        engine_options=EngineOptions(ctx_size=4096),
        engine_args=verbose,
    )
    stack_plan = plan_stack(options, probe())
    assert stack_plan.facts is not None, "checked against the image's flag contract"
    document = compose_stack(stack_plan.stack, "pytest: compose, no preset", stack_plan.facts)
    compose_file = write_stack(document, tmp_path / "compose.yaml")
    with contextlib.ExitStack() as served:
        serve_stack(served, compose_file, port, wait_s=240)
        answer = complete(port, "hello the model", max_tokens=8)
        assert answer.completion_tokens == 8 and answer.text, answer
        reply = chat(port, "What is an expert?", max_tokens=8)
        assert reply.completion_tokens > 0 and reply.text, reply
        logs = DockerClient(compose_files=[compose_file]).compose.logs()
    facts = read_facts(tiny_models[arch])
    shape = FAMILY_TINY_SHAPES[arch]
    assert facts.arch == arch and facts.expert_layers == shape.blocks - getattr(shape, "dense_layers", 0)
    stack = stack_plan.stack
    # No preset: the presets' rules, derived from the GGUF and said in the record (q8_0 cache among them).
    assert document.record.derived is not None and document.record.derived.startswith(
        f"no preset: from the model's {arch}"
    )
    assert stack.cache_type == "q8_0" and stack.flash_attention == "on"
    assert stack.ctx_size == 4096
    check_kv_as_planned(stack, logs)


# The families ik_llama.cpp's pinned tree can't load (DeepSeek-V3.2, MiniMax-M3), mainline's can.
MAINLINE_ONLY = [arch for arch in FAMILY_TINY_SHAPES if not _loads("ik_llama.cpp", arch)]


@pytest.mark.parametrize("arch", MAINLINE_ONLY)
def test_an_engine_without_the_architecture_refuses_it_in_one_line(
    arch: str, base_image: str, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """DeepSeek-V3.2 on ik_llama.cpp, whose pinned tree has no deepseek32, and MiniMax-M3, whose files it
    can't load: compose says so against the image and writes nothing (rather than a stack whose engine dies
    loading the model), for the architecture before any layout (V3.2's MTP block)."""
    assert _loads("llama.cpp", arch)
    image = build_engine_image("ik_llama.cpp", "avx2", base_image)
    out = tmp_path / "compose.yaml"
    made = run_cli(
        "compose", "--model", str(tiny_models[arch]), "--engine", "ik_llama.cpp", "--image", image.tag,
        "--out", str(out),
    )  # fmt: skip
    assert made.returncode == 1 and not out.exists(), made.stderr
    assert f"can't load {arch} models like tiny-{arch}.gguf" in made.stderr, made.stderr
    assert len(made.stderr.strip().splitlines()) == 1, made.stderr
