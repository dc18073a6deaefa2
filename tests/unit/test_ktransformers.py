"""KTransformers adapters: computed build values (never NATIVE), the variant kt-kernel picks per CPU,
server arguments from a stack, and every emit-time refusal as one line."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from builder.engines import get_engine
from builder.engines.base import ImageSpec, StackSpec
from builder.engines.ktransformers import (
    PYTHON_CPU_BASE,
    _python_toolchain,
    kt_variant,
    torch_arch_list,
    torch_index,
)
from builder.engines.llama_cpp import LlamaCpp
from builder.errors import SpecError, StackError
from builder.host.probe import CpuInfo
from builder.images.build import plan_build
from builder.images.matrix import cuda_target, default_image_spec
from builder.images.naming import image_spec, image_tag
from builder.images.recorded_contracts import recorded_contract
from builder.images.render import image_labels, render_files
from builder.images.source import resolve_local
from builder.models.facts import ModelFacts
from builder.models.kv_cache import CacheLayout, kv_cache_bytes
from builder.models.planner import GIB
from builder.models.planner import plan as make_plan
from builder.models.synth_hf import write_hf_checkpoint
from builder.models.synth_moe import MoeShape, write_moe_gguf
from builder.models.synth_shapes import TINY_SHAPES
from builder.platform.flags import parse_contract
from builder.platform.targets import cpu_target
from builder.spec import BaseImages, LocalSource
from builder.stacks.presets import get_preset
from tests.cli import run_cli_in_process
from tests.kt_layout import write_converted
from tests.specs import compose_dict
from tests.unit.variants import UNPUBLISHED

REPO = Path(__file__).resolve().parents[2]

KT = get_engine("ktransformers")
LEGACY = get_engine("ktransformers-legacy")


def flags_of(target: str) -> frozenset[str]:
    return frozenset(cpu_target(target).required_flags)


def test_kt_kernel_variant_per_cpu() -> None:
    assert kt_variant(flags_of("sapphirerapids")) == "amx"
    assert kt_variant(flags_of("zen4")) == "avx512_bf16"
    assert kt_variant(flags_of("zen5")) == "avx512_bf16"
    assert kt_variant(flags_of("avx2")) == "avx2"
    # Skylake-SP: AVX-512 F/BW without VNNI; kernels spell flags with or without the underscore.
    assert kt_variant(frozenset({"avx2", "avx512f", "avx512bw"})) == "avx512_base"
    assert kt_variant(frozenset({"avx2", "avx512f", "avx512bw", "avx512vnni"})) == "avx512_vnni"


def test_named_targets_pin_their_variant_and_portable_leaves_it_to_kt_kernel() -> None:
    def env(cpu: str) -> dict[str, str]:
        return KT.template_values(
            image_spec(get_engine("ktransformers"), cpu, cuda=cuda_target("12.8")),
            KT.toolchain(image_spec(get_engine("ktransformers"), cpu, cuda=cuda_target("12.8"))),
        )["engine_env"]

    own_config = {
        "SGLANG_APPLY_CONFIG_BACKUP": "none",  # SGLang reads the checkpoint's config.json
        # what NVIDIA's images tell the container toolkit, on this image's Debian base
        "NVIDIA_VISIBLE_DEVICES": "all",
        "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
        "NVIDIA_REQUIRE_CUDA": "cuda>=12.8",
    }
    assert env("sapphirerapids") == {**own_config, "KT_KERNEL_CPU_VARIANT": "amx"}
    assert env("zen4") == {**own_config, "KT_KERNEL_CPU_VARIANT": "avx512_bf16"}
    assert env("portable") == own_config


def test_source_builds_name_the_cpu_target_never_native() -> None:
    def build_env(spec_name: str) -> dict[str, str]:
        spec = UNPUBLISHED[spec_name]
        return dict(
            item.split("=", 1)
            for item in spec.engine.template_values(spec, spec.engine.toolchain(spec))["build_env"]
        )

    assert build_env("ktransformers-source-cuda12.8-sapphirerapids") == {
        "CPUINFER_CPU_INSTRUCT": "AVX512",
        "CPUINFER_ENABLE_AMX": "ON",
    }
    assert build_env("ktransformers-source-cuda12.8-portable") == {"CPUINFER_BUILD_ALL_VARIANTS": "1"}
    legacy = image_spec(get_engine("ktransformers-legacy"), "zen5", cuda=cuda_target("12.8"))
    env = dict(
        item.split("=", 1) for item in LEGACY.template_values(legacy, LEGACY.toolchain(legacy))["build_env"]
    )
    assert env == {
        "CC": "gcc-14",
        "CXX": "g++-14",
        "USE_NUMA": "1",
        "CPU_INSTRUCT": "AVX512",
        "TORCH_CUDA_ARCH_LIST": "'8.6;8.9;9.0;12.0'",
        "KTRANSFORMERS_FORCE_BUILD": "TRUE",
    }
    avx2 = image_spec(get_engine("ktransformers-legacy"), "avx2", cuda=cuda_target("12.8"))
    assert "CPU_INSTRUCT=AVX2" in LEGACY.template_values(avx2, LEGACY.toolchain(avx2))["build_env"]


def test_torch_comes_from_the_index_for_its_cuda() -> None:
    assert torch_index(cuda_target(None), "12.8") == "https://download.pytorch.org/whl/cpu"
    assert torch_index(cuda_target("13.0"), "12.8") == "https://download.pytorch.org/whl/cu130"
    assert torch_index(cuda_target("12.8"), "12.8") is None  # PyPI's own torch is that build
    assert KT.extra_index(cuda_target("12.8")) == ""
    assert (
        LEGACY.extra_index(cuda_target("12.8")) == " --extra-index-url https://download.pytorch.org/whl/cu128"
    )
    assert torch_arch_list(cuda_target("12.6")) == "8.6;8.9;9.0"


def test_what_a_kt_image_can_be_built_from() -> None:
    assert image_spec(get_engine("ktransformers"), "zen4").source.kind == "pypi"
    with pytest.raises(SpecError, match="has no CPU-only image"):
        image_spec(get_engine("ktransformers-legacy"), "zen4")
    from_pypi = ImageSpec.model_validate(
        image_spec(get_engine("llama.cpp"), "avx2").model_dump() | {"source": {"kind": "pypi", "ref": "1"}}
    )
    with pytest.raises(SpecError, match="not installed from PyPI wheels"):
        get_engine("llama.cpp").check_image(from_pypi)
    with pytest.raises(SpecError, match="not installed from PyPI wheels"):
        render_files(from_pypi)  # what every build renders first
    with pytest.raises(SpecError, match=r"torch 2.9.1, which PyTorch builds for CUDA 12.6, 12.8 only"):
        image_spec(get_engine("ktransformers"), "zen4", cuda=cuda_target("12.4"))
    with pytest.raises(SpecError, match="no kt-kernel wheels"):  # a source build compiles on Ubuntu 22.04
        _python_toolchain(cpu_target("zen4"), cuda_target("12.4"), BaseImages(), compiles=True)


def test_cuda_images_from_released_wheels_need_no_nvidia_cuda_image() -> None:
    """Their CUDA is torch's (the nvidia-*-cu12 wheels): every stage is Debian bookworm (Python 3.11 for
    kt-kernel's wheels), which `moe-stack base --suite bookworm` makes without a registry; the image sets
    what NVIDIA's images set for the container toolkit. A build from source compiles CUDA: NVIDIA's devel."""
    dockerfile = render_files(image_spec(get_engine("ktransformers"), "portable", cuda=cuda_target("12.8")))[
        "Dockerfile"
    ]
    bases = re.findall(r"^FROM (\S+)", dockerfile, re.MULTILINE)
    assert set(bases) - {"toolchain", "scratch"} == {PYTHON_CPU_BASE}, bases
    assert "nvidia/cuda" not in dockerfile
    for line in ("NVIDIA_DRIVER_CAPABILITIES=compute,utility", "NVIDIA_REQUIRE_CUDA=cuda>=12.8"):
        assert line in dockerfile
    labels = image_labels(image_spec(get_engine("ktransformers"), "portable", cuda=cuda_target("12.8")))
    assert labels["io.moe-stack.cuda-base"] == "torch-wheels"
    with pytest.raises(SpecError, match="drop --cuda-base debian"):
        _python_toolchain(cpu_target("zen4"), cuda_target("12.8"), BaseImages(cuda="debian"), compiles=False)
    legacy = LEGACY.toolchain(
        image_spec(get_engine("ktransformers-legacy"), "zen4", cuda=cuda_target("12.8"))
    )
    assert legacy.build_image.startswith("nvidia/cuda:12.8.1-devel-ubuntu24.04")


def test_a_wheelhouse_is_a_source_and_replaces_the_wheelhouse_stage(tmp_path: Path) -> None:
    (tmp_path / "kt_kernel-0.7.2-cp311-cp311-manylinux_2_35_x86_64.whl").write_bytes(b"")
    assert resolve_local(KT, str(tmp_path)) == tmp_path
    spec = image_spec(get_engine("ktransformers"), "avx2", tree=tmp_path, ref="0.7.2")
    assert isinstance(spec.source, LocalSource) and spec.source.holds == "wheels"
    assert plan_build(spec, tmp_path / "ctx", tmp_path).build_contexts == {"wheelhouse": str(tmp_path)}


def _stack(tmp_path: Path, engine: str = "ktransformers", **update: object) -> StackSpec:
    model = tmp_path / "DeepSeek-R1-IQ4_XS-00001-of-00009.gguf"
    values: dict[str, object] = {
        "project_name": "kt",
        "engine": engine,
        "image_ref": "kt:test",
        "model": model,
        "cpu_threads": 32,
        "numa_node_count": 2,
        "gpu": "nvidia",
        "config_dir": tmp_path / "hf",
        "ctx_size": 8192,
    }
    return StackSpec(**(values | update))


def test_sglang_arguments_from_a_stack(tmp_path: Path) -> None:
    args = KT.server_args(_stack(tmp_path, gpu_experts=6), None)
    assert args == [
        "--model-path",
        "/model-config",
        "--kt-weight-path",
        "/models",
        "--kt-method",
        "LLAMAFILE",
        "--kt-cpuinfer",
        "32",
        "--kt-threadpool-count",
        "2",
        "--host",
        "0.0.0.0",
        "--port",
        "8080",
        "--context-length",
        "8192",
        "--max-running-requests",
        "1",
        "--max-total-tokens",
        "8192",
        "--kt-num-gpu-experts",
        "6",
        "--enable-metrics",
    ]
    # The KV pool is what the stack serves: the context of each of its requests.
    two = KT.server_args(_stack(tmp_path, parallel=2), None)
    assert two[two.index("--max-total-tokens") + 1] == "16384"
    # No GPU experts asked for: still written, as 0. Without it sglang-kt configures no kt-kernel
    # experts and runs all of them on the GPU (seen on the H200: bench/results/kt-gpu-2026-12-01).
    unasked = KT.server_args(_stack(tmp_path), None)
    assert unasked[unasked.index("--kt-num-gpu-experts") + 1] == "0"
    # Python from the model's directory runs only when asked for (security review: it was always on).
    trusting = KT.server_args(_stack(tmp_path, trust_remote_code=True), None)
    assert trusting[-1] == "--trust-remote-code" and "--trust-remote-code" not in args
    with pytest.raises(
        StackError, match="llama.cpp does not read --config-dir, --trust-remote-code: drop them"
    ):
        LlamaCpp().server_args(_stack(tmp_path, engine="llama.cpp", gpu="none", trust_remote_code=True), None)
    bound = KT.server_args(
        _stack(tmp_path, numa_policy="membind", bind_nodes=(1, 3), numa_node_count=2), None
    )
    assert bound[bound.index("--kt-threadpool-count") :][:2] == ["--kt-threadpool-count", "2"]
    assert bound[bound.index("--kt-numa-nodes") :][:3] == ["--kt-numa-nodes", "1", "3"]
    assert LEGACY.server_args(_stack(tmp_path, engine="ktransformers-legacy"), None) == [
        "--model_path",
        "/model-config",
        "--gguf_path",
        "/models",
        "--cpu_infer",
        "32",
        "--cache_lens",
        "8192",
        "--host",
        "0.0.0.0",
        "--port",
        "8080",
    ]


@pytest.mark.parametrize(
    ("update", "message"),
    [
        ({"gpu": "none"}, "has no CPU-only server: give --gpu nvidia"),
        ({"config_dir": None}, "give --config-dir DIR"),
        ({"kt_method": "AMXINT4"}, "AMXINT4 reads weights from kt-kernel's converter, not a GGUF file"),
        ({"kt_method": "FP8"}, "FP8 reads weights from a safetensors checkpoint, not a GGUF file"),
        ({"cache_type": "q8_0", "mlock": True}, "does not read --cache-type, --mlock: drop them"),
        ({"override_tensors": ("exps=CPU",)}, "does not read --override-tensor/--experts-on-cpu: drop it"),
    ],
)
def test_what_ktransformers_refuses(tmp_path: Path, update: dict[str, object], message: str) -> None:
    with pytest.raises(StackError, match=message.replace("(", r"\(").replace(")", r"\)")):
        KT.server_args(_stack(tmp_path, **update), None)


def test_sglang_needs_the_checkpoints_weights_in_the_config_dir(tmp_path: Path) -> None:
    """SGLang loads attention, embeddings and router from --model-path ("Cannot find any model weights"
    without them); the legacy server reads only config and tokenizer there."""
    tmp_path.chmod(0o755)  # the engine's user reads the model and the directory in the container
    model = write_moe_gguf(tmp_path / "m.gguf", TINY_SHAPES["deepseek2"])  # what both servers load
    model.chmod(0o644)
    hf = tmp_path / "hf"
    hf.mkdir(mode=0o755)
    (hf / "config.json").write_text("{}")
    (hf / "config.json").chmod(0o644)

    def compose(engine: str, served: Path = model) -> tuple[int, str]:
        result = run_cli_in_process(
            "compose",
            "--engine",
            engine,
            "--model",
            str(served),
            "--config-dir",
            str(hf),
            "--gpu",
            "nvidia",
            "--image",
            f"ghcr.io/moe-stack/{engine}:test-cuda12.8-avx2",
            "--skip-image-checks",
            "--for-other-host",
            "--out",
            str(tmp_path / f"{engine}.yaml"),
        )
        return result.returncode, result.stdout + result.stderr

    code, output = compose("ktransformers")
    assert code != 0 and "has config.json but no weights (*.safetensors)" in output
    assert "fetch-model --hf" in output and "Traceback" not in output
    assert not (tmp_path / "ktransformers.yaml").exists()
    assert compose("ktransformers-legacy")[0] == 0
    (hf / "model-00001-of-00002.safetensors").write_bytes(b"")
    assert compose("ktransformers")[0] == 0
    # 0.2.4 has no Qwen3-MoE model class: refused in one line, 0.7.2 takes it.
    qwen3 = write_moe_gguf(tmp_path / "q.gguf", MoeShape(layers=2))
    qwen3.chmod(0o644)
    code, output = compose("ktransformers-legacy", qwen3)
    assert code != 0 and "Traceback" not in output
    assert "ktransformers-legacy can't load qwen3moe models like q.gguf" in output
    assert "deepseek2, llama, qwen2moe" in output
    assert compose("ktransformers", qwen3)[0] == 0


def test_the_config_dir_must_be_the_model_whose_experts_kt_kernel_reads(tmp_path: Path) -> None:
    """SGLang builds the model from --config-dir, kt-kernel reads the experts from --model by layer: a
    checkpoint of another model would fail only at load, in shape errors."""
    tmp_path.chmod(0o755)
    model = write_moe_gguf(tmp_path / "r1.gguf", TINY_SHAPES["deepseek2"])
    model.chmod(0o644)
    for arch in ("deepseek2", "qwen3next"):
        write_hf_checkpoint(tmp_path / arch, TINY_SHAPES[arch]).chmod(0o755)
        for path in (tmp_path / arch).iterdir():
            path.chmod(0o644)

    def compose(config_dir: Path) -> tuple[int, str]:
        result = run_cli_in_process(
            "compose", "--engine", "ktransformers", "--preset", "deepseek-r1-671b", "--model", str(model),
            "--config-dir", str(config_dir), "--gpu", "nvidia", "--skip-image-checks", "--for-other-host",
            "--out", str(tmp_path / "kt.yaml"),
        )  # fmt: skip
        return result.returncode, result.stdout + result.stderr

    code, output = compose(tmp_path / "qwen3next")
    assert code != 0 and "Traceback" not in output and not (tmp_path / "kt.yaml").exists()
    assert "is another model than r1.gguf (architecture qwen3next vs deepseek2; layers 4 vs 3)" in output
    assert compose(tmp_path / "deepseek2")[0] == 0


def test_amx_methods_need_an_amx_cpu(tmp_path: Path) -> None:
    zen4 = CpuInfo(flags=flags_of("zen4"), logical_cpus=64, physical_cores=32)
    converted = write_converted(tmp_path / "Qwen3-AMXINT8", pools=2, method="AMXINT8")
    with pytest.raises(
        StackError, match="AMXINT8 runs on AMX, and this CPU lacks amx_tile amx_int8 amx_bf16"
    ):
        get_engine("ktransformers").check_host(_stack(tmp_path, model=converted), zen4)
    get_engine("ktransformers").check_host(
        _stack(tmp_path, model=converted),
        CpuInfo(flags=flags_of("sapphirerapids"), logical_cpus=64, physical_cores=32),
    )
    get_engine("ktransformers").check_host(_stack(tmp_path), zen4)  # LLAMAFILE runs anywhere


def test_the_stack_binds_numa_memory_and_mounts_the_config(tmp_path: Path) -> None:
    service = compose_dict(_stack(tmp_path), "test", check_files=False)["services"]["engine"]
    assert service["cap_add"] == ["SYS_NICE"] and "environment" not in service  # no numactl policy asked for
    assert {
        "type": "bind",
        "source": str(tmp_path / "hf"),
        "target": "/model-config",
        "read_only": True,
    } in service["volumes"]


def test_gpu_experts_from_the_vram_plan() -> None:
    r1 = ModelFacts(
        arch="deepseek2",
        layers=58,
        expert_bytes=(6 * GIB,) * 58,
        other_bytes=14 * GIB,
        kv_heads=128,
        key_dim=192,
        value_dim=128,
        mla_dim=576,
        expert_count=256,
    )
    fitted = make_plan(r1, 24 * GIB, 512 * GIB, 16384, "q8_0", layout=CacheLayout(latent=True))
    spare = (
        24 * GIB - GIB - 14 * GIB - kv_cache_bytes(r1, 16384, "q8_0", CacheLayout(latent=True)) - 2 * GIB
    )  # 1 GiB margin
    one_expert_all_layers = 58 * 6 * GIB // 256
    assert fitted.gpu_experts_per_layer == spare // one_expert_all_layers > 0
    assert fitted.gpu_expert_layers == spare // (6 * GIB)


def test_presets_carry_ktransformers_without_llama_cpp_options() -> None:
    preset = get_preset("qwen3-235b-a22b")
    options = preset.engine_options(get_engine("ktransformers"))
    # No expert backend: the weights name it (a GGUF: LLAMAFILE; a kt-convert directory: its method).
    assert options.kt_method is None and preset.override_rules(get_engine("ktransformers")) == ()
    assert options.cache_type is None and options.gpu_layers is None and options.ctx_size == 16384
    assert "ktransformers-legacy" in get_preset("deepseek-r1-671b").engines
    assert "ktransformers-legacy" not in get_preset("qwen3-next-80b-a3b").engines


def test_server_wrapper_runs_the_named_module_with_the_python_on_path(tmp_path: Path) -> None:
    """The wrapper the entrypoint execs: `python3 -m MODULE ARGS`, python3 from PATH (the venv's)."""
    (tmp_path / "python3").write_text('#!/bin/sh\necho "$@"\n')
    (tmp_path / "python3").chmod(0o755)
    wrapper = Path(__file__).resolve().parents[2] / "dockerfiles/ktransformers/moe-stack-server"
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "MOE_STACK_SERVER_MODULE": "sglang.launch_server"}
    ran = subprocess.run(
        ["sh", str(wrapper), "--port", "8080"], env=env, capture_output=True, text=True, check=False
    )
    assert ran.returncode == 0 and ran.stdout == "-m sglang.launch_server --port 8080\n", ran.stderr
    unset = subprocess.run(
        ["sh", str(wrapper)], env={"PATH": env["PATH"]}, capture_output=True, text=True, check=False
    )
    assert unset.returncode != 0 and "MOE_STACK_SERVER_MODULE is not set" in unset.stderr


def test_served_name_metrics_and_sampling_in_ktransformers(tmp_path: Path) -> None:
    args = KT.server_args(_stack(tmp_path, served_name="deepseek-r1-671b"), None)
    assert args[args.index("--served-model-name") :][:3] == [
        "--served-model-name",
        "deepseek-r1-671b",
        "--enable-metrics",
    ]
    legacy = LEGACY.server_args(
        _stack(tmp_path, engine="ktransformers-legacy", served_name="r1", temperature=0.6, top_p=0.95), None
    )
    assert legacy[-6:] == ["--model_name", "r1", "--temperature", "0.6", "--top_p", "0.95"]
    with pytest.raises(StackError, match="ktransformers does not read --temperature, --top-k: drop them"):
        KT.server_args(
            _stack(tmp_path, temperature=0.6, top_k=20), None
        )  # SGLang: the model's generation config


def test_each_preset_gives_sglang_its_reasoning_and_tool_call_parsers(tmp_path: Path) -> None:
    """R1's <think> and V3-format tool calls, Qwen3's <think> and <tool_call> JSON, Qwen3-Next Instruct's
    tool calls only; a value the image's --help does not list is refused in one line."""
    expected = {
        "deepseek-r1-671b": ("deepseek-r1", "deepseekv3"),
        "qwen3-235b-a22b": ("qwen3", "qwen"),
        "qwen3-next-80b-a3b": (None, "qwen"),
    }
    for name, (reasoning, tools) in expected.items():
        stack = _stack(tmp_path).with_options(get_preset(name).engine_options(get_engine("ktransformers")))
        args = KT.server_args(stack, None)
        got = args[args.index("--reasoning-parser") + 1] if "--reasoning-parser" in args else None
        assert (got, args[args.index("--tool-call-parser") + 1]) == (reasoning, tools), name
    # sglang-kt 0.7.2's --help writes argparse's choices as the placeholder
    flags = {flag: "" for spelling in KT.flag_spellings for flag in spelling}
    flags["--reasoning-parser"] = "{deepseek-r1,deepseek-v3,qwen3,qwen3-thinking}"
    with pytest.raises(StackError, match=r"takes --reasoning-parser deepseek-r1 \| .* not 'qwen4'"):
        KT.server_args(_stack(tmp_path, reasoning_parser="qwen4"), flags)
    assert "qwen3" in KT.server_args(_stack(tmp_path, reasoning_parser="qwen3"), flags)


def test_a_stack_without_image_lets_kt_kernel_choose_its_variant() -> None:
    """A named CPU target pins kt-kernel's variant (the avx2 image runs AVX2 experts on an AMX Xeon):
    the image a KTransformers stack names without --image is the portable one, which pins none."""
    engine = get_engine("ktransformers")
    spec = default_image_spec(get_engine("ktransformers"), gpu=True)
    assert image_tag(spec).endswith("-cuda12.8-portable")
    assert "KT_KERNEL_CPU_VARIANT" not in engine.engine_env(spec)
    pinned = image_spec(get_engine("ktransformers"), "avx2", cuda=cuda_target("12.8"))
    assert engine.engine_env(pinned)["KT_KERNEL_CPU_VARIANT"] == "avx2"
    assert (
        default_image_spec(get_engine("llama.cpp"), gpu=False).cpu.name == "avx2"
    )  # other engines: unchanged


def test_the_recorded_sglang_contract_is_the_help_read_on_the_gpu() -> None:
    """dockerfiles/contracts/ktransformers.json (what compose/'s KTransformers stacks are checked
    against) is sglang-kt 0.7.2's --help as the H200 run printed it, parsed as an image build parses it."""
    help_text = (REPO / "bench/results/kt-gpu-2026-12-01/sglang-help.txt").read_text()
    recorded = recorded_contract(get_engine("ktransformers"))
    assert recorded is not None and recorded.ref == "0.7.2"
    assert recorded.flags == parse_contract(help_text, None)
    assert {"--kt-num-gpu-experts", "--reasoning-parser", "--tool-call-parser", "--api-key"} <= set(
        recorded.flags
    )
    assert (
        "qwen" in recorded.flags["--tool-call-parser"]
        and "deepseek-r1" in recorded.flags["--reasoning-parser"]
    )
