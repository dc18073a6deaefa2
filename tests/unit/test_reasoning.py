"""Reasoning controls (issue 45, item 4): thinking on/off/auto, its token budget, the effort and the format
as neutral options, each written in its engine's syntax, refused in one line where the engine or the
preset's model can't do it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from builder.engines import get_engine
from builder.engines.base import StackSpec
from builder.errors import SpecError, StackError
from builder.images.recorded_contracts import recorded_contract
from builder.platform.flags import check_args, parse_contract, parse_help
from builder.spec import EngineOptions
from builder.stacks.presets import get_preset, merge_options
from tests.specs import compose_dict, routed_stacks

DATA = Path(__file__).parent / "data"
MAINLINE = parse_help((DATA / "llama.cpp-0c1e57098-help.txt").read_text())
IK = parse_contract(
    (DATA / "ik_llama.cpp-ikpy-0.1.5-help.txt").read_text(),
    (DATA / "ik_llama.cpp-ikpy-0.1.5-parser-flags.txt").read_text(),
)
# A mainline build from before --reasoning and --reasoning-effort: its budget was the switch.
MAINLINE_OLD = {
    flag: v for flag, v in MAINLINE.items() if flag not in ("-rea", "--reasoning", "--reasoning-effort")
}
REASONING = (
    "--reasoning",
    "--reasoning-budget",
    "--reasoning-effort",
    "--reasoning-format",
    "--chat-template-kwargs",
)


def _stack(engine: str, **options: object) -> StackSpec:
    return StackSpec.model_validate(
        {
            "project_name": "p",
            "engine": engine,
            "image_ref": "i",
            "model": Path("/m/x.gguf"),
            "cpu_threads": 8,
            **options,
        }
    )


def _reasoning(engine: str, flags: dict[str, str] | None, **options: object) -> list[str]:
    """The reasoning flags (and their values) the adapter writes for `options`."""
    args = get_engine(engine).server_args(_stack(engine, **options), flags)
    return [arg for at, arg in enumerate(args) if arg in REASONING or (at and args[at - 1] in REASONING)]


@pytest.mark.parametrize("flags", [MAINLINE, None])
def test_mainline_writes_its_own_reasoning_flags(flags: dict[str, str] | None) -> None:
    for mode in ("on", "off", "auto"):
        assert _reasoning("llama.cpp", flags, thinking=mode) == ["--reasoning", mode]
    assert _reasoning("llama.cpp", flags, thinking="on", reasoning_budget=512) == [
        *("--reasoning", "on", "--reasoning-budget", "512"),
    ]
    assert _reasoning("llama.cpp", flags, reasoning_budget=0) == ["--reasoning-budget", "0"]
    assert _reasoning("llama.cpp", flags, reasoning_effort="low") == ["--reasoning-effort", "low"]
    assert _reasoning("llama.cpp", flags, reasoning_format="none") == ["--reasoning-format", "none"]
    assert _reasoning("llama.cpp", flags) == []  # nothing given: the model's and engine's defaults


@pytest.mark.parametrize("flags", [IK, None])
def test_ik_switches_thinking_with_its_budget_and_hands_the_effort_to_the_template(
    flags: dict[str, str] | None,
) -> None:
    """ik_llama.cpp has no --reasoning: thinking is on unless --reasoning-budget 0 (server-context.cpp at
    the pin); the effort goes in --chat-template-kwargs, which reach gpt-oss's template."""
    assert _reasoning("ik_llama.cpp", flags, thinking="off") == ["--reasoning-budget", "0"]
    assert _reasoning("ik_llama.cpp", flags, thinking="on") == ["--reasoning-budget", "-1"]
    assert _reasoning("ik_llama.cpp", flags, thinking="auto") == []  # the template's own default
    assert _reasoning("ik_llama.cpp", flags, thinking="off", reasoning_budget=0) == [
        "--reasoning-budget",
        "0",
    ]
    effort = _reasoning("ik_llama.cpp", flags, reasoning_effort="high")
    assert effort[0] == "--chat-template-kwargs" and json.loads(effort[1]) == {"reasoning_effort": "high"}
    assert _reasoning("ik_llama.cpp", flags, reasoning_format="deepseek") == [
        "--reasoning-format",
        "deepseek",
    ]


def test_ik_refuses_a_token_budget_naming_the_fix() -> None:
    with pytest.raises(
        StackError, match=r"^ik_llama.cpp's --reasoning-budget is a switch, -1 \(think\) or 0"
    ):
        _reasoning("ik_llama.cpp", IK, reasoning_budget=512)
    with pytest.raises(StackError, match="drop it or give --thinking off, or serve with mainline llama.cpp"):
        _reasoning("ik_llama.cpp", None, thinking="on", reasoning_budget=2048)


def test_an_older_build_gets_the_switch_it_has_and_a_missing_flag_is_named() -> None:
    assert _reasoning("llama.cpp", MAINLINE_OLD, thinking="off") == ["--reasoning-budget", "0"]
    assert _reasoning("llama.cpp", MAINLINE_OLD, reasoning_effort="medium") == [
        *("--chat-template-kwargs", '{"reasoning_effort":"medium"}'),
    ]
    bare = {
        flag: v for flag, v in IK.items() if not flag.startswith(("--reasoning", "--chat-template-kwargs"))
    }
    with pytest.raises(
        StackError, match=r"^this ik_llama.cpp build has no --reasoning-budget; drop --thinking$"
    ):
        _reasoning("ik_llama.cpp", bare, thinking="off")
    with pytest.raises(StackError, match="has no --chat-template-kwargs; drop --reasoning-effort$"):
        _reasoning("ik_llama.cpp", bare, reasoning_effort="low")
    with pytest.raises(StackError, match="has no --reasoning-format; drop --reasoning-format$"):
        _reasoning("ik_llama.cpp", bare, reasoning_format="none")


def test_the_pinned_builds_accept_what_is_written() -> None:
    """Every flag written for every option, checked against the contracts recorded from the pinned servers."""
    options = {
        "thinking": "off",
        "reasoning_budget": 0,
        "reasoning_effort": "low",
        "reasoning_format": "none",
    }
    for name in ("llama.cpp", "ik_llama.cpp"):
        adapter = get_engine(name)
        contract = recorded_contract(adapter)
        assert contract is not None
        args = adapter.server_args(_stack(name, **options), contract.flags)
        check_args(args, contract.flags, name)
        assert any(arg in args for arg in ("--reasoning", "--reasoning-budget")), args


@pytest.mark.parametrize("engine", ["llama.cpp", "ik_llama.cpp"])
def test_thinking_needs_the_jinja_template(engine: str) -> None:
    """Both engines switch thinking through the Jinja template only (`use_jinja &&` in their servers)."""
    for without in ({"jinja": False}, {"chat_template": "chatml"}):  # a built-in name turns Jinja off
        with pytest.raises(StackError, match=r"^--thinking, --reasoning-effort: the model gets them through"):
            _reasoning(engine, None, thinking="off", reasoning_effort="low", **without)
    assert _reasoning(engine, None, jinja=False, reasoning_format="none") == ["--reasoning-format", "none"]


def test_a_budget_must_agree_with_thinking() -> None:
    with pytest.raises(ValidationError, match="--thinking off with --reasoning-budget 512"):
        EngineOptions(thinking="off", reasoning_budget=512)
    with pytest.raises(ValidationError, match=r"--thinking on with --reasoning-budget 0 \(no thinking\)"):
        _stack("llama.cpp", thinking="on", reasoning_budget=0)
    with pytest.raises(ValidationError, match="greater than or equal to -1"):
        EngineOptions(reasoning_budget=-2)
    with pytest.raises(ValidationError):
        EngineOptions.model_validate({"thinking": "maybe"})
    # a preset's thinking and the command line's budget meet in the stack, checked there
    merged = EngineOptions(reasoning_budget=256).over(EngineOptions(thinking="off"))
    with pytest.raises(ValidationError, match="--thinking off with --reasoning-budget 256"):
        _stack("llama.cpp").with_options(merged)


def test_ktransformers_refuses_them_in_one_line_saying_why() -> None:
    """SGLang switches thinking per request; its contract has no server flag for it."""
    kt = get_engine("ktransformers")
    contract = recorded_contract(kt)
    assert contract is not None and not any("think" in flag for flag in contract.flags)
    stack = _stack("ktransformers", thinking="off", reasoning_effort="low", config_dir=Path("/m/hf"))
    with pytest.raises(StackError) as refused:
        kt.server_args(stack, None)
    message = str(refused.value)
    assert message.startswith("ktransformers does not read --thinking, --reasoning-effort: drop them; SGLang")
    assert message.count("per request") == 1 and "\n" not in message
    with pytest.raises(
        StackError, match="its --reasoning-parser puts a reply's thoughts in reasoning_content"
    ):
        kt.server_args(_stack("ktransformers", reasoning_format="deepseek", config_dir=Path("/m/hf")), None)
    with pytest.raises(StackError, match="parse by the chat template"):
        get_engine("llama.cpp").server_args(_stack("llama.cpp", reasoning_parser="qwen3"), None)


@pytest.mark.parametrize("preset", ["deepseek-r1-671b", "minimax-m2", "gpt-oss-120b"])
@pytest.mark.parametrize("engine", ["llama.cpp", "ik_llama.cpp"])
def test_a_model_that_always_thinks_refuses_thinking_off(preset: str, engine: str) -> None:
    adapter = get_engine(engine)
    with pytest.raises(
        SpecError, match=rf"^preset {preset}: the model always thinks \(.*\), so --thinking off"
    ):
        merge_options(preset, adapter, EngineOptions(thinking="off"))
    cap = EngineOptions(reasoning_budget=1024)
    if engine == "llama.cpp":  # mainline's budget ends thinking whatever the template: the lever it has
        assert merge_options(preset, adapter, EngineOptions(reasoning_budget=0))[0].reasoning_budget == 0
        assert merge_options(preset, adapter, cap)[0].reasoning_budget == 1024
    else:  # ik_llama.cpp's 0 only flips the template's switch, which these templates lack
        with pytest.raises(
            SpecError, match="only turns the template's switch off: drop it; mainline llama.cpp's"
        ):
            merge_options(preset, adapter, EngineOptions(reasoning_budget=0))


def test_a_model_with_a_switch_turns_off_and_one_without_thinking_refuses_on() -> None:
    for engine, written in (
        ("llama.cpp", ["--reasoning", "off"]),
        ("ik_llama.cpp", ["--reasoning-budget", "0"]),
    ):
        options, _ = merge_options("qwen3-235b-a22b", get_engine(engine), EngineOptions(thinking="off"))
        assert _reasoning(engine, None, **options.model_dump(exclude_unset=True)) == written
        merge_options("glm-4.6", get_engine(engine), EngineOptions(thinking="off"))
        with pytest.raises(
            SpecError, match=r"^preset qwen3-next-80b-a3b: the model does not think \(.*drop --thinking on$"
        ):
            merge_options("qwen3-next-80b-a3b", get_engine(engine), EngineOptions(thinking="on"))


def test_presets_keep_the_models_defaults_but_gpt_oss_shows_its_effort() -> None:
    """No preset switches thinking (each model's own default); gpt-oss writes OpenAI's default effort so
    the file shows the lever."""
    for name in ("deepseek-r1-671b", "qwen3-235b-a22b", "qwen3-next-80b-a3b", "glm-4.6", "minimax-m2"):
        for engine in get_preset(name).engines:
            options = get_preset(name).engine_options(get_engine(engine))
            assert (options.thinking, options.reasoning_budget, options.reasoning_effort) == (
                None,
                None,
                None,
            )
    gpt_oss = get_preset("gpt-oss-120b")
    assert _reasoning(
        "llama.cpp", None, **gpt_oss.engine_options(get_engine("llama.cpp")).model_dump(exclude_unset=True)
    ) == ["--reasoning-effort", "medium"]


def test_a_users_template_kwargs_add_to_the_stacks(tmp_path: Path) -> None:
    """ik_llama.cpp writes the effort as --chat-template-kwargs; an extra one (GLM's clear_thinking, say)
    merges with it key by key in the server, so it is not refused as a repeated flag."""
    tmp_path.chmod(0o755)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    model.chmod(0o644)
    extra = ("--chat-template-kwargs", '{"clear_thinking": false}')
    stack = StackSpec(
        project_name="p",
        engine="ik_llama.cpp",
        image_ref="img:1",
        model=model,
        cpu_threads=4,
        reasoning_effort="low",
        extra_args=extra,
    )
    command = compose_dict(stack, "x")["services"]["engine"]["command"]
    assert command.count("--chat-template-kwargs") == 2 and tuple(command[-2:]) == extra
    with pytest.raises(StackError, match=r"repeat flags the stack sets itself \(--reasoning-budget\)"):
        compose_dict(stack.model_copy(update={"extra_args": ("--reasoning-budget", "0")}), "x")


def test_the_routers_preset_keeps_a_budget_of_minus_one(tmp_path: Path) -> None:
    """Without a contract the router's preset told a flag's value by its dash: `-1` is a value."""
    first, second = routed_stacks(tmp_path)
    first = first.model_copy(update={"reasoning_budget": -1, "thinking": "on"})
    second = second.model_copy(update={"thinking": "off", "reasoning_effort": "low"})
    _, preset = get_engine("llama.cpp").router_command(first, (first, second), None)
    sections = preset.split("\n\n")
    assert "reasoning = on\nreasoning-budget = -1" in sections[1]
    assert "reasoning = off\nreasoning-effort = low" in sections[2]
