"""Placement: NUMA policy, physical-core cpusets and thread counts for recorded hosts."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.engines import get_engine
from builder.engines.base import StackSpec
from builder.errors import SpecError, StackError
from builder.host.placement import check_hugepages_reserved, cpulist, numa_env, place
from builder.host.probe import probe
from tests.hosts import EPYC_9554_FLAGS, epyc_host, fake_host
from tests.specs import compose_dict, readable_file


@pytest.fixture
def epyc(tmp_path: Path):
    return epyc_host(tmp_path / "h", sockets=2, node_gib=288)


def test_defaults_interleave_on_physical_cores(epyc) -> None:
    where = place(epyc)
    assert (where.numa, where.threads, where.cpuset) == ("interleave", 64, "0-63")  # 64-127 are SMT siblings


def test_one_node(epyc) -> None:
    where = place(epyc, nodes=(1,))
    assert (where.numa, where.numa_nodes, where.cpuset, where.threads) == ("cpunodebind", (1,), "32-63", 32)
    assert numa_env(where.numa, where.numa_nodes) == "cpunodebind:1"


def test_impossible_requests(epyc) -> None:
    with pytest.raises(SpecError, match=r"NUMA node\(s\) 2 don't exist on this host \(it has 0, 1\)"):
        place(epyc, nodes=(2,))
    with pytest.raises(SpecError, match="--threads 128 is more than the 64 physical cores"):
        place(epyc, threads=128)


def test_single_node_host_without_smt_needs_no_cpuset(tmp_path: Path) -> None:
    host = probe(
        fake_host(tmp_path, EPYC_9554_FLAGS, sockets=1, cores=8, threads=1, node_gib=64), nvidia_smi_text=""
    )
    assert place(host) == place(host, "auto", (), 8)
    assert place(host).cpuset is None and place(host).numa == "none"


def test_cpulist() -> None:
    assert cpulist([3, 0, 1, 2, 8, 10, 11]) == "0-3,8,10-11"


def test_compose_gets_the_capabilities_its_features_need(tmp_path: Path) -> None:
    model = readable_file(tmp_path / "m" / "x.gguf", b"GGUF")
    key = readable_file(tmp_path / "key", b"k3y-v4lue-not-in-compose\n")
    base = {"project_name": "p", "engine": "llama.cpp", "image_ref": "i", "model": model, "cpu_threads": 4}
    plain = compose_dict(StackSpec(**base), "x")["services"]["engine"]
    assert "cap_add" not in plain and "environment" not in plain and "deploy" not in plain
    full = compose_dict(
        StackSpec(
            **base,
            numa_policy="membind",
            bind_nodes=(0, 1),
            cpuset="0-31",
            gpu="cdi",
            mlock=True,
            api_key_file=key,
        ),
        "x",
    )
    service = full["services"]["engine"]
    assert service["cap_add"] == ["SYS_NICE", "IPC_LOCK"] and service["cap_drop"] == ["ALL"]
    assert service["environment"] == {"MOE_STACK_NUMA": "membind:0,1"} and service["cpuset"] == "0-31"
    assert service["ulimits"] == {"memlock": {"soft": -1, "hard": -1}}
    assert service["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "cdi", "device_ids": ["nvidia.com/gpu=all"], "capabilities": ["gpu"]}
    ]
    assert full["secrets"] == {"moe-stack-api-key": {"file": str(key)}} and service["secrets"] == [
        "moe-stack-api-key"
    ]
    assert service["command"][-4:] == [
        "--load-mode",
        "mmap+mlock",
        "--api-key-file",
        "/run/secrets/moe-stack-api-key",
    ]
    assert "k3y-v4lue" not in str(full), "the key itself never enters the compose file"
    with pytest.raises(ValueError, match="needs the nodes to bind to"):
        StackSpec(**base, numa_policy="membind")


def test_hugepages_need_a_reserved_pool_and_ik(tmp_path: Path) -> None:
    none = probe(
        fake_host(tmp_path / "a", EPYC_9554_FLAGS, sockets=1, cores=4, threads=1, node_gib=8),
        nvidia_smi_text="",
    )
    with pytest.raises(SpecError, match="--hugepages needs hugepages reserved on the host and none are"):
        check_hugepages_reserved(none)
    check_hugepages_reserved(
        probe(
            fake_host(
                tmp_path / "b", EPYC_9554_FLAGS, sockets=1, cores=4, threads=1, node_gib=8, hugepages_2m=512
            ),
            nvidia_smi_text="",
        )
    )
    stack = {
        "project_name": "p",
        "image_ref": "i",
        "model": Path("/m/x.gguf"),
        "cpu_threads": 4,
        "hugepages": True,
    }
    assert "-thp" in get_engine("ik_llama.cpp").server_args(StackSpec(engine="ik_llama.cpp", **stack), None)
    with pytest.raises(StackError, match="^llama.cpp does not read --hugepages: drop it"):
        get_engine("llama.cpp").server_args(StackSpec(engine="llama.cpp", **stack), None)


def test_hugetlbfs_pool_must_hold_the_model(tmp_path: Path) -> None:
    host = probe(
        fake_host(
            tmp_path / "h", EPYC_9554_FLAGS, sockets=2, cores=4, threads=1, node_gib=8, hugepages_2m=100
        ),
        nvidia_smi_text="",
    )
    check_hugepages_reserved(host, 2048, 400 * 2**20)  # 200 pages on two nodes: a 400 MiB model fits exactly
    with pytest.raises(
        SpecError,
        match=r"needs 201 reserved 2 MiB hugepages for the model and the host has 200: "
        r"run `sudo sysctl -w vm.nr_hugepages=201`",
    ):
        check_hugepages_reserved(host, 2048, 400 * 2**20 + 1)
    with pytest.raises(
        SpecError,
        match=r"needs 1 reserved 1024 MiB .* has 0: run `echo 1 \| sudo tee "
        r"/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages`",
    ):
        check_hugepages_reserved(host, 1024 * 1024, 2**20)


def test_hugetlbfs_volume_is_the_engine_users(tmp_path: Path) -> None:
    model = readable_file(tmp_path / "m" / "x.gguf", b"GGUF")
    doc = compose_dict(
        StackSpec(
            project_name="p", engine="llama.cpp", image_ref="i", model=model, cpu_threads=4, hugetlbfs="1G"
        ),
        "x",
    )
    service = doc["services"]["engine"]
    assert service["environment"] == {"MOE_STACK_HUGETLBFS": "/hugepages"}
    assert service["volumes"][1] == {"type": "volume", "source": "hugepages", "target": "/hugepages"}
    assert doc["volumes"]["hugepages"]["driver_opts"] == {
        "type": "hugetlbfs",
        "device": "hugetlbfs",
        "o": "pagesize=1G,uid=10001,gid=10001,mode=0700",
    }
    assert "cap_add" not in service, "Docker mounts the volume: the engine needs no capability for it"
    with pytest.raises(ValueError, match="two ways to the same pool: pick one"):
        StackSpec(
            project_name="p",
            engine="ik_llama.cpp",
            image_ref="i",
            model=model,
            cpu_threads=4,
            hugetlbfs="2M",
            hugepages=True,
        )
