"""P1, container overhead: the same engine, the same flags, the same model, in our image and built
natively on this host, measured alternately in one run (prefill and decode t/s as the engine reports
them). Target: container ÷ native ≥ 0.99.

The native build uses the configure arguments `moe-stack cmake-args` renders for the image (the host's
compiler; the image's is the base image's) and is cached under ~/.cache/moe-stack/native.

Usage: python bench/container_overhead.py [--rounds 5] [--image TAG]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
import urllib.request
from pathlib import Path

from builder.contract import MODEL_DIR
from builder.engines import Engine
from builder.engines.base import StackSpec
from builder.engines.llama_family import LlamaFamilyEngine
from builder.files import cache_dir
from builder.host.probe import read_cpu
from builder.images.image_facts import read_image_facts
from builder.images.naming import image_spec
from builder.images.render import configure_args
from builder.images.source import resolve_local
from builder.models.model_files import DEMO_CHAT_TEMPLATE, fetch_demo_model
from builder.running.benchmark import measure
from builder.running.run import down, up
from builder.stackfile.host_checks import free_local_port
from builder.stacks.compose import compose_stack, write_stack

DEFAULT_IMAGE = "localhost/moe-stack-test/llama-cpp:0c1e57098-cpu-avx2"


def native_server(engine: Engine, cpu: str) -> Path:
    """llama-server built on this host with the image's configure arguments (ccache launchers dropped)."""
    if not isinstance(engine, LlamaFamilyEngine):
        raise SystemExit(f"{engine} is not built with cmake: the native comparison is for llama.cpp's family")
    tree = resolve_local(engine, f"pypi:{engine.sdist}")
    build = cache_dir() / "native" / f"{engine.slug}-{cpu}"
    binary = build / "bin" / engine.server_target
    if not binary.exists():
        args = [
            a
            for a in configure_args(image_spec(engine, cpu, tree=tree, ref=engine.sdist_ref))
            if "LAUNCHER" not in a
        ]
        subprocess.run(["cmake", "-S", str(tree), "-B", str(build), "-G", "Ninja", *args], check=True)
        subprocess.run(
            [
                "cmake",
                "--build",
                str(build),
                "--target",
                engine.server_target,
                "--parallel",
                str(os.cpu_count()),
            ],
            check=True,
        )
    return binary


def wait_healthy(port: int, timeout_s: int = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"native server on port {port} did not become healthy")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--image", default=DEFAULT_IMAGE)
    options = parser.parse_args()
    facts = read_image_facts(options.image)
    model = fetch_demo_model()
    threads = read_cpu().physical_cores
    stack = StackSpec(
        project_name="bench-overhead",
        engine=facts.engine,
        image_ref=options.image,
        model=facts.engine.open_model(model),
        port=free_local_port(),
        cpu_threads=threads,
        chat_template=DEMO_CHAT_TEMPLATE,
    )
    document = compose_stack(stack, "bench/container_overhead.py", facts)
    compose_file = write_stack(document, cache_dir() / "bench" / "overhead" / "compose.yaml")
    command = [str(native_server(facts.engine, facts.cpu_target))]
    native_port = free_local_port()
    for arg in stack.engine.server_args(stack, facts.server_flags):  # the stack's flags: host paths, port
        command.append(arg.replace(f"{MODEL_DIR}/", f"{model.parent}/").replace("8080", str(native_port)))
    native = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        up(compose_file, timeout_s=300)
        wait_healthy(native_port)
        rows = []
        for _ in range(options.rounds):
            container = measure(stack.port, repetitions=2)
            bare = measure(native_port, repetitions=2)
            rows.append((container.prefill / bare.prefill, container.decode / bare.decode, container, bare))
    finally:
        native.terminate()
        native.wait(timeout=30)
        down(compose_file)
    print(
        f"{facts.engine} {facts.variant}, Gemma 3 270M Q4_K_M, {threads} threads, "
        f"{options.rounds} alternating rounds"
    )
    print("| round | prefill container | prefill native | ratio | decode container | decode native | ratio |")
    print("|---|---|---|---|---|---|---|")
    for i, (pp, tg, c, b) in enumerate(rows, 1):
        print(
            f"| {i} | {c.prefill:.1f} | {b.prefill:.1f} | {pp:.3f} "
            f"| {c.decode:.1f} | {b.decode:.1f} | {tg:.3f} |"
        )
    print(
        f"| median | | | **{statistics.median(r[0] for r in rows):.3f}** | | | "
        f"**{statistics.median(r[1] for r in rows):.3f}** |"
    )


if __name__ == "__main__":
    main()
