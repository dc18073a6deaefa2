"""A model without a preset gets the presets' rules from its own facts (stacks/derived.py), says so in
its record, and the user's options still win."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from builder.engines import get_engine
from builder.errors import SpecError
from builder.host.probe import HostFacts
from builder.models.synth_catalog import synth_shape
from builder.models.synth_moe import shape_facts, write_moe_gguf
from builder.models.synth_shapes import TINY_SHAPES
from builder.spec import EXPERTS_ON_CPU_RULE, EngineOptions
from builder.stacks.assemble import assemble_stack
from builder.stacks.derived import derived_preset
from builder.stacks.options import StackOptions
from builder.stacks.presets import load_presets
from tests.hosts import epyc_host
from tests.specs import compose_dict, preset_engines

# What every packaged preset says of its model's placement, and the derivation must say the same.
PLACEMENT = ("cache_type", "flash_attention", "fused_moe", "mla", "moe_offload_batch", "ubatch_size")


@pytest.fixture
def host(tmp_path: Path) -> HostFacts:
    return epyc_host(tmp_path / "h", node_gib=512)


@pytest.mark.parametrize(("preset", "engine"), preset_engines())
def test_the_derivation_gives_each_presets_model_its_placement(preset: str, engine: str) -> None:
    """At its model's real widths and expert counts, a preset's architecture derives the placement the
    preset gives it (context and sampling are the model card's, which a GGUF does not hold)."""
    chosen = load_presets()[preset]
    adapter = get_engine(engine)
    facts = shape_facts(chosen.model_shape())
    derived = derived_preset(facts, adapter, gpu=True)
    assert derived is not None
    wanted = chosen.engine_options(adapter)
    for name in PLACEMENT:
        assert getattr(derived.options, name) == getattr(wanted, name), (preset, engine, name)
    assert derived.override_rules == chosen.override_rules(adapter) == (EXPERTS_ON_CPU_RULE,)


@pytest.mark.parametrize("arch", ["deepseek2", "qwen3moe", "qwen3next", "gpt-oss", "glm4moe"])
def test_a_gpu_stack_without_a_preset_is_the_hybrid_layout(
    tmp_path: Path, host: HostFacts, arch: str
) -> None:
    shape = synth_shape(arch, tiny=True)
    model = write_moe_gguf(tmp_path / "models" / f"{arch}.gguf", shape)
    stack = assemble_stack(StackOptions(model_path=model, engine="ik_llama.cpp", gpu="nvidia"), host)
    command = compose_dict(stack, "x")["services"]["engine"]["command"]
    assert command[command.index("--override-tensor") + 1] == EXPERTS_ON_CPU_RULE
    assert int(command[command.index("--n-gpu-layers") + 1]) > shape.layers
    assert command[command.index("--cache-type-k") + 1] == "q8_0" and stack.fused_moe  # ik's default now
    assert ("-mla" in command) == (arch == "deepseek2")
    # 32 x 2 used / 8 experts: a batch of 32 tokens takes the CPU experts to the GPU.
    assert command[command.index("-cuda") + 1] == "offload-batch-size=8"
    # The recurrent layers of qwen3next split a batch themselves: no -ub, as its preset.
    assert ("--ubatch-size" in command) == (arch != "qwen3next")
    record = compose_dict(stack, "x")["x-moe-stack"]
    assert record["derived"].startswith(f"no preset: from the model's {arch}, 8 experts (2 used)")
    assert "routed experts on the CPU" in record["derived"]
    cpu = assemble_stack(StackOptions(model_path=model, engine="ik_llama.cpp"), host)  # --gpu none
    assert cpu.override_tensors == () and cpu.gpu_layers is None and cpu.moe_offload_batch is None
    assert cpu.derived is not None and "routed experts" not in cpu.derived and "fused_moe" in cpu.derived


def test_the_users_options_win_and_a_dense_model_gets_none(tmp_path: Path, host: HostFacts) -> None:
    model = write_moe_gguf(tmp_path / "models" / "moe.gguf", TINY_SHAPES["qwen3moe"])
    given = EngineOptions(cache_type="f16", ubatch_size=512)
    stack = assemble_stack(StackOptions(model_path=model, gpu="nvidia", engine_options=given), host)
    assert (stack.cache_type, stack.ubatch_size, stack.flash_attention) == ("f16", 512, "on")
    assert stack.derived is not None and "cache_type" not in stack.derived and "ubatch" not in stack.derived
    assert "flash_attention=on" in stack.derived  # what it set, not what the user did
    # The tiny model was trained for 40960 tokens: the presets' 32768; a shorter training, that.
    assert stack.ctx_size == 32768
    short = write_moe_gguf(
        tmp_path / "models" / "short.gguf", synth_shape("qwen3moe", tiny=True, context=2048)
    )
    assert assemble_stack(StackOptions(model_path=short), host).ctx_size == 2048
    dense_facts = replace(shape_facts(synth_shape("qwen3moe", tiny=True)), expert_count=0, experts_used=0)
    assert derived_preset(dense_facts, get_engine("llama.cpp"), gpu=True) is None
    # A preset named: nothing derived, and the record says nothing of it.
    deepseek = write_moe_gguf(tmp_path / "models" / "r1.gguf", TINY_SHAPES["deepseek2"])
    preset = assemble_stack(StackOptions(model_path=deepseek, preset="deepseek-r1-671b", gpu="nvidia"), host)
    assert preset.derived is None and "derived" not in compose_dict(preset, "x")["x-moe-stack"]


def test_sparse_attention_that_would_run_dense_is_refused(tmp_path: Path, host: HostFacts) -> None:
    """MiniMax-M3's sparse attention runs only with flash attention and a cache per slot; otherwise mainline
    attends densely with a warning in its log alone: such a stack is refused in one line, and its derived
    options keep the preset's -ub 512."""
    model = write_moe_gguf(tmp_path / "models" / "m3.gguf", synth_shape("minimax-m3", tiny=True))
    plain = assemble_stack(StackOptions(model_path=model, engine="llama.cpp", gpu="nvidia"), host)
    assert (plain.flash_attention, plain.ubatch_size) == ("on", 512)
    assert plain.derived is not None and "sparse (an indexer's blocks) in 2 layers" in plain.derived
    off = StackOptions(
        model_path=model, engine="llama.cpp", engine_options=EngineOptions(flash_attention="off")
    )
    with pytest.raises(SpecError, match=r"runs only with flash attention .*: drop --flash-attention off$"):
        assemble_stack(off, host)
    unified = StackOptions(model_path=model, engine="llama.cpp", parallel=2, engine_args=("-kvu",))
    with pytest.raises(SpecError, match=r"needs a cache per slot .*: drop --kv-unified$"):
        assemble_stack(unified, host)
    assert assemble_stack(unified.model_copy(update={"parallel": 1}), host).extra_args == ("-kvu",)
