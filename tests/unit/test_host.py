"""Host probe on recorded trees: a 2-socket Zen 4 EPYC with SMT, a Xeon with AMX, and this machine."""

from __future__ import annotations

from pathlib import Path

from builder.host.probe import missing_flags, parse_cpulist, parse_nvidia_smi, probe, read_cpu
from builder.platform.targets import cpu_target
from tests.hosts import EPYC_9554_FLAGS, XEON_EMR_FLAGS, fake_host


def test_two_socket_epyc_with_smt(tmp_path: Path) -> None:
    root = fake_host(
        tmp_path, EPYC_9554_FLAGS, sockets=2, cores=64, threads=2, node_gib=384, numa_balancing=1
    )
    host = probe(root, nvidia_smi_text="NVIDIA GeForce RTX 4090, 8.9, 570.86.15, 24564\n")
    assert (host.cpu.logical_cpus, host.cpu.physical_cores) == (256, 128)
    assert [len(n.cpus) for n in host.nodes] == [128, 128]
    assert host.nodes[1].physical_cpus == tuple(range(64, 128)), "SMT siblings (cpu 128+) left out"
    assert host.nodes[0].mem_total_bytes == 384 * 1024**3 and host.numa_balancing == 1
    assert host.gpus[0].compute_capability == "8.9" and host.gpus[0].memory_mib == 24564


def test_xeon_with_amx(tmp_path: Path) -> None:
    root = fake_host(
        tmp_path,
        XEON_EMR_FLAGS,
        sockets=1,
        cores=56,
        threads=2,
        node_gib=512,
        hugepages_2m=4096,
        thp="always",
    )
    host = probe(root, nvidia_smi_text="")
    assert missing_flags(cpu_target("sapphirerapids").required_flags, host.cpu) == []
    assert host.nodes[0].hugepages == {2048: 4096, 1048576: 0}
    assert host.thp_mode == "always" and host.gpus == ()


def test_this_machine() -> None:
    host = probe(Path("/"), nvidia_smi_text="")
    assert 0 < host.cpu.physical_cores <= host.cpu.logical_cpus
    assert "avx2" in host.cpu.flags  # every target host of this project has x86-64-v3
    assert host.nodes and sum(len(n.cpus) for n in host.nodes) == host.cpu.logical_cpus


def test_missing_flags_for_avx2_target(tmp_path: Path) -> None:
    cpu = read_cpu(fake_host(tmp_path, "fpu sse4_2 avx", sockets=1, cores=1, threads=1, node_gib=1))
    assert missing_flags(cpu_target("avx2").required_flags, cpu)[:2] == ["avx2", "bmi1"]


def test_parsers() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == (0, 1, 2, 3, 8, 10, 11)
    assert parse_nvidia_smi("NVIDIA H200, 9.0, 580.159.04, 143771\nbad line\n")[0].driver == "580.159.04"
