"""The tools image and `moe-stack bench --tool`: a stack's server flags written as each engine's
llama-bench / llama-sweep-bench takes them (checked against the tools' recorded --help), their
recorded outputs read back, the tools image's name, build target and the container it runs in."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.engines import bench_engine, get_engine
from builder.engines.llama_bench import llama_bench_args, server_settings, sweep_bench_args
from builder.errors import SpecError, StackError
from builder.images.build import plan_build
from builder.images.build_plan import TOOLS_STAGE
from builder.images.matrix import cuda_target
from builder.images.naming import image_spec, image_tag, tools_image_of
from builder.images.render import render_files
from builder.platform.flags import parse_contract, parse_help
from builder.running.tool_bench import (
    ToolOutput,
    parse,
    parse_llama_bench,
    parse_sweep_bench,
    program,
    tool_args,
)
from builder.running.tool_run import stack_server_args, tool_document
from builder.stackfile.stack_file import StackFile
from builder.stacks.compose import compose_stack
from tests.specs import routed_stacks

DATA = Path(__file__).parent / "data"
MAINLINE_BENCH = parse_help((DATA / "llama.cpp-0c1e57098-llama-bench-help.txt").read_text())
IK_BENCH = parse_help((DATA / "ik_llama.cpp-ikpy-0.1.5-llama-bench-help.txt").read_text())
IK_SERVER = parse_contract(
    (DATA / "ik_llama.cpp-ikpy-0.1.5-help.txt").read_text(),
    (DATA / "ik_llama.cpp-ikpy-0.1.5-parser-flags.txt").read_text(),
)

EXPERTS = r"blk\.[0-9]+\.ffn_.*_exps\.weight=CPU"
# A hybrid two-GPU stack's command, as `moe-stack compose` writes it.
SERVER = [
    "--model",
    "/models/m-00001-of-00003.gguf",
    "--host",
    "0.0.0.0",
    "--port",
    "8080",
    "--ctx-size",
    "32768",
    "--threads",
    "16",
    "--parallel",
    "1",
    "--override-tensor",
    r"blk\.[0-2]\.ffn_.*_exps\.weight=CUDA0",
    "--override-tensor",
    EXPERTS,
    "--alias",
    "qwen3-235b-a22b",
    "--metrics",
    "--jinja",
    "--n-gpu-layers",
    "99",
    "--tensor-split",
    "3,1",
    "--cache-type-k",
    "q8_0",
    "--cache-type-v",
    "q8_0",
    "-fa",
    "on",
    "--temp",
    "0.6",
    "--batch-size",
    "2048",
    "--ubatch-size",
    "4096",
    "--no-mmap",
    "--mlock",
]


def test_server_settings_pairs_values_and_switches() -> None:
    assert server_settings(["-t", "4", "--no-mmap", "--cuda-params=offload-batch-size=2", "-ngl", "-1"]) == [
        ("-t", "4"),
        ("--no-mmap", None),
        ("--cuda-params", "offload-batch-size=2"),
        ("-ngl", "-1"),
    ]


def test_mainline_llama_bench_gets_the_stacks_placement_batch_and_cache() -> None:
    planned = llama_bench_args(SERVER, MAINLINE_BENCH, ";")
    assert planned.args == [
        "-m",
        "/models/m-00001-of-00003.gguf",
        "-t",
        "16",
        "-ngl",
        "99",
        "-ts",
        "3/1",
        "-ctk",
        "q8_0",
        "-ctv",
        "q8_0",
        "-fa",
        "on",
        "-b",
        "2048",
        "-ub",
        "4096",
        "-lm",
        "none",  # mainline's load mode, where ik keeps -mmp 0
        "-ot",
        rf"blk\.[0-2]\.ffn_.*_exps\.weight=CUDA0;{EXPERTS}",
    ]
    # Serving-only flags and the context size go without a word; --mlock changes paging and is said.
    assert planned.left_out == ["--mlock"]


def test_ik_llama_bench_takes_switches_as_values_and_rules_joined_by_commas() -> None:
    server = [
        "--model",
        "/models/m.gguf",
        "--threads",
        "8",
        "-ot",
        r"blk\.0\.=CUDA0",
        "-ot",
        EXPERTS,
        "-fa",
        "on",
        "-no-fmoe",
        "-mla",
        "3",
        "-amb",
        "512",
        "-rtr",
        "--no-mmap",
        "-thp",
        "-cuda",
        "offload-batch-size=2",
    ]
    planned = llama_bench_args(server, IK_BENCH, ",")
    assert planned.args == [
        "-m",
        "/models/m.gguf",
        "-t",
        "8",
        "-fa",
        "1",
        "-fmoe",
        "0",
        "-mla",
        "3",
        "-amb",
        "512",
        "-rtr",
        "1",
        "-mmp",
        "0",
        "-thp",
        "1",
        "-cuda",
        "offload-batch-size=2",
        "-ot",
        rf"blk\.0\.=CUDA0,{EXPERTS}",
    ]
    assert planned.left_out == []


def test_what_the_tool_cannot_take_is_reported_not_dropped() -> None:
    planned = llama_bench_args(
        ["-m", "/models/m.gguf", "-fa", "auto", "-ot", r"blk\.(1,2)\.=CPU", "-rtr", "--some-new-flag", "3"],
        IK_BENCH,
        ",",
    )
    assert planned.args == ["-m", "/models/m.gguf", "-rtr", "1"]
    assert planned.left_out == [
        "-fa auto (this llama-bench's -fa is 0 or 1; it runs its default)",
        r"-ot blk\.(1,2)\.=CPU (its ',' would split it in llama-bench's -ot)",
        "--some-new-flag 3",
    ]
    # Mainline's llama-bench has no run-time repack switch.
    assert llama_bench_args(["-rtr"], MAINLINE_BENCH, ";").left_out == ["-rtr (this llama-bench has no -rtr)"]


def test_sweep_bench_keeps_the_servers_own_flags_and_the_context() -> None:
    server = [
        "--model",
        "/models/m.gguf",
        "--host",
        "0.0.0.0",
        "--port",
        "8080",
        "--ctx-size",
        "8192",
        "--threads",
        "8",
        "--override-tensor",
        EXPERTS,
        "--alias",
        "m",
        "--metrics",
        "-ub",
        "2048",
        "-rtr",
        "--made-up",
        "1",
    ]
    planned = sweep_bench_args(server, IK_SERVER)
    assert planned.args == [
        "--model",
        "/models/m.gguf",
        "--ctx-size",
        "8192",
        "--threads",
        "8",
        "--override-tensor",
        EXPERTS,
        "-ub",
        "2048",
        "-rtr",
    ]
    assert planned.left_out == ["--made-up 1 (this llama-sweep-bench has no --made-up)"]


def test_tool_args_add_the_tests_and_output_format() -> None:
    server = ["--model", "/models/m.gguf", "--threads", "2"]
    bench = tool_args(get_engine("llama.cpp"), "llama-bench", server, MAINLINE_BENCH, 512, 128, 3)
    assert bench.args == [
        "-m",
        "/models/m.gguf",
        "-t",
        "2",
        "-p",
        "512",
        "-n",
        "128",
        "-r",
        "3",
        "-o",
        "json",
    ]
    sweep = tool_args(get_engine("ik_llama.cpp"), "sweep-bench", server, IK_SERVER, 512, 32, 3)
    assert sweep.args == [*server, "-n", "32", "--output-format", "jsonl"]
    assert program(get_engine("ik_llama.cpp"), "sweep-bench") == "llama-sweep-bench"


@pytest.mark.parametrize(
    ("engine", "tool", "said"),
    [
        ("llama.cpp", "sweep-bench", "llama.cpp has no sweep-bench"),
        ("ktransformers", "llama-bench", "ktransformers has no tools image"),
        ("llama.cpp", "perplexity", "--tool 'perplexity': choose llama-bench or sweep-bench"),
    ],
)
def test_tools_an_engine_lacks_are_refused(engine: str, tool: str, said: str) -> None:
    with pytest.raises(StackError, match=said):
        program(bench_engine(get_engine(engine)), tool)


def test_llama_bench_json_reads_back_as_prefill_and_decode_rows() -> None:
    rows = parse_llama_bench((DATA / "llama.cpp-0c1e57098-llama-bench-output.json").read_text())
    assert [(row.test, row.tokens, row.depth, len(row.samples_tps)) for row in rows] == [
        ("pp32", 32, 0, 2),
        ("tg8", 8, 0, 2),
    ]
    assert all(row.tps > 0 and row.spread >= 0 for row in rows)
    assert rows[0].tps == pytest.approx(sum(rows[0].samples_tps) / 2)
    with pytest.raises(StackError, match="printed no JSON result: error: unknown argument"):
        parse_llama_bench("error: unknown argument: -q\n")


def test_llama_bench_json_is_read_around_ik_llama_cpps_load_lines() -> None:
    """ik_llama.cpp prints "Computed blk.0.attn_kv_b.weight ..." on stdout between the JSON's "[" and its
    first row (a deepseek2 model in mainline's MLA form, on the H200): `tune` failed on it before."""
    text = (DATA / "ik-llama-bench-mla-stdout.txt").read_text()
    assert "Computed blk.0.attn_kv_b.weight" in text.split("{", 1)[0]
    rows = parse_llama_bench(text)
    assert [(row.test, row.tokens) for row in rows] == [("pp512", 512), ("tg64", 64)]
    assert rows[1].samples_tps == (34.8783,)


def test_sweep_bench_log_reads_back_per_window() -> None:
    log = (DATA / "ik_llama.cpp-ikpy-0.1.5-sweep-bench-output.txt").read_text()
    rows = parse(tool="sweep-bench", output=ToolOutput(stdout="", stderr=log))
    assert [(row.test, row.depth) for row in rows] == [("pp256", 0), ("tg8", 0), ("pp256", 256), ("tg8", 256)]
    assert all(row.tps > 0 for row in rows)
    with pytest.raises(StackError, match="llama-sweep-bench printed no result"):
        parse_sweep_bench("main: error: unable to load model\n")


@pytest.mark.parametrize(
    ("image", "tools"),
    [
        (
            "ghcr.io/moe-stack/llama-cpp:0c1e57098-cpu-avx2",
            "ghcr.io/moe-stack/llama-cpp-tools:0c1e57098-cpu-avx2",
        ),
        (
            "ghcr.io/moe-stack/llama-cpp:cpu-avx2@sha256:" + "a" * 64,
            "ghcr.io/moe-stack/llama-cpp-tools:cpu-avx2",
        ),
        ("localhost:5000/ik-llama-cpp", "localhost:5000/ik-llama-cpp-tools:latest"),
        ("localhost/x/ik-llama-cpp-tools:abc-cpu-zen4", "localhost/x/ik-llama-cpp-tools:abc-cpu-zen4"),
    ],
)
def test_tools_image_sits_beside_the_server_image(image: str, tools: str) -> None:
    assert tools_image_of(image) == tools


def test_tools_image_builds_the_tools_stage_of_the_same_context(tmp_path: Path) -> None:
    server, tools = (
        image_spec(get_engine("ik_llama.cpp"), "zen4"),
        image_spec(get_engine("ik_llama.cpp"), "zen4", tools=True),
    )
    assert image_tag(tools) == image_tag(server).replace("/ik-llama-cpp:", "/ik-llama-cpp-tools:")
    plan = plan_build(tools, tmp_path, None)
    assert plan.target == TOOLS_STAGE and plan.tags == (image_tag(tools),)
    assert render_files(tools) == render_files(server)  # one context, two targets
    dockerfile = render_files(tools)["Dockerfile"]
    assert "FROM build AS tools-build" in dockerfile and "FROM runtime AS tools" in dockerfile
    assert "--target llama-bench llama-sweep-bench llama-batched-bench llama-quantize" in dockerfile
    with pytest.raises(SpecError, match="ktransformers has no tools image"):
        image_spec(get_engine("ktransformers"), "avx2", cuda=cuda_target("12.8"), tools=True)


RECORD = {
    "generated-by": "moe-stack compose",
    "engine": "llama.cpp",
    "image": "r/llama-cpp:x",
    "model": "/m/m.gguf",
    "served-name": None,
    "engine-options": {},
    "flags-checked": False,
}


def test_the_tools_container_is_the_stacks_service_without_serving() -> None:
    document = {
        "name": "moe-stack-m",
        "x-moe-stack": RECORD,
        "services": {
            "engine": {
                "image": "r/llama-cpp:x",
                "command": ["--model", "/models/m.gguf"],
                "ports": [{"target": 8080, "published": "8080"}],
                "restart": "unless-stopped",
                "healthcheck": {"test": ["CMD", "moe-stack-health"]},
                "cpuset": "0-15",
                "environment": {"MOE_STACK_NUMA": "interleave"},
                "volumes": [{"type": "volume", "source": "hugepages", "target": "/hugepages"}],
            },
            "prometheus": {"image": "moe-stack/prometheus:trixie"},
        },
        "volumes": {"hugepages": {"driver": "local"}},
    }
    derived = tool_document(
        StackFile.parse(document), "engine", "r/llama-cpp-tools:x", ["llama-bench", "-ot", "exps=CPU$"]
    )
    service = derived["services"]["engine"]
    assert list(derived["services"]) == ["engine"] and derived["name"] == "moe-stack-m-tool"
    assert service["image"] == "r/llama-cpp-tools:x" and service["healthcheck"] == {"disable": True}
    assert service["command"] == ["llama-bench", "-ot", "exps=CPU$$"]  # compose would interpolate a bare $
    assert "ports" not in service and "restart" not in service
    assert service["cpuset"] == "0-15" and service["environment"] == {"MOE_STACK_NUMA": "interleave"}
    assert derived["volumes"] == document["volumes"]
    assert document["services"]["engine"]["image"] == "r/llama-cpp:x"  # the stack's own document is untouched


def test_a_router_stack_is_not_benchmarked_as_one_model(tmp_path: Path) -> None:
    """Read from the record's models, not from the router's flags."""
    routed = routed_stacks(tmp_path)
    with pytest.raises(StackError, match="routes several models; benchmark one model's stack"):
        stack_server_args(compose_stack(routed[0], "x", routed=routed), tmp_path / "compose.yaml", None)
    engine, _, _ = stack_server_args(compose_stack(routed[0], "x"), tmp_path / "compose.yaml", None)
    assert engine.name == "llama.cpp"
