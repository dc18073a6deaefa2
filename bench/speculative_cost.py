"""What the draft path costs: decode with a draft model that is never accepted ÷ decode without one, the
same model in the same image, both stacks up side by side and measured alternately (one idle while the
other runs), after a warm-up each, repeated, with the spread of the per-round ratios.

Random weights accept no draft (the draft's guesses and the model's greedy tokens are unrelated), so this
is the cost side only: every step drafts up to --draft-max tokens and verifies them in one batch, and
keeps none. What a real draft gains is its acceptance rate times the tokens a step then yields, against
this cost; with hybrid MoE the verify batch routes to more experts, each read from RAM.

Usage: python bench/speculative_cost.py [--engine llama.cpp] [--image IMAGE] [--rounds 5] [--draft-max 4]
(the image: by default the engine's pinned avx2 CPU image, which `bash scripts/test.sh` or `moe-stack
build --engine E` makes)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import re
import statistics
import tempfile
import uuid
from pathlib import Path

from python_on_whales import DockerClient

from builder.engines import get_engine
from builder.host.probe import probe
from builder.images.matrix import default_image_spec
from builder.images.naming import image_tag
from builder.models.synth_catalog import synth_shape
from builder.models.synth_moe import write_moe_gguf
from builder.running.api import EngineApi
from builder.running.run import down, up
from builder.spec import EngineOptions
from builder.stackfile.host_checks import free_local_port
from builder.stacks.assemble import StackOptions, plan_stack
from builder.stacks.compose import compose_stack, write_stack

# Wide enough that a decode step is mostly weight reads (8 layers of 32 experts, 1024 wide: ~140 MB at
# Q8_0), small enough to write in seconds; the draft is one layer of it, another seed.
MODEL = synth_shape("qwen3moe", tiny=True, layers=8, hidden=1024, expert_ffn=512, experts=32, experts_used=4)
PROMPT = "the expert model reads a token from memory and the cache " * 4


def decode(port: int, tokens: int) -> tuple[float, int, int]:
    """One greedy completion of `tokens`: decode tok/s, tokens drafted, drafted tokens accepted."""
    body = {
        "prompt": PROMPT,
        "n_predict": tokens,
        "ignore_eos": True,
        "cache_prompt": False,
        "temperature": 0,
    }
    timings = EngineApi(port, timeout_s=300).post("/completion", body)["timings"]
    return (
        float(timings["predicted_per_second"]),
        int(timings.get("draft_n", 0)),
        int(timings.get("draft_n_accepted", 0)),
    )


def stack_file(
    directory: Path, engine: str, image: str, options: EngineOptions, name: str
) -> tuple[Path, int]:
    port = free_local_port()
    stack = StackOptions(
        model_path=directory / "model.gguf",
        engine=get_engine(engine),
        image=image,
        port=port,
        threads=max(1, probe().cpu.physical_cores),
        project=f"moe-stack-spec-{name}-{uuid.uuid4().hex[:6]}",
        engine_options=options,
    )
    planned = plan_stack(stack, probe())
    document = compose_stack(planned.stack, f"bench/speculative_cost.py ({name})", planned.facts)
    return write_stack(document, directory / f"{name}.yaml"), port


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default="llama.cpp", choices=["llama.cpp", "ik_llama.cpp"])
    parser.add_argument("--image", help="the engine image (default: its pinned avx2 CPU image)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--draft-max", type=int, default=4)
    args = parser.parse_args()
    image = args.image or image_tag(default_image_spec(get_engine(args.engine), gpu=False))
    with tempfile.TemporaryDirectory(prefix="moe-stack-spec-") as tmp, contextlib.ExitStack() as running:
        directory = Path(tmp)
        directory.chmod(0o755)
        for path in (
            write_moe_gguf(directory / "model.gguf", MODEL),
            write_moe_gguf(directory / "draft.gguf", dataclasses.replace(MODEL, layers=1), seed=11),
        ):
            path.chmod(0o644)
        drafted = EngineOptions(draft_model=directory / "draft.gguf", draft_max=args.draft_max)
        stacks = {
            "plain": stack_file(directory, args.engine, image, EngineOptions(), "plain"),
            "draft": stack_file(directory, args.engine, image, drafted, "draft"),
        }
        for compose_file, _port in stacks.values():
            up(compose_file, timeout_s=180)
            running.callback(down, compose_file)
        for _compose_file, port in stacks.values():  # warm-up: the model's page-in, the first graph
            decode(port, 16)
        speeds: dict[str, list[float]] = {"plain": [], "draft": []}
        drafts = accepted = 0
        for _ in range(args.rounds):
            for name, (_compose_file, port) in stacks.items():
                tps, n_drafted, n_accepted = decode(port, args.tokens)
                speeds[name].append(tps)
                if name == "draft":
                    drafts, accepted = drafts + n_drafted, accepted + n_accepted
        if not drafts:  # ik_llama.cpp's timings count no drafts: its log does, per request
            logged = DockerClient(compose_files=[stacks["draft"][0]]).compose.logs()
            counts = re.findall(r"\(\s*(\d+) accepted /\s*(\d+) generated\)", logged)
            accepted, drafts = sum(int(a) for a, _ in counts), sum(int(g) for _, g in counts)
    ratios = [d / p for d, p in zip(speeds["draft"], speeds["plain"], strict=True)]
    print(
        f"{args.engine} ({image}), {MODEL.layers}-layer qwen3moe, {args.tokens} tokens, {args.rounds} rounds"
    )
    for name, values in speeds.items():
        samples = " ".join(f"{v:.1f}" for v in values)
        print(f"  {name:5} decode t/s: median {statistics.median(values):.1f}  [{samples}]")
    print(f"  drafted {drafts} tokens, accepted {accepted} (--draft-max {args.draft_max})")
    print(f"  draft ÷ plain: {statistics.median(ratios):.2f} (spread {min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
