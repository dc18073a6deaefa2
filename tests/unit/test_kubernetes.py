"""Kubernetes manifests from the same stack as the compose file: valid against the API's schemas
(kubernetes-validate, strict, 1.37), mapped field by field, and carrying the compose file's command."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from builder.engines import get_engine
from builder.engines.base import StackSpec
from builder.errors import StackError
from builder.host.probe import HostFacts, probe
from builder.images.matrix import cuda_target
from builder.images.naming import image_spec, image_tag
from builder.models.synth_catalog import TINY
from builder.models.synth_moe import MoeShape, write_moe_gguf
from builder.platform.targets import CPU_TARGETS
from builder.spec import CudaTarget
from builder.stacks.assemble import assemble_stack
from builder.stacks.kubernetes import NFD_CPUID, KubeOptions, manifests, resource_name, to_kubernetes_yaml
from builder.stacks.memory_use import MemoryUse, memory_use
from builder.stacks.options import StackOptions
from builder.stacks.presets import load_presets
from tests.cli import run_cli
from tests.hosts import EPYC_9554_FLAGS, XEON_EMR_FLAGS, fake_host
from tests.specs import compose_dict

KUBERNETES = "1.37.0"
H200 = "NVIDIA H200, 9.0, 580.159.04, 143771\n"


def _host(tmp_path: Path, flags: str, sockets: int, smi: str) -> HostFacts:
    return probe(
        fake_host(tmp_path / "h", flags, sockets=sockets, cores=32, threads=2, node_gib=384),
        nvidia_smi_text=smi,
    )


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return write_moe_gguf(tmp_path / "models" / "moe.gguf", MoeShape(layers=4))


@pytest.fixture
def deepseek_model(tmp_path: Path) -> Path:
    """A tiny deepseek2 (what the DeepSeek-R1 preset is for)."""
    return write_moe_gguf(tmp_path / "models" / "moe.gguf", TINY["deepseek2"])


def _validate(documents: list[dict[str, object]]) -> None:
    for document in documents:
        kubernetes_validate.validate(document, KUBERNETES, strict=True)


@pytest.mark.parametrize("engine", ["llama.cpp", "ik_llama.cpp", "ktransformers"])
def test_every_preset_gives_valid_manifests(tmp_path: Path, engine: str) -> None:
    """Recorded hosts: a 2-socket EPYC with SMT, and a Xeon (Emerald Rapids) with an H200."""
    hosts = {
        "epyc": _host(tmp_path / "e", EPYC_9554_FLAGS, 2, ""),
        "xeon-h200": _host(tmp_path / "x", XEON_EMR_FLAGS, 1, H200),
    }
    config = tmp_path / "hf"
    config.mkdir(mode=0o755)
    (config / "config.json").write_text("{}")
    (config / "config.json").chmod(0o644)
    (config / "model.safetensors").write_bytes(b"")  # SGLang loads the non-expert weights from here
    for preset in load_presets().values():
        if engine not in preset.engines:
            continue
        for host_name, host in hosts.items():
            cpu = "zen4" if host_name == "epyc" else "sapphirerapids"
            image = image_tag(image_spec(get_engine(engine), cpu, cuda=_cuda(engine)))
            model = write_moe_gguf(
                tmp_path / "models" / f"{preset.architecture}.gguf", TINY[preset.architecture]
            )
            options = StackOptions(
                model_path=model,
                engine=engine,
                preset=preset.name,
                gpu="nvidia",
                image=image,
                config_dir=config if engine == "ktransformers" else None,
                skip_image_checks=True,
            )
            stack = assemble_stack(options, host)
            documents = manifests(stack, None, KubeOptions(memory=memory_use(stack)))
            _validate(documents)
            selector = documents[0]["spec"]["template"]["spec"]["nodeSelector"]  # type: ignore[index]
            if cpu == "sapphirerapids":
                assert selector["feature.node.kubernetes.io/cpu-cpuid.AMXTILE"] == "true"
            else:
                assert "feature.node.kubernetes.io/cpu-cpuid.AVX512VNNI" in selector


def _cuda(engine: str) -> CudaTarget:
    return cuda_target("13.0" if engine != "ktransformers" else "12.8")


def test_the_mapping_field_by_field(tmp_path: Path, deepseek_model: Path) -> None:
    key = tmp_path / "key"
    key.write_text("s3cret-key-value\n")
    key.chmod(0o644)
    host = _host(tmp_path, EPYC_9554_FLAGS, 2, H200 * 2)
    stack = assemble_stack(
        StackOptions(
            model_path=deepseek_model,
            engine="ik_llama.cpp",
            preset="deepseek-r1-671b",
            gpu="nvidia",
            gpus=(0, 1),
            hugetlbfs="off",
            api_key_file=key,
            threads=48,
            image="reg.local/ik:r-cuda13.0-zen4",
            skip_image_checks=True,
        ),
        host,
    )
    deployment, service = manifests(
        stack,
        None,
        KubeOptions(
            replicas=2,
            memory=MemoryUse(
                model_bytes=355 * 10**9, on_hugepages=False, kv_bytes=0, prompt_cache_bytes=8 * 2**30
            ),
            gpus=2,
            model_pvc="r1-weights",
            gpu_product="NVIDIA-H200",
        ),
    )
    _validate([deployment, service])
    spec = deployment["spec"]
    pod = spec["template"]["spec"]  # type: ignore[index]
    (container,) = pod["containers"]
    assert spec["replicas"] == 2 and spec["strategy"] == {"type": "Recreate"}  # type: ignore[index]
    # Guaranteed QoS: whole CPUs equal to the engine's threads, requests = limits (GPUs: limits only)
    resources = container["resources"]
    assert resources["requests"] == {
        "cpu": "48",
        # the model, ik's 8 GiB prompt cache and 2 GiB of the engine's own buffers
        "memory": f"{(355 * 10**9 + 10 * 2**30 + 2**30 - 1) // 2**30}Gi",
    }
    assert resources["limits"] == {**resources["requests"], "nvidia.com/gpu": "2"}
    assert pod["securityContext"]["runAsUser"] == 10001 and pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"], "add": ["SYS_NICE"]},
    }
    assert container["env"] == [{"name": "MOE_STACK_NUMA", "value": "interleave"}]  # two sockets
    assert pod["volumes"][0] == {
        "name": "models",
        "persistentVolumeClaim": {"claimName": "r1-weights", "readOnly": True},
    }
    secret = next(v for v in pod["volumes"] if v["name"] == "api-key")
    assert secret["secret"]["secretName"] == f"{resource_name(stack.project_name)}-api-key"
    assert "s3cret" not in yaml.safe_dump(deployment)  # the key itself never in a manifest
    assert container["startupProbe"]["failureThreshold"] == stack.start_period_s // 10 + 1
    assert pod["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-H200"
    assert pod["nodeSelector"]["feature.node.kubernetes.io/cpu-cpuid.AVX512F"] == "true"  # zen4 from the tag
    assert service["spec"]["ports"][0]["port"] == 8080  # type: ignore[index]
    text = to_kubernetes_yaml(
        [deployment, service], "moe-stack compose ...", f"{resource_name(stack.project_name)}-api-key"
    )
    assert (
        "&id" not in text and "kubectl create secret generic" in text and "cpuManagerPolicy: static" in text
    )
    assert [d["kind"] for d in yaml.safe_load_all(text)] == ["Deployment", "Service"]


def test_the_same_command_as_the_compose_file(tmp_path: Path, model: Path) -> None:
    host = _host(tmp_path, XEON_EMR_FLAGS, 1, H200)
    stack = assemble_stack(
        StackOptions(
            model_path=model, engine="llama.cpp", preset="qwen3-235b-a22b", gpu="nvidia", hugetlbfs="off"
        ),
        host,
    )
    deployment, _ = manifests(stack, None, KubeOptions(memory=memory_use(stack)))
    compose_command = compose_dict(stack, "x")["services"]["engine"]["command"]  # type: ignore[index]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["args"] == compose_command  # type: ignore[index]


def test_hugepages_and_refusals(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    stack = StackSpec(
        project_name="p_q", engine="llama.cpp", image_ref="i:1", model=model, cpu_threads=8, hugetlbfs="1G"
    )
    use = MemoryUse(model_bytes=100 * 2**30, on_hugepages=True, kv_bytes=0, prompt_cache_bytes=8 * 2**30)
    deployment, _ = manifests(stack, None, KubeOptions(memory=use))
    _validate([deployment])
    container = deployment["spec"]["template"]["spec"]["containers"][0]  # type: ignore[index]
    # the model once, as hugepages; memory: the prompt cache and the engine's buffers, not the model again
    assert container["resources"]["limits"]["hugepages-1Gi"] == "100Gi"
    assert container["resources"]["limits"]["memory"] == "10Gi"
    assert {"name": "hugepages", "mountPath": "/hugepages"} in container["volumeMounts"]
    assert resource_name("p_q") == "p-q"
    with pytest.raises(StackError, match="--mlock needs an unlimited memlock"):
        manifests(stack.model_copy(update={"mlock": True, "hugetlbfs": "off"}), None, KubeOptions())
    with pytest.raises(StackError, match="--monitoring is compose's"):
        manifests(stack.model_copy(update={"monitoring": True}), None, KubeOptions())
    with pytest.raises(StackError, match="--keep-prompts keeps the slots on a compose volume"):
        manifests(stack.model_copy(update={"keep_prompts": True}), None, KubeOptions())


def test_every_cpu_target_flag_nfd_labels_is_named() -> None:
    """The flags that tell targets apart all have NFD label names; the rest NFD leaves unlabelled."""
    simd = {
        flag
        for target in CPU_TARGETS.values()
        for flag in target.required_flags
        if flag.startswith(("avx", "amx")) or flag == "fma"
    }
    assert simd <= set(NFD_CPUID)


@pytest.mark.cli
def test_compose_format_kubernetes_writes_valid_manifests(tmp_path: Path, model: Path) -> None:
    out = tmp_path / "stack.k8s.yaml"
    result = run_cli(
        "compose",
        "--model",
        str(model),
        "--engine",
        "ik_llama.cpp",
        "--preset",
        "qwen3-235b-a22b",
        "--gpu",
        "nvidia",
        "--for-other-host",
        "--threads",
        "32",
        "--skip-image-checks",
        "--format",
        "kubernetes",
        "--replicas",
        "2",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    documents = list(yaml.safe_load_all(out.read_text()))
    _validate(documents)
    assert [d["kind"] for d in documents] == ["Deployment", "Service"] and documents[0]["spec"][
        "replicas"
    ] == 2
    bad = run_cli("compose", "--model", str(model), "--format", "helm", "--out", str(tmp_path / "x.yaml"))
    assert bad.returncode == 1 and "--format 'helm': choose compose or kubernetes" in bad.stderr
    assert not (tmp_path / "x.yaml").exists()


@pytest.mark.cli
def test_a_newline_in_a_model_name_injects_nothing(tmp_path: Path, model: Path) -> None:
    """A newline in a model file name (a hub may list one) ended the manifest's generated-by comment and
    started whole documents (a privileged hostPID Pod passed kubernetes-validate): refused at the model, and
    the comment can't be broken by anything else in the command."""
    hostile = model.with_name("x.gguf\n---\nkind: Pod\nspec: {hostPID: true}\n#.gguf")
    hostile.write_bytes(model.read_bytes())
    out = tmp_path / "stack.k8s.yaml"
    result = run_cli(
        "compose",
        "--model",
        str(hostile),
        "--skip-image-checks",
        "--for-other-host",
        "--threads",
        "4",
        "--format",
        "kubernetes",
        "--out",
        str(out),
    )
    assert result.returncode == 1 and "holds a control character" in result.stderr and not out.exists()
    text = to_kubernetes_yaml([{"kind": "Service"}], "moe-stack compose --project 'a\n---\nkind: Pod'", None)
    assert [d["kind"] for d in yaml.safe_load_all(text)] == ["Service"] and "a\\n---\\nkind: Pod" in text
