"""Host probe: what this machine's CPUs can run. Reads from a root path so tests can feed recorded trees."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CpuInfo:
    flags: frozenset[str]
    logical_cpus: int
    physical_cores: int  # SMT siblings counted once


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
    return CpuInfo(flags=flags, logical_cpus=logical, physical_cores=_physical_cores(root) or logical)


def _physical_cores(root: Path) -> int:
    """Distinct (package, core) pairs among online CPUs; 0 when sysfs has no topology."""
    cores: set[tuple[str, str]] = set()
    for topo in sorted((root / "sys/devices/system/cpu").glob("cpu[0-9]*/topology")):
        try:
            package = (topo / "physical_package_id").read_text().strip()
            core = (topo / "core_id").read_text().strip()
        except OSError:
            continue
        cores.add((package, core))
    return len(cores)


def missing_flags(required: tuple[str, ...], cpu: CpuInfo) -> list[str]:
    """The required CPU flags this host lacks, in the order required."""
    return [flag for flag in required if flag not in cpu.flags]
