"""x-moe-stack, the stack file's record of itself: one typed model (stackfile/stack_file.py holds it).

`compose` (stacks/document.py) and `load` (distribute/loaded_stack.py) write a Record; smoke, tune,
bench, up and bundle read it from `StackFile.read`, never from an engine's flags. The record holds the
values as meant (compose's `$` doubling is the file's, done in StackFile.to_yaml and undone in read).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import (
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    model_serializer,
)

from builder import __version__
from builder.engines import EngineField
from builder.spec import Strict

Scalar = StrictStr | StrictBool | StrictInt | StrictFloat
# An engine option as recorded: a plain value, or a list of them (override rules, a tensor split).
OptionValue = Scalar | list[Scalar]


def _kebab(name: str) -> str:
    return name.replace("_", "-")


class _Kebab(Strict):
    """The file's own keys (`gpu-layers`), set here by field name; nothing else is read."""

    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=_kebab, populate_by_name=True)


class Served(_Kebab):
    """What one engine service serves, for the readers of the file (smoke, tune, bench) that must not
    parse an engine's flags."""

    threads: StrictInt
    gpu_layers: StrictInt | None
    metrics: StrictBool  # its /metrics endpoint is on
    tool_calls: StrictBool  # chat is rendered with the model's own (Jinja) template, which tool calls need
    images: StrictBool = False  # chat reads images: the model's vision projector is loaded (--mmproj)

    @model_serializer(mode="wrap")
    def _as_written(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        """`images` written where it is on: the files of stacks without a projector stay as they were."""
        dumped: dict[str, object] = handler(self)
        return {key: value for key, value in dumped.items() if key != "images" or value}


class Rates(_Kebab):
    """Tokens per second of prefill and decode."""

    prefill: StrictFloat
    decode: StrictFloat


class Ratios(_Kebab):
    """Tuned over stack, of prefill and decode: "ratio (low-high)"."""

    prefill: StrictStr
    decode: StrictStr


class Bound(_Kebab):
    """Decode's ceiling: the read bandwidth over the bytes read per token, and how near decode got."""

    read_gbps: StrictFloat  # the best round: the bound
    read_median_gbps: StrictFloat | None = None  # the rounds' spread (moe-stack-bandwidth since 2026-12-03)
    read_min_gbps: StrictFloat | None = None
    bytes_per_token: StrictInt
    weights_read: StrictStr
    bound_tps: StrictFloat
    decode_over_bound: StrictFloat | None


class Tuning(_Kebab):
    """x-moe-stack.tuned: where and when `tune` ran, the settings that won, what they gained."""

    host: StrictStr
    date: StrictStr
    by: StrictStr  # the command
    objective: StrictStr
    settings: dict[str, StrictStr]
    changed: dict[str, StrictStr]  # setting: "stack's -> tuned"
    trials: StrictInt
    seconds: StrictInt
    prompt_tokens: StrictInt | None = None  # the prefill test's length (files of earlier tunes lack it)
    stack_tps: Rates
    tuned_tps: Rates
    tuned_over_stack: Ratios
    left_out: tuple[StrictStr, ...]
    not_confirmed: dict[str, StrictStr]
    failed: dict[str, StrictStr]
    bound: Bound | None = None  # with a measured bandwidth

    @model_serializer(mode="wrap")
    def _as_written(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        dumped: dict[str, object] = handler(self)
        return {key: value for key, value in dumped.items() if key != "bound" or value is not None}


# Keys the file leaves out when they hold nothing (served-name stays, as null).
_LEFT_OUT_EMPTY = ("loaded-from", "derived", "models", "cpu-weights", "profiles", "tuned")


class Record(_Kebab):
    """x-moe-stack, its keys in the file's order."""

    model_config = ConfigDict(arbitrary_types_allowed=True)  # the engine's adapter (EngineField)

    generator: StrictStr = f"moe-stack {__version__}"
    generated_by: StrictStr  # the command that made the file
    loaded_from: StrictStr | None = None  # the bundle `load` made it from, and how it was verified
    engine: EngineField
    image: StrictStr
    model: Path  # the model's first (or only) file on the host
    served_name: StrictStr | None
    models: tuple[StrictStr, ...] = ()  # a router's models, by served name
    engine_options: dict[str, OptionValue]  # the neutral options set (preset or command line)
    derived: StrictStr | None = None  # no preset: what the model's facts gave (stacks/derived.py)
    flags_checked: StrictBool  # emitted against the image's flag contract
    cpu_weights: Literal["pinned"] | None = None  # the engine keeps the CPU weights in page-locked memory
    profiles: tuple[StrictStr, ...] = ()  # the compose profiles of a file with a GPU and a CPU service
    serves: dict[str, Served] = Field(default_factory=dict)  # by service name
    # compose-lint rule ID: why this stack departs from it
    lint_exceptions: dict[str, str] = Field(default_factory=dict)
    tuned: Tuning | None = None  # what `tune` found (tuning/tune_stack.py)

    @model_serializer(mode="wrap")
    def _as_written(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        dumped: dict[str, object] = handler(self)
        return {key: value for key, value in dumped.items() if key not in _LEFT_OUT_EMPTY or value}
