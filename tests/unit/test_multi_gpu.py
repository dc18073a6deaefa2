"""Several GPUs: llama.cpp's layer split, a plan over each GPU's VRAM, `--gpus` device ids, and
mainline's own `--fit` placement, on recorded 2- and 4-GPU hosts."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.engines import get_engine
from builder.engines.compute_buffers import gpu_reserve
from builder.errors import SpecError, StackError
from builder.host.probe import HostFacts
from builder.models.facts import ModelFacts
from builder.models.gguf_facts import read_facts
from builder.models.kv_cache import CacheLayout
from builder.models.planner import GIB, layer_split, plan
from builder.models.synth_moe import MoeShape, write_moe_gguf
from builder.spec import EXPERTS_ON_CPU_RULE, EngineOptions
from builder.stacks.assemble import assemble_stack
from builder.stacks.options import StackOptions
from tests.hosts import epyc_host
from tests.specs import compose_dict

TWO_4090 = "NVIDIA GeForce RTX 4090, 8.9, 570.86.15, 24564\n" * 2
FOUR_H200 = "NVIDIA H200, 9.0, 580.159.04, 143771\n" * 4
# DeepSeek-R1's shape, sizes rounded: 61 layers, 58 of them MoE with 5.7 GB of IQ4_XS experts each.
R1 = ModelFacts(
    arch="deepseek2",
    layers=61,
    expert_bytes=(0,) * 3 + (int(5.7e9),) * 58,
    other_bytes=int(16e9),
    kv_heads=128,
    key_dim=192,
    value_dim=128,
    mla_dim=576,
    expert_count=256,
)


def _host(tmp_path: Path, smi: str) -> HostFacts:
    return epyc_host(tmp_path / "h", node_gib=768, smi=smi)


def test_layer_split_is_llama_cpps() -> None:
    """Layer il goes to the first GPU whose cumulative share exceeds il / (layers + 1)."""
    assert layer_split(61, [24, 24]) == [range(31), range(31, 61)]
    assert layer_split(4, [1, 1]) == [range(3), range(3, 4)]
    assert layer_split(61, [24, 48]) == [range(21), range(21, 61)]
    assert [len(r) for r in layer_split(94, [141] * 4)] == [24, 24, 24, 22]
    assert layer_split(61, [24]) == [range(61)]


def test_a_plan_over_two_gpus_fills_each_with_its_own_layers() -> None:
    result = plan(R1, [24 * GIB, 24 * GIB], 768 * GIB, 32768, "q8_0", layout=CacheLayout(latent=True))
    first, second = result.devices
    assert first.layers == range(31) and second.layers == range(31, 61)
    # each fills from its own first layer that holds experts (R1's first three are dense)
    assert first.expert_layers[0] == 3 and second.expert_layers[0] == 31
    assert all(d.used_bytes <= d.vram_bytes for d in result.devices)
    assert result.tensor_split == (24, 24)
    assert result.override_rules[0].endswith("=CUDA0") and result.override_rules[1].endswith("=CUDA1")
    assert result.override_rules[-1] == EXPERTS_ON_CPU_RULE
    single = plan(R1, 24 * GIB, 768 * GIB, 32768, "q8_0", layout=CacheLayout(latent=True))
    # One 24 GiB card: 19.4 GB held and a 1 GiB margin leave no room for a 5.7 GB layer of experts
    assert single.tensor_split == () and single.override_rules == (EXPERTS_ON_CPU_RULE,)
    assert result.gpu_expert_layers > single.gpu_expert_layers
    with pytest.raises(SpecError, match=r"on GPU 1 \(3 of 61 layers\), 1.8 GiB more"):
        plan(R1, [24 * GIB, 2 * GIB], 768 * GIB, 32768, "q8_0", layout=CacheLayout(latent=True))


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return write_moe_gguf(tmp_path / "models" / "moe.gguf", MoeShape(layers=4))


def test_a_stack_on_two_of_four_gpus(tmp_path: Path, model: Path) -> None:
    host = _host(tmp_path, FOUR_H200)
    # Each: llama.cpp's compute reserve for this model (-ub 512, 512 tokens) and 0.003 GiB: the layers'
    # share of attention and a 512-token cache, and the experts of layers 0 and 1 on the first GPU
    # (layer 2's stay in RAM), of layer 3 on the second
    vram_gb = (
        gpu_reserve(get_engine("llama.cpp").buffer_fits, read_facts(model), 512, 512, latent=False)
        + 1.003 * GIB
    ) / GIB
    options = StackOptions(
        model_path=model,
        gpu="nvidia",
        gpus=(2, 3),
        fit_vram_gb=(vram_gb, vram_gb),
        port=18432,
        engine_options=EngineOptions(ctx_size=512, cache_type="q8_0", gpu_layers=99, ubatch_size=512),
    )
    stack = assemble_stack(options, host)
    share = max(1, round(vram_gb))  # -ts: each GPU's VRAM in whole GiB
    assert stack.gpu_ids == (2, 3) and stack.tensor_split == (share, share)
    service = compose_dict(stack, "x")["services"]["engine"]
    device = service["deploy"]["resources"]["reservations"]["devices"][0]
    assert device == {"driver": "nvidia", "device_ids": ["2", "3"], "capabilities": ["gpu"]}
    command = service["command"]
    assert command[command.index("--tensor-split") + 1] == f"{share},{share}"
    # CUDA numbering is the container's: its two GPUs are CUDA0 and CUDA1
    assert stack.override_tensors == (
        r"blk\.(0|1)\.ffn_.*_exps\.weight=CUDA0",
        r"blk\.(3)\.ffn_.*_exps\.weight=CUDA1",
        EXPERTS_ON_CPU_RULE,
    )
    cdi = compose_dict(stack.model_copy(update={"gpu": "cdi"}), "x")["services"]["engine"]
    assert cdi["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] == [
        "nvidia.com/gpu=2",
        "nvidia.com/gpu=3",
    ]


def test_refusals(tmp_path: Path, model: Path) -> None:
    host = _host(tmp_path, TWO_4090)
    with pytest.raises(SpecError, match="--gpus names GPU 2, and this host has 2"):
        assemble_stack(StackOptions(model_path=model, gpu="nvidia", gpus=(0, 2)), host)
    with pytest.raises(SpecError, match="names 2 GPUs and --fit-vram-gb sizes 1"):
        assemble_stack(StackOptions(model_path=model, gpu="nvidia", gpus=(0, 1), fit_vram_gb=(24,)), host)
    with pytest.raises(SpecError, match="keeps its GPU experts on one GPU"):
        assemble_stack(
            StackOptions(model_path=model, engine="ktransformers", gpu="nvidia", fit_vram_gb=(24, 24)), host
        )


def test_either_llama_engine_may_place_everything_itself(tmp_path: Path, model: Path) -> None:
    """`--placement fit`: mainline's `--fit on`, ik_llama.cpp's `--fit` switch after every layer on the GPU
    (its default is none), each with the stack's margin (1 GiB unless --vram-margin-gb says)."""
    host = _host(tmp_path, TWO_4090)
    options = StackOptions(model_path=model, gpu="nvidia", preset="qwen3-235b-a22b", placement="fit")
    stack = assemble_stack(options, host)
    command = compose_dict(stack, "x")["services"]["engine"]["command"]
    assert (
        command[command.index("--fit") + 1] == "on" and command[command.index("--fit-target") + 1] == "1024"
    )
    assert "--n-gpu-layers" not in command and "--override-tensor" not in command  # left to --fit
    ik = options.model_copy(update={"engine": get_engine("ik_llama.cpp"), "vram_margin_gb": 2.0})
    command = compose_dict(assemble_stack(ik, host), "x")["services"]["engine"]["command"]
    assert command[command.index("--fit") + 1] == "--fit-margin" and "--fit-target" not in command
    assert command[command.index("--fit-margin") + 1] == "2048" and "--override-tensor" not in command
    assert int(command[command.index("--n-gpu-layers") + 1]) > read_facts(model).layers
    with pytest.raises(StackError, match="ktransformers does not read --placement fit"):
        compose_dict(
            assemble_stack(options.model_copy(update={"engine": get_engine("ktransformers")}), host), "x"
        )
    with pytest.raises(SpecError, match="--placement fit leaves -ngl and -ot to the engine"):
        assemble_stack(options.model_copy(update={"experts_on_cpu": True}), host)
