"""Where a stack's engine runs on the host: NUMA policy, the physical cores it may use, its threads.

The seed's rules: threads = physical cores only (SMT siblings cost ~18% decode), memory interleaved
over every node (`numactl --interleave=all`) unless bound to chosen nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from builder.errors import SpecError
from builder.host.probe import HostFacts
from builder.spec import NumaPolicy

# hugetlbfs page sizes a stack may ask for, in kB (the unit of /sys/kernel/mm/hugepages).
HUGEPAGE_KB = {"2M": 2048, "1G": 1024 * 1024}


@dataclass(frozen=True)
class Placement:
    numa: NumaPolicy
    numa_nodes: tuple[int, ...]
    cpuset: str | None  # None: no restriction needed (every CPU is a physical core of the chosen nodes)
    threads: int


def place(
    host: HostFacts,
    numa: NumaPolicy | Literal["auto"] = "auto",
    nodes: tuple[int, ...] = (),
    threads: int | None = None,
) -> Placement:
    """Pick the NUMA policy, cpuset and thread count for `host`; SpecError on impossible requests."""
    known = {n.node for n in host.nodes}
    unknown = sorted(set(nodes) - known)
    if unknown:
        raise SpecError(
            f"NUMA node(s) {', '.join(map(str, unknown))} don't exist on this host (it has "
            f"{', '.join(map(str, sorted(known))) or 'none'}); see `moe-stack doctor`"
        )
    policy: NumaPolicy
    if numa == "auto":
        policy = "cpunodebind" if nodes else ("interleave" if len(known) > 1 else "none")
    else:
        policy = numa
    chosen = [n for n in host.nodes if not nodes or n.node in nodes]
    physical = sorted(cpu for node in chosen for cpu in node.physical_cpus)
    if not physical:  # no sysfs topology here: fall back to the CPU count
        physical = list(range(host.cpu.physical_cores))
    threads = threads or len(physical)
    if threads > len(physical):
        raise SpecError(
            f"--threads {threads} is more than the {len(physical)} physical cores of the chosen NUMA "
            f"nodes; SMT siblings slow MoE decode: use --threads {len(physical)} or fewer"
        )
    every_cpu = sum(len(n.cpus) for n in chosen) == len(physical) and len(chosen) == len(host.nodes)
    return Placement(
        numa=policy, numa_nodes=tuple(nodes), cpuset=None if every_cpu else cpulist(physical), threads=threads
    )


def cpulist(cpus: list[int]) -> str:
    """[0, 1, 2, 3, 8] -> '0-3,8' (cpuset syntax)."""
    runs: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{low}-{high}" if low != high else str(low) for low, high in runs)


def numa_env(numa: str, nodes: tuple[int, ...]) -> str | None:
    """MOE_STACK_NUMA for the image's entrypoint, which turns it into numactl options."""
    if numa == "none":
        return None
    if numa == "interleave":
        return "interleave" + (f":{','.join(map(str, nodes))}" if nodes else "")
    return f"{numa}:{','.join(map(str, nodes))}"


def check_hugepages_reserved(host: HostFacts, page_kb: int | None = None, need_bytes: int = 0) -> None:
    """A stack that asks for hugepages needs a reserved pool (the kernel's, not the container's): any
    pool for ik_llama.cpp -thp (which falls back by itself), one of `page_kb` pages that holds
    `need_bytes` for a model copied onto hugetlbfs (where a short pool stops the start)."""
    pools: dict[int, int] = {}
    for node in host.nodes:
        for size_kb, count in node.hugepages.items():
            pools[size_kb] = pools.get(size_kb, 0) + count
    if page_kb is None:
        if not any(pools.values()):
            raise SpecError(
                "--hugepages needs hugepages reserved on the host and none are: run `sudo sysctl -w "
                "vm.nr_hugepages=N` with N × 2 MiB about the model's size (see `moe-stack doctor`)"
            )
        return
    need = -(-need_bytes // (page_kb * 1024))
    have = pools.get(page_kb, 0)
    if have < need:
        fix = (
            f"sudo sysctl -w vm.nr_hugepages={need}"
            if page_kb == 2048
            else f"echo {need} | sudo tee /sys/kernel/mm/hugepages/hugepages-{page_kb}kB/nr_hugepages"
        )
        raise SpecError(
            f"--hugetlbfs needs {need} reserved {page_kb // 1024} MiB hugepages for the model and the "
            f"host has {have}: run `{fix}`"
        )
