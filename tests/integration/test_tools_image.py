"""The tools image: built from the same build stage as the server image, it runs llama-bench and
gguf-py on a real model, and `moe-stack bench --tool` runs the engine's own benchmark with a stack's
exact flags in a container shaped like the stack's."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from python_on_whales import DockerClient

from builder.contract import IMAGE_UID
from builder.images.image_facts import read_image_facts
from builder.models.model_files import DEMO_CHAT_TEMPLATE
from builder.running.tool_bench import parse_llama_bench
from builder.spec import EXPERTS_ON_CPU_RULE
from tests.cli import run_cli
from tests.integration.conftest import StackFactory, budget_minutes, build_engine_image, emit_stack
from tests.integration.starts import run_image

pytestmark = pytest.mark.integration

_ROW = re.compile(r"^\s*((?:pp|tg)\d+)\s+(\d+)\s+([\d.]+)\s", re.MULTILINE)


def _rows(stdout: str) -> list[tuple[str, int, float]]:
    """(test, depth, mean t/s) rows of `moe-stack bench --tool`'s table."""
    return [(test, int(depth), float(tps)) for test, depth, tps in _ROW.findall(stdout)]


def test_avx2_tools_image_runs_llama_bench_and_gguf_py_on_the_demo_model(
    base_image: str, gemma_model: Path, docker_client: DockerClient
) -> None:
    server = build_engine_image("llama.cpp", "avx2", base_image)
    tools = build_engine_image("llama.cpp", "avx2", base_image, tools=True)
    mount = [(gemma_model.parent, "/models", "ro")]
    printed = run_image(
        docker_client,
        tools.tag,
        [
            "llama-bench",
            "-m",
            f"/models/{gemma_model.name}",
            "-t",
            "2",
            "-p",
            "32",
            "-n",
            "8",
            "-r",
            "1",
            "-o",
            "json",
        ],
        volumes=mount,
        remove=True,
        read_only=True,
    )
    rows = parse_llama_bench(str(printed))
    assert [row.test for row in rows] == ["pp32", "tg8"] and all(row.tps > 0 for row in rows)
    # gguf-py from the same tree reads the model, as the README runs it (python3's -m is no model flag).
    dump = run_image(
        docker_client,
        tools.tag,
        ["python3", "-m", "gguf.scripts.gguf_dump", "--json", "--no-tensors", f"/models/{gemma_model.name}"],
        volumes=mount,
        remove=True,
        read_only=True,
    )
    assert json.loads(str(dump))["metadata"]["general.architecture"]["value"] == "gemma3"
    # The engine's tools get the entrypoint's model check: a missing model is one line, exit 66.
    probe = "moe-stack-entrypoint llama-bench -m /models/none.gguf 2>&1; echo exit=$?"
    missing = run_image(
        docker_client, tools.tag, ["-c", probe], entrypoint="/bin/sh", volumes=mount, remove=True
    )
    assert "the model /models/none.gguf is missing" in str(missing) and str(missing).endswith("exit=66")
    # Every tool is there, next to the server; the image runs unprivileged.
    listing = str(
        run_image(
            docker_client, tools.tag, ["-c", "id -u; ls /opt/engine/bin"], entrypoint="/bin/sh", remove=True
        )
    )
    assert listing.split()[0] == str(IMAGE_UID)
    assert {
        "llama-server",
        "llama-bench",
        "llama-quantize",
        "llama-gguf-split",
        "llama-perplexity",
        "llama-imatrix",
        "llama-batched-bench",
    } <= set(listing.split()[1:])
    # Same variant as the server image: the same flag contract and CPU needs, so the same ISA guard.
    server_facts, tools_facts = read_image_facts(server.tag), read_image_facts(tools.tag)
    assert tools_facts.server_flags == server_facts.server_flags
    assert tools_facts.required_cpu_flags == server_facts.required_cpu_flags
    config = docker_client.image.inspect(tools.tag).config
    assert config.user == f"{IMAGE_UID}:{IMAGE_UID}" and config.healthcheck is not None
    assert config.healthcheck.test == ["NONE"]


def test_bench_tool_runs_llama_bench_with_the_stacks_flags(
    base_image: str, gemma_model: Path, tmp_path: Path, start_stack: StackFactory
) -> None:
    server = build_engine_image("llama.cpp", "avx2", base_image)
    build_engine_image("llama.cpp", "avx2", base_image, tools=True)
    compose_file, _ = emit_stack(
        tmp_path, server, gemma_model, chat_template=DEMO_CHAT_TEMPLATE, ubatch_size=128
    )
    result = run_cli("bench", str(compose_file), "--tool", "llama-bench", "-p", "32", "-n", "8", "-r", "2")
    assert result.returncode == 0, result.stderr
    assert f"llama-bench -m /models/{gemma_model.name} -t 2 -ub 128 -p 32 -n 8 -r 2 -o json" in " ".join(
        result.stdout.split()
    )
    rows = _rows(result.stdout)
    assert [(test, depth) for test, depth, _ in rows] == [("pp32", 0), ("tg8", 0)]
    assert all(tps > 0 for _, _, tps in rows)
    # While the stack serves, it holds the cores the tool would measure: refused in one line.
    running = start_stack(server, gemma_model, chat_template=DEMO_CHAT_TEMPLATE)
    refused = run_cli("bench", str(running.compose_file), "--tool", "llama-bench")
    assert refused.returncode == 1 and "is running" in refused.stderr and "Traceback" not in refused.stderr


def test_bench_tool_runs_ik_sweep_bench_and_llama_bench_on_a_hybrid_style_moe_stack(
    base_image: str, moe_model: Path, tmp_path: Path
) -> None:
    server = build_engine_image("ik_llama.cpp", "avx2", base_image)
    build_engine_image("ik_llama.cpp", "avx2", base_image, tools=True)
    compose_file, _ = emit_stack(
        tmp_path,
        server,
        moe_model,
        ctx_size=512,
        ubatch_size=128,
        override_tensors=(EXPERTS_ON_CPU_RULE,),
        extra_args=("-rtr",),
    )
    sweep = run_cli("bench", str(compose_file), "--tool", "sweep-bench", "-n", "8")
    assert sweep.returncode == 0, sweep.stderr
    # The server's flags as they are, the context included (it sweeps over it in -ub windows).
    assert "--ctx-size 512" in sweep.stdout and "-rtr" in sweep.stdout and "--alias" not in sweep.stdout
    rows = _rows(sweep.stdout)
    assert [(test, depth) for test, depth, _ in rows] == [
        (test, depth) for depth in (0, 128, 256, 384) for test in ("pp128", "tg8")
    ]
    assert all(tps > 0 for _, _, tps in rows)
    bench = run_cli("bench", str(compose_file), "--tool", "llama-bench", "-p", "64", "-n", "8", "-r", "1")
    assert bench.returncode == 0, bench.stderr
    command = " ".join(bench.stdout.split())
    assert "-ub 128 -rtr 1" in command and f"-ot {EXPERTS_ON_CPU_RULE}" in command
    assert [test for test, _, _ in _rows(bench.stdout)] == ["pp64", "tg8"]


def test_tune_searches_the_demo_stack_and_writes_the_winner(
    base_image: str, gemma_model: Path, tmp_path: Path
) -> None:
    server = build_engine_image("llama.cpp", "avx2", base_image)
    build_engine_image("llama.cpp", "avx2", base_image, tools=True)
    compose_file, _ = emit_stack(tmp_path, server, gemma_model, chat_template=DEMO_CHAT_TEMPLATE)
    too_short = run_cli("tune", str(compose_file), "--budget", "3s", "-p", "32", "-n", "8")
    assert too_short.returncode == 1 and "is too small: one trial takes about" in too_short.stderr
    # A busy host's trials are slower: the budget follows what tune says one dimension needs here.
    budget_s = max(75, 3 * 60 * budget_minutes(too_short.stderr))
    plot = tmp_path / "tune.png"
    result = run_cli(
        "tune", str(compose_file), "--budget", f"{budget_s}s", "-p", "32", "-n", "8", "--plot", str(plot)
    )
    assert result.returncode == 0, result.stderr
    tuned_file = compose_file.with_suffix(".tuned.yaml")
    record = yaml.safe_load(tuned_file.read_text())["x-moe-stack"]["tuned"]
    # Warm-ups, then at least one round of threads (2 values) and a confirm's worth; a slower (shared)
    # machine affords fewer trials, and then the dimensions the budget dropped are named.
    assert record["trials"] >= 2 + (2 + 2)
    assert record["trials"] >= 2 + 2 * (2 + 2) or record["left-out"], record
    assert set(record["settings"]) == {"threads", "ubatch", "no-mmap"}
    assert record["stack-tps"]["decode"] > 0 and record["tuned-tps"]["prefill"] > 0
    # The bandwidth probe ran in the stack's container; the bound ratio is decode over it.
    assert "bound" in record, result.stderr
    assert record["bound"]["read-gbps"] > 1 and 0 < record["bound"]["decode-over-bound"] < 5
    assert plot.stat().st_size > 10_000
    # The tuned file is a stack moe-stack can run: its command still names the model.
    command = yaml.safe_load(tuned_file.read_text())["services"]["engine"]["command"]
    assert command[:2] == ["--model", f"/models/{gemma_model.name}"]
