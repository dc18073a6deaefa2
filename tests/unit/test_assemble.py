"""What goes into a stack, assembled directly from typed options on recorded hosts (no CLI)."""

from __future__ import annotations

import socket
from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import ValidationError

from builder.engines import get_engine
from builder.engines.compute_buffers import gpu_reserve
from builder.errors import SpecError, StackError
from builder.host.probe import HostFacts, probe
from builder.images.image_facts import ImageFacts
from builder.images.naming import short_ref
from builder.images.recorded_contracts import recorded_contract
from builder.models.formats import GGUF
from builder.models.gguf_facts import read_facts
from builder.models.kv_cache import CacheLayout, kv_cache_bytes
from builder.models.planner import DEFAULT_VRAM_MARGIN, GIB
from builder.models.synth_moe import MoeShape, write_moe_gguf
from builder.models.synth_shapes import TINY_SHAPES
from builder.platform.pins import pinned_ref
from builder.platform.targets import cpu_target
from builder.spec import EXPERTS_ON_CPU_RULE, EngineOptions
from builder.stackfile.host_checks import free_local_port
from builder.stacks import pinned_memory
from builder.stacks.assemble import (
    assemble_stack,
    check_architecture,
    check_ports,
    plan_stack,
    served_name_for,
)
from builder.stacks.options import StackOptions
from builder.stacks.pinned_memory import check_pinned, pinned_bytes, pinned_finding
from tests.hosts import EPYC_9554_FLAGS, epyc_host, fake_host
from tests.specs import compose_dict, opened

AVX2_FLAGS = " ".join(cpu_target("avx2").required_flags) + " fpu sse4_2 ht"
from tests.kt_layout import write_converted


@pytest.fixture
def epyc(tmp_path: Path) -> HostFacts:
    """Two sockets of 32 Zen 4 cores with SMT, 288 GiB each."""
    return epyc_host(tmp_path / "h", sockets=2, node_gib=288)


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return write_moe_gguf(tmp_path / "models" / "moe.gguf", MoeShape(layers=4))


@pytest.fixture
def deepseek_model(tmp_path: Path) -> Path:
    """A tiny deepseek2 (what the DeepSeek-R1 preset is for)."""
    return write_moe_gguf(tmp_path / "models" / "moe.gguf", TINY_SHAPES["deepseek2"])


def test_preset_given_options_and_host_placement(epyc: HostFacts, deepseek_model: Path) -> None:
    options = StackOptions(
        model_path=deepseek_model,
        engine="ik_llama.cpp",
        preset="deepseek-r1-671b",
        gpu="nvidia",
        engine_options=EngineOptions(ctx_size=8192, mla=None),
    )
    stack = assemble_stack(options, epyc)
    assert stack.ctx_size == 8192 and stack.mla is None  # given, even as None, wins over the preset's 3
    assert stack.cache_type == "q8_0" and stack.fused_moe is True and stack.gpu_layers == 99  # the preset's
    assert stack.override_tensors == (EXPERTS_ON_CPU_RULE,)
    assert (
        stack.cpu_threads == 64 and stack.numa_policy == "interleave" and stack.numa_node_count == 2
    )  # physical cores
    # no --image: the engine's published CUDA image this Zen 4 host runs (a GPU stack on its CPU image
    # would never use the GPU; the avx2 CUDA image of ik_llama.cpp was never built)
    assert (
        stack.image_ref
        == f"ghcr.io/moe-stack/ik-llama-cpp:{short_ref(pinned_ref('ik_llama.cpp'))}-cuda13.0-zen4"
    )
    assert stack.start_period_s >= 60 and stack.project_name.startswith("moe-stack-moe-")


def test_user_rules_come_first_and_repeat_once(epyc: HostFacts, model: Path) -> None:
    options = StackOptions(
        model_path=model,
        override_tensor=("blk\\.0\\.=CUDA0", EXPERTS_ON_CPU_RULE),
        experts_on_cpu=True,
        numa_nodes=(1,),
        threads=8,
    )
    stack = assemble_stack(options, epyc)
    assert stack.override_tensors == ("blk\\.0\\.=CUDA0", EXPERTS_ON_CPU_RULE)
    assert (stack.numa_policy, stack.bind_nodes, stack.cpu_threads, stack.numa_node_count) == (
        "cpunodebind",
        (1,),
        8,
        1,
    )


def test_a_vram_plan_replaces_the_presets_rule(epyc: HostFacts, model: Path) -> None:
    # The engine's compute reserve (llama.cpp at the preset's 16k and -ub 2048), attention and a 16k
    # q8_0 cache, and 3 of the 4 layers' experts, with half a layer's to spare
    facts = read_facts(model)
    held = (
        facts.gpu_weight_bytes
        + kv_cache_bytes(facts, 16384, "q8_0", CacheLayout())
        + gpu_reserve(get_engine("llama.cpp").buffer_fits, facts, 16384, 2048, latent=False)
    )
    vram_gb = (held + DEFAULT_VRAM_MARGIN + 3.5 * facts.expert_bytes[0]) / GIB  # the margin kept free
    options = StackOptions(model_path=model, preset="qwen3-235b-a22b", fit_vram_gb=(vram_gb,), gpu="nvidia")
    stack = assemble_stack(options, epyc)
    assert stack.override_tensors == ("blk\\.(0|1|2)\\.ffn_.*_exps\\.weight=CUDA0", EXPERTS_ON_CPU_RULE)
    # KTransformers' preset keeps an f16 cache (12.5 MiB more here): it places experts itself, by count.
    kt = assemble_stack(
        options.model_copy(update={"engine": get_engine("ktransformers"), "fit_vram_gb": (3.035,)}), epyc
    )
    assert kt.override_tensors == () and kt.gpu_experts == 7


def test_for_other_host_ignores_this_topology(epyc: HostFacts, model: Path) -> None:
    stack = assemble_stack(StackOptions(model_path=model, for_other_host=True, threads=16), epyc)
    assert (stack.numa_policy, stack.cpuset, stack.cpu_threads, stack.numa_node_count) == (
        "none",
        None,
        16,
        1,
    )


def test_refusals(epyc: HostFacts, model: Path) -> None:
    with pytest.raises(SpecError, match="more than the 64 physical cores"):
        assemble_stack(StackOptions(model_path=model, threads=65), epyc)
    with pytest.raises(SpecError, match="--fit-vram-gb sizes what a GPU holds and --gpu none gives"):
        assemble_stack(StackOptions(model_path=model, fit_vram_gb=(24.0,)), epyc)
    with pytest.raises(SpecError, match="--cpu-image adds a CPU-only profile"):
        plan_stack(StackOptions(model_path=model, cpu_image="img:cpu", skip_image_checks=True), epyc)
    with pytest.raises(StackError, match="AMXINT8 reads weights from kt-kernel's converter, not a GGUF"):
        assemble_stack(
            StackOptions(
                model_path=model,
                engine="ktransformers",
                gpu="nvidia",
                engine_options=EngineOptions(kt_method="AMXINT8"),
            ),
            epyc,
        )
    converted = write_converted(model.parent / "moe-AMXINT8", pools=2, method="AMXINT8")
    with pytest.raises(StackError, match="AMXINT8 runs on AMX, and this CPU lacks"):
        assemble_stack(StackOptions(model_path=converted, engine="ktransformers", gpu="nvidia"), epyc)
    with pytest.raises(ValidationError, match="hugetlbfs"):
        StackOptions(model_path=model, hugetlbfs="3M")  # type: ignore[arg-type]


def test_a_gpu_stack_names_a_cuda_image_the_hosts_driver_runs(tmp_path: Path, model: Path) -> None:
    """No --image: the CPU image `moe-stack build` builds by default for a CPU stack; for a GPU stack a
    published (built) one: the newest CUDA release published that the host's driver runs (570.x: not
    13.0; 12.8 was never built, 12.4 was), at a CPU target this host has."""
    host = probe(
        fake_host(tmp_path / "g", EPYC_9554_FLAGS, sockets=1, cores=8, threads=2, node_gib=64),
        nvidia_smi_text="NVIDIA GeForce RTX 4090, 8.9, 570.86.15, 24564\n",
    )
    tag = short_ref(pinned_ref("llama.cpp"))
    images = {
        gpu: assemble_stack(StackOptions(model_path=model, gpu=gpu, skip_image_checks=True), host).image_ref
        for gpu in ("none", "nvidia")
    }
    assert images == {
        "none": f"ghcr.io/moe-stack/llama-cpp:{tag}-cpu-avx2",
        "nvidia": f"ghcr.io/moe-stack/llama-cpp:{tag}-cuda12.4-avx2",
    }
    # Another host: neither this driver nor this CPU says anything there; the default target's published
    # CUDA image
    elsewhere = StackOptions(model_path=model, gpu="nvidia", skip_image_checks=True, for_other_host=True)
    assert assemble_stack(elsewhere, host).image_ref.endswith("-cuda12.4-avx2")
    # ik_llama.cpp on an AVX2-only host: no published GPU image fits, the unbuilt default is said
    avx2_host = probe(
        fake_host(tmp_path / "a", AVX2_FLAGS, sockets=1, cores=8, threads=2, node_gib=64),
        nvidia_smi_text="NVIDIA GeForce RTX 4090, 8.9, 580.95.05, 24564\n",
    )
    options = StackOptions(model_path=model, engine="ik_llama.cpp", gpu="nvidia", skip_image_checks=True)
    planned = plan_stack(options.model_copy(update={"port": free_local_port()}), avx2_host)
    assert planned.stack.image_ref.endswith("-cuda13.0-avx2")
    assert any("no test or recorded run has built it" in note for note in planned.notes)


def test_plan_without_image_checks(epyc: HostFacts, model: Path) -> None:
    plan = plan_stack(
        StackOptions(model_path=model, gpu="nvidia", cpu_image="img:cpu", skip_image_checks=True, port=18123),
        epyc,
    )
    assert plan.facts is None and plan.cpu_profile is not None
    cpu_stack, cpu_facts = plan.cpu_profile
    assert cpu_stack.image_ref == "img:cpu" and cpu_stack.gpu == "none" and cpu_facts is None


def test_served_name_defaults_to_the_preset_else_the_models_name(
    epyc: HostFacts, model: Path, tmp_path: Path
) -> None:
    assert assemble_stack(StackOptions(model_path=model), epyc).served_name == "moe"
    assert (
        assemble_stack(StackOptions(model_path=model, preset="qwen3-235b-a22b"), epyc).served_name
        == "qwen3-235b-a22b"
    )
    assert assemble_stack(StackOptions(model_path=model, served_name="mine"), epyc).served_name == "mine"
    split = Path("/m/DeepSeek-R1-IQ4_XS-00001-of-00009.gguf")
    assert served_name_for(GGUF.stem(split)) == "DeepSeek-R1-IQ4_XS"
    assert served_name_for(GGUF.stem(Path("/m/_odd name!.gguf"))) == "odd-name-"


def test_pinned_cpu_weights_are_said_and_refused_where_they_do_not_fit(
    tmp_path: Path, deepseek_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ik's CUDA build pins CPU-placed tensors (CUDA_Host) whatever mmap says; mainline only with
    --no-mmap."""
    small = probe(
        fake_host(tmp_path / "small", EPYC_9554_FLAGS, sockets=2, cores=32, threads=2, node_gib=4),
        nvidia_smi_text="",
    )
    ik = StackOptions(
        model_path=deepseek_model,
        engine="ik_llama.cpp",
        gpu="nvidia",
        image="ik:1",
        skip_image_checks=True,
        port=free_local_port(),
    )
    with pytest.raises(
        SpecError,
        match=r"ik_llama.cpp would keep .* of CPU weights in page-locked \(pinned\) memory "
        r"and this host has 8.0 GiB .*no setting of ik_llama.cpp avoids it",
    ):
        plan_stack(ik, small)
    mainline = ik.model_copy(
        update={"engine": get_engine("llama.cpp"), "engine_options": EngineOptions(mmap=False)}
    )
    with pytest.raises(SpecError, match=r"keep the weights mapped \(--mmap\)"):
        plan_stack(mainline, small)
    mapped = plan_stack(mainline.model_copy(update={"engine_options": EngineOptions()}), small)
    assert mapped.notes == () and pinned_bytes(mapped.stack) == 0
    assert compose_dict(mapped.stack, "x", check_files=False)["x-moe-stack"].get("cpu-weights") is None  # type: ignore[union-attr]
    # Over half the RAM: said, not refused.
    monkeypatch.setattr(pinned_memory, "HEADROOM_BYTES", 0)
    stack = plan_stack(ik.model_copy(update={"gpu": "none"}), small).stack.model_copy(
        update={"gpu": "nvidia"}
    )
    pinned = pinned_bytes(stack)
    assert pinned == sum(read_facts(deepseek_model).expert_bytes) + read_facts(deepseek_model).embedding_bytes
    assert "keeps" in str(check_pinned(stack, int(pinned * 1.5))) and check_pinned(stack, pinned * 3) is None
    assert compose_dict(stack, "x", check_files=False)["x-moe-stack"]["cpu-weights"] == "pinned"  # type: ignore[index]
    assert (
        pinned_finding(400 * GIB, 576 * GIB)[0] == "WARN"
        and pinned_finding(400 * GIB, 384 * GIB)[0] == "FAIL"
    )


def test_an_engine_that_names_no_such_architecture_is_refused(deepseek_model: Path) -> None:
    """An image of an engine version whose tree has no loader for the model's architecture (its
    llama-arch.cpp names it not) is refused at emit time, saying whether the pinned version's does."""
    old = ImageFacts(
        image="ik:9c4e21a",
        engine=get_engine("ik_llama.cpp"),
        engine_ref="9c4e21a",
        variant="9c4e21a-cpu-avx2",
        cpu_target="avx2",
        required_cpu_flags=(),
        server_flags={},
        architectures=("llama", "qwen3moe"),
    )
    with pytest.raises(
        StackError,
        match=r"ik_llama.cpp 9c4e21a \(ik:9c4e21a\) can't load deepseek2 models like "
        rf"moe.gguf .*the image of ik_llama.cpp {short_ref(_recorded_ref('ik_llama.cpp'))} does",
    ):
        check_architecture(old, opened(deepseek_model, "ik_llama.cpp"))
    check_architecture(replace(old, architectures=("deepseek2",)), opened(deepseek_model, "ik_llama.cpp"))
    check_architecture(replace(old, architectures=()), opened(deepseek_model, "ik_llama.cpp"))  # not recorded


@pytest.mark.parametrize(
    "extra",
    [{}, {"experts_on_cpu": True}, {"fit_vram_gb": (24.0,)}],
    ids=["no-preset", "experts-on-cpu", "fit-vram-gb"],
)
@pytest.mark.parametrize("engine", ["ik_llama.cpp", "llama.cpp"])
def test_a_gpu_stack_puts_every_layer_on_the_gpu(
    epyc: HostFacts, deepseek_model: Path, engine: str, extra: dict[str, object]
) -> None:
    """Without a preset or --gpu-layers, a GPU stack's command still offloads every layer (attention and
    KV cache on the GPU): ik_llama.cpp's own default is none, which served from the CPU."""
    layers = read_facts(deepseek_model).layers
    stack = assemble_stack(
        StackOptions(model_path=deepseek_model, engine=engine, gpu="nvidia", **extra),  # type: ignore[arg-type]
        epyc,
    )
    command = get_engine(engine).server_args(stack, None)
    offloaded = int(command[command.index("--n-gpu-layers") + 1])
    assert offloaded > layers  # every layer and the output
    cpu = assemble_stack(StackOptions(model_path=deepseek_model, engine=engine), epyc)
    assert "--n-gpu-layers" not in get_engine(engine).server_args(cpu, None)
    given = StackOptions(
        model_path=deepseek_model, engine=engine, gpu="nvidia", engine_options=EngineOptions(gpu_layers=2)
    )
    assert assemble_stack(given, epyc).gpu_layers == 2  # the user's count stands


@pytest.mark.parametrize(
    ("engine", "preset"), [("ik_llama.cpp", "deepseek-r1-671b"), ("llama.cpp", "qwen3-235b-a22b")]
)
def test_a_cpu_stack_of_a_gpu_preset_leaves_its_gpu_layout_out(
    epyc: HostFacts, tmp_path: Path, engine: str, preset: str
) -> None:
    """--gpu none with a preset: no layer count, -ot rule, offload batch or --no-mmap of the preset's (what
    the CPU-only profile leaves out), its other options kept; the user's own layout options stand."""
    arch = "deepseek2" if preset.startswith("deepseek") else "qwen3moe"
    path = write_moe_gguf(tmp_path / "models" / f"{arch}.gguf", TINY_SHAPES[arch])
    options = StackOptions(model_path=path, engine=engine, preset=preset, gpu="nvidia")
    gpu = assemble_stack(options, epyc)
    cpu = assemble_stack(options.model_copy(update={"gpu": "none"}), epyc)
    assert gpu.gpu_layers == 99 and gpu.override_tensors == (EXPERTS_ON_CPU_RULE,)
    assert (cpu.gpu_layers, cpu.override_tensors, cpu.moe_offload_batch, cpu.mmap) == (None, (), None, None)
    assert cpu.cache_type == gpu.cache_type == "q8_0" and cpu.flash_attention == gpu.flash_attention
    command = get_engine(engine).server_args(cpu, None)
    assert "--n-gpu-layers" not in command and "--override-tensor" not in command
    layout = EngineOptions(gpu_layers=2, mmap=False)
    given = options.model_copy(update={"gpu": "none", "engine_options": layout, "experts_on_cpu": True})
    kept = assemble_stack(given, epyc)
    assert (kept.gpu_layers, kept.mmap, kept.override_tensors) == (2, False, (EXPERTS_ON_CPU_RULE,))


def test_ports_are_checked_only_where_the_stack_publishes_them(epyc: HostFacts, model: Path) -> None:
    """A Kubernetes manifest or another host's compose file publishes nothing here: a port this host
    holds (the README's demo on 8080, say) must not refuse it."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        options = StackOptions(model_path=model, port=held.getsockname()[1], skip_image_checks=True)
        with pytest.raises(StackError, match="is already in use"):
            check_ports(plan_stack(options, epyc), options)
        for elsewhere in ({"ports_here": False}, {"for_other_host": True}):
            moved = options.model_copy(update=elsewhere)
            check_ports(plan_stack(moved, epyc), moved)


def test_a_plan_that_does_not_fit_names_its_levers(epyc: HostFacts, model: Path) -> None:
    options = StackOptions(
        model_path=model, gpu="nvidia", fit_vram_gb=(1.2,), engine_options=EngineOptions(ctx_size=32768)
    )
    with pytest.raises(
        SpecError, match=r"more than the 1\.2 GiB given less its 1\.0 GiB margin\. Alone, cheapest"
    ):
        assemble_stack(options, epyc)


def _recorded_ref(engine: str) -> str:
    """The ref of the tree whose contract is recorded (what the messages name; a pin bump moves the pin
    first, the record once that tree is built)."""
    contract = recorded_contract(get_engine(engine))
    assert contract is not None
    return contract.ref
