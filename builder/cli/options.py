"""Typer options made from their one declaration (a pydantic field: type, default, spellings, help): the
engine's neutral options (spec.NeutralOptions) and the stack's own (stacks/options.py). A verb takes a
whole group in place of its `**given` (compose), or one option by its parameter's name with its own
default or help (`port: int = declared()`)."""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import typer
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from builder.engines import Engine, adapters, engine_names, get_engine
from builder.spec import EngineOptions, NeutralOptions
from builder.stacks.options import StackCommandLine, StackFileOptions

PANEL = "Engine options (the preset's unless given)"
Verb = TypeVar("Verb", bound=Callable[..., None])
# Where `declared()` looks an option up by name, in this order.
DECLARATIONS: tuple[type[BaseModel], ...] = (StackCommandLine, StackFileOptions, NeutralOptions)


def command_line_type(annotation: Any) -> type:
    """The type typer parses a neutral option as: its int, float or bool (None aside), else text that the
    declaration then validates (the Literal choices: cache types, on/off/auto)."""
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    args = typing.get_args(annotation) if union else ()
    for candidate in (*args, annotation):
        if candidate in (bool, int, float):
            return candidate
    return str


def panel_for(name: str) -> str:
    """The help panel of a neutral option: the shared one, or its engine's where only one engine reads it
    (ik_llama.cpp's MLA, KTransformers' parsers), so `compose --help` groups single-engine options."""
    readers = [engine.name for engine in adapters() if name in engine.honours]
    return f"{readers[0]} options (the preset's unless given)" if len(readers) == 1 else PANEL


def engine_named(value: str | Engine) -> Engine:
    """`--engine NAME` read as its adapter (a verb that takes `engine: Engine` gets the adapter); an
    unknown name is a SpecError, one line and exit 1 as everywhere else."""
    return value if isinstance(value, Engine) else get_engine(value)


def _typer_info(
    field: FieldInfo,
    help: str | None = None,
    panel: str | None = None,
    parser: Callable[..., Any] | None = None,
) -> Any:
    """The typer Option (or Argument) a field declares: its spellings and help (an engine's: the engines
    named, from the registry)."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    text, metavar = help if help is not None else field.description, None
    if parser is engine_named:
        text, metavar = f"{text}: one of {', '.join(engine_names())}", "<name>"
    if extra.get("argument"):
        return typer.Argument(help=text)
    flags = [str(flag) for flag in extra["flags"]]  # type: ignore[union-attr]
    return typer.Option(*flags, help=text, rich_help_panel=panel, parser=parser, metavar=metavar)


def _as_typed(field: FieldInfo) -> tuple[Any, Any]:
    """The type typer parses a stack option as, and its default: a choice as text, a list as the option
    repeated (`str` items) or as comma-separated text, each validated by the declaration."""
    origin = typing.get_origin(field.annotation)
    if origin is typing.Literal:
        return str, field.default
    if origin is tuple:
        repeated = typing.get_args(field.annotation) == (str, ...)
        return (list[str] if repeated else str) | None, None
    return field.annotation, inspect.Parameter.empty if field.default is PydanticUndefined else field.default


def _group_parameter(group: type[BaseModel], name: str, field: FieldInfo) -> inspect.Parameter:
    """A group's field as a keyword parameter: a neutral option is None unless given (the preset's
    value stands), in its panel; a stack option as typer parses it (`_as_typed`)."""
    if group is NeutralOptions:
        annotation: Any = Annotated[
            command_line_type(field.annotation) | None, _typer_info(field, None, panel_for(name))
        ]
        default = None
    else:
        typed, default = _as_typed(field)
        annotation = Annotated[typed, _typer_info(field, parser=engine_named if typed is Engine else None)]
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


@dataclass(frozen=True)
class _Declared:
    default: Any
    help: str | None


def declared(default: Any = PydanticUndefined, *, help: str | None = None) -> Any:
    """A verb's parameter that is the declared option of its name (its spellings; its default and help
    unless given here). The parameter's own annotation is the type typer parses."""
    return _Declared(default, help)


def _declaration(name: str) -> FieldInfo:
    for group in DECLARATIONS:
        if name in group.model_fields:
            return group.model_fields[name]
    raise LookupError(f"no option {name!r} is declared in {[group.__name__ for group in DECLARATIONS]}")


def _from_declaration(parameter: inspect.Parameter) -> inspect.Parameter:
    if not isinstance(parameter.default, _Declared):
        return parameter
    field, mine = _declaration(parameter.name), parameter.default
    default = field.default if mine.default is PydanticUndefined else mine.default
    parser = engine_named if parameter.annotation is Engine else None
    return parameter.replace(
        annotation=Annotated[parameter.annotation, _typer_info(field, mine.help, parser=parser)],
        default=default,
    )


def _help_order(group: type[BaseModel]) -> list[str]:
    """A class's options in the order its help lists them: its own, then each of its groups' in the order
    it names them."""
    own = [name for name in vars(group).get("__annotations__", {}) if name in group.model_fields]
    inherited = [name for base in group.__bases__ for name in getattr(base, "model_fields", {})]
    return list(dict.fromkeys([*own, *inherited]))


def takes_options(*groups: type[BaseModel]) -> Callable[[Verb], Verb]:
    """`verb(..., **given)` gets each group's options as typer options in place of its `**given`, after
    its own; its `declared()` parameters get theirs from the declaration of their name."""

    def decorate(verb: Verb) -> Verb:
        signature = inspect.signature(verb, eval_str=True)
        own = [
            _from_declaration(p)
            for p in signature.parameters.values()
            if p.kind is not inspect.Parameter.VAR_KEYWORD
        ]
        positional = [p for p in own if p.kind is not inspect.Parameter.KEYWORD_ONLY]
        keyword = [p for p in own if p.kind is inspect.Parameter.KEYWORD_ONLY]
        taken = [
            _group_parameter(group, name, group.model_fields[name])
            for group in groups
            for name in _help_order(group)
        ]
        verb.__signature__ = signature.replace(parameters=[*positional, *keyword, *taken])  # type: ignore[attr-defined]
        return verb

    return decorate


def group_values(group: type[BaseModel], given: dict[str, Any]) -> dict[str, Any]:
    """The values of `group`'s options among a verb's `**given`."""
    return {name: given[name] for name in group.model_fields if name in given}


def given_options(neutral: dict[str, Any]) -> EngineOptions:
    """The EngineOptions of the neutral options given (validated by their declaration: a bad value is
    named by its flag where the CLI reports it)."""
    values = group_values(NeutralOptions, neutral)
    return EngineOptions.model_validate({k: v for k, v in values.items() if v is not None})
