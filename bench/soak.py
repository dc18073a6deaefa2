"""A soak of a `--keep-prompts` stack: CLIENTS clients ask chat turns without pause for MINUTES minutes while
the stack is restarted RESTARTS times (SIGTERM: the slots saved, then restored once healthy). Prints and
records: requests answered, errors inside the restart windows and outside them (the goal: none outside),
latency p50/p99 outside the windows, restarts survived (healthy again within 300 s), slot saves and
restores done or refused, and partial slot files left on the volume (the goal: none).

Usage: python -m bench.soak [--engine llama.cpp] [--model moe|demo] [--minutes 5] [--clients 8]
    [--restarts 3] [--image IMAGE] [--out bench/results/soak-DATE]
(the image: the engine's pinned avx2 CPU image, which `bash scripts/test.sh` or `moe-stack build` makes)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import openai
from python_on_whales import DockerClient

from builder.container_start import start_container
from builder.engines import get_engine
from builder.errors import StackError
from builder.host.probe import probe
from builder.images.matrix import default_image_spec
from builder.images.naming import image_tag
from builder.models.model_files import DEMO_CHAT_TEMPLATE, fetch_demo_model
from builder.models.synth_catalog import synth_shape
from builder.models.synth_moe import write_moe_gguf
from builder.running.api import EngineApi
from builder.running.run import down, up
from builder.spec import EngineOptions
from builder.stackfile.host_checks import free_local_port
from builder.stacks.assemble import StackOptions, plan_stack
from builder.stacks.compose import compose_stack, write_stack

SLOTS = 4
# A synthetic Qwen3-MoE of full attention (8 layers, 1024 wide, 32 experts): quick on 2 cores, every layer
# in the saved slots.
MOE = synth_shape("qwen3moe", tiny=True, layers=8, hidden=1024, expert_ffn=512, experts=32, experts_used=4)


def prompt(topic: int) -> str:
    """One of eight long prompts (about 1500 characters), alike within a topic, so a restored slot helps."""
    facts = " ".join(
        f"Fact {topic}.{i}: item {i} of topic {topic} weighs {i * 3 % 11} units." for i in range(30)
    )
    return f"{facts} Which item of topic {topic} weighs the most?"


@dataclass(frozen=True)
class Asked:
    started: float
    ended: float
    error: str | None  # None: answered


@dataclass(frozen=True)
class Window:
    started: float
    healthy: float | None  # None: not healthy again within 300 s


def ask_until(port: int, stop: float, index: int, out: list[Asked]) -> None:
    """One client: chat turns without pause until `stop`, each prompt one of eight (so saved slots matter)."""
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=120)
    turn = 0
    while time.monotonic() < stop:
        started = time.monotonic()
        try:
            client.chat.completions.create(
                model="model",
                messages=[{"role": "user", "content": prompt((index + turn) % 8)}],
                max_tokens=16,
                temperature=0,
            )
            out.append(Asked(started, time.monotonic(), None))
        except openai.OpenAIError as err:
            out.append(Asked(started, time.monotonic(), type(err).__name__))
            time.sleep(0.5)
        turn += 1


def restart(compose_file: Path, port: int) -> Window:
    """`docker compose restart` (SIGTERM: the helper saves the slots), then until /health answers."""
    started = time.monotonic()
    DockerClient(compose_files=[compose_file]).compose.restart()
    deadline = started + 300
    while time.monotonic() < deadline:
        with contextlib.suppress(StackError):
            EngineApi(port, timeout_s=5).get("/health")
            return Window(started, time.monotonic())
        time.sleep(0.5)
    return Window(started, None)


def in_window(asked: Asked, windows: list[Window], grace_s: float = 5.0) -> bool:
    """Whether a request overlapped a restart (from its start to healthy again, and a few seconds after:
    the restore runs once /health answers)."""
    return any(
        asked.started <= (w.healthy or asked.ended) + grace_s and asked.ended >= w.started for w in windows
    )


def partial_files(compose_file: Path) -> list[str]:
    """Files on the prompts volume that are not a whole save (the helper's temporary names)."""
    client = DockerClient(compose_files=[compose_file])
    container = client.compose.ps()[0]
    listing = start_container(
        lambda: container.execute(["sh", "-c", 'ls -A "$MOE_STACK_PROMPTS_DIR"']), f"ls in {container.name}"
    )
    return [name for name in str(listing).split() if "-saving-" in name]


def stack_file(directory: Path, model: Path, engine: str, image: str) -> tuple[Path, int]:
    port = free_local_port()
    options = StackOptions(
        model_path=model,
        engine=get_engine(engine),
        image=image,
        port=port,
        threads=max(1, probe().cpu.physical_cores),
        parallel=SLOTS,
        project=f"moe-stack-soak-{uuid.uuid4().hex[:6]}",
        chat_template=DEMO_CHAT_TEMPLATE if model == fetch_demo_model() else None,
        keep_prompts=True,
        engine_options=EngineOptions(ctx_size=4096 * SLOTS),
    )
    planned = plan_stack(options, probe())
    return write_stack(
        compose_stack(planned.stack, "bench/soak.py", planned.facts), directory / "soak.yaml"
    ), port


def summary(asked: list[Asked], windows: list[Window], logs: str, partial: list[str]) -> dict[str, object]:
    windowed = [in_window(a, windows) for a in asked]
    latencies = sorted(
        a.ended - a.started for a, w in zip(asked, windowed, strict=True) if not w and not a.error
    )
    helper = [line for line in logs.splitlines() if "moe-stack-prompts:" in line]

    def quantile(q: float) -> float | None:
        return round(latencies[int(q * (len(latencies) - 1))], 3) if latencies else None

    def said(action: str, *outcomes: str) -> int:
        return sum(f"{action} slot" in line and any(o in line for o in outcomes) for line in helper)

    return {
        "requests": len(asked),
        "answered": sum(a.error is None for a in asked),
        "errors_in_restart_windows": sum(bool(a.error) and w for a, w in zip(asked, windowed, strict=True)),
        "errors_outside": sum(bool(a.error) and not w for a, w in zip(asked, windowed, strict=True)),
        "error_kinds": sorted({a.error for a in asked if a.error}),
        "latency_outside_s": {"p50": quantile(0.5), "p99": quantile(0.99), "n": len(latencies)},
        "restarts": len(windows),
        "restarts_survived": sum(w.healthy is not None for w in windows),
        "back_healthy_s": [round(w.healthy - w.started, 1) for w in windows if w.healthy is not None],
        "saves_done": said("save", ": done", ": written"),
        "restores_done": said("restore", ": done"),
        "refused_or_unanswered": said("save", "refused", "no reply") + said("restore", "refused", "no reply"),
        "partial_files_left": partial,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default="llama.cpp", choices=["llama.cpp", "ik_llama.cpp"])
    parser.add_argument("--model", default="moe", choices=["moe", "demo"])
    parser.add_argument("--minutes", type=float, default=5)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--restarts", type=int, default=3)
    parser.add_argument("--image", help="the engine image (default: its pinned avx2 CPU image)")
    parser.add_argument("--out", type=Path, help="a results folder for soak.json and the stack's log")
    args = parser.parse_args()
    image = args.image or image_tag(default_image_spec(get_engine(args.engine), gpu=False))
    with tempfile.TemporaryDirectory(prefix="moe-stack-soak-") as tmp, contextlib.ExitStack() as running:
        Path(tmp).chmod(0o755)
        model = fetch_demo_model() if args.model == "demo" else write_moe_gguf(Path(tmp) / "moe.gguf", MOE)
        model.chmod(0o644)
        compose_file, port = stack_file(Path(tmp), model, args.engine, image)
        up(compose_file, timeout_s=300)
        running.callback(down, compose_file)
        asked: list[Asked] = []
        stop = time.monotonic() + args.minutes * 60
        clients = [
            threading.Thread(target=ask_until, args=(port, stop, index, asked))
            for index in range(args.clients)
        ]
        for thread in clients:
            thread.start()
        windows: list[Window] = []
        begun, span = time.monotonic(), args.minutes * 60
        for number in range(1, args.restarts + 1):  # at even points of the run (later if one came back late)
            time.sleep(max(0.0, begun + span * number / (args.restarts + 1) - time.monotonic()))
            windows.append(restart(compose_file, port))
        for thread in clients:
            thread.join()
        logs = str(DockerClient(compose_files=[compose_file]).compose.logs())
        figures = summary(asked, windows, logs, partial_files(compose_file))
    said = {"engine": args.engine, "image": image, "model": args.model, "minutes": args.minutes,
            "clients": args.clients, "slots": SLOTS, **figures}  # fmt: skip
    print(json.dumps(said, indent=1))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "soak.json").write_text(json.dumps(said, indent=1) + "\n")
        (args.out / "stack.log").write_text(logs)  # xz it before committing
        (args.out / "requests.jsonl").write_text("".join(json.dumps(asdict(a)) + "\n" for a in asked))


if __name__ == "__main__":
    main()
