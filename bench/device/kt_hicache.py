"""KTransformers' prompt cache across a restart on the GPU machine (issue 45, point 1): SGLang's hierarchical
cache with its file backend, under a preset's stack (KT_GPU_PRESET, as kt_gpu.py: a slice of 2 layers at
Qwen3-235B's or R1's widths; Qwen3-Next's recurrent state is refused by the cache), run as
bench/device/kt_gpu.py runs the server (natively: the image's packages, entrypoint and the stack's command,
with that script's substitutions).

  1. the slice written (GGUF and HF), the stack composed by moe-stack with the cache's flags as extra
     engine arguments (HICACHE_ARGS: what a stack with --keep-prompts is to write);
  2. served with the file backend's directory set; a warm-up, then a long prompt (cold), then it again
     (from the GPU's cache);
  3. stopped; the directory's files counted; served again on the same directory, a warm-up of another
     text, the long prompt again (from the files, if they are read back);
  4. for each request (SGLang's native /generate): the seconds to its one token and where its cached
     tokens came from (the GPU, host memory or the files).

A slice of two layers prefills in a fraction of a second: its times say whether the files are read back,
not what a full model gains. Usage: kt_hicache.py OUT_DIR WORK_DIR (results: OUT_DIR/kt-hicache.json and
the servers' logs).
"""

from __future__ import annotations

import json
import os
import secrets
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

from builder.contract import API_KEY_PATH, CONFIG_DIR, MODEL_DIR
from builder.errors import StackError
from builder.stacks.api import EngineApi
from builder.stacks.stack_file import StackFile

STORAGE_ENV = "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"
# sglang-kt 0.7.2: the file backend needs the hierarchical cache on; a page of 64 tokens a file (the default
# 1 writes a file a token); write_through files each prefix after its prefill; wait_complete reads a stored
# prefix back before the request runs (best_effort stops at scheduling); no NUMA binding of the scheduler;
# torch's copies between GPU and host (`direct`: the default `kernel` is sgl_kernel's compiled transfer, which
# this machine's stand-ins don't replace).
HICACHE_ARGS = os.environ.get(
    "KT_HICACHE_ARGS",
    "--enable-hierarchical-cache --hicache-storage-backend file --hicache-write-policy write_through "
    "--page-size 64 --hicache-storage-prefetch-policy wait_complete --disable-hicache-numa-detect "
    "--hicache-io-backend direct",
).split()
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


def files(directory: Path) -> dict[str, int]:
    found = [p for p in directory.rglob("*") if p.is_file()]
    return {"count": len(found), "bytes": sum(p.stat().st_size for p in found)}


def main(out: Path, work: Path) -> None:
    result: dict[str, object] = {
        "substituted": {"args": DEVICE_ARGS, "env": DEVICE_ENV},
        "hicache": HICACHE_ARGS,
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
        "--out", str(stack_file), "--", *HICACHE_ARGS,
    ]  # fmt: skip
    cli(*compose)
    result["compose"] = "moe-stack " + " ".join(compose)
    service = StackFile.read(stack_file).service("engine")
    mounts = {MODEL_DIR: str(gguf_dir), CONFIG_DIR: str(hf_dir), API_KEY_PATH: str(key_file)}
    args, run_env = native_command(service, mounts, server_bin, work)
    run_env[STORAGE_ENV] = str(storage)
    result["command"] = args
    long_text = prompt(1, int(os.environ.get("KT_HICACHE_WORDS", "10000")))
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
                    entry["long"] = first_token(api, long_text)
                    entry["long_again"] = first_token(api, long_text)
                except (StackError, OSError) as err:  # recorded; the files and the log still tell
                    entry["error"] = str(err)
                time.sleep(float(os.environ.get("KT_HICACHE_SETTLE_S", "5")))  # writes behind the reply
                entry["files_before_stop"] = files(storage)
            finally:
                stop(server)
        entry_files = files(storage)
        runs[-1]["files_after_stop"] = entry_files
        cached = [
            line for line in log_path.read_text(errors="replace").splitlines() if "cached-token" in line
        ]
        runs[-1]["prefill_log"] = [line[-200:] for line in cached][-6:]
        print(json.dumps(runs[-1]), flush=True)
        result |= {"runs": runs, "seconds": round(time.time() - started, 1)}  # each run's kept as it ends
        (out / "kt-hicache.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
