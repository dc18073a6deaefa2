"""Host placement in a running stack: the NUMA policy reaches the engine, the cpuset holds, the API key
is enforced; without SYS_NICE the entrypoint says why numactl can't work."""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from python_on_whales import DockerClient

from builder.engines.base import StackSpec
from builder.images.image_facts import read_image_facts
from builder.running.run import down, up
from builder.stackfile.host_checks import free_local_port
from builder.stacks.compose import compose_stack, write_stack
from builder.stacks.document import cpu_only
from tests.integration.conftest import StackFactory, build_engine_image
from tests.integration.starts import docker_run, run_in

pytestmark = pytest.mark.integration


def _status(url: str, key: str | None = None) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def test_numa_cpuset_and_api_key(
    base_image: str, moe_model: Path, start_stack: StackFactory, tmp_path: Path
) -> None:
    key = tmp_path / "api-key"
    key.write_text("moe-stack-test-key\n")
    key.chmod(0o644)
    image = build_engine_image("llama.cpp", "avx2", base_image)
    stack = start_stack(
        image, moe_model, numa_policy="interleave", cpuset="0", cpu_threads=1, api_key_file=key
    )
    engine = stack.client.compose.ps()[0]
    assert "interleave" in run_in(engine, ["cat", "/proc/1/numa_maps"]), (
        "the engine's memory is not interleaved"
    )
    status = run_in(engine, ["cat", "/proc/1/status"])
    assert "Cpus_allowed_list:\t0\n" in status + "\n", "the cpuset does not hold"
    assert _status(f"{stack.url}/v1/models") == 401
    assert _status(f"{stack.url}/v1/models", "moe-stack-test-key") == 200


def test_numa_policy_without_sys_nice_is_named(base_image: str) -> None:
    image = build_engine_image("llama.cpp", "avx2", base_image)
    result = docker_run(["-e", "MOE_STACK_NUMA=interleave", image.tag, "--version"], timeout=120)
    assert result.returncode == 71
    assert "needs cap_add: [SYS_NICE]" in result.stderr


@pytest.fixture
def reserved_hugepages() -> Iterator[int]:
    """Reserve 2 MiB pages on the host for one test (root needed), then give them back."""
    knob = Path("/proc/sys/vm/nr_hugepages")
    before = int(knob.read_text())
    try:
        knob.write_text("256\n")
    except OSError as err:
        if os.environ.get("CI"):
            pytest.fail(f"CI runs as root and must be able to reserve hugepages: {err}")
        pytest.skip(f"can't reserve hugepages here ({err})")
    try:
        yield int(knob.read_text())
    finally:
        knob.write_text(f"{before}\n")


def _free_hugepages() -> int:
    return int(
        next(
            line.split()[1]
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("HugePages_Free:")
        )
    )


def test_ik_weights_come_from_reserved_hugepages(
    reserved_hugepages: int, base_image: str, moe_model: Path, start_stack: StackFactory
) -> None:
    assert reserved_hugepages == 256 and _free_hugepages() == 256
    stack = start_stack(build_engine_image("ik_llama.cpp", "avx2", base_image), moe_model, hugepages=True)
    engine = stack.client.compose.ps()[0]
    assert "KernelPageSize:     2048 kB" in run_in(engine, ["cat", "/proc/1/smaps"])
    assert _free_hugepages() < 256, "the engine took no pages from the reserved pool"
    assert "-thp" in engine.config.cmd


def test_llama_cpp_maps_a_model_staged_on_hugetlbfs(
    reserved_hugepages: int, base_image: str, moe_model: Path, start_stack: StackFactory
) -> None:
    """Mainline has no -thp: the entrypoint copies the model onto the stack's hugetlbfs volume and the
    engine's mmap of that copy is backed by the reserved 2 MiB pages."""
    assert _free_hugepages() == reserved_hugepages
    stack = start_stack(build_engine_image("llama.cpp", "avx2", base_image), moe_model, hugetlbfs="2M")
    engine = stack.client.compose.ps()[0]
    smaps = run_in(engine, ["cat", "/proc/1/smaps"])
    mapping = smaps.split(f"/hugepages/{moe_model.name}\n", 1)
    assert len(mapping) == 2, "the engine did not map the staged copy"
    assert "KernelPageSize:     2048 kB" in mapping[1].split("VmFlags", 1)[0]
    pages_for_model = -(-moe_model.stat().st_size // 2**21)
    assert reserved_hugepages - _free_hugepages() >= pages_for_model
    assert _status(f"{stack.url}/v1/models") == 200
    assert f"staging /models/{moe_model.name} on hugepages" in engine.logs()


def test_cpu_profile_runs_where_there_is_no_gpu(base_image: str, moe_model: Path, tmp_path: Path) -> None:
    """A file with gpu/cpu profiles: `--profile cpu` starts only the CPU service, from the CPU image, and
    never touches the GPU service's image (which doesn't exist here)."""
    image = build_engine_image("llama.cpp", "avx2", base_image)
    port = free_local_port()
    gpu_stack = StackSpec(
        project_name=f"mst-profiles-{port}",
        engine="llama.cpp",
        model=moe_model,
        port=port,
        cpu_threads=2,
        image_ref="localhost/moe-stack-test/llama-cpp:absent-cuda12.8-avx2",
        gpu="nvidia",
        gpu_layers=99,
    )
    document = compose_stack(
        gpu_stack, "pytest", cpu_profile=(cpu_only(gpu_stack, image.tag), read_image_facts(image.tag))
    )
    compose_file = write_stack(document, tmp_path / "compose.yaml")
    try:
        up(compose_file, timeout_s=180, profile="cpu")
        running = DockerClient(compose_files=[compose_file], compose_profiles=["*"]).compose.ps()
        assert [c.config.labels["com.docker.compose.service"] for c in running] == ["engine-cpu"]
        assert _status(f"http://127.0.0.1:{port}/v1/models") == 200
    finally:
        down(compose_file)
