"""The neutral engine options on the command line, made from their one declaration (spec.NeutralOptions:
type, limits, spellings, help): a verb that takes them gets one typer option per field, each None unless
given, and reads them back as the EngineOptions the user set."""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer

from builder.engines import engine_names, get_engine
from builder.spec import EngineOptions, NeutralOptions, option_flags

PANEL = "Engine options (the preset's unless given)"
Verb = TypeVar("Verb", bound=Callable[..., None])


def command_line_type(annotation: Any) -> type:
    """The type typer parses a field as: its int, float or bool (None aside), else text that the
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
    readers = [engine for engine in engine_names() if name in get_engine(engine).honours]
    return f"{readers[0]} options (the preset's unless given)" if len(readers) == 1 else PANEL


def neutral_parameters() -> list[inspect.Parameter]:
    """One keyword parameter per neutral option, None by default (not given)."""
    parameters = []
    for name, field in NeutralOptions.model_fields.items():
        kind = command_line_type(field.annotation)
        declared = typer.Option(*option_flags(name), help=field.description, rich_help_panel=panel_for(name))
        parameters.append(
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                default=None,
                annotation=Annotated[kind | None, declared],
            )
        )
    return parameters


def takes_neutral_options(verb: Verb) -> Verb:
    """`verb(..., **neutral)` gets the neutral options as typer options in place of its `**neutral`."""
    signature = inspect.signature(verb, eval_str=True)
    own = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    positional = [p for p in own if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    keyword = [p for p in own if p.kind is inspect.Parameter.KEYWORD_ONLY]
    verb.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*positional, *keyword, *neutral_parameters()]
    )
    return verb


def given_options(neutral: dict[str, Any]) -> EngineOptions:
    """The EngineOptions of the neutral options given (validated by their declaration: a bad value is
    named by its flag where the CLI reports it)."""
    return EngineOptions.model_validate({k: v for k, v in neutral.items() if v is not None})
