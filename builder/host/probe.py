"""Host probe: CPUs, NUMA nodes, kernel memory settings, hugepage pools and NVIDIA GPUs.

Everything is read below a root path (and GPUs from `nvidia-smi` text), so tests feed recorded trees
of other machines. Missing files mean "not exposed here", never an error.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from builder.errors import SpecError


@dataclass(frozen=True)
class CpuInfo:
    flags: frozenset[str]
    logical_cpus: int
    physical_cores: int  # SMT siblings counted once


@dataclass(frozen=True)
class NumaNode:
    node: int
    cpus: tuple[int, ...]
    physical_cpus: tuple[int, ...]  # the first SMT thread of each core on this node
    mem_total_bytes: int
    hugepages: dict[int, int]  # page size in kB -> pages reserved on this node


@dataclass(frozen=True)
class Gpu:
    name: str
    compute_capability: str
    driver: str
    memory_mib: int


@dataclass(frozen=True)
class HostFacts:
    cpu: CpuInfo
    nodes: tuple[NumaNode, ...]
    mem_total_bytes: int
    numa_balancing: int | None
    thp_mode: str | None
    gpus: tuple[Gpu, ...]


def read_cpu(root: Path = Path("/")) -> CpuInfo:
    """CPU flags (first processor's) and core counts from /proc/cpuinfo and sysfs topology."""
    text = (root / "proc/cpuinfo").read_text(errors="replace")
    flags: frozenset[str] = frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            flags = frozenset(value.split())
            break
    logical = sum(1 for line in text.splitlines() if line.startswith("processor"))
    return CpuInfo(flags=flags, logical_cpus=logical, physical_cores=len(_core_leaders(root)) or logical)


def _core_leaders(root: Path) -> set[int]:
    """CPUs that are the first thread of their core (distinct package/core pairs)."""
    seen: dict[tuple[str, str], int] = {}
    for topo in (root / "sys/devices/system/cpu").glob("cpu[0-9]*/topology"):
        try:
            key = ((topo / "physical_package_id").read_text().strip(), (topo / "core_id").read_text().strip())
        except OSError:
            continue
        cpu = int(topo.parent.name.removeprefix("cpu"))
        seen[key] = min(cpu, seen.get(key, cpu))
    return set(seen.values())


def parse_cpulist(text: str) -> tuple[int, ...]:
    """'0-3,8,10-11' -> (0, 1, 2, 3, 8, 10, 11)."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.extend(range(int(low), int(high or low) + 1))
    return tuple(cpus)


def read_nodes(root: Path = Path("/")) -> tuple[NumaNode, ...]:
    leaders = _core_leaders(root)
    nodes = []
    for path in sorted((root / "sys/devices/system/node").glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        cpus = parse_cpulist(_read(path / "cpulist") or "")
        meminfo = _read(path / "meminfo") or ""
        match = re.search(r"MemTotal:\s+(\d+) kB", meminfo)
        pages = {}
        for pool in (path / "hugepages").glob("hugepages-*kB"):
            pages[int(pool.name[10:-2])] = int(_read(pool / "nr_hugepages") or 0)
        nodes.append(
            NumaNode(
                node=int(path.name[4:]),
                cpus=cpus,
                physical_cpus=tuple(c for c in cpus if c in leaders) if leaders else cpus,
                mem_total_bytes=int(match.group(1)) * 1024 if match else 0,
                hugepages=pages,
            )
        )
    return tuple(nodes)


def parse_nvidia_smi(text: str) -> tuple[Gpu, ...]:
    """Rows of `nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total
    --format=csv,noheader,nounits`."""
    gpus = []
    for line in text.strip().splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 4 and fields[3].isdigit():
            gpus.append(
                Gpu(name=fields[0], compute_capability=fields[1], driver=fields[2], memory_mib=int(fields[3]))
            )
    return tuple(gpus)


def query_nvidia_smi() -> str:
    """nvidia-smi's GPU rows, or '' where there is no NVIDIA driver."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return ""
    result = subprocess.run(
        [binary, "--query-gpu=name,compute_cap,driver_version,memory.total", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return result.stdout if result.returncode == 0 else ""


def probe(root: Path = Path("/"), nvidia_smi_text: str | None = None) -> HostFacts:
    """Everything the doctor and the stack emitter need to know about a host."""
    if not (root / "proc/cpuinfo").is_file():
        raise SpecError(
            f"{root} holds no proc/cpuinfo: not a host tree (record one with /proc and /sys files)"
        )
    meminfo = _read(root / "proc/meminfo") or ""
    match = re.search(r"MemTotal:\s+(\d+) kB", meminfo)
    balancing = _read(root / "proc/sys/kernel/numa_balancing")
    thp = re.search(r"\[(\w+)\]", _read(root / "sys/kernel/mm/transparent_hugepage/enabled") or "")
    smi = query_nvidia_smi() if nvidia_smi_text is None else nvidia_smi_text
    return HostFacts(
        cpu=read_cpu(root),
        nodes=read_nodes(root),
        mem_total_bytes=int(match.group(1)) * 1024 if match else 0,
        numa_balancing=int(balancing) if balancing and balancing.strip().isdigit() else None,
        thp_mode=thp.group(1) if thp else None,
        gpus=parse_nvidia_smi(smi),
    )


def missing_flags(required: tuple[str, ...], cpu: CpuInfo) -> list[str]:
    """The required CPU flags this host lacks, in the order required."""
    return [flag for flag in required if flag not in cpu.flags]


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None
