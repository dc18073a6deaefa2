"""KTransformers on the GPU machine: the `kt`, `kt-restart` and `kt-check` measures of harness.py.

That machine has no Docker, no network and a 64 MiB carry, and the CUDA image is ~10 GB, so the image's
own Python packages run natively (.device/kt/overlay.tar.xz from bench/device/prepare_kt_gpu.sh, over the
machine's torch) and what could not travel is substituted, each substitution written into the row:
sgl_kernel's compiled ops by torch stand-ins (sgl_kernel_torch/, checked on the GPU first), SGLang's
backends below (KT-ON-THE-GPU.md). The stack is the one `moe-stack compose --engine ktransformers
--preset P --gpu nvidia` writes for this host, its command checked against the server's own --help, run
by the image's entrypoint with the container's paths mapped onto this machine's.

  kt          ktransformers:MODEL[:weights=amx]: smoke's client checks, a request without the stack's key
              refused, GPU memory, single-stream decode, kt-kernel's variant as logged, whether the key is
              in the server's log; weights=amx serves kt-kernel's AMXINT4 experts, converted on the command
              line `moe-stack kt-convert` plans for this host
  kt-restart  ktransformers:MODEL[:words=N][:interval=S][:profile=1]: the stack composed with
              --keep-prompts, served twice on one directory for its prompts volume (the image's helper
              stopped alone, as `docker stop` stops a container): per request the seconds to its one
              token and where its cached tokens came from (the GPU, host memory or the files)

  kt-check    host:kt: kt-kernel's CPU variants through the images' check (each the carry holds)

MODEL is a name of KT_MODELS (each preset's model at its real widths, 16 experts); layers=N another depth.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from machine import MULTICAST_OFF, REPO, WORK, Case, gpu_used_mib, healthy, next_port, serve, stop
from models import KT_MODELS

from builder.contract import API_KEY_PATH, CONFIG_DIR, MODEL_DIR, PROMPTS_DIR
from builder.engines.ktransformers import KTransformers
from builder.errors import StackError
from builder.host.probe import probe
from builder.images.matrix import cuda_target
from builder.images.naming import image_spec
from builder.models.kt_weights import converted_facts, read_checkpoint
from builder.platform.flags import check_args, check_choice, parse_contract
from builder.running.api import EngineApi
from builder.running.kt_convert import finish_conversion, plan_conversion
from builder.stackfile.stack_file import Service, StackFile

ENGINE = KTransformers()
KT = WORK / "kt"
HELPERS = REPO / "dockerfiles/ktransformers"  # the image's server wrapper, key launcher and prompt helper
# What the GPU machine can't run as the image does: sgl_kernel's FA3 and CUDA-graph paths are compiled for
# torch 2.9.1; flashinfer's sampling and xgrammar were not carried; deep_gemm was left out; no network.
DEVICE_ARGS = ["--attention-backend", "triton", "--sampling-backend", "pytorch", "--grammar-backend", "none",
               "--disable-cuda-graph"]  # fmt: skip
# KT_KERNEL_DEBUG: kt-kernel logs the CPU variant it loads
DEVICE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "SGLANG_ENABLE_JIT_DEEPGEMM": "0",
              "KT_KERNEL_DEBUG": "1"}  # fmt: skip
# The cache's copies between GPU and host by torch: the default `kernel` is sgl_kernel's compiled transfer.
RESTART_ARGS = ["--hicache-io-backend", "direct"]
WORDS = ("the", "expert", "model", "reads", "a", "token", "from", "memory", "and", "cache", "keeps", "it")


def kt_env() -> dict[str, str]:
    """The server's Python: the overlay (unpacked once per machine) first, sgl_kernel's stand-ins, this
    checkout, the builder's wheels; the image's .pth line (its GIL switch interval) by sitecustomize."""
    site = KT / "site"
    if not (site / ".unpacked").is_file():
        site.mkdir(parents=True, exist_ok=True)
        subprocess.run(["tar", "-C", str(site), "-xJf", str(REPO / ".device/kt/overlay.tar.xz")], check=True)
        for wheel in (REPO / ".device/kt").glob("py_spy-*.whl"):
            pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
            subprocess.run([*pip, "--target", str(KT / "tools"), str(wheel)], check=True)
        (site / "sitecustomize.py").write_text(f"import site\nsite.addsitedir({str(HELPERS)!r})\n")
        (site / ".unpacked").touch()
    path = [site, REPO / "bench/device/sgl_kernel_torch", REPO, WORK / "site"]
    return {**MULTICAST_OFF, "PYTHONPATH": ":".join(map(str, path)), "PYTHONUNBUFFERED": "1"}


def python(*args: str, env: dict[str, str] | None = None, timeout: int = 600) -> str:
    """This checkout's Python with the server's packages; its output, or the run ends with it."""
    run = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **kt_env(), **(env or {})},
        check=False,
    )
    if run.returncode:
        raise StackError(
            f"{' '.join(args[:3])} failed ({run.returncode}): {(run.stdout + run.stderr)[-2000:]}"
        )
    return run.stdout + run.stderr


def prepared(case: Case, row: dict, keep_prompts: bool) -> tuple[list[str], dict[str, str], Path, Path]:
    """The stand-ins checked, the server's flags read, the model written (GGUF and HF), the stack composed
    and its command checked: the command and environment to run it with, the stack file and the directory
    of this run (its key file `api-key`, its prompts volume `prompts`)."""
    preset, arch, layers = KT_MODELS[case.model]
    work = KT / case.model / case.options.get("layers", str(layers))
    shutil.rmtree(work, ignore_errors=True)
    (work / "bin").mkdir(parents=True)
    row["stand_in_checks"] = python(
        str(REPO / "bench/device/sgl_kernel_torch/check_ops.py"), "cuda"
    ).splitlines()[-1]
    for name in ("moe-stack-server", "moe-stack-sglang-with-key"):  # as the image's Dockerfile copies them
        shutil.copy(HELPERS / name, work / "bin" / name)
        (work / "bin" / name).chmod(0o755)
    server_env = {**os.environ, **kt_env(), "MOE_STACK_SERVER_MODULE": ENGINE.server_module}
    help_text = subprocess.run([str(work / "bin/moe-stack-server"), "--help"], capture_output=True, text=True,
                               timeout=300, check=False, env=server_env).stdout  # fmt: skip
    (WORK / "logs" / "sglang-help.txt").write_text(help_text)
    flags = parse_contract(help_text, None)
    shape = ["--arch", arch, "--layers", case.options.get("layers", str(layers)), "--experts", "16"]
    model = work / "gguf" / f"{arch}-{shape[3]}l-16e-q4_0.gguf"
    model.parent.mkdir()
    cli = ["-m", "builder"]
    python(*cli, "synth-moe", *shape, str(model))
    python(*cli, "synth-moe", *shape, "--format", "hf", str(work / "hf"))
    if case.options.get("weights") == "amx":
        model = converted(work, row)
    key = work / "api-key"
    key.write_text(secrets.token_urlsafe(24) + "\n")  # this run's own: no key lives in the repo
    stack_file = WORK / "logs" / f"{case.measure}-{case.model}-stack.yaml"
    kept = ["--keep-prompts"] if keep_prompts else []
    compose = ["compose", "--engine", ENGINE.name, "--preset", preset, "--gpu", "nvidia", "--model",
               str(model), "--config-dir", str(work / "hf"), "--api-key-file", str(key),
               "--skip-image-checks", *kept, "--out", str(stack_file)]  # fmt: skip
    python(*cli, *compose)
    service = StackFile.read(stack_file).service("engine")
    check_args(service.args, flags, "sglang-kt (this run's --help)")
    for flag in ("--kt-method", "--reasoning-parser", "--tool-call-parser"):
        if flag in service.args:
            check_choice(flags, flag, service.args[service.args.index(flag) + 1], "sglang-kt")
    row |= {"compose": "moe-stack " + " ".join(compose), "image": service.image, "substituted": DEVICE_ARGS}
    mounts = {
        MODEL_DIR: str(model.parent),
        CONFIG_DIR: str(work / "hf"),
        API_KEY_PATH: str(key),
        PROMPTS_DIR: str(work / "prompts"),
    }
    (work / "prompts").mkdir()
    args, env = native_command(service, mounts, work)
    return args, env, stack_file, work


def mapped(value: str, mounts: dict[str, str]) -> str:
    for inside, outside in mounts.items():
        if value == inside or value.startswith(inside + "/"):
            return outside + value[len(inside) :]
    return value


def native_command(service: Service, mounts: dict[str, str], work: Path) -> tuple[list[str], dict[str, str]]:
    """The stack's command and environment here: its paths mapped, on 127.0.0.1 and a port of its own, with
    the image's environment (its Dockerfile's ENV, for the variant the tag names) and the substitutions."""
    args = [mapped(arg, mounts) for arg in service.args] + DEVICE_ARGS
    args[args.index("--host") + 1], args[args.index("--port") + 1] = "127.0.0.1", str(next_port())
    spec = image_spec(ENGINE, service.image.rsplit("-", 1)[-1], cuda=cuda_target("12.8"))
    image = {
        "PYTHONDONTWRITEBYTECODE": "1",
        "MOE_STACK_ENGINE_BIN": str(work / "bin/moe-stack-server"),
        "MOE_STACK_MODEL_FLAGS": " ".join(ENGINE.model_flags),
        "MOE_STACK_SERVER_MODULE": ENGINE.server_module,
        "MOE_STACK_HEALTH_PATH": ENGINE.health_path,
        "MOE_STACK_PROMPTS_DIR": PROMPTS_DIR,
        **ENGINE.engine_env(spec),
    }
    env = {**kt_env(), **image, **{key: str(value) for key, value in service.env.items()}}
    env = {key: mapped(value, mounts) for key, value in env.items()} | DEVICE_ENV
    env |= {"HOME": str(work / "home"), "XDG_CACHE_HOME": str(work / "home/.cache")}
    env["PATH"] = f"{HELPERS}:{os.environ['PATH']}"  # the image's helpers, as on its PATH
    return args, env


def converted(work: Path, row: dict) -> Path:
    """The checkpoint converted to AMXINT4 as `moe-stack kt-convert` plans it for this host."""
    plan = plan_conversion(
        read_checkpoint(work / "hf"),
        REPO / ".device/kt/ktransformers",
        "AMXINT4",
        probe(),
        image="(this run's packages)",
    )
    staging = work / f".{plan.output.name}.staging"
    staging.mkdir()
    args = plan.converter_args(str(work / "hf"), str(staging), str(plan.script))
    started = time.time()
    printed = python(*args, env={"KT_KERNEL_CPU_VARIANT": "amx"}, timeout=300)
    weights = finish_conversion(staging, plan, printed.splitlines())
    facts = converted_facts(weights.path)
    row["conversion"] = {
        "converter_args": ["python3", *args],
        "seconds": round(time.time() - started, 1),
        "numa_pools": weights.numa_pools,
        "moe_layers": weights.moe_layers,
        "record": weights.record,
        "files": {p.name: p.stat().st_size for p in sorted(weights.path.iterdir())},
        "facts": {"arch": facts.arch, "layers": facts.layers, "expert_bytes": facts.expert_bytes},
    }
    return weights.path


def port_of(args: list[str]) -> int:
    return int(args[args.index("--port") + 1])


def measure_kt(case: Case, row: dict, deadline: float) -> None:
    args, env, stack_file, work = prepared(case, row, keep_prompts=False)
    key, row["command"] = work / "api-key", args
    log = WORK / "logs" / f"kt-{case.model}-server.log"
    started = time.time()
    server = serve(Path("sh"), [str(REPO / "dockerfiles/common/moe-stack-entrypoint"), *args], log, env)
    try:
        if not healthy(port_of(args), server, min(started + 300, deadline)):
            row["error"] = f"not healthy (exit {server.poll()})"
            return
        row["load_s"], row["gpu_used_mib"] = round(time.time() - started, 1), gpu_used_mib()
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port_of(args)}/v1/models", timeout=30)
            row["without_key"] = 200
        except urllib.error.HTTPError as err:
            row["without_key"] = err.code
        # smoke's checks use the official clients: the image's packages carry them, this machine doesn't
        sys.path.append(str(KT / "site"))
        from builder.running.smoke import api_checks

        api = EngineApi(port_of(args), api_key=key.read_text().strip(), timeout_s=300)
        row["smoke"] = [
            {"check": c.name, "passed": c.passed, "seen": c.seen} for c in api_checks(stack_file, api)
        ]
        row["gpu_used_after_requests_mib"] = gpu_used_mib()
        row["decode"] = decode_rates(api, KT_MODELS[case.model][0])
    finally:
        stop(server)
        text = log.read_text(errors="replace")
        said = ("[kt-kernel]", "backend=", "kt_num_gpu_experts", "KTConfig")  # what kt-kernel chose
        logged = [line[:300] for line in text.splitlines() if any(word in line for word in said)]
        row["kt_kernel_logged"] = list(dict.fromkeys(logged))[:16]
        row["key_in_server_log"] = key.read_text().strip() in text


def measure_kt_check(case: Case, row: dict, deadline: float) -> None:
    """kt-kernel as the images load it, through their check (dockerfiles/ktransformers/moe-stack-kt-check,
    host:kt): the variant it picks on this CPU, then each variant the carried kt_kernel holds forced
    (KT_KERNEL_CPU_VARIANT), each against NumPy's float64 reference."""
    del case, deadline
    kt_env()  # the overlay unpacked: which variants it holds
    variants = sorted({path.name.split(".")[0].removeprefix("_kt_kernel_ext_")
                       for path in (KT / "site/kt_kernel").glob("_kt_kernel_ext_*.so")})  # fmt: skip
    for variant in ["", *variants]:
        started = time.time()
        try:
            printed = python(str(HELPERS / "moe-stack-kt-check"), "--threads", str(os.cpu_count()),
                             env={"KT_KERNEL_CPU_VARIANT": variant})  # fmt: skip
            report = json.loads(next(line for line in printed.splitlines() if line.startswith("{")))
        except (StackError, StopIteration) as err:
            report = {"error": str(err)[-500:]}
        row[variant or "chosen"] = {"seconds": round(time.time() - started, 1), **report}


def decode_rates(api: EngineApi, served: str, tokens: int = 64, rounds: int = 3) -> dict[str, object]:
    """Tokens a second of single-stream completions (a short prompt, the end of text ignored) after one
    warm-up. A slice of two or four layers times SGLang's per-token overhead more than its layers."""
    body = {
        "model": served,
        "prompt": "The capital of France is",
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    api.post("/v1/completions", body)
    rates = []
    for _ in range(rounds):
        started = time.perf_counter()
        reply = api.post("/v1/completions", body)
        rates.append(round(reply["usage"]["completion_tokens"] / (time.perf_counter() - started), 1))
    return {"tokens": tokens, "rounds_tok_s": rates, "median_tok_s": sorted(rates)[len(rates) // 2]}


def text_of(seed: int, words: int) -> str:
    """A text of `words` words drawn from WORDS by a simple generator (`seed`: another text)."""
    state, out = seed * 7919 + 1, []
    for _ in range(words):
        state = (state * 1103515245 + 12345) % (1 << 31)
        out.append(WORDS[state % len(WORDS)])
    return " ".join(out)


def first_token(api: EngineApi, text: str) -> dict[str, object]:
    """One token of `text` through SGLang's native /generate: its seconds and where the cached tokens came
    from (meta_info's cached_tokens_details: device, host, storage)."""
    started = time.perf_counter()
    reply = api.post("/generate", {"text": text, "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
    meta = reply.get("meta_info", {})
    return {
        "seconds": round(time.perf_counter() - started, 3),
        "prompt_tokens": meta.get("prompt_tokens"),
        "cached_tokens": meta.get("cached_tokens"),
        "cached_tokens_details": meta.get("cached_tokens_details"),
    }


def measure_kt_restart(case: Case, row: dict, deadline: float) -> None:
    args, env, _, work = prepared(case, row, keep_prompts=True)
    args += RESTART_ARGS
    if "interval" in case.options:  # SGLang's GIL switch interval instead of the helper's (0.005: Python's)
        env["MOE_STACK_SWITCH_INTERVAL_S"] = case.options["interval"]
    key, row["command"], row["runs"] = work / "api-key", args, []
    long_texts = [text_of(seed, int(case.options.get("words", "2500"))) for seed in (1, 4)]
    for number, warm_up in enumerate((text_of(2, 600), text_of(3, 600))):
        log = WORK / "logs" / f"kt-restart-{case.model}-{number + 1}.log"
        started = time.time()
        server = serve(Path("sh"), [str(REPO / "dockerfiles/common/moe-stack-entrypoint"), *args], log, env)
        entry: dict[str, object] = {}
        row["runs"].append(entry)
        try:
            if not healthy(port_of(args), server, min(started + 300, deadline)):
                entry["error"] = f"not healthy (exit {server.poll()})"
                break
            api = EngineApi(port_of(args), api_key=key.read_text().strip(), timeout_s=300)
            entry |= {"load_s": round(time.time() - started, 1), "warm_up": first_token(api, warm_up)}
            spy = profiler(server.pid) if number and case.options.get("profile") == "1" else None
            entry["long"] = [first_token(api, text) for text in long_texts]
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(60)
            if number:  # the first run stops with a long prompt its last: the helper writes it
                entry["long_again"] = first_token(api, long_texts[0])
        finally:
            stopping = time.time()
            stop(server, grace_s=300, leader_first=True)  # the stack's stop grace
            entry["stop_s"] = round(time.time() - stopping, 1)
        found = [p for p in (work / "prompts").rglob("*") if p.is_file()]
        entry["files_after_stop"] = {"count": len(found), "bytes": sum(p.stat().st_size for p in found)}
        lines = log.read_text(errors="replace").splitlines()
        entry["helper"] = [line for line in lines if line.startswith("moe-stack-prompts:")]
        print(json.dumps(entry), flush=True)


def profiler(pid: int) -> subprocess.Popen | None:
    """py-spy (prepare_kt_gpu.sh's wheel) sampling the server's processes, waiting threads too, without
    pausing them, until interrupted: its raw stacks into the logs."""
    spy = KT / "tools/bin/py-spy"
    if not spy.is_file():
        return None
    out = WORK / "logs" / "restore-profile.txt"
    command = [str(spy), "record", "--pid", str(pid), "--subprocesses", "--idle", "--nonblocking",
               "--rate", "200", "--format", "raw", "--output", str(out)]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
