"""Which stack options each engine honours (Engine.honours), and which flags a stack sets itself
(Engine.flag_spellings): declared once per adapter, and held here to what the adapters write."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import typer

from builder import spec
from builder.cli import stack as cli_stack
from builder.cli.main import app
from builder.cli.options import PANEL
from builder.engines import base, engine_names, get_engine
from builder.engines.base import StackSpec
from builder.errors import StackError
from builder.models.synth_catalog import synth_shape
from builder.models.synth_moe import write_moe_gguf
from builder.platform.flags import option_names
from builder.request import ENGINE_OPTIONS
from tests.specs import compose_dict

DATA = Path(__file__).parent / "data"
# The stack's own fields (image, host side, placement): every other field is an engine option.
STACK_OWN = {
    "project_name",
    "engine",
    "image_ref",
    "model",
    "port",
    "bind",
    "monitoring",
    "monitoring_port",
    "numa_policy",
    "bind_nodes",
    "numa_node_count",
    "cpuset",
    "gpu",
    "gpu_ids",
    "shm_size",
    "start_period_s",
    "vram_margin_mib",  # written only by the engine-fit placement (with engine_fit), else the plan's
    "sliding_window",  # a fact of the model, read for --keep-prompts
    "grouped_routing",  # a fact of the model (expert groups) where the engine applies them on request
    "derived",  # no preset: what the model's facts gave, said in the stack's record
}
# A value other than the default for each engine option (valid together with the base stack).
CHANGED: dict[str, object] = {
    "ctx_size": 8192,
    "cpu_threads": 8,
    "parallel": 2,
    "override_tensors": ("exps=CPU",),
    "chat_template": "chatml",
    "served_name": "m",
    "jinja": False,
    "metrics": False,
    "flash_attention": "on",
    "fused_moe": False,
    "mla": 3,
    "gpu_layers": 99,
    "cache_type": "q8_0",
    "cache_type_v": "q4_0",
    "moe_offload_batch": 2,
    "split_mode_graph": True,
    "mmap": False,
    "temperature": 0.6,
    "top_p": 0.95,
    "top_k": 20,
    "min_p": 0.0,
    "batch_size": 2048,
    "ubatch_size": 512,
    "idle_unload": "10m",
    "cache_ram": "2g",
    "kt_method": "AMXINT8",
    "reasoning_parser": "qwen3",
    "tool_call_parser": "qwen25",
    "thinking": "off",
    "reasoning_budget": 0,
    "reasoning_effort": "high",
    "reasoning_format": "none",
    "gpu_experts": 4,
    "config_dir": "other-config",
    "trust_remote_code": True,
    "tensor_split": (1, 1),
    "engine_fit": True,
    "mlock": True,
    "hugepages": True,
    "hugetlbfs": "2M",
    "api_key_file": "key",
    "keep_prompts": True,
    "extra_args": ("--verbose",),
    "draft_model": "d.gguf",
    "mtp": True,
    "draft_max": 4,
    "mmproj": "mmproj-m.gguf",
}
# Flags an engine takes several times by design (one -ot rule each).
REPEATED = {"--override-tensor"}


def _base(tmp_path: Path, engine: str) -> dict[str, object]:
    tmp_path.chmod(0o755)
    for name in ("m.gguf", "key", "d.gguf", "mmproj-m.gguf"):
        (tmp_path / name).write_bytes(b"GGUF")
        (tmp_path / name).chmod(0o644)
    (tmp_path / "config").mkdir(mode=0o755, exist_ok=True)
    (tmp_path / "other-config").mkdir(mode=0o755, exist_ok=True)
    kt = engine.startswith("ktransformers")
    if kt:  # a model SGLang's cache can keep (--keep-prompts reads its attention's kind)
        write_moe_gguf(tmp_path / "m.gguf", synth_shape("qwen3moe", tiny=True)).chmod(0o644)
    return {
        "project_name": "p",
        "engine": engine,
        "image_ref": "img:1",
        "model": tmp_path / "m.gguf",
        "cpu_threads": 4,
        "gpu": "nvidia",
        **({"config_dir": tmp_path / "config"} if kt else {}),
    }


def _value(tmp_path: Path, name: str) -> object:
    value = CHANGED[name]
    paths = ("config_dir", "api_key_file", "draft_model", "mmproj")
    return tmp_path / value if name in paths and isinstance(value, str) else value


def test_every_stack_field_is_an_engine_option_or_the_stacks_own() -> None:
    """A new StackSpec field must be classified: an engine option is refused by the engines that don't
    declare it, never dropped."""
    assert set(ENGINE_OPTIONS) | STACK_OWN == set(StackSpec.model_fields)
    assert not set(ENGINE_OPTIONS) & STACK_OWN
    assert set(CHANGED) == set(ENGINE_OPTIONS)
    for name in engine_names():
        assert get_engine(name).honours <= set(ENGINE_OPTIONS), name


@pytest.mark.parametrize("engine", engine_names())
@pytest.mark.parametrize("option", sorted(ENGINE_OPTIONS))
def test_an_option_changes_what_runs_or_is_refused(tmp_path: Path, engine: str, option: str) -> None:
    """`compose --engine llama.cpp --kt-method AMXINT8` exited 0 and dropped it: now every engine x option
    either changes the engine's service or is refused in one line naming the option."""
    base = _base(tmp_path, engine)
    before = compose_dict(StackSpec(**base), "x")["services"]["engine"]
    try:
        changed = StackSpec(**{**base, option: _value(tmp_path, option)})
        after = compose_dict(changed, "x")["services"]["engine"]
    except StackError as err:  # unread, or a value this engine can't take here: named either way
        if option not in get_engine(engine).honours:
            assert f"{engine} does not read {ENGINE_OPTIONS[option]}" in str(err)
        else:
            assert any(flag in str(err) for flag in re.findall(r"--[a-z-]+", ENGINE_OPTIONS[option])), str(
                err
            )
        return
    assert option in get_engine(engine).honours, f"{engine} wrote a stack for {option} it doesn't declare"
    assert after != before, f"{engine} accepted {option} and ran the same"


@pytest.mark.parametrize("engine", engine_names())
def test_the_adapter_writes_only_declared_flags_and_none_twice(tmp_path: Path, engine: str) -> None:
    adapter = get_engine(engine)
    declared = set().union(*adapter.flag_spellings)
    base = _base(tmp_path, engine)
    for option in sorted(adapter.honours):
        try:
            stack = StackSpec(**{**base, option: _value(tmp_path, option)})
            command = compose_dict(stack, "x")["services"]["engine"]["command"]
        except StackError:
            continue  # refused for another reason (an option this engine needs a GPU flag for, say)
        written = [
            arg
            for arg in command[: len(command) - len(stack.extra_args)]
            if arg.startswith("--") or (arg.startswith("-") and not arg[1:2].isdigit())
        ]
        assert set(written) <= declared, (option, set(written) - declared)
        options = [
            next(names for names in adapter.flag_spellings if flag in names)
            for flag in written
            if flag not in REPEATED
        ]
        assert len(options) == len(set(options)), (option, command)


@pytest.mark.parametrize("engine", engine_names())
def test_no_spelling_of_a_stack_flag_passes_as_an_extra_argument(tmp_path: Path, engine: str) -> None:
    """ik_llama.cpp writes -fa: `--flash-attention on -- -fa off` emitted -fa twice. A flag whose repeats
    merge (--chat-template-kwargs: key by key) adds to the stack's instead."""
    base = _base(tmp_path, engine)
    adapter = get_engine(engine)
    for flag in sorted(set().union(*adapter.flag_spellings) - adapter.merged_flags):
        with pytest.raises(StackError, match=f"repeat flags the stack sets itself \\({flag}\\)"):
            compose_dict(StackSpec(**{**base, "extra_args": (flag, "1")}), "x")
        with pytest.raises(StackError, match=f"\\({flag}\\)"):
            compose_dict(StackSpec(**{**base, "extra_args": (f"{flag}=1",)}), "x")


@pytest.mark.parametrize(
    ("engine", "help_file"),
    [("llama.cpp", "llama.cpp-0c1e57098-help.txt"), ("ik_llama.cpp", "ik_llama.cpp-ikpy-0.1.5-help.txt")],
)
def test_the_declared_spellings_are_the_engines(engine: str, help_file: str) -> None:
    """Each option of the pinned server's --help that the adapter writes has all its spellings declared."""
    adapter = get_engine(engine)
    for names in option_names((DATA / help_file).read_text()):
        groups = [group for group in adapter.flag_spellings if group & set(names)]
        for group in groups:
            assert set(names) <= group, (names, sorted(group))


@pytest.mark.parametrize("engine", engine_names())
def test_the_file_records_what_it_serves(tmp_path: Path, engine: str) -> None:
    """smoke, tune and bench read threads, GPU layers, /metrics and tool calls from x-moe-stack, never
    from an engine's flags: the record follows the command the adapter wrote."""
    adapter = get_engine(engine)
    for metrics in (True, False):
        try:
            document = compose_dict(StackSpec(**{**_base(tmp_path, engine), "metrics": metrics}), "x")
        except StackError:
            assert not metrics and "metrics" not in adapter.honours
            continue
        served = document["x-moe-stack"]["serves"]["engine"]
        command = document["services"]["engine"]["command"]
        assert served["threads"] == 4 and served["gpu-layers"] is None
        assert (
            served["metrics"]
            == (adapter.metrics_flag in command)
            == (metrics and adapter.metrics_flag is not None)
        )
        assert served["tool-calls"] == (
            adapter.tool_calls_flag is not None and adapter.tool_calls_flag in command
        )


def test_each_neutral_option_is_declared_once() -> None:
    """Its type, default and limits live in NeutralOptions alone: EngineOptions (presets, the command
    line) and StackSpec inherit them, so a limit can't hold on one and not the other."""
    declared: dict[str, list[str]] = {}
    for module in (spec, base):
        for node in ast.parse(Path(module.__file__).read_text()).body:
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        declared.setdefault(item.target.id, []).append(node.name)
    for name in spec.NeutralOptions.model_fields:
        assert declared[name] == ["NeutralOptions"], (name, declared[name])
        assert repr(base.StackSpec.model_fields[name]) == repr(spec.EngineOptions.model_fields[name]), name


def test_compose_takes_each_neutral_option_from_its_declaration() -> None:
    """The compose verb declares none of them itself: each typer option is made from NeutralOptions'
    field (its spellings and help), in one help panel; a value is checked by the field's limits."""
    tree = ast.parse(Path(cli_stack.__file__).read_text())
    verb = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "compose")
    written = {arg.arg for arg in (*verb.args.args, *verb.args.kwonlyargs)}
    by_hand = written & set(spec.NeutralOptions.model_fields)
    assert not by_hand, by_hand
    command = typer.main.get_command(app).commands["compose"]  # type: ignore[attr-defined]
    params = {param.name: param for param in command.params}
    for name, field in spec.NeutralOptions.model_fields.items():
        param = params[name]
        extra = field.json_schema_extra
        assert isinstance(extra, dict)
        spelled = tuple(flag for declared in extra["flags"] for flag in str(declared).split("/"))  # type: ignore[union-attr]
        assert (*param.opts, *param.secondary_opts) == spelled, name
        assert param.help == field.description and param.default is None, name
        readers = [engine for engine in engine_names() if name in get_engine(engine).honours]
        # one engine's own option in its engine's panel, the others together
        panel = f"{readers[0]} options (the preset's unless given)" if len(readers) == 1 else PANEL
        assert getattr(param, "rich_help_panel", None) == panel, name
    assert getattr(params["mla"], "rich_help_panel", None).startswith("ik_llama.cpp options")


def test_every_spelling_an_error_names_is_an_option_of_compose() -> None:
    command = typer.main.get_command(app).commands["compose"]  # type: ignore[attr-defined]
    options = {name for param in command.params for name in (*param.opts, *param.secondary_opts)}
    for name, spelling in ENGINE_OPTIONS.items():
        flags = re.findall(r"--[a-z][a-z-]*", spelling)
        assert name == "extra_args" or flags, name
        assert set(flags) <= options, (name, set(flags) - options)


def test_kv_cache_types_are_each_engines_own_and_k_and_v_may_differ(tmp_path: Path) -> None:
    """ik_llama.cpp's q6_0 and q8_KV are written for it and refused for mainline in one line naming the
    types mainline takes; K and V get their own types."""
    ik = StackSpec(**{**_base(tmp_path, "ik_llama.cpp"), "cache_type": "q8_KV", "cache_type_v": "q6_0"})
    args = get_engine("ik_llama.cpp").server_args(ik, None)
    assert (
        args[args.index("--cache-type-k") + 1] == "q8_KV" and args[args.index("--cache-type-v") + 1] == "q6_0"
    )
    mainline = StackSpec(**{**_base(tmp_path, "llama.cpp"), "cache_type": "q8_0", "cache_type_v": "q6_0"})
    with pytest.raises(
        StackError, match="llama.cpp has no KV cache type q6_0; it takes bf16, f16, f32, iq4_nl"
    ):
        get_engine("llama.cpp").server_args(mainline, None)
    only_v = StackSpec(**{**_base(tmp_path, "llama.cpp"), "cache_type_v": "q8_0"})
    args = get_engine("llama.cpp").server_args(only_v, None)
    assert "--cache-type-k" not in args and args[args.index("--cache-type-v") + 1] == "q8_0"


@pytest.mark.parametrize("engine", ["llama.cpp", "ik_llama.cpp"])
def test_a_quantized_v_cache_without_flash_attention_is_refused(tmp_path: Path, engine: str) -> None:
    """ik_llama.cpp 007d640 threw at start on the H200 for the Qwen3 preset with -fa off ("Quantized V
    cache cannot be used without flash attention"); mainline fails the same way on `off`. An f16 V cache,
    or flash attention on or auto, is written as asked."""
    adapter = get_engine(engine)
    refused = StackSpec(**{**_base(tmp_path, engine), "cache_type": "q8_0", "flash_attention": "off"})
    with pytest.raises(StackError, match="--flash-attention off with a q8_0 V cache.*--cache-type-v f16"):
        adapter.server_args(refused, None)
    for changes in ({"cache_type_v": "f16"}, {"flash_attention": "auto"}):
        stack = StackSpec(
            **{**_base(tmp_path, engine), "cache_type": "q8_0", "flash_attention": "off", **changes}
        )
        args = adapter.server_args(stack, None)
        assert args[args.index("--cache-type-k") + 1] == "q8_0"
