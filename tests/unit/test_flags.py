"""The flag contract: parsing --help, checking rendered flags, translating neutral options per version."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from builder.engines import get_engine
from builder.engines.base import StackSpec
from builder.errors import StackError
from builder.models.model_files import DEMO_JINJA_TEMPLATE
from builder.platform.flags import check_args, from_label, parse_contract, parse_help, takes_value, to_label

DATA = Path(__file__).parent / "data"
RESULTS = Path(__file__).resolve().parents[2] / "bench/results"
MAINLINE = parse_help((DATA / "llama.cpp-0c1e57098-help.txt").read_text())
IK_HELP = (DATA / "ik_llama.cpp-ikpy-0.1.5-help.txt").read_text()
IK = parse_contract(IK_HELP, (DATA / "ik_llama.cpp-ikpy-0.1.5-parser-flags.txt").read_text())
IK_OLD = parse_help((DATA / "ik_llama.cpp-pre-pr863-help-excerpt.txt").read_text())
# The pin's server --help, from its CUDA build on the device (it lists the GPU options: -sm, -ts, --max-gpu).
IK_PIN = parse_help((RESULTS / "ik-bump-2026-12-06/ik-8337e4c-server-help.txt").read_text())


def test_parse_real_help_texts() -> None:
    assert MAINLINE["-fa"] == MAINLINE["--flash-attn"] == "[on|off|auto]"
    assert MAINLINE["-ot"].startswith("<tensor name pattern>=")
    assert MAINLINE["-t"] == "N" and "--cpu-moe" in MAINLINE and "-fmoe" not in MAINLINE
    assert takes_value(IK, "-fa") and "-no-fmoe" in IK and "-fmoe" not in IK
    assert {"-mla", "-amb", "-ot", "-thp", "--host", "--port"} <= set(IK)
    assert len(MAINLINE) > 200 and len(IK) > 150


def test_ik_help_alone_misses_accepted_flags() -> None:
    """Why the ik contract adds its parser's literals: --help omits -ot and -thp, which it accepts."""
    help_only = parse_help(IK_HELP)
    assert "-ot" not in help_only and "-thp" not in help_only
    assert IK["-fa"] == help_only["-fa"], "--help placeholders win over bare literals"


def test_parse_alignment_and_continuations() -> None:
    flags = parse_help(
        "  -x,     --exa N      does x\n"
        "                        - a bullet, not a flag\n"
        "--solo\n"
        "-ab, --alpha-beta <a|b>   picks\n"
    )
    assert flags == {"-x": "N", "--exa": "N", "--solo": "", "-ab": "<a|b>", "--alpha-beta": "<a|b>"}


def test_label_round_trip() -> None:
    assert from_label(to_label(IK)) == IK


def test_check_args_names_the_unknown_flag() -> None:
    check_args(["--threads", "8", "--seed", "-1", "-fa", "on"], MAINLINE, "llama.cpp x")
    with pytest.raises(StackError, match=r"ik_llama.cpp ikpy-0.1.5 \(img\) does not accept -fmoe"):
        check_args(["-fmoe"], IK, "ik_llama.cpp ikpy-0.1.5 (img)")


def _stack(engine: str, **options: object) -> StackSpec:
    """A stack without the on-by-default switches (tested on their own below), plus `options`."""
    return StackSpec.model_validate(
        {
            "project_name": "p",
            "engine": engine,
            "image_ref": "i",
            "model": Path("/m/x.gguf"),
            "cpu_threads": 8,
            "jinja": False,
            "metrics": False,
            **options,
        }
    )


def _neutral(engine: str, flags: dict[str, str] | None, **options: object) -> list[str]:
    args = get_engine(engine).server_args(_stack(engine, **options), flags)
    return args[12:]  # after model, host, port, ctx, threads, parallel


def test_seed_options_per_ik_version() -> None:
    seed = {"flash_attention": "on", "fused_moe": True, "mla": 3}
    assert _neutral("ik_llama.cpp", IK_OLD, **seed) == ["-fa", "-fmoe", "-mla", "3"]  # the seed's spelling
    assert _neutral("ik_llama.cpp", IK, **seed) == ["-fa", "on", "-mla", "3"]  # fused MoE is the default now
    assert _neutral("ik_llama.cpp", IK, fused_moe=False) == ["-no-fmoe"]
    assert _neutral("ik_llama.cpp", IK_OLD, fused_moe=False) == []
    assert _neutral("ik_llama.cpp", None, flash_attention="auto") == ["-fa", "auto"]


def test_impossible_options_are_refused() -> None:
    with pytest.raises(StackError, match="on-switch only"):
        _neutral("ik_llama.cpp", IK_OLD, flash_attention="auto")
    with pytest.raises(StackError, match="llama.cpp does not read --fused-moe/--no-fused-moe: drop it"):
        _neutral("llama.cpp", MAINLINE, fused_moe=True)
    with pytest.raises(StackError, match="llama.cpp does not read --mla: drop it"):
        _neutral("llama.cpp", MAINLINE, mla=3)
    assert _neutral("llama.cpp", MAINLINE, flash_attention="on") == ["-fa", "on"]


def test_moe_offload_batch_is_an_ik_cuda_parameter() -> None:
    assert _neutral("ik_llama.cpp", IK, moe_offload_batch=2) == ["-cuda", "offload-batch-size=2"]
    with pytest.raises(StackError, match="has no -cuda parameters"):
        _neutral(
            "ik_llama.cpp",
            {k: v for k, v in IK.items() if k not in ("-cuda", "--cuda-params")},
            moe_offload_batch=2,
        )
    with pytest.raises(StackError, match="^llama.cpp does not read --moe-offload-batch"):
        _neutral("llama.cpp", MAINLINE, moe_offload_batch=2)


def test_split_mode_graph_is_an_ik_opt_in_over_a_multi_gpu_plan() -> None:
    """`--split-mode-graph` on a two-GPU plan writes ik's graph split and -smgs (its scheduling despite the
    plan's -ot rules), which both recorded ik contracts accept; no stack gets it unless asked."""
    two_gpus = {"gpu": "nvidia", "tensor_split": (24, 24)}
    for flags in (IK, IK_PIN, None):
        written = _neutral("ik_llama.cpp", flags, **two_gpus, split_mode_graph=True)
        assert written == ["--tensor-split", "24,24", "--split-mode", "graph", "-smgs"], flags is None
    for contract, who in ((IK, "ik_llama.cpp 55d3c05"), (IK_PIN, "ik_llama.cpp 8337e4c")):
        args = get_engine("ik_llama.cpp").server_args(
            _stack("ik_llama.cpp", **two_gpus, split_mode_graph=True), contract
        )
        check_args(args, contract, who)
    for off in ({}, {"split_mode_graph": False}):
        written = _neutral("ik_llama.cpp", IK_PIN, **two_gpus, **off)
        assert "--split-mode" not in written and "-smgs" not in written


def test_split_mode_graph_is_refused_where_it_cant_split() -> None:
    with pytest.raises(
        StackError,
        match="^--split-mode-graph splits the model over a multi-GPU plan's GPUs and this stack has no "
        "such plan: give --gpus and one --fit-vram-gb size per GPU, or drop --split-mode-graph$",
    ):
        _neutral("ik_llama.cpp", IK_PIN, gpu="nvidia", split_mode_graph=True)
    without = {k: v for k, v in IK_PIN.items() if k not in ("-smgs", "--split-mode-graph-scheduling")}
    with pytest.raises(
        StackError,
        match=r"^this ik_llama.cpp build has no --split-mode graph scheduling \(-smgs\); build a newer",
    ):
        _neutral("ik_llama.cpp", without, gpu="nvidia", tensor_split=(24, 24), split_mode_graph=True)
    # mainline's -sm has no graph; KTransformers splits no layers (it also reads neither this test's
    # --no-jinja nor a multi-GPU plan: named in the same line)
    for engine in ("llama.cpp", "ktransformers"):
        with pytest.raises(
            StackError, match=f"^{engine} does not read --split-mode-graph/--no-split-mode-graph"
        ):
            _neutral(engine, None, gpu="nvidia", tensor_split=(24, 24), split_mode_graph=True)


def test_served_name_jinja_and_metrics_where_the_image_has_them() -> None:
    on = {"served_name": "qwen3-235b-a22b", "jinja": True, "metrics": True}
    assert _neutral("llama.cpp", MAINLINE, **on) == ["--alias", "qwen3-235b-a22b", "--metrics", "--jinja"]
    assert _neutral("ik_llama.cpp", IK, **on) == ["--alias", "qwen3-235b-a22b", "--metrics", "--jinja"]
    assert _neutral("ik_llama.cpp", IK_OLD, **on) == []  # an old build without them: they are left out
    assert _neutral("ik_llama.cpp", None, **on) == ["--alias", "qwen3-235b-a22b", "--metrics", "--jinja"]


def test_sampling_and_batches_in_each_engines_syntax() -> None:
    options = {
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": 20,
        "min_p": 0.0,
        "batch_size": 4096,
        "ubatch_size": 2048,
    }
    written = [
        "--temp",
        "0.6",
        "--top-p",
        "0.95",
        "--top-k",
        "20",
        "--min-p",
        "0",
        "--batch-size",
        "4096",
        "--ubatch-size",
        "2048",
    ]
    assert _neutral("llama.cpp", MAINLINE, **options) == written
    assert _neutral("ik_llama.cpp", IK, **options) == written
    with pytest.raises(StackError, match="has no --min-p; drop --min-p"):
        _neutral("ik_llama.cpp", {k: v for k, v in IK.items() if k != "--min-p"}, min_p=0.05)
    with pytest.raises(ValidationError, match="ubatch_size 4096 is larger than batch_size 2048"):
        _stack("llama.cpp", batch_size=2048, ubatch_size=4096)


def test_a_built_in_template_name_turns_jinja_off() -> None:
    """With Jinja on, `--chat-template gemma` would make the word "gemma" the template."""
    assert _neutral("llama.cpp", MAINLINE, jinja=True, chat_template="gemma") == [
        "--chat-template",
        "gemma",
        "--no-jinja",
    ]
    assert _neutral("llama.cpp", None, jinja=True, chat_template="gemma")[-1] == "--no-jinja"
    assert _neutral("ik_llama.cpp", IK, jinja=True, chat_template="gemma") == [
        "--chat-template",
        "gemma",
    ]  # off already


def test_a_jinja_template_keeps_jinja_on() -> None:
    """The demo's Gemma template as Jinja text: rendered by the Jinja path, which takes `tools` requests
    (mainline's chat page sends its get_datetime tool with every message)."""
    assert _neutral("llama.cpp", MAINLINE, jinja=True, chat_template=DEMO_JINJA_TEMPLATE) == [
        "--chat-template",
        DEMO_JINJA_TEMPLATE,
        "--jinja",
    ]


def test_load_mode_in_each_engines_syntax() -> None:
    """Mainline at 0c1e57098 has `--load-mode` and no `--no-mmap` or `--mlock` (an invalid argument at
    start, seen on the H200); ik_llama.cpp keeps the two switches."""
    assert "--no-mmap" not in MAINLINE and "--mlock" not in MAINLINE and "--load-mode" in MAINLINE
    for flags in (MAINLINE, None):  # the recorded contract, and the engine's current syntax
        assert _neutral("llama.cpp", flags, mmap=False) == ["--load-mode", "none"]
        assert _neutral("llama.cpp", flags, mmap=False, mlock=True) == ["--load-mode", "mlock"]
        assert _neutral("llama.cpp", flags, mlock=True) == ["--load-mode", "mmap+mlock"]
        assert _neutral("llama.cpp", flags, mmap=True) == []
    assert _neutral("ik_llama.cpp", IK, mmap=False, mlock=True) == ["--no-mmap", "--mlock"]
    assert _neutral("ik_llama.cpp", None, mmap=False) == ["--no-mmap"]
    with pytest.raises(StackError, match="has neither --mlock nor --load-mode; drop --mlock"):
        _neutral("ik_llama.cpp", {k: v for k, v in IK.items() if k != "--mlock"}, mlock=True)
    args = get_engine("llama.cpp").server_args(_stack("llama.cpp", mmap=False, mlock=True), MAINLINE)
    check_args(args, MAINLINE, "llama.cpp 0c1e57098")


def test_kv_cache_types_come_from_the_images_help_where_it_lists_them() -> None:
    """Mainline's --help lists `allowed values` for -ctk/-ctv: the contract holds them as choices and a
    stack is checked against the image's own list; ik's lists none, so its adapter's list decides."""
    mainline = MAINLINE
    choices = "{f32,f16,bf16,q8_0,q4_0,q4_1,iq4_nl,q5_0,q5_1}"
    assert mainline["--cache-type-k"] == mainline["-ctv"] == choices
    assert mainline["--numa"] == "TYPE" and mainline["-ngl"] == "N"  # other placeholders as they were
    adapter = get_engine("llama.cpp")
    assert adapter.cache_type_args("q8_0", "q4_0", mainline) == [
        "--cache-type-k",
        "q8_0",
        "--cache-type-v",
        "q4_0",
    ]
    with pytest.raises(
        StackError, match="this llama.cpp build takes --cache-type-v f32 | f16 .*, not 'q6_0'"
    ):
        adapter.cache_type_args("q8_0", "q6_0", mainline)
    # A build whose help listed q6_0 would take it: the image's list, not the adapter's, decides.
    assert adapter.cache_type_args(
        "q6_0", None, {**mainline, "--cache-type-k": "{q6_0}", "--cache-type-v": "{q6_0}"}
    )
    ik = get_engine("ik_llama.cpp")
    assert IK["--cache-type-k"] == "TYPE"
    assert ik.cache_type_args("q8_KV", None, IK) == ["--cache-type-k", "q8_KV", "--cache-type-v", "q8_KV"]
    with pytest.raises(StackError, match="ik_llama.cpp has no KV cache type q4_9"):
        ik.cache_type_args("q4_9", None, IK)
