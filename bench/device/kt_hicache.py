"""KTransformers' prompt cache across a restart on the GPU machine (issue 45, point 1): a preset's stack
(KT_GPU_PRESET, as kt_gpu.py: a slice of 2 layers at Qwen3-235B's or R1's widths; Qwen3-Next's recurrent
state is refused) composed with `--keep-prompts`, run as bench/device/kt_gpu.py runs the server (natively:
the image's packages, entrypoint and prompt helper, and the stack's command, with that script's
substitutions and SGLang's torch copies between GPU and host, `--hicache-io-backend direct`: the default
`kernel` is sgl_kernel's compiled transfer, which this machine's stand-ins don't replace).

  1. the slice written (GGUF and HF), the stack composed by moe-stack with --keep-prompts;
  2. served under the image's moe-stack-prompts, on a directory for the stack's volume: a warm-up, then two
     long prompts (cold), then stopped as `docker stop` stops a container (the helper alone is signalled:
     it has the last prompt's pages written, then stops the server);
  3. served again on the same directory: a warm-up of another text, the long prompts (from the files, if
     they are read back), then the first again (from the GPU's cache);
  4. for each request (SGLang's native /generate): the seconds to its one token and where its cached
     tokens came from (the GPU, host memory or the files); the helper's lines; the files.

A slice of two layers prefills in a fraction of a second: its times say whether the files are read back,
not what a full model gains. KT_GPU_LAYERS runs a deeper slice: kt_hicache_depth.py puts the depths side
by side and follows each time's growth per layer to the model's depth. KT_HICACHE_PROFILE=1 samples the
restarted server's processes with py-spy while its long prompts are read back (restore-profile.txt).
KT_HICACHE_SWITCH_INTERVAL_S sets SGLang's GIL switch interval instead of the image's helper (0.005:
Python's own, as before the helper set one).

Usage: kt_hicache.py OUT_DIR WORK_DIR (results: OUT_DIR/kt-hicache.json and the servers' logs).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from kt_gpu import (
    DEVICE_ARGS,
    DEVICE_ENV,
    ENGINE,
    PORT,
    PRESET,
    SHAPE_ARGS,
    check_stand_ins,
    cli,
    healthy,
    install_server,
    native_command,
    serve,
    stop,
)

from builder.contract import API_KEY_PATH, CONFIG_DIR, MODEL_DIR, PROMPTS_DIR
from builder.errors import StackError
from builder.running.api import EngineApi
from builder.stackfile.stack_file import StackFile

# The device's stand-in for sgl_kernel's compiled copies (above); the cache's other flags are the stack's.
DEVICE_HICACHE_ARGS = ["--hicache-io-backend", "direct"]
# Where the image's moe-stack-prompts is (on the image's PATH).
HELPER_DIR = Path(__file__).resolve().parents[2] / "dockerfiles/ktransformers"
WORDS = ("the", "expert", "model", "reads", "a", "token", "from", "memory", "and", "cache", "keeps", "it")


def prompt(seed: int, words: int) -> str:
    """A text of `words` words drawn from WORDS by a simple generator (`seed`: another text)."""
    state, out = seed * 7919 + 1, []
    for _ in range(words):
        state = (state * 1103515245 + 12345) % (1 << 31)
        out.append(WORDS[state % len(WORDS)])
    return " ".join(out)


def first_token(api: EngineApi, text: str) -> dict[str, object]:
    """One token of `text` through SGLang's native /generate: the seconds it took, and where the prompt's
    cached tokens came from (its meta_info's cached_tokens_details: device, host, storage)."""
    started = time.perf_counter()
    reply = api.post("/generate", {"text": text, "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
    meta = reply.get("meta_info", {}) if isinstance(reply, dict) else {}
    return {
        "seconds": round(time.perf_counter() - started, 3),
        "prompt_tokens": meta.get("prompt_tokens"),
        "cached_tokens": meta.get("cached_tokens"),
        "cached_tokens_details": meta.get("cached_tokens_details"),
    }


def profiler(work: Path, pid: int, path: Path) -> subprocess.Popen | None:
    """With KT_HICACHE_PROFILE=1: py-spy (kt_gpu.sh installs it in WORK/tools) sampling the server's
    processes, their waiting threads too, without pausing them; its collapsed stacks go to `path` when it
    is interrupted (`profiled_until_here`), what it says to `path`.log."""
    spy = work / "tools/bin/py-spy"
    if not os.environ.get("KT_HICACHE_PROFILE") or not spy.is_file():
        return None
    command = [str(spy), "record", "--pid", str(pid), "--subprocesses", "--idle", "--nonblocking"]
    command += ["--rate", "200", "--format", "raw", "--output", str(path)]
    with path.with_suffix(".log").open("w") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)


def profiled_until_here(spy: subprocess.Popen | None) -> None:
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        try:
            spy.wait(60)
        except subprocess.TimeoutExpired:
            spy.kill()


def files(directory: Path) -> dict[str, int]:
    found = [p for p in directory.rglob("*") if p.is_file()]
    return {"count": len(found), "bytes": sum(p.stat().st_size for p in found)}


def main(out: Path, work: Path) -> None:
    result: dict[str, object] = {
        "preset": PRESET,
        "shape": SHAPE_ARGS,
        "substituted": {"args": DEVICE_ARGS + DEVICE_HICACHE_ARGS, "env": DEVICE_ENV},
        "stand_in_checks": check_stand_ins(),
    }
    print(result["stand_in_checks"], flush=True)
    started = time.time()
    server_bin = install_server(work / "bin")
    gguf_dir, hf_dir, storage = work / "gguf", work / "hf", work / "prompts"
    for directory in (gguf_dir, storage):
        directory.mkdir(parents=True, exist_ok=True)
    model = gguf_dir / f"{SHAPE_ARGS[1]}-{SHAPE_ARGS[3]}l-16e-q4_0.gguf"
    cli("synth-moe", *SHAPE_ARGS, str(model))
    cli("synth-moe", *SHAPE_ARGS, "--format", "hf", str(hf_dir))
    key_file = work / "api-key"
    key_file.write_text(secrets.token_urlsafe(24) + "\n")
    stack_file = out / "kt-hicache-stack.yaml"
    compose = [
        "compose", "--engine", ENGINE.name, "--preset", PRESET, "--gpu", "nvidia", "--model", str(model),
        "--config-dir", str(hf_dir), "--api-key-file", str(key_file), "--skip-image-checks",
        "--keep-prompts", "--out", str(stack_file),
    ]  # fmt: skip
    cli(*compose)
    result["compose"] = "moe-stack " + " ".join(compose)
    service = StackFile.read(stack_file).service("engine")
    mounts = {
        MODEL_DIR: str(gguf_dir),
        CONFIG_DIR: str(hf_dir),
        API_KEY_PATH: str(key_file),
        PROMPTS_DIR: str(storage),
    }
    args, run_env = native_command(service, mounts, server_bin, work)
    args += DEVICE_HICACHE_ARGS
    run_env["PATH"] = f"{HELPER_DIR}:{run_env['PATH']}"  # the image's helper, as on its PATH
    if interval := os.environ.get("KT_HICACHE_SWITCH_INTERVAL_S"):  # 0.005: Python's own, the helper's before
        run_env["MOE_STACK_SWITCH_INTERVAL_S"] = interval
    result |= {
        "command": args,
        "environment": dict(service.env),
        "switch_interval_s": run_env.get("MOE_STACK_SWITCH_INTERVAL_S", "the helper's"),
    }
    words = int(os.environ.get("KT_HICACHE_WORDS", "2500"))  # ~12.9k tokens of 16k
    long_texts = [prompt(seed, words) for seed in (1, 4)]  # two texts: two cold and two restored times
    runs: list[dict[str, object]] = []
    for run, warm_up in enumerate((prompt(2, 600), prompt(3, 600))):
        log_path = out / f"kt-hicache-server-{run + 1}.log"
        with log_path.open("w") as log:
            server = serve(args, run_env, log)
            start = time.time()
            try:
                if not healthy(server, start + float(os.environ.get("KT_GPU_START_S", "240"))):
                    runs.append({"error": f"not healthy (exit {server.poll()})"})
                    break
                api = EngineApi(PORT, api_key=key_file.read_text().strip(), timeout_s=300)
                entry: dict[str, object] = {"load_s": round(time.time() - start, 1)}
                runs.append(entry)
                try:
                    entry["warm_up"] = first_token(api, warm_up)
                    spy = profiler(work, server.pid, out / "restore-profile.txt") if run else None
                    entry["long"] = [first_token(api, text) for text in long_texts]
                    profiled_until_here(spy)
                    if run:  # the first run stops with a long prompt its last: the helper writes it
                        entry["long_again"] = first_token(api, long_texts[0])
                except (StackError, OSError) as err:  # recorded; the files and the log still tell
                    entry["error"] = str(err)
                entry["files_before_stop"] = files(storage)
            finally:
                stopping = time.time()
                stop(server, grace_s=300)  # the stack's stop grace
                runs[-1]["stop_s"] = round(time.time() - stopping, 1)
        runs[-1]["files_after_stop"] = files(storage)
        lines = log_path.read_text(errors="replace").splitlines()
        runs[-1]["helper"] = [line for line in lines if line.startswith("moe-stack-prompts:")]
        runs[-1]["prefill_log"] = [line[-200:] for line in lines if "cached-token" in line][-6:]
        print(json.dumps(runs[-1]), flush=True)
        result |= {"runs": runs, "seconds": round(time.time() - started, 1)}  # each run's kept as it ends
        (out / "kt-hicache.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
