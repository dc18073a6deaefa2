"""Every preset × llama.cpp-family engine the product offers, as `moe-stack compose --preset` emits it
against the built image (its flag contract checked), served on this CPU with a tiny model of the
preset's architecture (qwen3moe, deepseek2 with MLA, qwen3next with its recurrent layers, and the
families: glm4moe, gpt-oss, minimax-m2): healthy, a
completion and a chat answered, the preset's own flags on the engine's command line (less its GPU layout:
these stacks have no GPU). The committed
compose/ examples are emitted against the contracts recorded from these same images: the records must
equal the images' labels."""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from pathlib import Path

import pytest
from python_on_whales import DockerClient

from builder.engines import get_engine
from builder.files import write_file_atomically
from builder.host.probe import probe
from builder.images.image_facts import read_image_facts
from builder.images.recorded_contracts import (
    RecordedContract,
    contract_path,
    contract_text,
    recorded_contract,
)
from builder.models.synth_catalog import synth_shape
from builder.models.synth_moe import write_moe_gguf
from builder.stackfile.host_checks import free_local_port
from builder.stacks.assemble import plan_stack
from builder.stacks.compose import compose_stack, write_stack
from builder.stacks.demo import chat, complete
from builder.stacks.options import StackOptions
from builder.stacks.presets import Preset, load_presets
from tests.integration.conftest import ENGINES, build_engine_image, check_kv_as_planned, serve_stack
from tests.specs import preset_engines

pytestmark = pytest.mark.integration

PRESETS = sorted(load_presets().values(), key=lambda p: p.name)
CASES = preset_engines(tuple(ENGINES))


# The routing of a preset's own model, where its example shape changes its architecture's (Kimi-K2: 384
# experts, past llama.cpp's old limit of 256, without groups, one dense layer), kept at tiny widths.
ROUTING = ("experts", "expert_groups", "groups_used", "dense_layers")


def _tiny_model(preset: Preset, tiny_models: dict[str, Path], directory: Path) -> Path:
    """A tiny model of the preset's architecture, with its own model's routing."""
    routing = {key: value for key, value in preset.example_shape.items() if key in ROUTING}
    if not routing:
        return tiny_models[preset.architecture]
    directory.chmod(0o755)  # the engine's user (uid 10001) reads it
    model = write_moe_gguf(
        directory / f"tiny-{preset.name}.gguf", synth_shape(preset.architecture, True, **routing)
    )
    model.chmod(0o644)
    return model


@pytest.mark.parametrize(("preset", "engine"), CASES, ids=[f"{p}-{e}" for p, e in CASES])
def test_preset_serves_its_architecture(
    preset: str, engine: str, base_image: str, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    engine_image = build_engine_image(engine, "avx2", base_image)
    chosen = next(p for p in PRESETS if p.name == preset)
    port = free_local_port()
    project = f"mst-preset-{uuid.uuid4().hex[:8]}"
    verbose = (
        ("-lv", "4") if "-lv" in read_image_facts(engine_image.tag).server_flags else ()
    )  # mainline's buffer log
    options = StackOptions(
        model_path=_tiny_model(chosen, tiny_models, tmp_path),
        engine=engine,
        image=engine_image.tag,
        preset=preset,
        port=port,
        threads=2,
        project=project,
        engine_args=verbose,
    )
    stack_plan = plan_stack(options, probe())
    assert stack_plan.facts is not None, "checked against the image's flag contract"
    document = compose_stack(stack_plan.stack, f"pytest: compose --preset {preset}", stack_plan.facts)
    compose_file = write_stack(document, tmp_path / "compose.yaml")
    command = document.service("engine").args
    expected = get_engine(engine).server_args(stack_plan.stack, stack_plan.facts.server_flags)
    assert command == expected and "--ctx-size" in command
    # A stack without a GPU leaves the preset's GPU layout out (its -ngl and experts-on-CPU rule).
    assert "--override-tensor" not in command and "--n-gpu-layers" not in command
    with contextlib.ExitStack() as served:
        serve_stack(served, compose_file, port, wait_s=240)
        answer = complete(port, "hello the model", max_tokens=8)
        assert answer.completion_tokens == 8 and answer.text, answer
        reply = chat(port, "What is an expert?", max_tokens=8)
        assert reply.completion_tokens > 0 and reply.text, reply
        running = DockerClient(compose_files=[compose_file]).compose.ps()[0].config.cmd
        assert running == command, "the container runs the command the file says"
        logs = DockerClient(compose_files=[compose_file]).compose.logs()
    # The preset's own settings reached the engine, as its log shows them.
    assert command[command.index("--ctx-size") + 1] == str(chosen.options["ctx_size"])
    facts = stack_plan.stack.model.facts
    assert facts.expert_count == chosen.example_shape.get("experts", facts.expert_count)
    if chosen.architecture == "deepseek2" and engine == "ik_llama.cpp":
        assert "Adjusted mainline llama.cpp MLA tensors" in logs and "mla_attn      = 3" in logs, logs[-2000:]
    assert "exceeds the training context" not in logs
    # The plan's KV cache (the latent, the recurrent state) is what the engine allocated, within 10 %.
    check_kv_as_planned(stack_plan.stack, logs)


@pytest.mark.parametrize("engine", ENGINES)
def test_recorded_contract_is_the_images(engine: str, base_image: str) -> None:
    """dockerfiles/contracts/<engine>.json (what compose/ is checked against) equals the built image's
    label; MOE_STACK_UPDATE_GOLDEN=1 rewrites it from the image."""
    engine_image = build_engine_image(engine, "avx2", base_image)
    facts = read_image_facts(engine_image.tag)
    source = engine_image.source
    if os.environ.get("MOE_STACK_UPDATE_GOLDEN") == "1":
        write_file_atomically(
            contract_path(get_engine(engine)),
            contract_text(
                RecordedContract(
                    engine=get_engine(engine),
                    ref=facts.engine_ref,
                    source=source,
                    flags=facts.server_flags,
                    architectures=facts.architectures,
                )
            ),
        )
    recorded = recorded_contract(get_engine(engine))
    assert recorded is not None, f"no contract recorded for {engine}: run with MOE_STACK_UPDATE_GOLDEN=1"
    assert (recorded.ref, recorded.source) == (facts.engine_ref, source)
    assert recorded.architectures == facts.architectures, (
        "the image's architectures label differs from the record"
    )
    assert {"qwen3moe", "deepseek2", "qwen3next"} <= set(facts.architectures)
    missing = sorted(set(facts.server_flags) ^ set(recorded.flags))
    assert recorded.flags == facts.server_flags, (
        f"recorded contract differs ({json.dumps(missing[:20])}): rerun "
        "with MOE_STACK_UPDATE_GOLDEN=1 and re-emit compose/"
    )
