"""What `compose --keep-prompts` saves: the time to first token of a long prompt after a restart ÷ the same
prompt's before it (its first prefill), a fresh prompt each round; and the same without the prompt cache
(a control: it prefills again, about 1). Each round restarts both stacks (SIGTERM: the cache's save),
waits for them to answer (and the restore), then asks each the prompt again.

The model: a synthetic Qwen3-MoE of full attention (8 layers, 1024 wide, 32 experts), or with `--model
demo` the demo model, Gemma 3 270M, whose sliding-window layers keep only the window in a saved slot.

Usage: python bench/prompt_restart.py [--engine llama.cpp] [--model moe|demo] [--image IMAGE] [--rounds 3]
    [--chars 6000]
(the image: by default the engine's pinned avx2 CPU image, which `bash scripts/test.sh` or `moe-stack
build --engine E` makes)
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from python_on_whales import DockerClient

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

RESTORED = "restore slot 0: done"
MOE = synth_shape("qwen3moe", tiny=True, layers=8, hidden=1024, expert_ffn=512, experts=32, experts_used=4)


def prompt(round_: int, chars: int) -> str:
    """About `chars` characters (the synthetic vocabulary reads about one a token, Gemma's about four),
    unlike any other round's from the first word."""
    text, i = "", 0
    while len(text) < chars:
        text += f"Entry {round_}.{i}: the value of item {i} in round {round_} is {i * 7 % 13}. "
        i += 1
    return text


def first_token_s(port: int, text: str) -> tuple[float, int]:
    """Seconds to the first token (one token asked for, the prompt cache on) and tokens prefilled."""
    started = time.monotonic()
    reply = EngineApi(port, timeout_s=600).post(
        "/completion", {"prompt": text, "n_predict": 1, "temperature": 0, "cache_prompt": True}
    )
    return time.monotonic() - started, int(reply["timings"]["prompt_n"])


def stack_file(directory: Path, model: Path, engine: str, image: str, keep: bool) -> tuple[Path, int]:
    port = free_local_port()
    name = "kept" if keep else "plain"
    stack = StackOptions(
        model_path=model,
        engine=get_engine(engine),
        image=image,
        port=port,
        threads=max(1, probe().cpu.physical_cores),
        project=f"moe-stack-prompts-{name}-{uuid.uuid4().hex[:6]}",
        chat_template=DEMO_CHAT_TEMPLATE if model == fetch_demo_model() else None,
        keep_prompts=keep,
        engine_options=EngineOptions(ctx_size=16384),
    )
    planned = plan_stack(stack, probe())
    document = compose_stack(planned.stack, f"bench/prompt_restart.py ({name})", planned.facts)
    return write_stack(document, directory / f"{name}.yaml"), port


def restart(compose_file: Path, port: int, restores: int) -> None:
    """Restart the stack and wait until it answers (and, keeping prompts, has restored `restores` times)."""
    client = DockerClient(compose_files=[compose_file])
    client.compose.restart()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if restores == 0 or str(client.compose.logs()).count(RESTORED) >= restores:
            with contextlib.suppress(StackError):  # 503 while it loads, nothing while it starts
                EngineApi(port).get("/health")
                return
        time.sleep(1)
    raise SystemExit(f"{compose_file} did not come back within 300 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default="llama.cpp", choices=["llama.cpp", "ik_llama.cpp"])
    parser.add_argument("--model", default="moe", choices=["moe", "demo"])
    parser.add_argument("--image", help="the engine image (default: its pinned avx2 CPU image)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chars", type=int, default=6000, help="the prompt's length in characters")
    args = parser.parse_args()
    image = args.image or image_tag(default_image_spec(get_engine(args.engine), gpu=False))
    ratios: dict[str, list[float]] = {"kept": [], "plain": []}
    samples: dict[str, list[str]] = {"kept": [], "plain": []}
    with tempfile.TemporaryDirectory(prefix="moe-stack-prompts-") as tmp, contextlib.ExitStack() as running:
        Path(tmp).chmod(0o755)
        model = fetch_demo_model() if args.model == "demo" else write_moe_gguf(Path(tmp) / "moe.gguf", MOE)
        model.chmod(0o644)
        stacks = {
            "kept": stack_file(Path(tmp), model, args.engine, image, keep=True),
            "plain": stack_file(Path(tmp), model, args.engine, image, keep=False),
        }
        for compose_file, port in stacks.values():
            up(compose_file, timeout_s=300)
            running.callback(down, compose_file)
            first_token_s(port, prompt(-1, 200))  # warm-up: the model's page-in, the first graph
        for round_ in range(args.rounds):
            text = prompt(round_, args.chars)
            before = {name: first_token_s(port, text) for name, (_file, port) in stacks.items()}
            for name, (compose_file, port) in stacks.items():
                restart(compose_file, port, round_ + 1 if name == "kept" else 0)
            for name, (_file, port) in stacks.items():
                after = first_token_s(port, text)
                ratios[name].append(after[0] / before[name][0])
                samples[name].append(
                    f"{before[name][0]:.2f} s ({before[name][1]} tok) -> {after[0]:.2f} s ({after[1]} tok)"
                )
    what = "Gemma 3 270M (the demo)" if args.model == "demo" else f"{MOE.layers}-layer qwen3moe"
    print(f"{args.engine} ({image}), {what}, a {args.chars}-character prompt, {args.rounds} rounds")
    for name, values in ratios.items():
        print(
            f"  {name:5} first token after a restart ÷ before: median {statistics.median(values):.3f} "
            f"(spread {min(values):.3f}-{max(values):.3f})  [{'; '.join(samples[name])}]"
        )


if __name__ == "__main__":
    main()
