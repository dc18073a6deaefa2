"""A vision projector in a stack (`--mmproj`): read from its GGUF header, refused in one line where it can't
work (not a vision projector, elsewhere than the model's directory, made for another width), written in
both llama.cpp engines' syntax against their recorded flag contracts, refused by name by KTransformers,
mounted beside the model, and counted by the VRAM plan and a CPU stack's memory. Checked on real GGUFs
(synth-moe's tiny qwen3moe, synth_mmproj's tiny InternVL projector)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import gguf
import pytest

from builder.engines import get_engine
from builder.engines.base import StackSpec
from builder.errors import ModelError, SpecError, StackError
from builder.features.vision import checked_projector, projector_bytes
from builder.host.probe import probe
from builder.images.recorded_contracts import recorded_contract
from builder.models.planner import GIB
from builder.models.projector import read_projector
from builder.models.synth_mmproj import write_mmproj_gguf
from builder.models.synth_moe import write_moe_gguf
from builder.models.synth_shapes import TINY_SHAPES
from builder.spec import EngineOptions
from builder.stacks.assemble import plan_models
from builder.stacks.document import serves
from builder.stacks.memory_report import MemoryAsk, memory_report
from builder.stacks.memory_use import memory_use
from builder.stacks.options import StackOptions

QWEN = TINY_SHAPES["qwen3moe"]
from tests.specs import opened


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("vision")
    audio = directory / "mmproj-audio.gguf"
    writer = gguf.GGUFWriter(str(audio), "clip")
    writer.add_bool("clip.has_vision_encoder", False)
    writer.add_bool("clip.has_audio_encoder", True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    return {
        "model": write_moe_gguf(directory / "m.gguf", QWEN),
        "mmproj": write_mmproj_gguf(directory / "mmproj-m.gguf", QWEN.hidden),
        "narrow": write_mmproj_gguf(directory / "mmproj-narrow.gguf", QWEN.hidden // 2),
        "audio": audio,
    }


def test_the_header_says_the_kind_width_and_bytes(ggufs: dict[str, Path]) -> None:
    facts = read_projector(ggufs["mmproj"])
    assert (facts.kind, facts.projection_dim, facts.image_size, facts.patch_size) == (
        "internvl",
        QWEN.hidden,
        64,
        8,
    )
    reader = gguf.GGUFReader(str(ggufs["mmproj"]))
    assert facts.weight_bytes == sum(int(t.n_bytes) for t in reader.tensors) > 0
    # 64 patches: their scores in 4 heads (64 KiB) are less than 4 rows of the 128-wide FFN per patch.
    assert facts.encoder_buffer_bytes == max(64 * 64 * 4 * 4, 4 * 64 * 128 * 4) == 131072


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "model",
            r"m.gguf is a qwen3moe model, not a multimodal projector .* give the projector to --mmproj",
        ),
        ("audio", r"mmproj-audio.gguf has no vision encoder .* give the model's vision mmproj"),
        (
            "narrow",
            rf"writes {QWEN.hidden // 2}-wide embeddings and m.gguf is {QWEN.hidden} wide: give the mmproj",
        ),
    ],
)
def test_a_projector_that_cannot_work_is_refused_in_one_line(
    ggufs: dict[str, Path], name: str, message: str
) -> None:
    with pytest.raises((SpecError, ModelError), match=message) as raised:
        checked_projector(EngineOptions(mmproj=ggufs[name]), opened(ggufs["model"]), get_engine("llama.cpp"))
    assert "\n" not in str(raised.value)


def test_a_projector_elsewhere_than_the_models_directory_is_refused(
    ggufs: dict[str, Path], tmp_path: Path
) -> None:
    elsewhere = tmp_path / "mmproj-m.gguf"
    elsewhere.write_bytes(ggufs["mmproj"].read_bytes())
    with pytest.raises(SpecError, match="the vision projector .* is not in the model's directory"):
        checked_projector(EngineOptions(mmproj=elsewhere), opened(ggufs["model"]), get_engine("ik_llama.cpp"))
    with pytest.raises(SpecError, match="the vision projector .*/absent.gguf does not exist; give the path"):
        checked_projector(
            EngineOptions(mmproj=ggufs["model"].parent / "absent.gguf"),
            opened(ggufs["model"]),
            get_engine("llama.cpp"),
        )


def _stack(engine: str, ggufs: dict[str, Path], gpu: str = "none") -> StackSpec:
    options = checked_projector(
        EngineOptions(mmproj=ggufs["mmproj"]), opened(ggufs["model"]), get_engine(engine)
    )
    stack = StackSpec(
        project_name="p", engine=engine, image_ref="i:1", model=ggufs["model"], cpu_threads=2, gpu=gpu
    )  # type: ignore[arg-type]
    return stack.with_options(options)


@pytest.mark.parametrize("engine", ["llama.cpp", "ik_llama.cpp"])
def test_both_llama_cpp_engines_load_it_beside_the_model(engine: str, ggufs: dict[str, Path]) -> None:
    stack = _stack(engine, ggufs, gpu="nvidia")
    contract = recorded_contract(get_engine(engine))
    assert contract is not None
    args = get_engine(engine).server_args(stack, contract.flags)
    assert args[args.index("--mmproj") :][:2] == ["--mmproj", "/models/mmproj-m.gguf"]
    assert "--no-mmproj-offload" not in args  # on the GPU with the attention, as the plan counts it
    assert serves(stack, args).images
    plain = get_engine(engine).server_args(stack.model_copy(update={"mmproj": None}), contract.flags)
    assert "--mmproj" not in plain and not serves(stack.model_copy(update={"mmproj": None}), plain).images


def test_ktransformers_refuses_it_by_name(ggufs: dict[str, Path]) -> None:
    stack = StackSpec(
        project_name="p", engine="ktransformers", image_ref="i:1", model=ggufs["model"], cpu_threads=2
    )
    with pytest.raises(
        StackError, match="ktransformers does not read --mmproj: drop it; .* a llama.cpp engine"
    ):
        get_engine("ktransformers").server_args(
            stack.with_options(EngineOptions(mmproj=ggufs["mmproj"])), None
        )


def test_the_plan_and_a_cpu_stacks_memory_count_it(ggufs: dict[str, Path]) -> None:
    facts = read_projector(ggufs["mmproj"])
    counted = facts.weight_bytes + facts.encoder_buffer_bytes
    assert projector_bytes(EngineOptions(mmproj=ggufs["mmproj"])) == counted
    assert projector_bytes(EngineOptions()) == 0
    ask = MemoryAsk((24.0,), 64.0, 1.0, 8192, "q8_0", False, 512, None, EngineOptions(mmproj=ggufs["mmproj"]))
    model = get_engine("llama.cpp").open_model(ggufs["model"])
    with_it = memory_report(get_engine("llama.cpp"), model, ask)
    without = memory_report(get_engine("llama.cpp"), model, dataclasses.replace(ask, options=EngineOptions()))
    assert with_it.projector == counted and with_it.as_json()["projector_bytes"] == counted
    assert with_it.plan.gpu_bytes - without.plan.gpu_bytes == counted
    assert any(row[0].startswith("vision projector mmproj-m.gguf") for row in with_it.gpu_rows())
    cpu, gpu = _stack("llama.cpp", ggufs), _stack("llama.cpp", ggufs, gpu="nvidia")
    assert memory_use(cpu).features_bytes == counted and memory_use(gpu).features_bytes == 0
    assert (
        memory_use(cpu).memory_bytes - memory_use(cpu.model_copy(update={"mmproj": None})).memory_bytes
        == counted
    )
    assert counted < GIB


def test_a_stack_routing_several_models_refuses_it(ggufs: dict[str, Path]) -> None:
    second = write_moe_gguf(ggufs["model"].parent / "m2.gguf", QWEN, seed=2)
    models = [
        StackOptions(model_path=model, engine_options=EngineOptions(mmproj=projector), for_other_host=True)
        for model, projector in ((ggufs["model"], ggufs["mmproj"]), (second, None))
    ]
    with pytest.raises(StackError, match=r"images \(--mmproj\) are for a stack of one model"):
        plan_models(models, probe())
