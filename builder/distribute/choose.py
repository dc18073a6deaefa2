"""Which published variant fits a host: CPU flags → the richest CPU target it runs, GPU compute
capability and driver → the newest CUDA release whose images carry that arch and that the driver runs.

Pure over HostFacts and a list of offered variants (naming.parse_variant reads them from tags), so
recorded hosts can be tested against the matrix.
"""

from __future__ import annotations

from dataclasses import dataclass

from builder.errors import SpecError
from builder.host.probe import Gpu, HostFacts, missing_flags
from builder.images.matrix import cuda_target
from builder.images.naming import Variant
from builder.platform.targets import CPU_TARGETS, best_cpu_target, fallback_cost
from builder.platform.toolchain import MIN_DRIVER, driver_runs


@dataclass(frozen=True)
class Choice:
    offered: Variant
    reason: str


def choose_variant(host: HostFacts, offered: list[Variant], cpu_only: bool = False) -> Choice:
    """The best of `offered` for `host`; SpecError naming what is missing when none fits."""
    runnable = [o for o in offered if not missing_flags(CPU_TARGETS[o.cpu].required_flags, host.cpu)]
    gpu = host.gpus[0] if host.gpus and not cpu_only else None
    gpu_note = ""
    if gpu is not None:
        fitting = [o for o in runnable if o.cuda is not None and _cuda_fits(o.cuda, gpu)]
        if fitting:
            best = max(fitting, key=lambda o: (_version(o.cuda), _cpu_rank(o.cpu)))
            return Choice(
                best,
                f"{gpu.name} (sm_{_arch(gpu)}, driver {gpu.driver}) runs CUDA {best.cuda} images; "
                f"CPU target {best.cpu} is the richest published one this CPU runs{_ideal(host, best)}",
            )
        gpu_note = f"; no CUDA variant fits {gpu.name} (sm_{_arch(gpu)}, driver {gpu.driver}), so CPU-only"
    cpu_images = [o for o in runnable if o.cuda is None]
    if cpu_images:
        best = max(cpu_images, key=lambda o: _cpu_rank(o.cpu))
        return Choice(
            best,
            f"CPU target {best.cpu} is the richest published one this CPU runs{_ideal(host, best)}{gpu_note}",
        )
    raise SpecError(_nothing_fits(host, offered, gpu))


def _ideal(host: HostFacts, chosen: Variant) -> str:
    """A note when this CPU could use a richer target than any published one."""
    ideal = best_cpu_target(host.cpu.flags)
    if ideal is None or ideal.name == chosen.cpu:
        return ""
    cost = fallback_cost(ideal, CPU_TARGETS[chosen.cpu])
    return f" (a {ideal.name} build would fit it better{': ' + cost if cost else ''})"


def _cuda_fits(cuda: str, gpu: Gpu) -> bool:
    return driver_runs(gpu.driver, cuda) and _arch(gpu) in cuda_target(cuda).archs


def _nothing_fits(host: HostFacts, offered: list[Variant], gpu: Gpu | None) -> str:
    if not offered:
        return "the registry holds no variant of this engine and ref; publish one or pick another --ref"

    def nearness(o: Variant) -> tuple[int, bool, tuple[int, ...], int]:
        lacking = len(missing_flags(CPU_TARGETS[o.cpu].required_flags, host.cpu))
        return (-lacking, o.cuda is None or gpu is not None, _version(o.cuda), _cpu_rank(o.cpu))

    nearest = max(offered, key=nearness)
    lacking = missing_flags(CPU_TARGETS[nearest.cpu].required_flags, host.cpu)
    if lacking:
        why = f"it needs CPU flags this host lacks: {' '.join(lacking)}"
    elif gpu is None:
        why = "it is a CUDA image and this host has no NVIDIA GPU"
    else:
        cuda = nearest.cuda or ""
        archs = cuda_target(cuda).archs
        gaps = []
        if not driver_runs(gpu.driver, cuda):
            need = MIN_DRIVER[cuda]
            gaps.append(f"needs driver >= {need[0]}.{need[1]} (this GPU has {gpu.driver})")
        if _arch(gpu) not in archs:
            gaps.append(f"its GPU archs ({','.join(map(str, archs))}) lack sm_{_arch(gpu)}")
        why = f"a CUDA {cuda} image: " + "; ".join(gaps)
    return f"no published variant runs on this host; the nearest is {nearest.tag}: {why}"


def _cpu_rank(name: str) -> int:
    """Richer targets require more flags; runtime dispatch (portable) requires none and ranks last."""
    return len(CPU_TARGETS[name].required_flags)


def _version(cuda: str | None) -> tuple[int, ...]:
    return tuple(int(part) for part in (cuda or "0").split("."))


def _arch(gpu: Gpu) -> int:
    return int(gpu.compute_capability.replace(".", ""))
