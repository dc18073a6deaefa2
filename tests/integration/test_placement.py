"""Host placement in a running stack: the NUMA policy reaches the engine, the cpuset holds, the API key
is enforced; without SYS_NICE the entrypoint says why numactl can't work."""

from __future__ import annotations

import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import StackFactory, build_engine_image

pytestmark = pytest.mark.integration


def _status(url: str, key: str | None = None) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def test_numa_cpuset_and_api_key(base_image: str, moe_model: Path, start_stack: StackFactory, tmp_path: Path) -> None:
    key = tmp_path / "api-key"
    key.write_text("moe-stack-test-key\n")
    key.chmod(0o644)
    image = build_engine_image("llama.cpp", "avx2", base_image)
    stack = start_stack(image, moe_model, numa="interleave", cpuset="0", threads=1, api_key_file=key)
    engine = stack.client.compose.ps()[0]
    assert "interleave" in engine.execute(["cat", "/proc/1/numa_maps"]), "the engine's memory is not interleaved"
    status = engine.execute(["cat", "/proc/1/status"])
    assert "Cpus_allowed_list:\t0\n" in status + "\n", "the cpuset does not hold"
    assert _status(f"{stack.url}/v1/models") == 401
    assert _status(f"{stack.url}/v1/models", "moe-stack-test-key") == 200


def test_numa_policy_without_sys_nice_is_named(base_image: str) -> None:
    image = build_engine_image("llama.cpp", "avx2", base_image)
    result = subprocess.run(["docker", "run", "--rm", "-e", "MOE_STACK_NUMA=interleave", image.tag, "--version"],
                            capture_output=True, text=True, timeout=120)
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
    return int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                    if line.startswith("HugePages_Free:")))


def test_ik_weights_come_from_reserved_hugepages(reserved_hugepages: int, base_image: str, moe_model: Path,
                                                 start_stack: StackFactory) -> None:
    assert reserved_hugepages == 256 and _free_hugepages() == 256
    stack = start_stack(build_engine_image("ik_llama.cpp", "avx2", base_image), moe_model, hugepages=True)
    engine = stack.client.compose.ps()[0]
    assert "KernelPageSize:     2048 kB" in engine.execute(["cat", "/proc/1/smaps"])
    assert _free_hugepages() < 256, "the engine took no pages from the reserved pool"
    assert "-thp" in engine.config.cmd
