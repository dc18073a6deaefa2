"""KTransformers' server on the GPU machine (issue 27), with the product's own command line.

That machine has no Docker and a 64 MiB carry, and the CUDA image is ~10 GB, so the image's own
Python packages run natively (bench/device/kt_gpu.sh unpacks them over the machine's torch), and
what could not travel is substituted, each substitution written to the results:

  1. the stand-ins for sgl_kernel's compiled ops pass their checks on the GPU (sgl_kernel_torch/);
  2. the server's --help is captured (SGLang's flag contract, as the image's build records it);
  3. a random-weight model of the preset's architecture (KT_GPU_PRESET: qwen3-235b-a22b, deepseek-r1-671b
     or qwen3-next-80b-a3b; PRESET_SHAPES, or KT_GPU_LAYERS layers) is written twice, as `moe-stack
     synth-moe` writes it: the GGUF kt-kernel's LLAMAFILE experts read, and the Hugging Face directory
     SGLang reads the rest from;
  4. `moe-stack compose --engine ktransformers --preset PRESET --gpu nvidia` is run for this host, and
     its command checked against the captured --help;
  5. the image's entrypoint runs the file's exact command (container paths mapped onto this
     machine's), with the image's environment and the stack's, plus the substitutions;
  6. once healthy: smoke's client checks (served name, completion, chat, tool call, metrics), a
     request without the stack's API key refused, GPU memory in use, single-stream decode rates,
     kt-kernel's variant as logged; and whether the key is anywhere in the server's log.

With KT_GPU_WEIGHTS=amx the experts are kt-kernel's AMXINT4 instead of the GGUF's: step 3 converts the
checkpoint with kt-kernel's converter (carried from a ktransformers tree in .device/kt/ktransformers)
on the command line `moe-stack kt-convert` plans for this host, run natively where the verb runs it in
the image, then checked, recorded and renamed by the verb's own code (finish_conversion); step 4's
stack serves that directory.

Usage: kt_gpu.py OUT_DIR WORK_DIR (results: OUT_DIR/kt-gpu.json, kt-PRESET.json or kt-amx.json, the
server's log, sglang-help.txt, ...)
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO

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
from builder.running.smoke import api_checks
from builder.stackfile.stack_file import Service, StackFile

REPO = Path(__file__).resolve().parents[2]
ENGINE = KTransformers()
PORT = 8080
# What the GPU machine can't run as the image does, and what stands in (KT-ON-THE-GPU.md):
# sgl_kernel's FA3 and CUDA-graph paths are compiled for torch 2.9.1; flashinfer's sampling and
# xgrammar were not carried; the machine is offline; deep_gemm was left out of the carry.
DEVICE_ARGS = [
    "--attention-backend", "triton",
    "--sampling-backend", "pytorch",
    "--grammar-backend", "none",
    "--disable-cuda-graph",
]  # fmt: skip
DEVICE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "SGLANG_ENABLE_JIT_DEEPGEMM": "0",
    "KT_KERNEL_DEBUG": "1",  # kt-kernel then prints the CPU variant it loads (a log line, no behaviour)
}
# The machine's rule: NVLink multicast stays off in every process (device README).
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
# Each preset's model at its real widths, few layers and 16 experts: Qwen3-235B's (2 layers); R1's (MLA with
# its 128 heads, q_lora 1536: one dense leading layer and one MoE layer with a shared expert, 8 groups of
# 2 experts); Qwen3-Next's (three gated delta nets and one gated attention layer).
PRESET_SHAPES = {
    "qwen3-235b-a22b": ["--arch", "qwen3moe", "--layers", "2", "--experts", "16"],
    "deepseek-r1-671b": ["--arch", "deepseek2", "--layers", "2", "--experts", "16"],
    "qwen3-next-80b-a3b": ["--arch", "qwen3next", "--layers", "4", "--experts", "16"],
}
PRESET = os.environ.get("KT_GPU_PRESET", "qwen3-235b-a22b")
# KT_GPU_LAYERS: a deeper slice of the same widths (kt_hicache.py's depth series)
SHAPE_ARGS = list(PRESET_SHAPES[PRESET])
if "KT_GPU_LAYERS" in os.environ:
    SHAPE_ARGS[SHAPE_ARGS.index("--layers") + 1] = os.environ["KT_GPU_LAYERS"]
AMX = os.environ.get("KT_GPU_WEIGHTS", "gguf") == "amx"
NAME = "kt-amx" if AMX else "kt-gpu" if PRESET == "qwen3-235b-a22b" else f"kt-{PRESET}"
DECODE_TOKENS, DECODE_ROUNDS = 64, 3
KT_TREE = REPO / ".device/kt/ktransformers"  # kt-kernel/scripts/convert_cpu_weights.py, version.py


def cli(*args: str, timeout: int = 600) -> str:
    """`moe-stack ARGS` (this checkout's), its output; a failure ends the run with it."""
    run = subprocess.run(
        [sys.executable, "-c", "from builder.cli.main import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if run.returncode:
        raise SystemExit(f"moe-stack {' '.join(args)} failed ({run.returncode}): {run.stdout}{run.stderr}")
    return run.stdout


def install_server(bin_dir: Path) -> Path:
    """The image's server wrapper and key launcher, as its Dockerfile copies them (mode 0755)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in ("moe-stack-server", "moe-stack-sglang-with-key"):
        shutil.copy(REPO / "dockerfiles/ktransformers" / name, bin_dir / name)
        (bin_dir / name).chmod(0o755)
    return bin_dir / "moe-stack-server"


def image_env(image: str, server: Path) -> dict[str, str]:
    """The environment the stack's image sets (its Dockerfile's ENV), for the variant its tag names."""
    cpu = image.rsplit("-", 1)[-1]
    spec = image_spec(ENGINE, cpu, cuda=cuda_target("12.8"))
    return {
        "PYTHONDONTWRITEBYTECODE": "1",
        "MOE_STACK_ENGINE_BIN": str(server),
        "MOE_STACK_MODEL_FLAGS": " ".join(ENGINE.model_flags),
        "MOE_STACK_SERVER_MODULE": ENGINE.server_module,
        "MOE_STACK_HEALTH_PATH": ENGINE.health_path,
        "MOE_STACK_PROMPTS_DIR": PROMPTS_DIR,  # the stack's prompt volume, for the image's helper
        **ENGINE.engine_env(spec),
    }


def mapped(value: str, mounts: dict[str, str]) -> str:
    for inside, outside in mounts.items():
        if value == inside or value.startswith(inside + "/"):
            return outside + value[len(inside) :]
    return value


def native_command(
    service: Service, mounts: dict[str, str], server_bin: Path, work: Path
) -> tuple[list[str], dict[str, str]]:
    """The stack's command and environment on this machine: the container's paths mapped onto its own, on
    127.0.0.1, with the image's environment and this machine's substitutions."""
    args = [mapped(arg, mounts) for arg in service.args] + DEVICE_ARGS
    args[args.index("--host") + 1] = "127.0.0.1"
    env = {
        **os.environ,
        **MULTICAST_OFF,
        **{key: mapped(value, mounts) for key, value in image_env(service.image, server_bin).items()},
        **{key: mapped(str(value), mounts) for key, value in service.env.items()},
        **DEVICE_ENV,
        "HOME": str(work / "home"),
        "XDG_CACHE_HOME": str(work / "home/.cache"),
    }
    return args, env


def serve(args: list[str], env: dict[str, str], log: IO[str]) -> subprocess.Popen:
    """The image's entrypoint running the stack's command, in a process group of its own (`stop`)."""
    return subprocess.Popen(
        ["sh", str(REPO / "dockerfiles/common/moe-stack-entrypoint"), *args],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )  # fmt: skip


def gpu_used_mib() -> int:
    text = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return int(text.split()[0]) if text.strip() else -1


def status_without_key(path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{PORT}{path}", timeout=30) as reply:
            return reply.status
    except urllib.error.HTTPError as err:
        return err.code


def healthy(server: subprocess.Popen, deadline: float) -> bool:
    while time.time() < deadline and server.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=5) as reply:
                if reply.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(2)
    return False


def stop(server: subprocess.Popen, grace_s: float = 0) -> None:
    """The server's whole process group (SGLang's scheduler and detokenizer processes too). With
    `grace_s`, its first process alone is asked first, as `docker stop` asks the container's, and given
    that long (a stack's image helper stops the server itself)."""
    if grace_s:
        server.terminate()
        try:
            server.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    for signal, wait_s in ((15, 30), (9, 10)):
        try:
            os.killpg(server.pid, signal)
            server.wait(wait_s)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def decode_rates(api: EngineApi) -> dict[str, object]:
    """Tokens a second of single-stream completions of DECODE_TOKENS tokens (a short prompt, the end of
    text ignored), after one warm-up: each round's figure and their median. A slice of two or four layers
    times SGLang's per-token overhead more than its layers: no figure for the full model."""
    body = {
        "model": PRESET,  # the stack's served name
        "prompt": "The capital of France is",
        "max_tokens": DECODE_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
    }
    api.post("/v1/completions", body)
    rates = []
    for _ in range(DECODE_ROUNDS):
        started = time.perf_counter()
        reply = api.post("/v1/completions", body)
        elapsed = time.perf_counter() - started
        rates.append(round(reply["usage"]["completion_tokens"] / elapsed, 1))
    return {"tokens": DECODE_TOKENS, "rounds_tok_s": rates, "median_tok_s": sorted(rates)[len(rates) // 2]}


def convert(hf_dir: Path, work: Path, out: Path, env: dict[str, str], result: dict[str, object]) -> Path:
    """The checkpoint converted to AMXINT4 as `moe-stack kt-convert` plans it for this host."""
    checkpoint = read_checkpoint(hf_dir)
    plan = plan_conversion(checkpoint, KT_TREE, "AMXINT4", probe(), image="(this run's packages)")
    staging = work / f".{plan.output.name}.staging"
    staging.mkdir()
    args = plan.converter_args(str(hf_dir), str(staging), str(plan.script))
    started = time.time()
    run = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=300, check=False,
        env={**env, "KT_KERNEL_CPU_VARIANT": "amx"},
    )  # fmt: skip
    (out / "kt-convert.log").write_text(run.stdout + run.stderr)
    if run.returncode:
        raise SystemExit(f"the converter failed ({run.returncode}): {(run.stdout + run.stderr)[-3000:]}")
    weights = finish_conversion(staging, plan, run.stdout.splitlines())
    facts = converted_facts(weights.path)
    result["conversion"] = {
        "converter_args": ["python3", *args],
        "seconds": round(time.time() - started, 1),
        "output": str(weights.path),
        "numa_pools": weights.numa_pools,
        "moe_layers": weights.moe_layers,
        "record": weights.record,
        "files": {p.name: p.stat().st_size for p in sorted(weights.path.iterdir())},
        "facts": {
            "arch": facts.arch, "layers": facts.layers, "expert_bytes": facts.expert_bytes,
            "other_bytes": facts.other_bytes, "vocab": facts.vocab, "kv_heads": facts.kv_heads,
        },
        "checkpoint_expert_bytes_per_layer_f16": 2 * 16 * 3 * 4096 * 1536,
    }  # fmt: skip
    return weights.path


def check_stand_ins() -> str:
    """sgl_kernel's stand-ins against their references on the GPU (check_ops.py): its line, or exits with
    what failed."""
    ops = subprocess.run(
        [sys.executable, str(REPO / "bench/device/sgl_kernel_torch/check_ops.py"), "cuda"],
        capture_output=True, text=True, env={**os.environ, **MULTICAST_OFF}, check=False,
    )  # fmt: skip
    if ops.returncode:
        raise SystemExit(ops.stdout + ops.stderr)
    return (ops.stdout + ops.stderr).strip().splitlines()[-1]


def main(out: Path, work: Path) -> None:
    result: dict[str, object] = {"substituted": {"args": DEVICE_ARGS, "env": DEVICE_ENV}}
    started = time.time()

    def note(step: str) -> None:
        print(f"[{time.time() - started:.0f}s] {step}", flush=True)

    env = {**os.environ, **MULTICAST_OFF}
    result["stand_in_checks"] = check_stand_ins()
    note(f"stand-ins: {result['stand_in_checks']}")

    server_bin = install_server(work / "bin")
    server_env = {**env, "MOE_STACK_SERVER_MODULE": ENGINE.server_module}
    help_run = subprocess.run(
        [str(server_bin), "--help"],
        capture_output=True, text=True, env=server_env, timeout=300, check=False,
    )  # fmt: skip
    (out / "sglang-help.txt").write_text(help_run.stdout)
    flags = parse_contract(help_run.stdout, None)
    note(f"--help: exit {help_run.returncode}, {len(flags)} flags")
    if not flags:
        raise SystemExit(f"SGLang's --help listed no flags: {help_run.stderr[-3000:]}")

    gguf_dir, hf_dir = work / "gguf", work / "hf"
    gguf_dir.mkdir(parents=True, exist_ok=True)
    arch, layers = SHAPE_ARGS[1], SHAPE_ARGS[3]
    result["model"] = {
        "gguf": cli("synth-moe", *SHAPE_ARGS, str(gguf_dir / f"{arch}-{layers}l-16e-q4_0.gguf"))
        .strip()
        .splitlines(),
        "hf": cli("synth-moe", *SHAPE_ARGS, "--format", "hf", str(hf_dir)).strip().splitlines(),
    }
    note("models written")
    weights_dir = gguf_dir
    model_arg = next(gguf_dir.glob("*.gguf"))
    if AMX:
        model_arg = convert(hf_dir, work, out, env, result)
        weights_dir = model_arg.parent  # the stack mounts a converted directory's parent at /models
        note(f"converted: {result['conversion']}")

    key_file = work / "api-key"
    key_file.write_text(secrets.token_urlsafe(24) + "\n")  # this run's own: no key lives in the repo
    stack_file = out / f"{NAME}-stack.yaml"
    compose_args = [
        "compose", "--engine", ENGINE.name, "--preset", PRESET, "--gpu", "nvidia",
        "--model", str(model_arg), "--config-dir", str(hf_dir),
        "--api-key-file", str(key_file), "--skip-image-checks", "--out", str(stack_file),
    ]  # fmt: skip
    cli(*compose_args)
    result["compose"] = "moe-stack " + " ".join(compose_args)
    service = StackFile.read(stack_file).service("engine")
    command = service.args
    result["image"], result["command"] = service.image, command
    try:
        check_args(command, flags, "sglang-kt 0.7.2 (this run's --help)")
        for flag in ("--kt-method", "--reasoning-parser", "--tool-call-parser"):
            if flag in command:
                check_choice(flags, flag, command[command.index(flag) + 1], "sglang-kt 0.7.2")
        result["command_checked"] = "every flag and parser choice is in the server's --help"
    except StackError as err:
        result["command_checked"] = f"REFUSED: {err}"
    note(f"stack: {service.image}, {len(command)} arguments; {result['command_checked']}")

    mounts = {MODEL_DIR: str(weights_dir), CONFIG_DIR: str(hf_dir), API_KEY_PATH: str(key_file)}
    args, run_env = native_command(service, mounts, server_bin, work)
    result["image_env"] = image_env(service.image, server_bin)
    result["stack_env"] = {key: mapped(str(value), mounts) for key, value in service.env.items()}
    log = (out / f"{NAME}-server.log").open("w")
    server = serve(args, run_env, log)
    start = time.time()
    try:
        if not healthy(server, start + float(os.environ.get("KT_GPU_START_S", "300"))):
            result["error"] = f"not healthy (exit {server.poll()})"
            return
        result["load_s"] = round(time.time() - start, 1)
        result["gpu_used_mib"] = gpu_used_mib()
        note(f"healthy after {result['load_s']} s")
        result["without_key"] = {"/v1/models": status_without_key("/v1/models")}
        api = EngineApi(PORT, api_key=key_file.read_text().strip(), timeout_s=300)
        result["smoke"] = [
            {"check": c.name, "passed": c.passed, "seen": c.seen} for c in api_checks(stack_file, api)
        ]
        result["gpu_used_after_requests_mib"] = gpu_used_mib()
        try:
            result["decode"] = decode_rates(api)
        except (StackError, OSError, KeyError) as err:  # recorded; the checks above stand
            result["decode"] = f"failed: {err}"
        note(f"decode: {result['decode']}")
    finally:
        stop(server)
        log.close()
        text = (out / f"{NAME}-server.log").read_text(errors="replace")
        kt_lines = re.findall(
            r"^.*(?:\[kt-kernel\]|backend=|kt_num_gpu_experts|KTConfig).*$", text, re.MULTILINE
        )
        result["kt_kernel_logged"] = [line[:300] for line in dict.fromkeys(kt_lines)][:16]
        result["key_in_server_log"] = key_file.read_text().strip() in text
        result["seconds"] = round(time.time() - started, 1)
        (out / f"{NAME}.json").write_text(json.dumps(result, indent=2) + "\n")
        note(json.dumps(result, indent=2))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
