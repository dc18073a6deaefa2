"""What a device case measures (harness.py runs them): each takes the stack `moe-stack compose --gpu nvidia
[--preset P]` emits for this host and the case's model, run natively by the case's tree.

  serve    the engine's server: healthy, its logged buffers, GPU memory (peak, sampled), a completion,
           prefill and decode rounds (a warm-up first), decode against the read bound. Of an image
           (ENGINE@NAME+image): its entrypoint with the service's command and environment, in its own
           root filesystem (machine.enter), beside a tree's server in alternating rounds.
           load=1 (started, buffers read, stopped), pp=N/N… (prefill at each length), rounds=N,
           cold=1 (page cache dropped first), card=GiB (a torch process holds all but that much of
           the GPU), load_mode=MODE (mainline's --load-mode), warmup=full
  restart  the server's prompt cache across restarts: a prompt of sentences=N (618: 32754 tokens) cold,
           again, its slot saved; three restarts with the slot restored, one without
  bench    llama-bench with the stack's own settings (builder.running.tool_bench): p=, n=, r=, gpu=1
           (every tensor on the GPU: the -ot rules dropped) and -FLAG=VALUE levers (replacing the
           stack's value, or added)
  tune     `moe-stack tune --native-bin` on the stack for budget=S seconds (tune=--decode/--only/fmoe,amb:
           more of its options, split at /)
  bandwidth host:tool or host:reference: a read of host memory (march=, pages=, bind=close, vector=512)
  pinned-pages  host:torch: the page-locked allocations SGLang's file backend makes to read a prompt back
  fatbin   TREE:objects: the tree's CUDA device code object by object (TREE+lineinfo: with -lineinfo)
  kt, kt-restart, kt-check   KTransformers from the image's own packages (kt.py)

Options of every stack: preset=none (compose's own derivation), extra=ARG/ARG (engine arguments
after --), fit=GiB, placement=fit, gpu=none, and EngineOptions fields (ub, ctx and mmap for short);
of every case: needs=S (started only with that much of the call left; each measure has its own).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from machine import (
    REPO,
    WORK,
    Case,
    GpuPeak,
    Tree,
    builder_env,
    enter,
    gpu_used_mib,
    healthy,
    next_port,
    output,
    serve,
    stop,
)
from models import KT_MODELS, MODELS, path_of, quantized, quantizer_of

from builder.contract import CONTAINER_PORT
from builder.engines import get_engine
from builder.engines.base import StackSpec
from builder.engines.llama_family import LlamaFamilyEngine
from builder.errors import StackError
from builder.host.probe import probe
from builder.models.synth_moe import token_read_bytes
from builder.platform.flags import check_args, from_label, parse_contract
from builder.running.api import EngineApi
from builder.running.tool_bench import parse_llama_bench, tool_args
from builder.spec import EngineOptions
from builder.stackfile.service_parts import SERVICE
from builder.stacks.assemble import assemble_stack
from builder.stacks.compose import compose_stack
from builder.stacks.options import StackOptions

HOST = probe()
SENTENCE = "the expert model reads a token from memory and the cache"
TOKENS_PER_SENTENCE = 53  # in the synthetic vocabulary
PROMPT = " ".join([SENTENCE] * 48)  # 2545 tokens of the synthetic vocabulary (530 in a real one)
# "CUDA0 KV buffer size = 229.50 MiB" (both engines; ik's weights: "CUDA0 buffer size", mainline's "model")
BUFFER = re.compile(r"(\S+)\s+(?:(model|KV|RS|compute|output) )?buffer size =\s+([\d.]+) MiB")
OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
HARNESS_OPTIONS = {"preset", "extra", "fit", "placement", "gpu", "load", "pp", "rounds", "cold", "card",
                   "load_mode", "warmup", "sentences", "p", "n", "r", "budget", "tune", "needs"}  # fmt: skip
SHORT = {"ub": "ubatch_size", "ctx": "ctx_size"}


def log_name(case: Case, round_: int) -> str:
    return re.sub(r"[^A-Za-z0-9.=_@+-]+", "_", case.key(round_))


def model_file(case: Case) -> Path:
    return quantized(case.model, quantizer_of(case.tree)) if "~" in case.model else path_of(case.model)


def engine_options(case: Case) -> EngineOptions:
    given: dict[str, object] = {
        SHORT.get(k, k): v
        for k, v in case.options.items()
        if k not in HARNESS_OPTIONS and not k.startswith("-")
    }
    if "mmap" in given:
        given["mmap"] = case.options["mmap"] == "1"
    return EngineOptions(**given)  # type: ignore[arg-type]


def contract(tree: Tree, tool: str = "llama-server") -> dict[str, str]:
    """The built tool's flags: its --help, plus its parser's literals where the engine's --help leaves
    flags out (as the images' contract stage reads them)."""
    engine = get_engine(tree.engine_name)
    help_text = output([str(tree.tool(tool)), "--help"], timeout=60)
    literals_command = engine.parser_literals_command() if tool == "llama-server" else None  # type: ignore[attr-defined]
    literals = output(literals_command.replace("/src/", f"{tree.home}/")) if literals_command else None
    return parse_contract(help_text, literals)


def stack_of(case: Case) -> StackSpec:
    """The stack compose writes for this host and the case's model and options."""
    options = case.options
    return assemble_stack(
        StackOptions(
            model_path=model_file(case),
            engine=case.tree.engine_name,  # type: ignore[arg-type]  # given by name
            preset=None if options.get("preset") == "none" else MODELS[case.model.partition("~")[0]][0],
            gpu=options.get("gpu", "nvidia"),  # type: ignore[arg-type]
            numa="none",
            image="native",  # nothing pulls it: a tree runs natively, an image entered
            skip_image_checks=True,
            engine_options=engine_options(case),
            engine_args=tuple(options["extra"].split("/")) if "extra" in options else (),
            fit_vram_gb=(float(options["fit"]),) if "fit" in options else (),
            placement=options.get("placement", "rules"),  # type: ignore[arg-type]
        ),
        HOST,
    )


def command(case: Case, port: int) -> list[str]:
    """The stack's engine arguments, checked against the build's contract, pointed at the model file and
    a local port."""
    options, model, stack = case.options, model_file(case), stack_of(case)
    flags = contract(case.tree)
    args = stack.engine.server_args(stack, flags)
    check_args(args, flags, f"{case.tree.name} (native)")
    for flag, value in (("--model", str(model)), ("--port", str(port)), ("--host", "127.0.0.1")):
        args[args.index(flag) + 1] = value
    if "--load-mode" in args and "load_mode" in options:
        args[args.index("--load-mode") + 1] = options["load_mode"]
    elif "load_mode" in options:
        args += ["--load-mode", options["load_mode"]]
    return args + buffers_logged(flags)


def buffers_logged(flags: dict[str, str]) -> list[str]:
    """What makes the server log its buffers: mainline logs them from verbosity 4 (a server with -lv)."""
    return ["-lv", "4"] if "-lv" in flags else []


def complete(api: EngineApi, prompt: str, n_predict: int, **more: object) -> dict:
    body = {"prompt": prompt, "n_predict": n_predict, "ignore_eos": True, "cache_prompt": False, **more}
    return api.post("/completion", body)


def held_gpu(card_gib: float) -> subprocess.Popen:
    """A torch process holding all but `card_gib` of the GPU's free memory: a smaller card."""
    code = (
        "import time, torch\nfree, total = torch.cuda.mem_get_info()\n"
        f"x = torch.empty(free - int({card_gib} * 2**30), dtype=torch.uint8, device='cuda')\n"
        "torch.cuda.synchronize()\nprint(free, flush=True)\ntime.sleep(36000)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert holder.stdout is not None
    holder.stdout.readline()
    return holder


def drop_caches() -> int:
    return subprocess.run(["sh", "-c", "sync && echo 3 > /proc/sys/vm/drop_caches"], check=False).returncode


# ----- the measures -------------------------------------------------------------------------------


def measure_serve(case: Case, row: dict, deadline: float) -> None:
    options = case.options
    if options.get("cold") == "1":
        row["drop_caches_rc"] = drop_caches()
    holder = held_gpu(float(options["card"])) if "card" in options else None
    log = WORK / "logs" / f"{log_name(case, row['round'])}.log"
    started = time.time()
    with GpuPeak() as peak:
        server, port = started_server(case, row, log)
        try:
            speeds(case, server, port, started, deadline, row)
        except StackError as err:  # e.g. the server died on a request: its buffers are still in the log
            row["error"] = str(err)
        finally:
            stop(server)
            if holder is not None:
                stop(holder)
    row["gpu_peak_used_mib"] = peak.peak_mib
    text = log.read_text(errors="replace")
    row["buffers_mib"] = [[where, kind or "model", float(mib)] for where, kind, mib in BUFFER.findall(text)]
    offloaded = OFFLOADED.findall(text)
    row["offloaded"] = "/".join(offloaded[-1]) if offloaded else None


def started_server(
    case: Case, row: dict, log: Path, more: tuple[str, ...] = ()
) -> tuple[subprocess.Popen, int]:
    """The case's server and its port: the tree's llama-server with the stack's arguments and `more`, or an
    image's entrypoint with the command and environment compose writes for its service, as a runtime
    starts it (`more` after them)."""
    if not case.tree.is_image:
        port = next_port()
        row["command"] = args = [*command(case, port), *more]
        return serve(case.tree.tool("llama-server"), args, log), port
    service = compose_stack(stack_of(case), "bench/device/harness.py", check_files=False).service(SERVICE)
    flags = from_label((case.tree.home / "carried/flags.json").read_text())  # the image's own contract
    args = [*service.args, *buffers_logged(flags), *more]
    check_args(args, flags, f"{case.tree.name} (its contract)")
    row["command"], row["environment"] = args, service.env
    return enter(case.tree, model_file(case).parent, args, service.env, log), CONTAINER_PORT


def speeds(
    case: Case, server: subprocess.Popen, port: int, started: float, deadline: float, row: dict
) -> None:
    """Healthy (no more with load=1: the buffers a start logs), a warm-up, prefill and decode rounds, then
    prefill at each pp= length or one prompt 8 times longer (every micro-batch full)."""
    options = case.options
    if not healthy(port, server, min(started + 600, deadline)):
        row["error"] = f"not healthy after {round(time.time() - started)} s (exit {server.poll()})"
        return
    row["load_s"], row["gpu_used_mib"] = round(time.time() - started, 1), gpu_used_mib()
    if options.get("load") == "1":
        return
    api = EngineApi(port, timeout_s=240)
    row["completion"] = complete(api, PROMPT if options.get("warmup") == "full" else "hello the model", 16)[
        "content"
    ]
    prefill, decode = [], []
    for _ in range(int(options.get("rounds", "3"))):
        timings = complete(api, PROMPT, 64)["timings"]
        prefill.append(round(timings["prompt_per_second"], 1))
        decode.append(round(timings["predicted_per_second"], 2))
        row["prompt_tokens"] = timings["prompt_n"]
    if not decode:  # rounds=0: loaded and warmed up only
        return
    row |= {"prefill_tps": prefill, "decode_tps": decode, "gpu_used_after_prefill_mib": gpu_used_mib()}
    row["decode_median"] = statistics.median(decode)
    if "pp" in options:
        at = {}
        for length in map(int, options["pp"].split("/")):
            timed = complete(api, " ".join([SENTENCE] * max(1, length // TOKENS_PER_SENTENCE)), 1)["timings"]
            at[str(length)] = [timed["prompt_n"], round(timed["prompt_per_second"], 1)]
        row["prefill_at"] = at
    else:
        timings = complete(api, PROMPT * 8, 4)["timings"]
        row["long_prompt_tokens"], row["long_prefill_tps"] = (
            timings["prompt_n"],
            round(timings["prompt_per_second"], 1),
        )


def measure_restart(case: Case, row: dict, deadline: float) -> None:
    """The prompt cold, cached, its slot saved; then restarts with the slot restored before the prompt,
    and one without: each step's wall time and the engine's prompt_n (1 where the restore was used)."""
    steps: list[dict] = []
    slots = WORK / "slots"
    slots.mkdir(exist_ok=True)
    query = {"prompt": " ".join([SENTENCE] * int(case.options.get("sentences", "618"))), "n_predict": 1,
             "cache_prompt": True, "id_slot": 0}  # fmt: skip

    def timed(path: str, body: dict, step: str, **more: object) -> dict:
        began = time.time()
        reply = api.post(path, body)
        prompt_n = reply.get("timings", {}).get("prompt_n")
        steps.append({"step": step, "wall_s": round(time.time() - began, 3), "prompt_n": prompt_n, **more})
        return reply

    for number, step in enumerate(["cold", "restart 0", "restart 1", "restart 2", "restart without restore"]):
        started = time.time()
        log = WORK / "logs" / f"{log_name(case, row['round'])}-{number}.log"
        # Each start on a port of its own (started_server): the API follows it.
        server, port = started_server(case, row, log, ("--slot-save-path", f"{slots}/"))
        api = EngineApi(port, timeout_s=300)
        try:
            if not healthy(port, server, min(started + 600, deadline)):
                row["error"] = f"{step}: not healthy (exit {server.poll()})"
                break
            load_s = round(time.time() - started, 1)
            if number == 0:
                api.post("/completion", {"prompt": "hello", "n_predict": 4})
                timed("/completion", query, "cold", load_s=load_s)
                timed("/completion", query, "the same server, cached")
                saved = timed("/slots/0?action=save", {"filename": "slot.bin"}, "save")
                steps[-1]["bytes"] = (slots / "slot.bin").stat().st_size
                steps[-1]["reply"] = saved
            elif step.startswith("restart ") and "without" not in step:
                restored = timed("/slots/0?action=restore", {"filename": "slot.bin"}, f"{step}: restore")
                steps[-1]["reply"] = restored
                timed("/completion", query, f"{step}: the prompt", load_s=load_s)
            else:
                timed("/completion", query, step, load_s=load_s)
        finally:
            stop(server)
    row["steps"] = steps


def measure_bench(case: Case, row: dict, deadline: float) -> None:
    """llama-bench with the stack's settings as the tool takes them, the case's levers applied."""
    del deadline
    options = case.options
    server_args = command(case, next_port())
    engine = get_engine(case.tree.engine_name)
    assert isinstance(engine, LlamaFamilyEngine)
    bench_flags = contract(case.tree, "llama-bench")
    p, n, r = (options.get(k, d) for k, d in (("p", "0"), ("n", "64"), ("r", "2")))
    translated = tool_args(engine, "llama-bench", server_args, bench_flags, 0, 0, int(r))
    args = with_levers(translated.args, options, p.replace("/", ","), n)
    row |= {"command": args, "left_out": translated.left_out}
    log = WORK / "logs" / f"{log_name(case, row['round'])}.log"
    run = subprocess.run(
        [str(case.tree.tool("llama-bench")), *args], capture_output=True, text=True, timeout=900, check=False
    )
    log.write_text(run.stderr)
    rows = parse_llama_bench(run.stdout)
    row["tests"] = {bench.test: [round(v, 2) for v in bench.samples_tps] for bench in rows}


def with_levers(args: list[str], options: dict[str, str], prompt: str, generate: str) -> list[str]:
    """`args` with -p/-n set, each -FLAG=VALUE lever replacing the stack's value (or added), and with
    gpu=1 no -ot rule (every tensor on the GPU)."""
    levers = {"-p": prompt, "-n": generate} | {k: v for k, v in options.items() if k.startswith("-")}
    out, at = [], 0
    while at < len(args):
        flag, value = args[at], args[at + 1]
        at += 2
        if flag == "-ot" and options.get("gpu") == "1":
            continue
        out += [flag, levers.pop(flag, value)]
    return out + [item for pair in levers.items() for item in pair]


def measure_tune(case: Case, row: dict, deadline: float) -> None:
    """`moe-stack tune --native-bin` on the stack compose writes for this host, for budget=S seconds."""
    options = case.options
    budget = min(int(options.get("budget", "300")), int(deadline - time.time() - 30))
    stack = WORK / "logs" / f"tune-{case.tree.name}-{case.model}.yaml"
    preset = MODELS[case.model][0]
    builder = [sys.executable, "-m", "builder"]
    compose = [*builder, "compose", "--engine", case.tree.engine_name, "--model", str(path_of(case.model)),
               "--preset", preset, "--gpu", "nvidia", "--skip-image-checks", "--for-other-host",
               "--port", "18080", "-o", str(stack)]  # fmt: skip
    more = [arg for arg in options.get("tune", "").split("/") if arg]
    tune = [*builder, "tune", str(stack), "--native-bin", str(case.tree.tool("")), "--budget", f"{budget}s",
            "--plot", str(stack.with_suffix(".png")), *more]  # fmt: skip
    for step in (compose, tune):
        run = subprocess.run(step, capture_output=True, text=True, env=builder_env(), check=False)
        with stack.with_suffix(".log").open("a") as log:
            log.write(f"$ {' '.join(step)}\n{run.stdout}{run.stderr}")
        if run.returncode:
            row["error"] = f"{step[3]} failed: {run.stdout[-300:]}{run.stderr[-300:]}"
            return
    row["command"], row["tune_tail"] = tune, run.stdout.splitlines()[-12:]


def measure_bandwidth(case: Case, row: dict, deadline: float) -> None:
    """A read of host memory: the images' tool (model `tool`, dockerfiles/common/moe-stack-bandwidth.c) or
    the reference loop (`reference`, tests/unit/data/read_reference.c), compiled for march= (vector=512:
    512-bit vectors preferred), with pages= (the tool's --pages) or bind=close (OpenMP threads pinned)."""
    del deadline
    options = case.options
    source = {
        "tool": "dockerfiles/common/moe-stack-bandwidth.c",
        "reference": "tests/unit/data/read_reference.c",
    }
    flags = ["-O3", "-fopenmp", f"-march={options.get('march', 'native')}"]
    flags += ["-mprefer-vector-width=512"] if options.get("vector") == "512" else []
    binary = WORK / log_name(case, 0)
    subprocess.run(["gcc", *flags, "-o", str(binary), str(REPO / source[case.model])], check=True)
    args = ["4096", "--rounds", "9"] if case.model == "tool" else ["4096", "9"]
    args += ["--pages", options["pages"]] if "pages" in options else []
    env = {"OMP_PROC_BIND": "close", "OMP_PLACES": "cores"} if options.get("bind") == "close" else {}
    run = subprocess.run(
        [str(binary), *args], capture_output=True, text=True, env={**os.environ, **env}, check=False
    )
    row["command"], row["printed"] = [*flags, *args], run.stdout.splitlines()[-12:]
    best = re.search(r"read GB/s ([\d.]+)", run.stdout)  # the best round (both print it so)
    row["best_gbs"] = float(best.group(1)) if best else None


def measure_pinned_pages(case: Case, row: dict, deadline: float) -> None:
    """What reading a stored prompt back costs SGLang before a byte is read (host:torch): sglang-kt 0.7.2's
    file backend gets each page into a new zeroed page-locked tensor (memory_pool_host.py's
    get_dummy_flat_data_page, `pin_memory=True`), then copies it into the host pool. The allocations for
    a 12.9k-token prompt's pages (201 of 64 tokens, bf16 K and V of 4 heads of 128) at the kt-restart
    slice's 2 layers and Qwen3-235B's 94, fresh and again (torch keeps freed pinned blocks), and
    unpinned: in a process of its own, so that each case's first allocation is a fresh one."""
    del case, deadline
    code = """
import json, sys, time, torch
torch.cuda.init()
pages, page_tokens, kv_heads, head_dim = 201, 64, 4, 128
def seconds(layers, pinned):
    started = time.perf_counter()
    held = [torch.zeros((2, layers, page_tokens, kv_heads, head_dim), dtype=torch.bfloat16,
                        pin_memory=pinned) for _ in range(pages)]
    elapsed = time.perf_counter() - started
    del held
    return round(elapsed, 3)
print(json.dumps({name: {"page_bytes": 2 * layers * page_tokens * kv_heads * head_dim * 2,
                         "pinned_fresh_s": seconds(layers, True), "pinned_again_s": seconds(layers, True),
                         "unpinned_s": seconds(layers, False)}
                  for name, layers in (("slice", 2), ("qwen3-235b", 94))}))
"""
    child = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    if child.returncode:
        raise ValueError(f"the allocations' own process failed: {child.stderr[-300:]}")
    row |= json.loads(child.stdout)


def measure_fatbin(case: Case, row: dict, deadline: float) -> None:
    """Each CUDA object's device code in the tree's build (model `objects`): its .nv_fatbin section's bytes
    (compressed, as linked into llama-server) and their sum. TREE+lineinfo against TREE: what the image's
    dockerfiles/llama-cpp-family/cuda-no-lineinfo.sh takes off (bench/results/ik-cuda-size-2026-12-02)."""
    del deadline
    sizes = {}
    for path in sorted((case.tree.home / "build").rglob("*.cu.o")):
        sections = subprocess.run(["size", "-A", str(path)], capture_output=True, text=True, check=True)
        fields = [line.split() for line in sections.stdout.splitlines()]
        sizes[path.stem] = sum(int(f[1]) for f in fields if f[:1] == [".nv_fatbin"])
    row["objects"], row["fatbin_bytes"] = sizes, sum(sizes.values())


def in_kt(name: str) -> Callable[[Case, dict, float], None]:
    """kt.py's measure `name`, imported when a case runs it (the image's packages come onto the path with
    kt.py, and the kt measures alone need them)."""

    def run(case: Case, row: dict, deadline: float) -> None:
        import kt

        getattr(kt, name)(case, row, deadline)

    return run


@dataclass(frozen=True)
class Measure:
    run: Callable[[Case, dict, float], None]
    targets: tuple[str, ...]  # what its tree builds (none: no build)
    needs_s: int  # started only with this much of the call left (needs=S: a case's own)
    models: tuple[str, ...] = tuple(MODELS)  # what its cases may name


MEASURES = {
    "serve": Measure(measure_serve, ("llama-server",), 90),
    "restart": Measure(measure_restart, ("llama-server",), 150),
    "bench": Measure(measure_bench, ("llama-server", "llama-bench"), 120),
    "tune": Measure(measure_tune, ("llama-server", "llama-bench"), 360),
    "bandwidth": Measure(measure_bandwidth, (), 60, ("tool", "reference")),  # host:tool, host:reference
    "pinned-pages": Measure(measure_pinned_pages, (), 60, ("torch",)),  # host:torch
    "fatbin": Measure(measure_fatbin, ("llama-server",), 30, ("objects",)),  # TREE:objects
    "kt": Measure(in_kt("measure_kt"), (), 420, tuple(KT_MODELS)),  # ktransformers:MODEL
    "kt-restart": Measure(in_kt("measure_kt_restart"), (), 480, tuple(KT_MODELS)),
    "kt-check": Measure(in_kt("measure_kt_check"), (), 120, ("kt",)),  # host:kt
}


def needs_s(case: Case) -> int:
    return int(case.options.get("needs", MEASURES[case.measure].needs_s))


def check(case: Case) -> None:
    """A case as the harness would run it, short of the machine: its measure, model, options and tree's
    configure arguments known (raises what is wrong)."""
    if case.measure not in MEASURES:
        raise ValueError(f"{case.line}: no measure {case.measure!r}: choose one of {', '.join(MEASURES)}")
    measure = MEASURES[case.measure]
    if case.model.partition("~")[0] not in measure.models:
        raise ValueError(
            f"{case.line}: no model {case.model!r}: {case.measure} takes {', '.join(measure.models)}"
        )
    if not measure.targets:
        return
    if case.model in MODELS:
        engine_options(case)
    if case.tree.is_image and case.measure != "serve":
        raise ValueError(f"{case.line}: an image (+image) runs the serve measure only")
    if not case.tree.is_image:
        case.tree.configure_args()


def run_case(case: Case, round_: int, bound_gbs: float | None, deadline: float) -> dict[str, object]:
    """One case's row: what it measured, or the error that stopped it."""
    row: dict = {"case": case.line, "measure": case.measure, "round": round_, "tree": case.tree.name,
                 "model": case.model, "bound_gbps": bound_gbs}  # fmt: skip
    try:
        MEASURES[case.measure].run(case, row, deadline)
    except (StackError, subprocess.SubprocessError, OSError, KeyError, ValueError) as err:
        row["error"] = f"{type(err).__name__}: {err}"
    if case.model.partition("~")[0] not in MODELS:
        return row
    row["token_ram_bytes"], row["token_vram_bytes"] = token_read_bytes(
        MODELS[case.model.partition("~")[0]][1]
    )
    if row.get("decode_median") and bound_gbs:
        row["decode_over_bound"] = round(row["decode_median"] / (bound_gbs * 1e9 / row["token_ram_bytes"]), 3)
    return row
