"""Every stack in compose/ passes `docker compose config` for each of its profiles: the GPU service
with its device request, the CPU-only one without (KTransformers stacks: the GPU service alone)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from python_on_whales import DockerClient

from builder.engines.base import StackSpec
from builder.spec import EXPERTS_ON_CPU_RULE
from builder.stacks.compose import compose_stack, write_stack

pytestmark = pytest.mark.integration

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "compose").glob("*.*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_passes_compose_config(docker_client: DockerClient, path: Path) -> None:
    gpu = _config(path, "gpu")
    # KTransformers serves only on the GPU: its stacks have no profiles and one service.
    profiles = yaml.safe_load(path.read_text())["x-moe-stack"].get("profiles") or []
    cpu = _config(path, "cpu") if "cpu" in profiles else {}
    assert list(gpu) == ["engine"] and list(cpu) in (["engine-cpu"], [])
    assert (_config(path, None) == {}) == bool(cpu), "a file with profiles starts nothing without one"
    device = gpu["engine"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert device["capabilities"] == ["gpu"] and device["driver"] == "nvidia"
    services = [gpu["engine"]]
    if cpu:
        assert "deploy" not in cpu["engine-cpu"] and "cpu" in cpu["engine-cpu"]["image"]
        services.append(cpu["engine-cpu"])
    for service in services:
        assert service["cap_add"] == ["SYS_NICE"] and service["cap_drop"] == ["ALL"]
        assert service["ports"][0]["host_ip"] == "127.0.0.1"
        assert service["shm_size"] == "1073741824"


def _config(path: Path, profile: str | None) -> dict[str, dict]:
    chosen = ["--profile", profile] if profile else []
    result = subprocess.run(
        ["docker", "compose", "-f", str(path), *chosen, "config", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["services"]


@pytest.mark.parametrize("gpu", ["nvidia", "cdi"])
def test_a_multi_gpu_stack_passes_compose_config(
    docker_client: DockerClient, tmp_path: Path, gpu: str
) -> None:
    """`--gpus 0,1` with a two-GPU plan: device ids instead of `count: all`, and -ts in the command."""
    model = tmp_path / "m" / "R1-00001-of-00009.gguf"
    stack = StackSpec(
        project_name="multi-gpu",
        engine="ik_llama.cpp",
        image_ref="ik:test",
        model=model,
        cpu_threads=32,
        gpu=gpu,
        gpu_ids=(0, 1),
        tensor_split=(24, 24),
        gpu_layers=99,
        override_tensors=(
            r"blk\.(3|4)\.ffn_.*_exps\.weight=CUDA0",
            r"blk\.(31)\.ffn_.*_exps\.weight=CUDA1",
            EXPERTS_ON_CPU_RULE,
        ),
    )
    path = write_stack(compose_stack(stack, "pytest", check_files=False), tmp_path / "compose.yaml")
    engine = _config(path, None)["engine"]
    device = engine["deploy"]["resources"]["reservations"]["devices"][0]
    ids = ["0", "1"] if gpu == "nvidia" else ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]
    assert device["device_ids"] == ids and "count" not in device
    assert engine["command"][engine["command"].index("--tensor-split") + 1] == "24,24"
