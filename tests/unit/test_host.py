"""Host probe from a recorded tree: flags and physical cores (SMT siblings counted once)."""

from __future__ import annotations

from pathlib import Path

from builder.host import missing_flags, read_cpu
from builder.targets import cpu_target


def _fake_host(root: Path, flags: str, topology: list[tuple[int, int]]) -> Path:
    cpuinfo = "".join(f"processor\t: {i}\nflags\t\t: {flags}\n\n" for i in range(len(topology)))
    (root / "proc").mkdir(parents=True)
    (root / "proc/cpuinfo").write_text(cpuinfo)
    for cpu, (package, core) in enumerate(topology):
        topo = root / f"sys/devices/system/cpu/cpu{cpu}/topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{package}\n")
        (topo / "core_id").write_text(f"{core}\n")
    return root


def test_smt_siblings_count_once(tmp_path: Path) -> None:
    # 2 sockets × 2 cores × 2 threads
    topology = [(p, c) for _ in range(2) for p in range(2) for c in range(2)]
    cpu = read_cpu(_fake_host(tmp_path, "fpu avx avx2", topology))
    assert (cpu.logical_cpus, cpu.physical_cores) == (8, 4)


def test_missing_flags_for_avx2_target(tmp_path: Path) -> None:
    cpu = read_cpu(_fake_host(tmp_path, "fpu sse4_2 avx", [(0, 0)]))
    assert missing_flags(cpu_target("avx2").required_flags, cpu)[:2] == ["avx2", "bmi1"]
