"""The reasoning options (spec.NeutralOptions: thinking, reasoning_budget, reasoning_effort,
reasoning_format) in each llama.cpp engine's syntax, as their pinned servers read them:

- mainline (common/arg.cpp at 0c1e57098): `--reasoning on|off|auto` sets the template's enable_thinking;
  `--reasoning-budget N` ends thinking after N tokens (a sampler forces the template's end-of-thinking
  tag, so it holds for templates without a switch too: R1, gpt-oss); `--reasoning-effort LEVEL` hands
  `reasoning_effort` to the template.
- ik_llama.cpp (55d3c05): no --reasoning; thinking is on unless `--reasoning-budget 0`, its only other
  value -1 (examples/server/server-context.cpp: enable_thinking = jinja && budget != 0 && the template
  has a switch); no --reasoning-effort: `--chat-template-kwargs` hands the template any variable
  (common/chat.cpp's extra_context), gpt-oss's `reasoning_effort` among them.

Both merge repeated --chat-template-kwargs key by key, and a request's own chat_template_kwargs win over
the server's, as a request's sampling values do. SGLang (KTransformers) switches thinking per request only.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Protocol

from builder.errors import StackError
from builder.platform.flags import required_flag

if TYPE_CHECKING:  # the adapters call in here: no import back at run time
    from builder.engines.base import StackSpec


class Reasoner(Protocol):
    """What these rules read of an engine (the llama.cpp adapters)."""

    name: str
    reasoning_flags: bool  # its current syntax has mainline's --reasoning and --reasoning-effort
    thinking_token_budget: bool  # its --reasoning-budget N > 0 ends thinking after N tokens

    def renders_jinja(self, stack: StackSpec) -> bool: ...


TEMPLATE_KWARGS = "--chat-template-kwargs"
# Where a build has no --reasoning, --reasoning-budget is the switch (ik_llama.cpp; mainline before it):
# -1 thinks, 0 doesn't; auto leaves the template's default.
_SWITCH_BUDGETS = {"on": -1, "off": 0}


def reasoning_args(engine: Reasoner, stack: StackSpec, flags: dict[str, str] | None) -> list[str]:
    """The server arguments for `stack`'s reasoning options, in the syntax of `engine`'s build."""
    _check_template(engine, stack)
    args: list[str] = []
    budget, budget_option = stack.reasoning_budget, "--reasoning-budget"
    if stack.thinking is not None:
        if _current(engine, flags, "--reasoning"):
            args += ["--reasoning", stack.thinking]
        elif budget is None:  # the options' validator keeps a given budget consistent with thinking
            budget, budget_option = _SWITCH_BUDGETS.get(stack.thinking), "--thinking"
    if budget is not None:
        args += budget_args(engine, budget, budget_option, flags)
    if stack.reasoning_effort is not None:
        args += effort_args(engine, stack.reasoning_effort, flags)
    if stack.reasoning_format is not None:
        spelled = required_flag(flags, "--reasoning-format", engine.name, "--reasoning-format")
        args += [spelled, stack.reasoning_format]
    return args


def budget_args(engine: Reasoner, budget: int, option: str, flags: dict[str, str] | None) -> list[str]:
    """`--reasoning-budget N`: a token count where the engine cuts thinking off, else -1 or 0."""
    if budget > 0 and not engine.thinking_token_budget:
        raise StackError(
            f"{engine.name}'s --reasoning-budget is a switch, -1 (think) or 0 (don't), not a token count "
            f"({budget}): drop it or give --thinking off, or serve with mainline llama.cpp, whose budget "
            "ends thinking after N tokens"
        )
    return [required_flag(flags, "--reasoning-budget", engine.name, option), str(budget)]


def effort_args(engine: Reasoner, effort: str, flags: dict[str, str] | None) -> list[str]:
    """`--reasoning-effort LEVEL` where the build has it, else the template's kwarg itself."""
    if _current(engine, flags, "--reasoning-effort"):
        return ["--reasoning-effort", effort]
    kwargs = json.dumps({"reasoning_effort": effort}, separators=(",", ":"))
    return [required_flag(flags, TEMPLATE_KWARGS, engine.name, "--reasoning-effort"), kwargs]


def _check_template(engine: Reasoner, stack: StackSpec) -> None:
    """Thinking, its budget and effort reach the model through its Jinja template: neither engine
    switches them on its other path (a built-in template's name, --no-jinja)."""
    given = [
        flag
        for flag, value in (
            ("--thinking", stack.thinking),
            ("--reasoning-budget", stack.reasoning_budget),
            ("--reasoning-effort", stack.reasoning_effort),
        )
        if value is not None
    ]
    if given and not engine.renders_jinja(stack):
        them = "it" if len(given) == 1 else "them"
        raise StackError(
            f"{', '.join(given)}: the model gets {them} through its Jinja chat template, which this stack "
            f"turns off (--no-jinja, or a built-in --chat-template name): drop {them}, or keep the template"
        )


def _current(engine: Reasoner, flags: dict[str, str] | None, flag: str) -> bool:
    """Whether the build has mainline's `flag` (--reasoning, --reasoning-effort): its contract says, else
    the adapter's current syntax does."""
    return engine.reasoning_flags if flags is None else flag in flags
