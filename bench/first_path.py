"""Figures for the first path, per engine, measured side by side in one run on this host:

  image size · warm rebuild (unchanged spec) · cold build (BuildKit log of the compile step, when the
  last build compiled) · stack up→healthy · Gemma 3 270M decode tok/s in the container.

Usage: python bench/first_path.py [--runs 3]   (builds both engines' avx2 CPU images if needed)
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
import uuid
from pathlib import Path

from builder.docker_client import docker
from builder.engines import engine_names, get_engine
from builder.engines.base import StackSpec
from builder.files import cache_dir
from builder.host.probe import read_cpu
from builder.images.baseimage import ensure_base
from builder.images.build import build_image
from builder.images.naming import image_spec
from builder.images.source import resolve_local
from builder.models.model_files import DEMO_CHAT_TEMPLATE, fetch_demo_model
from builder.running.run import down, up
from builder.spec import BaseImages
from builder.stackfile.host_checks import free_local_port
from builder.stacks.compose import compose_stack, write_stack
from builder.stacks.demo import DEMO_PROMPT, complete
from builder.stacks.document import start_period_for


def compile_seconds(log: Path) -> float | None:
    """The longest `#N DONE Xs` step of a BuildKit log: the engine compile, when it ran."""
    steps = (
        [float(m) for m in re.findall(r"^#\d+ DONE ([0-9.]+)s$", log.read_text(), re.MULTILINE)]
        if log.exists()
        else []
    )
    return max(steps) if steps and max(steps) > 30 else None


def measure(engine_name: str, runs: int) -> dict[str, str]:
    engine = get_engine(engine_name)
    base = ensure_base()
    tree = resolve_local(engine, f"pypi:{engine.sdist}")
    spec = image_spec(engine, tree=tree, ref=engine.sdist_ref, base=BaseImages(build=base, runtime=base))
    first_log = cache_dir() / "logs" / f"bench-{engine.slug}-first.log"
    tag = build_image(spec, tree, show=lambda line: None, log_path=first_log)
    cold = compile_seconds(first_log)
    warm = []
    for _ in range(runs):
        started = time.monotonic()
        build_image(spec, tree, show=lambda line: None, log_path=cache_dir() / "logs" / "bench-warm.log")
        warm.append(time.monotonic() - started)
    size_mb = docker().image.inspect(tag).size / 1e6

    model = fetch_demo_model()
    healthy, decode = [], []
    for _ in range(runs):
        port = free_local_port()
        stack = StackSpec(
            project_name=f"bench-{engine.slug}-{uuid.uuid4().hex[:6]}",
            engine=engine,
            image_ref=tag,
            model=engine.open_model(model),
            port=port,
            cpu_threads=read_cpu().physical_cores,
            chat_template=DEMO_CHAT_TEMPLATE,
            start_period_s=start_period_for(model.stat().st_size),
        )
        compose_file = write_stack(
            compose_stack(stack, "bench/first_path.py"),
            cache_dir() / "bench" / stack.project_name / "compose.yaml",
        )
        started = time.monotonic()
        try:
            up(compose_file, timeout_s=300)
            healthy.append(time.monotonic() - started)
            decode.append(complete(port, DEMO_PROMPT, max_tokens=64).decode_tokens_per_s or 0.0)
        finally:
            down(compose_file)
    return {
        "engine": engine.name,
        "image": tag,
        "size MB": f"{size_mb:.1f}",
        "cold compile s": f"{cold:.0f}" if cold else "cached",
        "warm rebuild s": f"{statistics.median(warm):.1f}",
        "up→healthy s": f"{statistics.median(healthy):.1f}",
        "decode tok/s": f"{statistics.median(decode):.1f}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    rows = [measure(name, args.runs) for name in engine_names()]
    columns = list(rows[0])
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(row[c] for c in columns) + " |")
    mainline, ik = rows
    print(
        f"\nik_llama.cpp ÷ llama.cpp: size {float(ik['size MB']) / float(mainline['size MB']):.2f}, "
        f"decode {float(ik['decode tok/s']) / float(mainline['decode tok/s']):.2f} "
        f"(Gemma 3 270M Q4_K_M, {read_cpu().physical_cores} threads, medians of {args.runs})"
    )


if __name__ == "__main__":
    main()
