"""Issue 47 on the GPU machine: item 13 (one full-size model end to end) and item 4 (ik_llama.cpp's own
--fit against moe-stack's plan on a 24 GB card).

Item 13: Qwen3-Next-80B-A3B at its real shape (`synth_shape("qwen3next")`, no changes: 48 layers, 512
experts of Q4_0, 44.6 GB), served by both llama.cpp engines with the command `moe-stack compose --preset
qwen3-next-80b-a3b --gpu nvidia` emits for the machine (seed_models.command's options): load time with
the page cache dropped and warm, mainline's `--load-mode` (the preset's `none`, mapped, `dio`), GPU memory
(nvidia-smi sampled every 0.5 s: peak over the run) against the plan's GPU bytes for that stack, prefill
and decode (a warm-up, then rounds), decode ÷ the bandwidth bound (token_read_bytes' RAM part at the
`moe-stack-bandwidth` read rate).

Item 4: with all but 24 GiB of the H200's free memory held by a blocker process (torch), ik_llama.cpp on
the R1-width slice r1-8 (and the full Qwen3-Next) as `compose --engine ik_llama.cpp --gpu nvidia`
writes it without a preset, with `--fit-vram-gb 24` (moe-stack's plan), and with `--placement fit`
(ik's own `--fit --fit-margin`), each with and without the R1 preset: where the engine put the tensors
(its log's buffer, override and fit lines), GPU peak, prefill and decode.

  full_size.py write DIR NAME…     the models (seed_models' MODELS and "qn-full")
  full_size.py run WORK OUT        the cases below whose engine (WORK/<engine>.done = ok) and model
                                   (WORK/models/NAME.gguf, the writer finished) are ready, in order,
                                   until $CASES_S; one JSON line each into WORK/results.jsonl (a case
                                   already there is not run again), the servers' logs into WORK/logs
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import seed_models  # bench/device, beside this file
from seed_models import BUFFER, MODELS, PROMPT, contract, stop

from builder.engines import get_engine
from builder.engines.compute_buffers import (
    CUDA_CONTEXT_BYTES,
    gpu_compute,
    prefill_pool,
)
from builder.engines.specs import StackSpec
from builder.errors import StackError
from builder.host.probe import probe
from builder.models.kv_cache import DEFAULT_UBATCH, kv_cache_bytes
from builder.models.synth_catalog import synth_shape
from builder.models.synth_moe import model_file_bytes, token_read_bytes
from builder.platform.flags import check_args
from builder.running.api import EngineApi
from builder.spec import EngineOptions
from builder.stacks.assemble import StackOptions, assemble_stack
from builder.stacks.memory_use import memory_use

MODELS["qn-full"] = ("qwen3-next-80b-a3b", synth_shape("qwen3next"))  # the real shape, unchanged
MIB = 1024**2
CARD_GIB = 24.0
HOST_FACTS = probe()


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    engine: str
    model: str
    preset: bool = True  # the model's preset (MODELS), else none
    fit_vram_gb: tuple[float, ...] = ()
    placement: str = "rules"
    changes: tuple[tuple[str, object], ...] = ()  # EngineOptions fields
    load_mode: str | None = None  # mainline's --load-mode, replacing the stack's
    cold: bool = False  # the page cache dropped first
    blocker: bool = False  # all but CARD_GIB of the GPU's free memory held
    rounds: int = 3
    full_warmup: bool = False  # the warm-up is a round of the full prompt (mapped weights faulted in)
    early: bool = False  # may run before the cases above it (they wait for the other engine's build)
    needs_s: int = 90  # started only with this much of the call left


IK, MAIN, QN, R1 = "ik_llama.cpp", "llama.cpp", "qn-full", "r1-8"
CASES = [
    # item 13: the preset's stacks, cold then warm
    Case("m-qn-cold", MAIN, QN, cold=True, early=True, needs_s=300),
    Case("m-qn-warm", MAIN, QN, rounds=0, early=True, needs_s=150),
    Case("i-qn-cold", IK, QN, cold=True, needs_s=300),
    # item 4: a 24 GB card; ik on the R1-width slice
    Case("i-r1-gpu", IK, R1, preset=False, blocker=True, needs_s=90),
    Case("i-r1-fit24", IK, R1, preset=False, fit_vram_gb=(CARD_GIB,), blocker=True, needs_s=90),
    Case("i-r1-p-fit24", IK, R1, fit_vram_gb=(CARD_GIB,), blocker=True, needs_s=90),
    Case("i-r1-fit", IK, R1, preset=False, placement="fit", blocker=True, needs_s=90),
    Case("i-r1-p-fit", IK, R1, placement="fit", blocker=True, needs_s=90),
    # item 13: mainline mapped, ik warm
    Case("m-qn-mmap", MAIN, QN, changes=(("mmap", True),), full_warmup=True, needs_s=200),
    Case("i-qn-warm", IK, QN, rounds=0, needs_s=150),
    # item 4 on the full Qwen3-Next: the plan's 24 GiB split against ik's --fit
    Case("i-qn-p-fit24", IK, QN, fit_vram_gb=(CARD_GIB,), blocker=True, needs_s=220),
    Case("i-qn-p-fit", IK, QN, placement="fit", blocker=True, needs_s=220),
    Case("m-qn-dio", MAIN, QN, load_mode="dio", rounds=1, needs_s=200),
    Case("m-qn-p-fit24", MAIN, QN, fit_vram_gb=(CARD_GIB,), blocker=True, rounds=1, needs_s=200),
    Case("m-qn-p-fit", MAIN, QN, placement="fit", blocker=True, rounds=1, needs_s=200),
]
OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
# Per-tensor placement lines: mainline (-lv 4) "tensor blk.3.ffn_up_exps.weight (...) buffer type
# overridden to CUDA_Host", ik "Tensor blk.3.ffn_up_exps.weight buffer type overriden to CPU"
TENSOR_PLACED = re.compile(r"(blk\.(\d+)\.ffn_\w+_exps\.weight)\b.*?overrid\w* to (\S+)")
NOTABLE = re.compile(
    r"buffer size|offloaded|fit|Fit|FIT|n_gpu_layers|CUDA_Host|mmap|load_mode|direct ?io|"
    r"error|Error|ERROR|failed|abort|free|projected|margin",
)


def write(directory: Path, names: list[str]) -> None:
    for name in names:
        shape = MODELS[name][1]
        print(json.dumps({"model": name, "planned_bytes": model_file_bytes(shape), "shape": repr(shape)}))
    seed_models.write(directory, names)


# ----- the stack and its plan ------------------------------------------------------------------------


def options_for(case: Case, model: Path) -> StackOptions:
    """As seed_models.command builds them (compose --preset P --gpu nvidia for this host), with the
    case's placement options."""
    return StackOptions(
        model=model,
        engine=get_engine(case.engine),
        preset=MODELS[case.model][0] if case.preset else None,
        gpu="nvidia",
        numa="none",
        image="native",
        skip_image_checks=True,
        engine_options=EngineOptions(**dict(case.changes)),  # type: ignore[arg-type]
        fit_vram_gb=case.fit_vram_gb,
        placement=case.placement,  # type: ignore[arg-type]
    )


def server_args(case: Case, stack: StackSpec, flags: dict[str, str], model: Path, port: int) -> list[str]:
    args = get_engine(case.engine).server_args(stack, flags)
    check_args(args, flags, f"{case.engine} (native)")
    args[args.index("--model") + 1] = str(model)
    args[args.index("--port") + 1] = str(port)
    args[args.index("--host") + 1] = "127.0.0.1"
    if case.load_mode:
        if "--load-mode" in args:
            args[args.index("--load-mode") + 1] = case.load_mode
        else:
            args += ["--load-mode", case.load_mode]
    return args + (["-lv", "4"] if "-lv" in flags else [])  # mainline logs its buffers from verbosity 4


def experts_on_gpu(stack: StackSpec, facts) -> list[int]:  # type: ignore[no-untyped-def]
    """Layers whose routed experts the stack's -ot rules (first match wins, as the engines apply them)
    put on a GPU; with no rule matching, a layer's experts go with the layer (all layers are on the GPU
    in these stacks)."""
    rules = [(re.compile(rule.rsplit("=", 1)[0]), rule.rsplit("=", 1)[1]) for rule in stack.override_tensors]
    layers = []
    for layer, n_bytes in enumerate(facts.expert_bytes):
        if not n_bytes:
            continue
        target = next((to for regex, to in rules if regex.search(f"blk.{layer}.ffn_up_exps.weight")), "GPU")
        if target != "CPU":
            layers.append(layer)
    return layers


def planned(stack: StackSpec) -> dict[str, object]:
    """The plan's GPU bytes for this stack, as _vram_plan sums them: the weights on the GPU (all but the
    token embeddings and the CPU's experts), the KV cache, the compute buffer, the CUDA context and ik's
    prefill pool."""
    adapter = stack.engine
    facts = stack.model.facts
    layout = adapter.cache_layout(stack.mla, stack.swa_full)
    latent = layout.latent
    ctx, ubatch, cache = stack.ctx_size, stack.ubatch_size or DEFAULT_UBATCH, stack.cache_type or "f16"
    kv = kv_cache_bytes(facts, ctx, cache, layout, stack.parallel, stack.cache_type_v, ubatch)
    compute = gpu_compute(adapter.buffer_fits, facts, ctx, ubatch, latent)
    pool = prefill_pool(adapter.buffer_fits, facts, ctx, ubatch, latent)
    gpu_layers = experts_on_gpu(stack, facts) if not stack.engine_fit else []
    experts = sum(facts.expert_bytes[layer] for layer in gpu_layers)
    gpu = facts.gpu_weight_bytes + experts + kv + compute.bytes + CUDA_CONTEXT_BYTES + pool
    return {
        "plan_gpu_mib": round(gpu / MIB),
        "plan_parts_mib": {
            "weights": round(facts.gpu_weight_bytes / MIB),
            "experts_on_gpu": round(experts / MIB),
            "kv": round(kv / MIB),
            "compute": round(compute.bytes / MIB),
            "compute_measured": compute.measured,
            "cuda_context": round(CUDA_CONTEXT_BYTES / MIB),
            "prefill_pool": round(pool / MIB),
        },
        "plan_expert_layers_on_gpu": gpu_layers if not stack.engine_fit else "the engine's --fit",
        "plan_ram_mib": round(memory_use(stack).memory_bytes / MIB),
        "expert_mib": round(sum(facts.expert_bytes) / MIB),
        "expert_layers": sum(1 for b in facts.expert_bytes if b),
    }


# ----- the machine -----------------------------------------------------------------------------------


_NVML: list[object] = []


def gpu_sample(pid: int) -> tuple[int, int, str]:
    """(the GPU's used MiB, process `pid`'s MiB, the source): NVML in this process (no nvidia-smi started
    beside a decode), else nvidia-smi."""
    try:
        import pynvml  # type: ignore[import-not-found]  # nvidia-ml-py, on the GPU machine

        if not _NVML:
            pynvml.nvmlInit()
            _NVML.append(pynvml.nvmlDeviceGetHandleByIndex(0))
        handle = _NVML[0]
        used = pynvml.nvmlDeviceGetMemoryInfo(handle).used // MIB
        app = max(
            (
                (p.usedGpuMemory or 0) // MIB
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
                if p.pid == pid
            ),
            default=0,
        )
        return used, app, "nvml"
    except Exception:  # noqa: BLE001  (no NVML here)
        used_rows = _smi(["--query-gpu=memory.used"])
        app = 0
        for row in _smi(["--query-compute-apps=pid,used_memory"]):
            if len(row) == 2 and row[0] == str(pid) and row[1].isdigit():
                app = int(row[1])
        return (int(used_rows[0][0]) if used_rows else 0), app, "nvidia-smi"


class Sampler:
    """The GPU's used memory, the server's own and the server's resident memory every 0.5 s, each kept
    at its peak."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak_used, self.peak_app, self.peak_rss, self.samples = pid, 0, 0, 0, 0
        self.source = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            used, app, self.source = gpu_sample(self.pid)
            self.peak_used, self.peak_app = max(self.peak_used, used), max(self.peak_app, app)
            try:
                status = Path(f"/proc/{self.pid}/status").read_text()
                rss = re.search(r"VmRSS:\s+(\d+) kB", status)
                if rss:
                    self.peak_rss = max(self.peak_rss, int(rss.group(1)) // 1024)
            except OSError:
                pass
            self.samples += 1
            self._stop.wait(0.5)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _smi(query: list[str]) -> list[list[str]]:
    try:
        text = subprocess.run(
            ["nvidia-smi", *query, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout
    except subprocess.TimeoutExpired:
        return []
    return [[cell.strip() for cell in line.split(",")] for line in text.splitlines() if line.strip()]


def gpu_free_used() -> tuple[int, int]:
    row = _smi(["--query-gpu=memory.free,memory.used"])
    return (int(row[0][0]), int(row[0][1])) if row else (-1, -1)


def drop_caches() -> dict[str, object]:
    before = _cached_mib()
    done = subprocess.run(
        ["sh", "-c", "sync && echo 3 > /proc/sys/vm/drop_caches"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return {
        "drop_caches_rc": done.returncode,
        "drop_caches_err": done.stderr.strip()[:200],
        "page_cache_mib_before": before,
        "page_cache_mib_after": _cached_mib(),
    }


def _cached_mib() -> int:
    match = re.search(r"^Cached:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.MULTILINE)
    return int(match.group(1)) // 1024 if match else -1


class Blocker:
    """A torch process holding all but CARD_GIB of the GPU's free memory (a smaller card's VRAM)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.info: dict[str, object] = {}

    def hold(self) -> dict[str, object]:
        if self.proc is not None and self.proc.poll() is None:
            return self.info
        code = (
            "import time, torch\n"
            "free, total = torch.cuda.mem_get_info()\n"
            f"n = free - int({CARD_GIB} * 2**30)\n"
            "x = torch.empty(n, dtype=torch.uint8, device='cuda')\n"
            "torch.cuda.synchronize()\n"
            "print(n, free, total, flush=True)\n"
            "time.sleep(36000)\n"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        time.sleep(1)
        free, used = gpu_free_used()
        self.info = {
            "blocker_bytes": int(line[0]) if line else -1,
            "blocker_saw_free": int(line[1]) if line else -1,
            "gpu_free_mib_with_blocker": free,
            "gpu_used_mib_with_blocker": used,
        }
        print(json.dumps({"blocker": self.info}), flush=True)
        return self.info

    def release(self) -> None:
        if self.proc is not None:
            stop(self.proc)
            self.proc = None
            time.sleep(1)


# ----- one case --------------------------------------------------------------------------------------


def bandwidth_gbs(work: Path) -> float | None:
    try:
        match = re.search(r"read GB/s ([\d.]+)", (work / "bandwidth.txt").read_text())
    except OSError:
        return None
    return float(match.group(1)) if match else None


def completion(api: EngineApi, prompt: str, n_predict: int) -> tuple[dict, float]:
    began = time.time()
    reply = api.post(
        "/completion", {"prompt": prompt, "n_predict": n_predict, "ignore_eos": True, "cache_prompt": False}
    )
    return reply, round(time.time() - began, 2)


def run_case(case: Case, work: Path, port: int, deadline: float, blocker: Blocker) -> dict[str, object]:
    model = work / "models" / f"{case.model}.gguf"
    options = options_for(case, model)
    stack = assemble_stack(options, HOST_FACTS)
    flags = contract(case.engine, work)
    args = server_args(case, stack, flags, model, port)
    result: dict[str, object] = {"case": case.name, **{k: v for k, v in dataclasses.asdict(case).items()}}
    result["command"] = args
    result.update(planned(stack))
    if case.placement == "fit" or case.fit_vram_gb or case.blocker:  # moe-stack's own plan for the card
        plan24 = assemble_stack(
            options.model_copy(update={"fit_vram_gb": (CARD_GIB,), "placement": "rules"}), HOST_FACTS
        )
        result["plan24"] = {
            "override_tensors": list(plan24.override_tensors),
            **{k: v for k, v in planned(plan24).items() if k.startswith("plan_")},
        }
    shape = MODELS[case.model][1]
    result["token_ram_bytes"], result["token_vram_bytes"] = token_read_bytes(shape)
    if case.blocker:
        result.update(blocker.hold())
    else:
        blocker.release()
    if case.cold:
        result.update(drop_caches())
    result["page_cache_mib_at_start"] = _cached_mib()
    result["gpu_free_used_mib_before"] = gpu_free_used()
    baseline = gpu_sample(0)[0]
    log = work / "logs" / f"{case.name}.log"
    started = time.time()
    with log.open("w") as sink:
        server = subprocess.Popen(
            [str(work / case.engine / "build/bin/llama-server"), *args],
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    sampler = Sampler(server.pid)
    try:
        measure(case, server, port, started, deadline, result, work)
    except StackError as err:
        result["error"] = str(err)
    finally:
        stop(server)
        sampler.close()
    result["gpu_peak_used_mib"] = sampler.peak_used
    result["gpu_peak_mib_over_baseline"] = sampler.peak_used - baseline
    result["gpu_peak_app_mib"] = sampler.peak_app
    result["rss_peak_mib"] = sampler.peak_rss
    result["samples"], result["sampler"] = sampler.samples, sampler.source
    text = log.read_text(errors="replace")
    result["buffers_mib"] = [
        [where, kind or "model", float(mib)] for where, kind, mib in BUFFER.findall(text)
    ]
    offloaded = OFFLOADED.findall(text)
    result["offloaded"] = "/".join(offloaded[-1]) if offloaded else None
    placed: dict[str, set[int]] = {}
    for _tensor, layer, target in TENSOR_PLACED.findall(text):
        placed.setdefault(target, set()).add(int(layer))
    result["expert_layers_by_target"] = {target: sorted(layers) for target, layers in placed.items()}
    notable = [line.strip()[:220] for line in text.splitlines() if NOTABLE.search(line)]
    notable = [line for line in notable if not TENSOR_PLACED.search(line)]
    result["log_lines"] = notable[:80]
    if result.get("decode_median") and result.get("bandwidth_gbs"):
        bound = result["bandwidth_gbs"] * 1e9 / result["token_ram_bytes"]  # type: ignore[operator]
        result["bound_tps"] = round(bound, 1)
        result["decode_over_bound"] = round(result["decode_median"] / bound, 3)  # type: ignore[operator]
    return result


def measure(
    case: Case, server: subprocess.Popen, port: int, started: float, deadline: float, result: dict, work: Path
) -> None:
    limit = min(started + 600, deadline - 15)
    if not seed_models._healthy(port, limit, server):
        result["error"] = f"not healthy after {round(time.time() - started)} s (exit {server.poll()})"
        result["incomplete"] = server.poll() is None  # still loading at the deadline: run again
        return
    result["load_s"] = round(time.time() - started, 1)
    result["gpu_free_used_mib_loaded"] = gpu_free_used()
    api = EngineApi(port, timeout_s=240)
    reply, seconds = completion(api, "hello the model", 16)
    result["warmup_s"], result["completion"] = seconds, reply.get("content")
    if case.full_warmup:
        reply, seconds = completion(api, PROMPT, 16)
        result["warmup_full_s"] = seconds
        result["warmup_full_prefill_tps"] = round(reply["timings"]["prompt_per_second"], 1)
    prefill, decode = [], []
    for _ in range(case.rounds):
        if time.time() > deadline - 20:
            result["rounds_cut"] = True
            break
        reply, _seconds = completion(api, PROMPT, 64)
        prefill.append(round(reply["timings"]["prompt_per_second"], 1))
        decode.append(round(reply["timings"]["predicted_per_second"], 2))
        result["prompt_tokens"] = reply["timings"]["prompt_n"]
    result["gpu_free_used_mib_after_rounds"] = gpu_free_used()
    if decode:
        result["prefill_tps"], result["decode_tps"] = prefill, decode
        result["prefill_median"] = statistics.median(prefill)
        result["decode_median"] = statistics.median(decode)
        result["bandwidth_gbs"] = bandwidth_gbs(work)


# ----- the loop --------------------------------------------------------------------------------------


def needs(case: Case) -> int:
    """The case's time, or NEEDS_<name> (dashes as underscores) where a call knows better."""
    return int(os.environ.get("NEEDS_" + case.name.replace("-", "_"), case.needs_s))


def ready(case: Case, work: Path) -> bool:
    done = work / f"{case.engine}.done"
    model = work / "models" / f"{case.model}.gguf"
    return (
        done.is_file()
        and done.read_text().strip() == "ok"
        and model.is_file()
        and (work / "write.done").is_file()
    )


def finished(results: Path) -> set[str]:
    if not results.is_file():
        return set()
    names = set()
    for line in results.read_text().splitlines():
        row = json.loads(line)
        if not row.get("incomplete"):
            names.add(row["case"])
    return names


def main() -> None:
    verb = sys.argv[1]
    if verb == "write":
        write(Path(sys.argv[2]), sys.argv[3:])
        return
    work = Path(sys.argv[2])  # argv[3], OUT: the shell script copies the results there
    deadline = time.time() + float(os.environ.get("CASES_S", "480"))
    results = work / "results.jsonl"
    port = 19000 + int(time.time()) % 500 * 2  # a port of its own each call: one can outlive its server
    blocker = Blocker()
    failed_engines = set()
    first = [n for n in os.environ.get("CASES_FIRST", "").split(",") if n]  # this call's order, e.g. the
    CASES.sort(key=lambda c: first.index(c.name) if c.name in first else len(first))  # last call's
    try:
        while time.time() < deadline:
            done = finished(results)
            pending = [c for c in CASES if c.name not in done and c.engine not in failed_engines]
            if not pending:
                print("all cases done", flush=True)
                break
            for engine in {c.engine for c in pending}:
                state = work / f"{engine}.done"
                if state.is_file() and state.read_text().strip() != "ok":
                    failed_engines.add(engine)
                    print(f"{engine}: build failed", flush=True)
            head = pending[0]
            candidates = [c for c in [head] + [c for c in pending[1:] if c.early] if ready(c, work)]
            left = deadline - time.time()
            case = next((c for c in candidates if needs(c) <= left), None)
            if case is None:
                if candidates:  # ready, but not in what is left of this call: the next call runs it
                    print(f"{round(left)} s left: too little for {[c.name for c in candidates]}", flush=True)
                    break
                time.sleep(5)  # the engine or the model is not ready yet
                continue
            print(f"{time.strftime('%T')} {case.name} ({round(left)} s left)", flush=True)
            port += 1
            if case.name == "i-r1-fit24":  # the same command as i-r1-gpu when the plan puts all on the GPU
                same = _same_command(case, next(c for c in CASES if c.name == "i-r1-gpu"), work, port)
                if same:
                    row: dict[str, object] = {
                        "case": case.name,
                        "same_command_as": "i-r1-gpu",
                        "command": same,
                    }
                    _append(results, row)
                    continue
            try:
                result = run_case(case, work, port, deadline, blocker)
            except StackError as err:  # its command refused (a plan that does not fit, a flag missing)
                result = {"case": case.name, "error": f"{type(err).__name__}: {err}"}
            _append(results, result)
            short = {k: v for k, v in result.items() if k not in ("command", "log_lines", "buffers_mib")}
            print(json.dumps(short), flush=True)
    finally:
        blocker.release()


def _same_command(case: Case, other: Case, work: Path, port: int) -> list[str] | None:
    model = work / "models" / f"{case.model}.gguf"
    flags = contract(case.engine, work)
    mine = server_args(case, assemble_stack(options_for(case, model), HOST_FACTS), flags, model, port)
    theirs = server_args(other, assemble_stack(options_for(other, model), HOST_FACTS), flags, model, port)
    return mine if mine == theirs else None


def _append(results: Path, row: dict[str, object]) -> None:
    with results.open("a") as sink:
        sink.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
