"""`moe-stack doctor`: what this host means for hybrid MoE inference, each finding with its fix.

Pure over HostFacts (plus a few environment checks passed in), so recorded hosts can be diagnosed
in tests exactly as a live one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from builder.engines import LLAMA_CPP
from builder.engines.ktransformers import AMX_FLAGS
from builder.host.probe import HostFacts, missing_flags
from builder.models.facts import ModelFacts
from builder.models.kt_weights import AMX_BITS, is_converted, read_converted
from builder.models.planner import size
from builder.platform.local_cuda import LOCAL_CUDA, WHERE, origin_of
from builder.platform.targets import AVX2, best_cpu_target, fallback_cost
from builder.platform.toolchain import MIN_DRIVER, driver_runs, highest_cuda
from builder.running.bandwidth import DecodeBound, ReadBandwidth
from builder.running.kt_convert import default_output
from builder.spec import cuda_knows_arch
from builder.stacks.memory_use import beside_model_bytes
from builder.stacks.pinned_memory import pinned_finding

Level = Literal["OK", "WARN", "FAIL"]


@dataclass(frozen=True)
class Finding:
    level: Level
    topic: str
    message: str
    fix: str = ""


def diagnose(
    host: HostFacts,
    docker_ok: bool,
    gpu_runtime_ok: bool,
    free_disk_bytes: int,
    model_bytes: int | None = None,
    cuda_bases: dict[str, bool] | None = None,
    model_problems: list[str] | None = None,
    checkpoint: Path | None = None,
) -> list[Finding]:
    """Every finding for `host`. `cuda_bases`: each registry-free CUDA base image (`moe-stack base
    --cuda`) and whether the Docker store has it (None: Docker wasn't asked). `model_problems`: how a
    fetched model's files differ from their record (None: no record). `checkpoint`: a Hugging Face
    checkpoint to look for kt-kernel's converted weights beside."""
    findings = [
        _cpu(host),
        *_amx(host, checkpoint),
        _cores(host),
        *_numa(host),
        _thp(host),
        _hugepages(host),
        *_gpus(host, gpu_runtime_ok),
    ]
    findings += [_docker(docker_ok), _disk(free_disk_bytes)]
    if cuda_bases is not None:
        findings.append(_cuda_bases(cuda_bases))
    if model_bytes is not None:
        findings += _model_findings(host, model_bytes)
    if model_problems is not None:
        findings.append(_model_files(model_problems))
    return findings


def _docker(docker_ok: bool) -> Finding:
    if docker_ok:
        return Finding("OK", "docker", "the Docker daemon answers")
    return Finding(
        "FAIL",
        "docker",
        "the Docker daemon does not answer",
        "sudo systemctl start docker   # or: sudo bash scripts/install-docker.sh",
    )


def _disk(free_disk_bytes: int) -> Finding:
    if free_disk_bytes >= 50 * 1024**3:
        return Finding("OK", "disk", f"{size(free_disk_bytes)} free")
    return Finding(
        "WARN",
        "disk",
        f"only {size(free_disk_bytes)} free; a CUDA image needs ~5 GiB, a large MoE GGUF 150-400 GB",
        "docker system prune   # or free space elsewhere",
    )


def _model_findings(host: HostFacts, model_bytes: int) -> list[Finding]:
    """Whether a model of `model_bytes` fits this host's memory, its NUMA nodes and its pinnable memory."""
    findings = [_model_fits(host, model_bytes), *_numa_policies(host, model_bytes)]
    if host.gpus and host.mem_total_bytes:
        level, message = pinned_finding(model_bytes, host.mem_total_bytes)
        fix = (
            ""
            if level == "OK"
            else "run mainline llama.cpp with mapped weights (--mmap), or use a smaller quant"
        )
        findings.append(Finding(level, "pinned-memory", message, fix))
    return findings


def _model_files(problems: list[str]) -> Finding:
    if not problems:
        return Finding("OK", "model-files", "every file as fetched (sizes match moe-stack-model.json)")
    return Finding(
        "FAIL",
        "model-files",
        "; ".join(problems),
        "fetch it again (moe-stack fetch-model --hf ...: complete files are kept)",
    )


def _cuda_bases(present: dict[str, bool]) -> Finding:
    have = [name for name, here in present.items() if here]
    if not have:
        return Finding(
            "OK",
            "cuda_base",
            "no registry-free CUDA base here: CUDA images build on NVIDIA's images (nvidia/cuda)",
            "where nvidia/cuda can't be pulled: sudo moe-stack base --cuda 13.0 (driver 580+) or 12.4 (550+)",
        )
    missing = [name for name, here in present.items() if not here]
    versions = sorted({name.rsplit(":", 1)[1].split("-")[0] for name in have})
    half = [name for name in missing if name.rsplit(":", 1)[1].split("-")[0] in versions]
    if half:
        return Finding(
            "WARN",
            "cuda_base",
            f"CUDA base {', '.join(have)} is here but {', '.join(half)} is not",
            " && ".join(f"sudo moe-stack base --cuda {version}" for version in versions)
            + "   # makes both again",
        )
    builds = "; ".join(
        f"moe-stack build --cuda {version} --cuda-base {origin_of(version)}" for version in versions
    )
    return Finding("OK", "cuda_base", f"registry-free CUDA bases here: {', '.join(have)} ({builds})")


def _cpu(host: HostFacts) -> Finding:
    target = best_cpu_target(host.cpu.flags)
    if target is None:
        return Finding(
            "WARN", "cpu", "no named CPU target fits (no AVX2)", "use the llama.cpp `portable` image"
        )
    cost = fallback_cost(target, AVX2)
    return Finding(
        "OK",
        "cpu",
        f"best CPU target: {target.name} ({target.description})"
        f"{'; an avx2 image here leaves ' + cost if cost else ''}",
    )


def _amx(host: HostFacts, checkpoint: Path | None) -> list[Finding]:
    """A Xeon with AMX could run KTransformers' AMX expert backends, from weights kt-kernel's converter
    makes out of the model's checkpoint: said for the checkpoint given (converted beside it or not)."""
    if missing_flags(AMX_FLAGS, host.cpu):
        return []
    convert = "moe-stack kt-convert --model CHECKPOINT --source KT_TREE (a ktransformers checkout)"
    if checkpoint is None:
        return [
            Finding(
                "OK",
                "amx",
                "this CPU has AMX: KTransformers' kt-kernel runs its experts as AMXINT4/AMXINT8 here, from "
                "weights converted from the model's BF16/FP8 checkpoint (a GGUF serves only LLAMAFILE, its "
                "AVX-512 path)",
                f"{convert}, then compose --engine ktransformers --model CONVERTED --config-dir CHECKPOINT",
            )
        ]
    pools = max(1, len(host.nodes))
    for method in AMX_BITS:
        converted = default_output(checkpoint, method)
        if not is_converted(converted):
            continue
        weights = read_converted(converted)
        if weights.numa_pools != pools:
            return [
                Finding(
                    "WARN",
                    "amx",
                    f"{converted} was converted for {weights.numa_pools} NUMA pool(s); this host has {pools}",
                    f"{convert.replace('CHECKPOINT', str(checkpoint))} --numa-pools {pools} --out NEW_DIR",
                )
            ]
        return [
            Finding(
                "OK",
                "amx",
                f"this CPU has AMX and {checkpoint}'s experts are converted for it: {converted} "
                f"({weights.method or method}, {weights.numa_pools} NUMA pool(s))",
            )
        ]
    return [
        Finding(
            "WARN",
            "amx",
            f"this CPU has AMX and {checkpoint} has no converted weights beside it: KTransformers would "
            "run its experts as LLAMAFILE from a GGUF (AVX-512), not on AMX",
            f"{convert.replace('CHECKPOINT', str(checkpoint))}",
        )
    ]


def _cores(host: HostFacts) -> Finding:
    cpu = host.cpu
    if cpu.logical_cpus > cpu.physical_cores:
        return Finding(
            "OK",
            "cores",
            f"{cpu.physical_cores} physical cores, {cpu.logical_cpus} logical (SMT on): "
            f"run with -t {cpu.physical_cores} on physical cores only",
        )
    return Finding("OK", "cores", f"{cpu.physical_cores} cores, no SMT siblings")


def _numa(host: HostFacts) -> list[Finding]:
    nodes = ", ".join(
        f"node{n.node}: {len(n.physical_cpus)} cores, {size(n.mem_total_bytes)}" for n in host.nodes
    )
    out = [Finding("OK", "numa", f"{len(host.nodes)} NUMA node(s)" + (f" ({nodes})" if nodes else ""))]
    if host.numa_balancing == 1:
        out.append(
            Finding(
                "WARN",
                "numa_balancing",
                "automatic NUMA balancing is on: page migration stalls cost "
                "50-65% of decode speed on multi-node hosts (seed guide)",
                "sudo sysctl -w kernel.numa_balancing=0",
            )
        )
    elif host.numa_balancing == 0:
        out.append(Finding("OK", "numa_balancing", "automatic NUMA balancing is off"))
    return out


def _thp(host: HostFacts) -> Finding:
    if host.thp_mode is None:
        return Finding("OK", "thp", "transparent hugepages not exposed here")
    if host.thp_mode == "never":
        return Finding(
            "WARN",
            "thp",
            "transparent hugepages are off: expert weights stream through 4 KiB pages",
            "echo madvise | sudo tee /sys/kernel/mm/transparent_hugepage/enabled",
        )
    return Finding("OK", "thp", f"transparent hugepages: {host.thp_mode}")


def _hugepages(host: HostFacts) -> Finding:
    pools: dict[int, list[str]] = {}
    for node in host.nodes:
        for page_kb, count in node.hugepages.items():
            if count:
                pools.setdefault(page_kb, []).append(f"node{node.node}: {count}")
    if not pools:
        return Finding(
            "OK",
            "hugepages",
            "no hugepages reserved (reserve them with `sudo sysctl -w "
            "vm.nr_hugepages=N` for stacks with --hugepages (ik_llama.cpp -thp) or --hugetlbfs)",
        )
    text = "; ".join(
        f"{kb // 1024} MiB pages: {', '.join(per_node)}" for kb, per_node in sorted(pools.items())
    )
    return Finding("OK", "hugepages", f"reserved {text}")


def _cuda_images(cuda: str, driver: str, arch: int) -> str:
    """Which CUDA images a stack here names and why, where their base comes from and, where that is
    NVIDIA's registry, which registry-free base this driver and GPU could use instead."""
    newest = next(reversed(MIN_DRIVER))
    names = f"stacks name the cuda{cuda} images"
    if cuda != newest:
        names += f" (cuda{newest} needs driver {'.'.join(map(str, MIN_DRIVER[newest]))}+)"
    origin = origin_of(cuda)
    if origin is not None:
        return f"{names}, their base needs no registry (`moe-stack base --cuda {cuda}`, from {WHERE[origin]})"
    free = [
        (MIN_DRIVER[version], version, source)
        for source, releases in LOCAL_CUDA.items()
        for version in releases
        if driver_runs(driver, version) and cuda_knows_arch(version, arch)
    ]
    if free:
        _, best, source = max(free)
        instead = (
            f"without a registry, build cuda{best} images on `moe-stack base --cuda {best}` ({WHERE[source]})"
        )
    else:
        instead = f"no registry-free base runs arch {arch} on this driver (CUDA {cuda} is registry-only here)"
    return f"{names}, their base is NVIDIA's nvidia/cuda:{cuda} image; {instead}"


def _gpus(host: HostFacts, runtime_ok: bool) -> list[Finding]:
    if not host.gpus:
        return [
            Finding(
                "WARN",
                "gpu",
                "no NVIDIA GPU (or no driver): only CPU images can run here",
                "install the NVIDIA driver, then re-run moe-stack doctor",
            )
        ]
    out = []
    for index, gpu in enumerate(host.gpus):
        cuda = highest_cuda(gpu.driver)
        if cuda is None:
            out.append(
                Finding(
                    "FAIL",
                    "gpu",
                    f"GPU {index} {gpu.name}: driver {gpu.driver} is older than any "
                    f"CUDA image here needs ({MIN_DRIVER['12.4'][0]}+)",
                    "upgrade the NVIDIA driver",
                )
            )
            continue
        out.append(
            Finding(
                "OK",
                "gpu",
                f"GPU {index} {gpu.name}: compute capability {gpu.compute_capability} "
                f"(arch {gpu.compute_capability.replace('.', '')}), {gpu.memory_mib // 1024} GiB, "
                f"driver {gpu.driver}: CUDA images up to {cuda}; "
                f"{_cuda_images(cuda, gpu.driver, int(gpu.compute_capability.replace('.', '')))}",
            )
        )
    out.append(
        Finding("OK", "gpu_runtime", "Docker can pass the GPU through (NVIDIA runtime or CDI)")
        if runtime_ok
        else Finding(
            "FAIL",
            "gpu_runtime",
            "Docker has no NVIDIA runtime and no CDI spec: containers can't see the GPU",
            "install nvidia-container-toolkit, then: sudo nvidia-ctk runtime configure "
            "--runtime=docker && sudo systemctl restart docker",
        )
    )
    return out


def _model_fits(host: HostFacts, model_bytes: int) -> Finding:
    """The model with what a llama.cpp engine's server keeps beside it (its default prompt cache and
    its buffers, as a stack's memory sum counts them) against RAM + VRAM."""
    vram = sum(gpu.memory_mib for gpu in host.gpus) * 1024**2
    room = host.mem_total_bytes + vram
    beside = beside_model_bytes(LLAMA_CPP)
    needed = model_bytes + beside
    what = f"the model ({size(model_bytes)}) and the server's prompt cache and buffers ({size(beside)})"
    if needed > room:
        return Finding(
            "FAIL",
            "model",
            f"{what} need {size(needed)}, {size(needed - room)} more than RAM + VRAM ({size(room)})",
            "use a smaller quant, a host with more memory, or a smaller prompt cache (compose --cache-ram)",
        )
    return Finding("OK", "model", f"{what} fit in RAM + VRAM ({size(room)})")


def _numa_policies(host: HostFacts, model_bytes: int) -> list[Finding]:
    """On a multi-node host, what each way of placing the weights costs in RAM: interleaved over every
    node (compose's default here), bound to one node, or one copy per node (mirror). Which is faster is
    the host's to say: `moe-stack tune` compares interleave, none and membind:0 (its numa dimension)."""
    if len(host.nodes) < 2:
        return []
    count, smallest = len(host.nodes), min(node.mem_total_bytes for node in host.nodes)
    findings = [
        Finding(
            "OK",
            "numa-interleave",
            f"interleaved (compose's default on this {count}-node host): {size(model_bytes // count)} of "
            f"the weights on each node; every token reads all {count} nodes' memory, half of it across "
            "the socket link; `moe-stack tune` compares it with membind:0",
        )
    ]
    if model_bytes > smallest:
        findings.append(
            Finding(
                "WARN",
                "numa-membind",
                f"bound to one node (--numa membind --numa-nodes N) the weights ({size(model_bytes)}) exceed "
                f"a node's RAM ({size(smallest)}): the kernel would spill them to the other nodes",
                "keep interleave, or use a smaller quant to bind to one node",
            )
        )
    else:
        findings.append(
            Finding(
                "OK",
                "numa-membind",
                f"bound to one node the weights ({size(model_bytes)}) fit its RAM ({size(smallest)}), using "
                "that node's memory bandwidth alone (--numa membind --numa-nodes N)",
            )
        )
    mirrored = model_bytes * count
    findings.append(
        Finding(
            "OK" if mirrored <= host.mem_total_bytes else "WARN",
            "numa-mirror",
            f"one copy of the weights per node (each socket reading its own) would take {size(mirrored)} of "
            f"the {size(host.mem_total_bytes)} RAM; neither pinned engine has it (llama.cpp 0c1e57098's and "
            "ik_llama.cpp 007d640's --numa take distribute, isolate or numactl only)",
            "" if mirrored <= host.mem_total_bytes else "a mirror needs a smaller quant or more RAM",
        )
    )
    return findings


def bandwidth_finding(image: str, measured: ReadBandwidth | str, model: ModelFacts | None) -> Finding:
    """This host's memory read rate as moe-stack-bandwidth in `image` measures it (built for the image's
    CPU target, wide loads, threads pinned to cores: the way decode reads the experts), and with a model
    decode's ceiling: hybrid (the routed experts a token runs through, from RAM) and CPU-only (every
    active weight). `measured` is why it couldn't be read, when it couldn't."""
    if isinstance(measured, str):
        return Finding(
            "WARN",
            "bandwidth",
            f"no read rate: {measured}",
            "name an engine image built for this CPU (moe-stack images) that has moe-stack-bandwidth",
        )
    said = f"memory read rate {measured.describe()}, best of 5 rounds (moe-stack-bandwidth in {image})"
    if model is not None:
        ceilings = []
        for kind, hybrid in ([("hybrid", True)] if model.expert_count else []) + [("CPU-only", False)]:
            bound = DecodeBound(measured, model.read_per_token(hybrid), hybrid)
            if bound.bound_tps is not None:
                ceilings.append(
                    f"{kind} decode can't pass {bound.bound_tps:.1f} t/s "
                    f"({bound.bytes_per_token / 1e6:.1f} MB read a token)"
                )
        said += "; " + ", ".join(ceilings)
    return Finding("OK", "bandwidth", said)


def as_dicts(findings: list[Finding]) -> list[dict[str, str]]:
    return [asdict(f) for f in findings]
