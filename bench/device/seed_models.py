"""The seed's presets on the GPU machine (issue 24, point 4): the DeepSeek-R1 and Qwen3-Next presets,
emitted by moe-stack's own stack assembly for that host, run by native builds of both llama.cpp
engines (the builder's configure arguments), on synthetic models of the real per-layer and per-expert
shapes at two depths. Per run: healthy, a completion, the engine's logged buffers, GPU memory in use,
prefill and decode speed (a warm-up, then rounds), against the memory-bandwidth bound.

  seed_models.py write DIR [MODEL…]         the models (default all: R1 and Qwen3-Next slices of 8 and
                                            16 layers, a Qwen3-235B slice of 8)
  seed_models.py run DIR BIN_ROOT OUT CASE…  CASE = TREE:MODEL[:ub=N][:ctx=N][:mmap=0|1][:load=1]
                                            [:preset=none][:pp=N/N…][:extra=ARG/ARG…][:OPTION=V]
                                            (TREE: an engine, or ENGINE@NAME for another tree of it;
                                            OPTION: an EngineOptions field, e.g. fused_moe=0,
                                            cache_type=f16; load=1: started, its buffers read,
                                            stopped; preset=none: the stack compose derives with no
                                            preset; pp: prefill once at each of these prompt lengths;
                                            extra: engine arguments added); results as JSON lines;
                                            each case waits for its tree's build. ROUNDS=N: the case
                                            list N times over, alternating, the read bound measured at
                                            the start of each round (BIN_ROOT/moe-stack-bandwidth)

BIN_ROOT/<tree>/build/bin/llama-server are the builds (BIN_ROOT/<tree>.done says "ok" once one is
built), BIN_ROOT/<tree>/common/common.cpp ik's parser (its --help leaves flags out, as in the images'
contract stage).
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from builder.engines import get_engine
from builder.errors import StackError
from builder.host.probe import probe
from builder.models.synth_catalog import synth_shape
from builder.models.synth_moe import token_read_bytes, write_moe_gguf
from builder.models.synth_shapes import MoeShape
from builder.platform.flags import check_args, parse_contract
from builder.running.api import EngineApi
from builder.spec import EngineOptions
from builder.stacks.assemble import StackOptions, assemble_stack

# Real per-layer and per-expert widths; fewer experts than the real models (R1 256, Qwen3-Next 512) to
# keep the files writable in the call: a token still reads its 8 (10) experts of the real shape.
MODELS: dict[str, tuple[str, MoeShape]] = {
    "r1-8": ("deepseek-r1-671b", synth_shape("deepseek2", layers=8, experts=32)),
    "r1-16": ("deepseek-r1-671b", synth_shape("deepseek2", layers=16, experts=32)),
    "qn-8": ("qwen3-next-80b-a3b", synth_shape("qwen3next", layers=8, experts=128)),
    "qn-16": ("qwen3-next-80b-a3b", synth_shape("qwen3next", layers=16, experts=128)),
    "q235-8": ("qwen3-235b-a22b", synth_shape("qwen3moe", layers=8, experts=32)),
    # Twice the experts of r1-8, else the same: the growth of prefill's expert copy in the compute buffer.
    "r1-8-e64": ("deepseek-r1-671b", synth_shape("deepseek2", layers=8, experts=64)),
    # q235-8 with Qwen3's real vocabulary (151936): the compute buffer's output stage at its real width.
    "q235-8-v": ("qwen3-235b-a22b", synth_shape("qwen3moe", layers=8, experts=32, vocab=151936)),
    # Issue 45's families at their real widths, 4 layers (each kind of layer the family has: a dense one,
    # window and full attention, Qwen3.5's delta nets and attention, DeepSeek-V4's ratios 0, 4 and 128),
    # 16 experts and the synthetic vocabulary: small files whose compute buffer is the layers' stage
    # (the expert copy and the output stage the plan computes from the sources beside it).
    "glm46-4": ("glm-4.6", synth_shape("glm4moe", layers=4, dense_layers=1, experts=16, vocab=0)),
    "gptoss-4": ("gpt-oss-120b", synth_shape("gpt-oss", layers=4, experts=16, vocab=0)),
    "minimax-4": ("minimax-m2", synth_shape("minimax-m2", layers=4, experts=16, vocab=0)),
    "glm5-4": ("glm-5", synth_shape("glm-dsa", layers=4, dense_layers=1, experts=16, vocab=0)),
    "q35-4": ("qwen3.5-397b-a17b", synth_shape("qwen35moe", layers=4, experts=16, vocab=0)),
    "kimi-4": (
        "kimi-k2",
        synth_shape(
            "deepseek2",
            layers=4,
            dense_layers=1,
            experts=16,
            heads=64,
            vocab=0,
            expert_groups=0,
            groups_used=0,
        ),
    ),
    "dsv4-4": ("deepseek-v4-flash", synth_shape("deepseek4", layers=4, experts=16, vocab=0)),
    # MiniMax-M2's 256 experts: prefill's expert copy at its real size, against the plan's from the sources.
    "minimax-4-e256": ("minimax-m2", synth_shape("minimax-m2", layers=4, experts=256, vocab=0)),
    # The families added after the first measurements, each kind of layer: Ling-1T's dense and MoE layers,
    # Ling-3's group of 5 KDA layers and an MLA one and its MTP block, Kimi-K3's 3 KDA layers and an MLA
    # one, MiniMax-M3's dense layer and sparse ones.
    "ling1t-4": ("ling-1t", synth_shape("bailingmoe2", layers=4, dense_layers=1, experts=16, vocab=0)),
    "ling3-6": ("ling-3.0-flash", synth_shape("bailingmoe3", layers=6, dense_layers=1, experts=16, vocab=0)),
    "k3-4": ("kimi-k3", synth_shape("kimi-k3", layers=4, experts=16, vocab=0)),
    "m3-4": ("minimax-m3", synth_shape("minimax-m3", layers=4, dense_layers=1, experts=16, vocab=0)),
    # DeepSeek-V3.2: R1's layers with the lightning indexer's key cache and scores.
    "dsv32-4": ("deepseek-v3.2", synth_shape("deepseek32", layers=4, dense_layers=1, experts=16, vocab=0)),
}
SENTENCE = "the expert model reads a token from memory and the cache"
PROMPT = " ".join([SENTENCE] * 48)  # 2545 tokens of the synthetic vocabulary (530 in a real one)
TOKENS_PER_SENTENCE = 53  # in the synthetic vocabulary: PROMPT, 48 of them, was 2545 tokens (r1-8)
# "CUDA0 KV buffer size = 229.50 MiB" (both engines; ik's weights: "CUDA0 buffer size", mainline's
# "model buffer")
BUFFER = re.compile(r"(\S+)\s+(?:(model|KV|RS|compute|output) )?buffer size =\s+([\d.]+) MiB")


def write(directory: Path, names: list[str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name in names or list(MODELS):
        shape = MODELS[name][1]
        path = directory / f"{name}.gguf"
        if not path.is_file():
            started = time.time()
            write_moe_gguf(path, shape)
            ram, vram = token_read_bytes(shape)
            print(
                json.dumps(
                    {
                        "model": name,
                        "bytes": path.stat().st_size,
                        "seconds": round(time.time() - started, 1),
                        "token_ram_bytes": ram,
                        "token_vram_bytes": vram,
                    }
                ),
                flush=True,
            )


def contract(tree: str, root: Path) -> dict[str, str]:
    engine = tree.split("@")[0]
    server = root / tree / "build/bin/llama-server"
    help_text = subprocess.run(
        [str(server), "--help"], capture_output=True, text=True, timeout=60, check=False
    ).stdout
    literals = None
    if engine == "ik_llama.cpp":
        literals = "\n".join(
            sorted(
                set(
                    re.findall(
                        r'"(--?[A-Za-z][A-Za-z0-9_.-]*)"', (root / tree / "common/common.cpp").read_text()
                    )
                )
            )
        )
    return parse_contract(help_text, literals)


def command(
    engine: str,
    model: Path,
    preset: str | None,
    flags: dict[str, str],
    port: int,
    changes: dict[str, object],
    extra: tuple[str, ...] = (),
) -> list[str]:
    """The stack's engine arguments as `moe-stack compose [--preset P] --gpu nvidia` writes them for this
    host (its physical cores), checked against the build's contract, pointed at the model and a local port."""
    options = StackOptions(
        model=model,
        engine=get_engine(engine),
        preset=preset,
        gpu="nvidia",
        numa="none",
        image="native",
        skip_image_checks=True,
        engine_options=EngineOptions(**changes),  # type: ignore[arg-type]
        engine_args=extra,
    )
    stack = assemble_stack(options, probe())
    args = get_engine(engine).server_args(stack, flags)
    check_args(args, flags, f"{engine} (native)")
    args[args.index("--model") + 1] = str(model)
    args[args.index("--port") + 1] = str(port)
    args[args.index("--host") + 1] = "127.0.0.1"
    return args + (["-lv", "4"] if "-lv" in flags else [])  # mainline logs its buffers from verbosity 4


def _healthy(port: int, deadline: float, server: subprocess.Popen) -> bool:
    while time.time() < deadline and server.poll() is None:
        try:
            EngineApi(port, timeout_s=2).get("/health")
            return True
        except StackError:
            time.sleep(1)
    return False


def _gpu_used_mib() -> int:
    text = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    ).stdout
    return int(text.split()[0]) if text.strip() else -1


def measure(
    api_port: int,
    server: subprocess.Popen,
    started: float,
    changes: dict[str, object],
    shape: MoeShape,
    result: dict[str, object],
    load_only: bool = False,
    prompt_lengths: tuple[int, ...] = (),
) -> None:
    """Healthy (and no more with `load_only`: the buffers a start logs), a completion, prefill and decode
    rounds, GPU memory after load, after the prefills and after one prompt longer than the presets' -ub
    (prefill's offload may allocate beyond the buffers logged at load), into `result`."""
    if not _healthy(api_port, started + 240, server):
        result["error"] = f"not healthy (exit {server.poll()})"
        return
    result["load_s"] = round(time.time() - started, 1)
    result["gpu_used_mib"] = _gpu_used_mib()
    if load_only:
        return
    # An engine that aborts mid-request may never answer: 16 tokens take well under 30 s on any case here.
    warm = EngineApi(api_port, timeout_s=30).post(
        "/completion", {"prompt": "hello the model", "n_predict": 16, "cache_prompt": False}
    )
    result["completion"] = warm.get("content")
    api = EngineApi(api_port, timeout_s=120)
    rounds = 3 if not changes or "mmap" in changes else 1
    prefill, decode = [], []
    for _ in range(rounds):
        reply = api.post(
            "/completion", {"prompt": PROMPT, "n_predict": 64, "ignore_eos": True, "cache_prompt": False}
        )
        timings = reply["timings"]
        prefill.append(timings["prompt_per_second"])
        decode.append(timings["predicted_per_second"])
    result["gpu_used_after_prefill_mib"] = _gpu_used_mib()
    if prompt_lengths:  # prefill at each length (its own timings), in place of the long prompt below
        prefill_at: dict[str, list[float]] = {}
        for length in prompt_lengths:
            prompt = " ".join([SENTENCE] * max(1, length // TOKENS_PER_SENTENCE))
            timed = api.post("/completion", {"prompt": prompt, "n_predict": 1, "cache_prompt": False})
            at = timed["timings"]
            prefill_at[str(length)] = [at["prompt_n"], round(at["prompt_per_second"], 1)]
        result["prefill_at"] = prefill_at
        result["prompt_tokens"] = reply["timings"]["prompt_n"]
        result["decode_tps"] = [round(v, 2) for v in decode]
        result["decode_median"] = round(statistics.median(decode), 2)
        result["token_ram_bytes"], result["token_vram_bytes"] = token_read_bytes(shape)
        return
    # A prompt longer than the presets' -ub 2048: every micro-batch full, the offload's copies widest.
    long = api.post("/completion", {"prompt": PROMPT * 8, "n_predict": 4, "cache_prompt": False})
    result["long_prompt_tokens"] = long["timings"]["prompt_n"]
    result["long_prefill_tps"] = round(long["timings"]["prompt_per_second"], 1)
    result["gpu_used_after_long_prefill_mib"] = _gpu_used_mib()
    result["prompt_tokens"] = reply["timings"]["prompt_n"]
    result["prefill_tps"] = [round(v, 1) for v in prefill]
    result["decode_tps"] = [round(v, 2) for v in decode]
    result["decode_median"] = round(statistics.median(decode), 2)
    result["token_ram_bytes"], result["token_vram_bytes"] = token_read_bytes(shape)


def stop(server: subprocess.Popen) -> None:
    """The server's whole process group ended and waited for: the next case needs its port and GPU memory
    (2026-12-02: a case found the last one's port still bound, another its aborted server's 2 GiB still
    on the GPU)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):  # KILL for what TERM left: a hung abort, its children
        try:
            os.killpg(server.pid, sig)
        except ProcessLookupError:
            break
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            continue


def run_case(case: str, directory: Path, root: Path, out: Path, port: int) -> dict[str, object]:
    tree, name, *rest = case.split(":")
    engine = tree.split("@")[0]
    changes: dict[str, object] = {
        key: int(value) if value.isdigit() else value for key, value in (item.split("=") for item in rest)
    }
    named, shape = MODELS[name]
    preset = None if changes.pop("preset", None) == "none" else named
    lengths = tuple(int(n) for n in str(changes.pop("pp", "")).split("/") if n)
    extra = tuple(str(changes.pop("extra", "")).split("/")) if "extra" in changes else ()
    if "ub" in changes:
        changes = {"ubatch_size": changes.pop("ub"), **changes}
    if "ctx" in changes:
        changes = {"ctx_size": changes.pop("ctx"), **changes}
    if "mmap" in changes:
        changes = {"mmap": bool(changes.pop("mmap")), **changes}
    load_only = bool(changes.pop("load", 0))
    flags = contract(tree, root)
    args = command(engine, directory / f"{name}.gguf", preset, flags, port, changes, extra)
    log = out / f"{case.replace(':', '_').replace('=', '').replace('/', '-')}.log"
    result: dict[str, object] = {
        "case": case,
        "engine": engine,
        "tree": tree,
        "model": name,
        "preset": preset,
        "command": args,
    }
    started = time.time()
    with log.open("w") as sink:
        server = subprocess.Popen(
            [str(root / tree / "build/bin/llama-server"), *args],
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        measure(port, server, started, changes, shape, result, load_only, lengths)
    except StackError as err:  # e.g. the server died on a request: its buffers are still in the log
        result["error"] = str(err)
    finally:
        stop(server)
    result["buffers_mib"] = [
        [where, kind or "model", float(mib)]
        for where, kind, mib in BUFFER.findall(log.read_text(errors="replace"))
    ]
    return result


def wait_built(engine: str, root: Path, deadline: float) -> str:
    """ "ok" once `engine`'s build has finished, "failed", or "building" at the deadline."""
    done = root / f"{engine}.done"
    while not done.is_file() and time.time() < deadline:
        time.sleep(5)
    return done.read_text().strip() if done.is_file() else "still building"


def main() -> None:
    verb = sys.argv[1]
    if verb == "write":
        write(Path(sys.argv[2]), sys.argv[3:])
        return
    directory, root, out = Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
    deadline = time.time() + float(os.environ.get("CASES_S", "480"))
    port_base = int(os.environ.get("PORT_BASE", "18700"))  # another per call: a port can outlive its server
    kept = root / "results.jsonl"  # every call's results on this machine: a case there is not run again
    done = {_key(json.loads(line)) for line in kept.read_text().splitlines()} if kept.is_file() else set()
    cases = sys.argv[5:]
    rounds = int(os.environ.get("ROUNDS", "1"))
    with (out / "results.jsonl").open("a") as results, kept.open("a") as all_results:
        for round_ in range(1, rounds + 1):
            bound = read_bound(root) if rounds > 1 else None
            for number, case in enumerate(cases):
                if (case, round_) in done:
                    continue
                if time.time() > deadline:
                    print(f"deadline: {case} (round {round_}) not run", flush=True)
                    continue
                built = wait_built(case.split(":")[0], root, deadline)
                if built != "ok":
                    print(f"{case} not run: its tree is {built}", flush=True)
                    continue
                port = port_base + (round_ - 1) * len(cases) + number
                try:
                    result = run_case(case, directory, root, out, port)
                except StackError as err:  # its command refused (a flag the build lacks): the next still runs
                    result = {"case": case, "error": str(err)}
                result |= {"round": round_, **({"bound_gbps": bound} if bound is not None else {})}
                for sink in (results, all_results):
                    sink.write(json.dumps(result) + "\n")
                    sink.flush()
                print(json.dumps({k: v for k, v in result.items() if k != "command"}), flush=True)


def _key(result: dict[str, object]) -> tuple[object, object]:
    return result["case"], result.get("round", 1)


def read_bound(root: Path) -> float | None:
    """The host's memory read rate now (moe-stack-bandwidth's best round, GB/s), for this round's bound."""
    tool = root / "moe-stack-bandwidth"
    if not tool.is_file():
        return None
    printed = subprocess.run(
        [str(tool), "4096"], capture_output=True, text=True, timeout=120, check=False
    ).stdout
    found = re.search(r"^read GB/s ([\d.]+)$", printed, re.MULTILINE)
    return float(found.group(1)) if found else None


if __name__ == "__main__":
    main()
