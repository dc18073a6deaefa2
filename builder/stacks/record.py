"""x-moe-stack, the stack file's record of itself: one typed model, written and read here.

`compose` (stacks/document.py) and `load` (distribute/loaded_stack.py) write a StackRecord; smoke, tune,
bench, up and bundle read one back with `read_record`, never an engine's flags. In the file every `$`
is doubled for compose (document.literal); the record holds the values as meant.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from builder import __version__
from builder.errors import StackError
from builder.stacks.escaping import meant as unescaped


@dataclass(frozen=True)
class Served:
    """What one engine service serves."""

    threads: int
    gpu_layers: int | None
    metrics: bool  # its /metrics endpoint is on
    tool_calls: bool  # chat is rendered with the model's own (Jinja) template, which tool calls need

    def as_dict(self) -> dict[str, object]:
        return {
            "threads": self.threads,
            "gpu-layers": self.gpu_layers,
            "metrics": self.metrics,
            "tool-calls": self.tool_calls,
        }


@dataclass(frozen=True)
class StackRecord:
    generated_by: str  # the command that made the file
    engine: str
    image: str
    model: Path  # the model's first (or only) file on the host
    served_name: str | None
    engine_options: dict[str, object]  # the neutral options set (preset or command line)
    flags_checked: bool  # emitted against the image's flag contract
    serves: dict[str, Served] = field(default_factory=dict)  # by service name
    models: tuple[str, ...] = ()  # a router's models, by served name
    cpu_weights_pinned: bool = False  # the engine keeps the CPU weights in page-locked memory
    profiles: tuple[str, ...] = ()  # the compose profiles of a file with a GPU and a CPU service
    loaded_from: str | None = None  # the bundle `load` made it from, and how it was verified
    generator: str = f"moe-stack {__version__}"

    def as_dict(self) -> dict[str, object]:
        """The record as the file holds it (before compose's `$` escaping)."""
        return {
            "generator": self.generator,
            "generated-by": self.generated_by,
            **({"loaded-from": self.loaded_from} if self.loaded_from is not None else {}),
            "engine": self.engine,
            "image": self.image,
            "model": str(self.model),
            "served-name": self.served_name,
            **({"models": list(self.models)} if self.models else {}),
            "engine-options": dict(self.engine_options),
            "flags-checked": self.flags_checked,
            **({"cpu-weights": "pinned"} if self.cpu_weights_pinned else {}),
            **({"profiles": list(self.profiles)} if self.profiles else {}),
            "serves": {name: served.as_dict() for name, served in self.serves.items()},
        }


def read_record(document: object, source: Path | str = "the stack file") -> StackRecord:
    """The record of a stack file moe-stack wrote; StackError (one line, naming `source`) when it has
    none or one this moe-stack can't read."""
    raw = document.get("x-moe-stack") if isinstance(document, dict) else None
    if (
        not isinstance(raw, dict)
        or not isinstance(raw.get("engine"), str)
        or not isinstance(raw.get("model"), str)
    ):
        raise StackError(
            f"{source} was not emitted by moe-stack (no x-moe-stack record); emit it with `moe-stack compose`"
        )
    meant = {key: unescaped(value) for key, value in raw.items()}
    given = meant.get("serves")
    served: dict = given if isinstance(given, dict) else {}
    return StackRecord(
        generated_by=str(meant.get("generated-by", "")),
        engine=str(meant["engine"]),
        image=str(meant.get("image", "")),
        model=Path(str(meant["model"])),
        served_name=str(meant["served-name"]) if meant.get("served-name") is not None else None,
        engine_options=dict(meant["engine-options"]) if isinstance(meant.get("engine-options"), dict) else {},
        flags_checked=meant.get("flags-checked") is True,
        serves={str(name): _served(facts, source) for name, facts in served.items()},
        models=tuple(map(str, meant["models"])) if isinstance(meant.get("models"), list) else (),
        cpu_weights_pinned=meant.get("cpu-weights") == "pinned",
        profiles=tuple(map(str, meant["profiles"])) if isinstance(meant.get("profiles"), list) else (),
        loaded_from=str(meant["loaded-from"]) if meant.get("loaded-from") is not None else None,
        generator=str(meant.get("generator", "")),
    )


def _served(facts: object, source: Path | str) -> Served:
    values = facts if isinstance(facts, dict) else {}
    threads, layers = values.get("threads"), values.get("gpu-layers")
    if type(threads) is not int or not (layers is None or type(layers) is int):
        raise StackError(
            f"{source}: x-moe-stack.serves is not threads, gpu-layers, metrics and tool-calls; emit it "
            "again with `moe-stack compose`"
        )
    return Served(
        threads=threads,
        gpu_layers=layers,
        metrics=values.get("metrics") is True,
        tool_calls=values.get("tool-calls") is True,
    )
