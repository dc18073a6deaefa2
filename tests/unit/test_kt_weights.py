"""kt-kernel's AMX weights: the checkpoint its converter reads, the conversion moe-stack plans (on
recorded hosts), the converted directory a KTransformers stack serves, and what each refuses."""

from __future__ import annotations

import json
import shutil
from collections import namedtuple
from pathlib import Path

import pytest
import yaml

from builder.engines import get_engine
from builder.engines.base import StackSpec
from builder.errors import ModelError, SourceError, StackError
from builder.host.probe import probe
from builder.models.kt_weights import converted_facts, read_checkpoint, read_converted
from builder.models.synth_hf import checkpoint_bytes, write_hf_checkpoint
from builder.models.synth_shapes import TINY_SHAPES
from builder.platform.targets import cpu_target
from builder.running.kt_convert import CONVERTER, default_output, plan_conversion
from builder.stackfile.host_checks import stack_files
from builder.stackfile.stack_file import Mount
from tests.cli import run_cli_in_process
from tests.hosts import EPYC_9554_FLAGS, XEON_EMR_FLAGS, fake_host
from tests.kt_layout import write_converted, write_safetensors

KT = get_engine("ktransformers")
DiskUsage = namedtuple("DiskUsage", "total used free")
SHAPE = TINY_SHAPES["qwen3moe"]


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    return write_hf_checkpoint(tmp_path / "Qwen3-tiny", SHAPE)


@pytest.fixture
def source(tmp_path: Path) -> Path:
    script = tmp_path / "ktransformers" / CONVERTER
    script.parent.mkdir(parents=True)
    script.write_text("# kt-kernel's converter\n")
    (tmp_path / "ktransformers/version.py").write_text('__version__ = "0.7.0"\n')
    return tmp_path / "ktransformers"


def test_the_checkpoint_as_the_converter_reads_it(checkpoint: Path) -> None:
    read = read_checkpoint(checkpoint)
    assert (read.input_type, read.moe_layers, read.experts) == ("fp16", SHAPE.layers, SHAPE.experts)
    assert (read.hidden, read.expert_ffn) == (SHAPE.hidden, SHAPE.expert_ffn)
    # One layer's experts at 4 bits: gate, up and down of every expert.
    assert read.layer_bytes("AMXINT4") == SHAPE.experts * 3 * SHAPE.hidden * SHAPE.expert_ffn // 2
    assert read.layer_bytes("AMXINT8") == 2 * read.layer_bytes("AMXINT4")
    experts_f16 = SHAPE.layers * SHAPE.experts * 3 * SHAPE.hidden * SHAPE.expert_ffn * 2
    assert read.other_bytes == checkpoint_bytes(SHAPE) - experts_f16  # copied by the converter as is
    assert read.converted_bytes("AMXINT4") == SHAPE.layers * read.layer_bytes("AMXINT4") * 101 // 100 + (
        read.other_bytes
    )


def test_what_the_converter_cannot_read_is_one_line(tmp_path: Path, checkpoint: Path) -> None:
    with pytest.raises(ModelError, match="has no config.json; give the model's Hugging Face directory"):
        read_checkpoint(tmp_path)
    dense = tmp_path / "dense"
    dense.mkdir()
    (dense / "config.json").write_text("{}")
    write_safetensors(dense / "model.safetensors", {"model.layers.0.mlp.up_proj.weight": ("BF16", (4,), 8)})
    with pytest.raises(ModelError, match="hold no routed experts"):
        read_checkpoint(dense)
    f32 = tmp_path / "f32"
    f32.mkdir()
    (f32 / "config.json").write_text((checkpoint / "config.json").read_text())
    write_safetensors(
        f32 / "model.safetensors", {"model.layers.0.mlp.experts.0.up_proj.weight": ("F32", (4,), 16)}
    )
    with pytest.raises(ModelError, match="experts are F32; kt-kernel's converter reads BF16, F16 or FP8"):
        read_checkpoint(f32)
    fp8 = {
        f"model.layers.0.mlp.experts.0.{proj}_proj.{part}": (dtype, (4,), 4)
        for proj in ("gate", "up", "down")
        for part, dtype in (("weight", "F8_E4M3"), ("weight_scale_inv", "F32"))
    }
    write_safetensors(f32 / "model.safetensors", fp8)
    assert read_checkpoint(f32).input_type == "fp8"  # the scales beside the weights are not its type
    (f32 / "model.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(ModelError, match="is not a safetensors file"):
        read_checkpoint(f32)


def test_the_conversion_on_a_two_socket_amx_host(tmp_path: Path, checkpoint: Path, source: Path) -> None:
    host = probe(fake_host(tmp_path / "emr", XEON_EMR_FLAGS, 2, 32, 2, 256), nvidia_smi_text="")
    plan = plan_conversion(read_checkpoint(checkpoint), source, "AMXINT4", host, "kt:img")
    assert plan.output == default_output(checkpoint, "AMXINT4") == checkpoint.parent / "Qwen3-tiny-AMXINT4"
    assert (plan.numa_pools, plan.threads) == (2, 64)  # one pool per node, every physical core
    assert plan.converter_args("/model", "/out", "/converter/convert_cpu_weights.py") == [
        "/converter/convert_cpu_weights.py",
        "--input-path",
        "/model",
        "--input-type",
        "fp16",
        "--output",
        "/out",
        "--quant-method",
        "int4",
        "--cpuinfer-threads",
        "64",
        "--threadpool-count",
        "2",
    ]
    # Docker's /dev/shm is 64 MiB by default; the converter stages a layer there.
    assert plan.shm_bytes == 2 * read_checkpoint(checkpoint).layer_bytes("AMXINT4") + 1024**3
    assert not plan.needs_gpu
    assert plan.record()["converter_version"] == "0.7.0"
    one = plan_conversion(
        read_checkpoint(checkpoint), source, "AMXINT8", host, "kt:img", numa_pools=1, threads=8
    )
    assert (one.numa_pools, one.threads, one.converter_args("m", "o", "s")[8]) == (1, 8, "int8")


def test_what_the_conversion_refuses(
    tmp_path: Path, checkpoint: Path, source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    epyc = probe(fake_host(tmp_path / "epyc", EPYC_9554_FLAGS, 1, 64, 2, 384), nvidia_smi_text="")
    emr = probe(fake_host(tmp_path / "emr", XEON_EMR_FLAGS, 1, 32, 2, 256), nvidia_smi_text="")
    read = read_checkpoint(checkpoint)
    with pytest.raises(
        StackError, match="this CPU lacks amx_tile amx_int8 amx_bf16: run kt-convert on the AMX"
    ):
        plan_conversion(read, source, "AMXINT4", epyc, "kt:img")
    with pytest.raises(SourceError, match=f"has no {CONVERTER}: give a ktransformers checkout"):
        plan_conversion(read, tmp_path, "AMXINT4", emr, "kt:img")
    (tmp_path / "taken").mkdir()
    with pytest.raises(ModelError, match="taken exists; remove it or give another --out"):
        plan_conversion(read, source, "AMXINT4", emr, "kt:img", output=tmp_path / "taken")
    with monkeypatch.context() as patched:
        patched.setattr(shutil, "disk_usage", lambda path: DiskUsage(total=10**12, used=10**12, free=1))
        with pytest.raises(
            ModelError, match="AMXINT4 weights of Qwen3-tiny need about 3.3 MiB and .* has 0.0 MiB free"
        ):
            plan_conversion(read, source, "AMXINT4", emr, "kt:img")
    with pytest.raises(ModelError, match="is not a directory you can write"):
        plan_conversion(read, source, "AMXINT4", emr, "kt:img", output=tmp_path / "no/such/out")
    fp8 = read.__class__(**{**read.__dict__, "input_type": "fp8"})
    with pytest.raises(StackError, match="is FP8: kt-kernel's converter dequantizes it on a GPU"):
        plan_conversion(fp8, source, "AMXINT4", emr, "kt:img")


def test_converted_weights_are_read_from_the_index(tmp_path: Path) -> None:
    weights = read_converted(write_converted(tmp_path / "w", layers=3, pools=2))
    assert (weights.numa_pools, weights.moe_layers, weights.method) == (2, 3, "AMXINT4")
    bare = read_converted(write_converted(tmp_path / "bare", pools=1, method=None))
    assert (bare.numa_pools, bare.method) == (1, None)
    with pytest.raises(
        ModelError, match="holds no kt-kernel converted weights; convert the checkpoint first"
    ):
        read_converted(tmp_path)


def test_the_plan_reads_converted_weights(tmp_path: Path) -> None:
    directory = write_converted(tmp_path / "w", layers=2, experts=4, pools=2, hidden=64, ffn=32)
    facts = converted_facts(directory)
    assert (facts.arch, facts.layers, facts.expert_count, facts.experts_used) == ("qwen3moe", 2, 4, 2)
    # Per layer: 3 projections x 4 experts x 2 pools of (64*32/2/2 weight bytes + 16 f32 scales).
    assert facts.expert_bytes == (3 * 4 * 2 * (512 + 64),) * 2
    assert facts.embedding_bytes == 2 * 259 * 64 and facts.vocab == 259
    assert facts.other_bytes == 2 * 259 * 64 + 2 * 64 + 2 * 2 * 64 * 64
    assert (facts.kv_heads, facts.key_dim, facts.value_dim, facts.mla_dim) == (2, 16, 16, None)


def _stack(model: Path, **update: object) -> StackSpec:
    values: dict[str, object] = {
        "project_name": "kt",
        "engine": "ktransformers",
        "image_ref": "kt:test",
        "model": model,
        "cpu_threads": 32,
        "numa_node_count": 2,
        "gpu": "nvidia",
        "config_dir": model.parent / "hf",
    }
    return StackSpec(**(values | update))


def test_a_stack_serves_converted_weights_with_their_method(tmp_path: Path) -> None:
    model = write_converted(tmp_path / "Qwen3-AMXINT8", pools=2, method="AMXINT8")
    args = KT.server_args(_stack(model), None)
    # The directory's parent is what the stack mounts at /models.
    assert args[args.index("--kt-weight-path") + 1] == "/models/Qwen3-AMXINT8"
    assert args[args.index("--kt-method") + 1] == "AMXINT8"
    assert args[args.index("--kt-threadpool-count") + 1] == "2"
    bare = write_converted(tmp_path / "bare", pools=2, method=None)
    assert "AMXINT4" in KT.server_args(_stack(bare, kt_method="AMXINT4"), None)


@pytest.mark.parametrize(
    ("update", "message"),
    [
        ({"numa_node_count": 1}, "was converted for 2 CPU thread pool(s) (NUMA nodes) and this stack runs 1"),
        (
            {"kt_method": "LLAMAFILE"},
            "holds kt-kernel's converted AMXINT4 experts, which --kt-method LLAMAFILE",
        ),
        ({"kt_method": "AMXINT8"}, "holds kt-kernel's converted AMXINT4 experts, which --kt-method AMXINT8"),
    ],
)
def test_what_a_converted_stack_refuses(tmp_path: Path, update: dict[str, object], message: str) -> None:
    model = write_converted(tmp_path / "w", pools=2)
    with pytest.raises(StackError, match=message.replace("(", r"\(").replace(")", r"\)")):
        KT.server_args(_stack(model, **update), None)
    with pytest.raises(StackError, match="its method is unrecorded: pass --kt-method AMXINT4 or AMXINT8"):
        KT.server_args(_stack(write_converted(tmp_path / "bare", method=None)), None)


def test_compose_emits_the_converted_stack(tmp_path: Path, checkpoint: Path) -> None:
    tmp_path.chmod(0o755)
    for path in [checkpoint, *checkpoint.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    model = write_converted(  # the checkpoint's experts, as the converter writes them
        tmp_path / "Qwen3-tiny-AMXINT4", layers=SHAPE.layers, experts=SHAPE.experts, pools=2,
        hidden=SHAPE.hidden, ffn=SHAPE.expert_ffn,
    )  # fmt: skip
    out = tmp_path / "c.yaml"
    emitted = run_cli_in_process(
        "compose", "--engine", "ktransformers", "--gpu", "nvidia", "--model", str(model),
        "--config-dir", str(checkpoint), "--for-other-host", "--numa-nodes", "0,1",
        "--skip-image-checks", "-o", str(out),
    )  # fmt: skip
    assert emitted.returncode == 0, emitted.stderr
    service = yaml.safe_load(out.read_text())["services"]["engine"]
    command = [str(arg) for arg in service["command"]]
    assert command[command.index("--kt-weight-path") + 1] == "/models/Qwen3-tiny-AMXINT4"
    assert command[command.index("--kt-method") + 1] == "AMXINT4"
    assert {"type": "bind", "source": str(tmp_path), "target": "/models", "read_only": True} in service[
        "volumes"
    ]
    refused = run_cli_in_process(
        "compose", "--engine", "ktransformers", "--gpu", "nvidia", "--model", str(model),
        "--config-dir", str(checkpoint), "--for-other-host", "--skip-image-checks",
        "-o", str(tmp_path / "d.yaml"),
    )  # fmt: skip
    assert refused.returncode == 1 and "converted for 2 CPU thread pool(s)" in refused.stderr
    assert len(refused.stderr.splitlines()) == 1
    assert not (tmp_path / "d.yaml").exists()
    assert json.loads((model / "moe-stack-kt-weights.json").read_text())["method"] == "AMXINT4"


def test_the_engines_user_must_read_the_converted_directory(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    model = write_converted(tmp_path / "Qwen3-AMXINT4", pools=2)
    files = stack_files(_stack(model))
    assert files.mounts == (Mount(type="bind", source=str(tmp_path), target="/models", read_only=True),)
    (model / "model.safetensors.index.json").chmod(0o600)
    with pytest.raises(StackError, match="index.json is not readable by the engine's user \\(uid 10001\\)"):
        stack_files(_stack(model))


def test_amx_weights_need_an_image_that_loads_kt_kernels_amx_variant(tmp_path: Path) -> None:
    """A named target's image pins its variant (the avx2 image: AVX2 kernels even on an AMX Xeon)."""
    stack = _stack(write_converted(tmp_path / "w", pools=2), image_ref="kt:0.7.2-cuda12.8-avx2")
    with pytest.raises(
        StackError, match="pins kt-kernel's avx2 variant .* use the portable or sapphirerapids"
    ):
        KT.check_image_target(stack, cpu_target("avx2"))
    with pytest.raises(StackError, match="pins kt-kernel's avx512_bf16 variant"):
        KT.check_image_target(stack, cpu_target("zen4"))
    KT.check_image_target(stack, cpu_target("portable"))  # kt-kernel's loader picks amx on the host
    KT.check_image_target(stack, cpu_target("sapphirerapids"))
    gguf = _stack(tmp_path / "m.gguf")
    KT.check_image_target(gguf, cpu_target("avx2"))  # LLAMAFILE runs in every variant
