"""Recorded-style host trees (procfs/sysfs files under a root) for the host probe and the doctor."""

from __future__ import annotations

from pathlib import Path

from builder.host.probe import HostFacts, probe
from builder.platform.targets import cpu_target

EPYC_9554_FLAGS = " ".join(cpu_target("zen4").required_flags) + " fpu sse4_2 ht"
XEON_EMR_FLAGS = " ".join(cpu_target("sapphirerapids").required_flags) + " fpu sse4_2 ht"


def fake_host(
    root: Path,
    flags: str,
    sockets: int,
    cores: int,
    threads: int,
    node_gib: int,
    numa_balancing: int = 0,
    thp: str = "madvise",
    hugepages_2m: int = 0,
) -> Path:
    """A host with `sockets` NUMA nodes of `cores` cores × `threads` SMT threads; Linux numbers the first
    thread of every core first (cpu0..N-1), then the siblings."""
    total = sockets * cores * threads
    (root / "proc/sys/kernel").mkdir(parents=True)
    (root / "proc/cpuinfo").write_text(
        "".join(f"processor\t: {i}\nflags\t\t: {flags}\n\n" for i in range(total))
    )
    (root / "proc/meminfo").write_text(f"MemTotal:       {sockets * node_gib * 1024**2} kB\n")
    (root / "proc/sys/kernel/numa_balancing").write_text(f"{numa_balancing}\n")
    thp_dir = root / "sys/kernel/mm/transparent_hugepage"
    thp_dir.mkdir(parents=True)
    thp_dir.joinpath("enabled").write_text(
        " ".join(f"[{m}]" if m == thp else m for m in ("always", "madvise", "never"))
    )
    node_cpus: dict[int, list[int]] = {s: [] for s in range(sockets)}
    for cpu in range(total):
        socket, core = divmod(cpu % (sockets * cores), cores)
        topo = root / f"sys/devices/system/cpu/cpu{cpu}/topology"
        topo.mkdir(parents=True)
        topo.joinpath("physical_package_id").write_text(f"{socket}\n")
        topo.joinpath("core_id").write_text(f"{core}\n")
        node_cpus[socket].append(cpu)
    for socket, cpus in node_cpus.items():
        node = root / f"sys/devices/system/node/node{socket}"
        (node / "hugepages/hugepages-2048kB").mkdir(parents=True)
        (node / "hugepages/hugepages-1048576kB").mkdir(parents=True)
        node.joinpath("cpulist").write_text(",".join(map(str, cpus)) + "\n")
        node.joinpath("meminfo").write_text(f"Node {socket} MemTotal:       {node_gib * 1024**2} kB\n")
        node.joinpath("hugepages/hugepages-2048kB/nr_hugepages").write_text(f"{hugepages_2m}\n")
        node.joinpath("hugepages/hugepages-1048576kB/nr_hugepages").write_text("0\n")
    return root


def epyc_host(
    root: Path, sockets: int = 1, cores: int = 32, threads: int = 2, node_gib: int = 512, smi: str = ""
) -> HostFacts:
    """An EPYC 9554 (Zen 4) host's facts as the probe reads them from a tree under `root`, its GPUs those
    `smi` (nvidia-smi's CSV) lists: none by default."""
    return probe(fake_host(root, EPYC_9554_FLAGS, sockets, cores, threads, node_gib), nvidia_smi_text=smi)
