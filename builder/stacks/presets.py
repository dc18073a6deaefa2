"""Model presets (compose/presets.yaml): the seed's models as neutral stack options, and the example
stacks emitted from them into compose/ (an EPYC 9374F, 32 Zen 4 cores with SMT, + one RTX 4090/5090)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from builder.engines import Engine, adapters, engine_names
from builder.engines.base import ImageSpec, StackSpec
from builder.errors import SpecError
from builder.images.matrix import published_image
from builder.images.naming import image_tag, short_ref
from builder.images.recorded_contracts import recorded_contract
from builder.models.opened import OpenedModel
from builder.models.synth_catalog import synth_shape
from builder.models.synth_shapes import MoeShape
from builder.platform.toolchain import MIN_DRIVER
from builder.spec import EXPERTS_ON_CPU_RULE, EngineOptions
from builder.stacks.compose import compose_stack
from builder.stacks.document import cpu_only, start_period_for
from builder.untrusted_text import CONTROL, UnreadableYaml, read_yaml

# A presets file of the user's own (the packaged one's schema), merged over the packaged presets: by
# `compose --presets FILE`, else this variable.
PRESETS_ENV = "MOE_STACK_PRESETS"
# A preset's keys that describe its model rather than set a stack option.
_DESCRIPTIVE = (
    "description", "architecture", "example_model", "example_size_gb", "example_shape", "engines",
    "unsupported", "always_thinks", "never_thinks"
)  # fmt: skip
# C0 (ESC, so every terminal sequence, included) but tab and newline, DEL and C1: `presets` prints a
# preset's text, and a presets file is data, never terminal commands (a title, a cleared screen, a
# clipboard write). A chat template (Jinja) spans lines, so newlines and tabs stay.


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    architecture: str  # the GGUF architecture of the preset's model (general.architecture)
    example_model: str
    example_size_gb: int
    options: dict[str, object]  # neutral engine options common to all engines, and experts_on_cpu
    engines: dict[str, dict[str, object]]  # per-engine additions (ik_llama.cpp's fused MoE, MLA)
    source: Path  # the file it came from (the last one that set a key of it)
    # Engines that can't serve the preset's model, each with the reason (said when one is asked for).
    unsupported: dict[str, str] = field(default_factory=dict)
    # The example model's widths where they differ from its architecture's full-size synth shape
    # (Kimi-K2 is deepseek2 with 384 experts and 64 heads): what the card table plans.
    example_shape: dict[str, int] = field(default_factory=dict)
    # Why its model thinks whatever a switch says (its template has none), or never does ("": it has the
    # template's switch): --thinking off, or on, is then refused, never silently ignored.
    always_thinks: str = ""
    never_thinks: str = ""

    def model_shape(self, quant: str = "Q4_0") -> MoeShape:
        """The full-size shape of the preset's example model (its architecture's, with its own widths)."""
        return synth_shape(self.architecture, False, quant=quant, **self.example_shape)

    def _check_engine(self, engine: Engine) -> None:
        if engine.name in self.unsupported:
            raise SpecError(
                f"preset {self.name}: {engine} can't serve it ({self.unsupported[engine.name]}); use "
                f"--engine {' or '.join(self.engines)}"
            )
        if engine.name not in self.engines:
            raise SpecError(
                f"preset {self.name} has no settings for {engine}; it has {', '.join(self.engines)}"
            )

    def engine_options(self, engine: Engine) -> EngineOptions:
        """The engine options for `engine` (its entry may null a common one); SpecError if the preset
        has no such engine."""
        self._check_engine(engine)
        return _engine_options(self.name, self.options, self.engines[engine.name], engine, self.source)

    def check_thinking(self, options: EngineOptions, engine: Engine) -> None:
        """SpecError where `options` ask the model to stop thinking when it can't, or to think when it
        doesn't (its template has no switch: a silent no-op, or thoughts the parser then misses)."""
        where = "" if engine.thinking_token_budget else "mainline llama.cpp's "
        cap = f"{where}--reasoning-budget N caps it"
        if self.always_thinks and options.thinking == "off":
            raise SpecError(
                f"preset {self.name}: the model always thinks ({self.always_thinks}), so --thinking off "
                f"can't stop it: drop it; {cap}"
            )
        if self.always_thinks and options.reasoning_budget == 0 and not engine.thinking_token_budget:
            raise SpecError(
                f"preset {self.name}: the model always thinks ({self.always_thinks}), and {engine}'s "
                f"--reasoning-budget 0 only turns the template's switch off: drop it; {cap}"
            )
        if self.never_thinks and options.thinking == "on":
            raise SpecError(
                f"preset {self.name}: the model does not think ({self.never_thinks}): drop --thinking on"
            )

    def override_rules(self, engine: Engine) -> tuple[str, ...]:
        """The preset's -ot rules for `engine`: all routed experts on the CPU, where it takes rules."""
        self._check_engine(engine)
        wanted = bool(self.options.get("experts_on_cpu")) and engine.takes_override_rules
        return (EXPERTS_ON_CPU_RULE,) if wanted else ()


def merge_options(
    preset: str, engine: Engine, given: EngineOptions, user_file: Path | None = None
) -> tuple[EngineOptions, tuple[str, ...]]:
    """The engine options: the preset's for `engine`, overridden by those `given` (the fields set in
    it); and the preset's -ot rules, kept apart so a VRAM plan can replace them."""
    chosen = get_preset(preset, user_file)
    options = given.over(chosen.engine_options(engine))
    chosen.check_thinking(options, engine)
    return options, chosen.override_rules(engine)


def check_model_architecture(preset: str, arch: str, model: Path, user_file: Path | None = None) -> None:
    """SpecError when `model` (of architecture `arch`) is not a model the preset is made for."""
    presets = load_presets(user_file)
    wanted = get_preset(preset, user_file).architecture
    if arch != wanted:
        fitting = [p.name for p in presets.values() if p.architecture == arch]
        raise SpecError(
            f"preset {preset} is for {wanted} models and {model.name} is {arch}: drop --preset, or pick "
            f"the preset of a {arch} model ({', '.join(fitting) or 'no preset has one'})"
        )


def presets_file() -> Path:
    """The packaged presets (compose/presets.yaml in a checkout)."""
    packaged = Path(str(resources.files("builder"))) / "presets.yaml"
    return (
        packaged if packaged.is_file() else Path(__file__).resolve().parents[2] / "compose" / "presets.yaml"
    )


def user_presets_file(given: Path | None) -> Path | None:
    """The user's presets file: `given`, else $MOE_STACK_PRESETS, else none."""
    if given is not None:
        return given
    named = os.environ.get(PRESETS_ENV)
    return Path(named) if named else None


def load_presets(user_file: Path | None = None) -> dict[str, Preset]:
    """The packaged presets with the user's file (or $MOE_STACK_PRESETS) merged over them: a preset of
    a new name is added whole, one of a packaged name changes the keys it gives (`engines` per engine).
    Every entry is checked as the packaged ones are; SpecError names the file, the preset and the key."""
    entries = {name: (entry, presets_file()) for name, entry in _read(presets_file()).items()}
    chosen = user_presets_file(user_file)
    if chosen is not None:
        for name, entry in _read(chosen).items():
            base = entries.get(name, ({}, chosen))[0]
            engines = dict(base.get("engines") or {})
            for engine, extra in (entry.get("engines") or {}).items():
                known = engines.get(engine)
                if isinstance(known, dict) and isinstance(extra, dict):
                    extra = {**known, **extra}
                engines[engine] = extra
            entries[name] = ({**base, **entry, "engines": engines}, chosen)
    return {name: _preset(name, entry, source) for name, (entry, source) in entries.items()}


def get_preset(name: str, user_file: Path | None = None) -> Preset:
    presets = load_presets(user_file)
    if name not in presets:
        raise SpecError(f"unknown preset {name!r}: choose one of {', '.join(presets)}")
    return presets[name]


def _read(path: Path) -> dict[str, dict[str, Any]]:
    try:
        data = read_yaml(path)
    except UnreadableYaml as err:
        raise SpecError(f"presets file {path} {err}; fix it") from None
    if not isinstance(data, dict) or not all(isinstance(entry, dict) for entry in data.values()):
        raise SpecError(
            f"presets file {path}: each preset is a mapping of its name to its keys (see {presets_file()})"
        )
    for name in data:
        if CONTROL.search(str(name)):
            raise SpecError(
                f"presets file {path}: the preset name {str(name)!r} holds a control character; "
                "presets are plain text: remove it"
            )
    return {str(name): entry for name, entry in data.items()}


def _control_character_at(value: object, where: str) -> str | None:
    """The key path (`engines.llama.cpp.chat_template`) of the first text in `value`, key or value,
    holding a control character; None when there is none."""
    if isinstance(value, str):
        return where if CONTROL.search(value) else None
    items: list[tuple[object, object]] = []
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, list):
        items = [(str(index), item) for index, item in enumerate(value)]
    for key, item in items:
        path = f"{where}.{key}" if where else str(key)
        if CONTROL.search(str(key)):
            return f"{where}.{key!r}" if where else repr(key)
        found = _control_character_at(item, path)
        if found is not None:
            return found
    return None


def _preset(name: str, entry: dict[str, Any], source: Path) -> Preset:
    def wrong(key: str, problem: str) -> SpecError:
        return SpecError(f"presets file {source}: preset {name}: {key}: {problem}")

    hostile = _control_character_at(entry, "")
    if hostile is not None:  # before any check that would echo the text
        raise wrong(
            hostile, "holds a control character (a terminal escape, say); presets are plain text: remove it"
        )
    for key, kind in (("description", str), ("architecture", str), ("engines", dict)):
        if not isinstance(entry.get(key), kind):
            raise wrong(key, f"missing, or not a {'mapping' if kind is dict else 'text'}")
    engines = {}
    for engine, extra in entry["engines"].items():
        if engine not in engine_names():
            raise wrong(f"engines.{engine}", f"no such engine; choose of {', '.join(engine_names())}")
        if extra is not None and not isinstance(extra, dict):
            raise wrong(f"engines.{engine}", "a mapping of options (or nothing)")
        engines[str(engine)] = dict(extra or {})
    unsupported = entry.get("unsupported") or {}
    if not isinstance(unsupported, dict) or not all(isinstance(v, str) for v in unsupported.values()):
        raise wrong("unsupported", "a mapping of engine to the reason it can't serve the model")
    for engine in unsupported:
        if engine not in engine_names() or engine in engines:
            raise wrong(f"unsupported.{engine}", "an engine the preset has no settings for")
    options = {k: v for k, v in entry.items() if k not in _DESCRIPTIVE}
    if not isinstance(options.get("experts_on_cpu", False), bool):
        raise wrong("experts_on_cpu", "true or false")
    for key in ("always_thinks", "never_thinks"):
        if not isinstance(entry.get(key, ""), str):
            raise wrong(key, "why the model thinks whatever a switch says (always), or never does: a text")
    if entry.get("always_thinks") and entry.get("never_thinks"):
        raise wrong("never_thinks", "a model that always thinks can't also never think: give one of them")
    size = entry.get("example_size_gb", 0)
    if not isinstance(size, int) or size < 0:
        raise wrong("example_size_gb", "a whole number of GB")
    try:
        shape = _example_shape(entry["architecture"], entry.get("example_shape") or {})
    except ValueError as err:
        raise wrong("example_shape", str(err).split("\n")[0]) from None
    preset = Preset(
        name=name,
        description=entry["description"],
        architecture=entry["architecture"],
        example_model=str(entry.get("example_model", "")),
        example_size_gb=size,
        options=options,
        engines=engines,
        source=source,
        unsupported={str(engine): reason for engine, reason in unsupported.items()},
        always_thinks=entry.get("always_thinks", ""),
        never_thinks=entry.get("never_thinks", ""),
        example_shape=shape,
    )
    for adapter in adapters():  # every engine's options valid now, not when a stack asks for them
        if adapter.name in engines:
            preset.check_thinking(preset.engine_options(adapter), adapter)
    return preset


def _example_shape(architecture: str, given: object) -> dict[str, int]:
    """A preset's example_shape, checked to be changes the architecture's synth shape takes; ValueError
    says what is wrong."""
    if not isinstance(given, dict) or not all(type(value) is int for value in given.values()):
        raise ValueError("a mapping of a synth shape's fields (experts, heads...) to whole numbers")
    shape = {str(key): value for key, value in given.items()}
    if shape:
        known = {f.name for f in fields(synth_shape(architecture))}
        if set(shape) - known:
            raise ValueError(f"no field {min(set(shape) - known)}; a shape has {', '.join(sorted(known))}")
        synth_shape(architecture, False, **shape)
    return shape


def _engine_options(
    name: str, common: dict[str, object], extra: dict[str, object], engine: Engine, source: Path
) -> EngineOptions:
    """The preset's options for `engine`: the common ones it honours (a preset says what its model wants,
    the engine takes what it reads: KTransformers no cache type or layer count), then its own entry's,
    all of which it must honour (compose refuses the rest, as it refuses a user's)."""
    honoured = engine.honours
    values = {  # an option no engine has (a typo) stays, to be refused by name
        key: value
        for key, value in common.items()
        if key != "experts_on_cpu" and (key in honoured or key not in EngineOptions.model_fields)
    }
    values.update(extra)
    try:
        return EngineOptions.model_validate(values)
    except ValidationError as error:
        first = error.errors()[0]
        key = ".".join(str(part) for part in first["loc"])
        where = key if key in common else f"engines.{engine}.{key}"
        raise SpecError(f"presets file {source}: preset {name}: {where}: {first['msg']}") from None


# The example host: the seed's EPYC 9374F (32 Zen 4 cores, SMT siblings 32-63, NPS=1) and one RTX 4090
# or 5090; each engine's published (built) image for it: zen4, else portable (KTransformers), of the
# newest CUDA release published for that engine.
EXAMPLE_CPUS = ("zen4", "portable")
EXAMPLE_THREADS = 32
EXAMPLE_CPUSET = "0-31"


def example_stacks() -> dict[str, str]:
    """compose/<preset>.<engine>.yaml text for every preset and engine (what the test keeps current)."""
    files = {}
    for preset in load_presets().values():
        for adapter in adapters():
            if adapter.name not in preset.engines:
                continue
            gpu_image = published_image(adapter, EXAMPLE_CPUS, gpu=True)
            if gpu_image is not None:  # else nothing built to name (ktransformers-legacy)
                files[f"{preset.name}.{adapter.name}.yaml"] = _example_stack(preset, adapter, gpu_image)
    return files


def _example_stack(preset: Preset, adapter: Engine, gpu_image: ImageSpec) -> str:
    """The example host's GPU stack of `preset` on `adapter`, with a CPU-only profile where the engine
    serves on the CPU, checked against the engine's recorded flags."""
    engine = adapter.name
    image = image_tag(gpu_image)
    stack = StackSpec(
        project_name=f"{preset.name}-{engine}".replace(".", "-").replace("_", "-"),
        engine=adapter,
        image_ref=image,
        model=OpenedModel(Path("/models") / preset.example_model, adapter.model_format),
        cpu_threads=EXAMPLE_THREADS,
        numa_policy="interleave",
        cpuset=EXAMPLE_CPUSET,
        gpu="nvidia",
        start_period_s=start_period_for(preset.example_size_gb * 10**9),
        config_dir=Path("/models") / f"{preset.name}-hf" if adapter.needs_config_dir else None,
        override_tensors=preset.override_rules(adapter),
        served_name=preset.name,
        grouped_routing=adapter.asks_for_groups(preset.architecture, preset.model_shape().expert_groups),
    ).with_options(preset.engine_options(adapter))
    generated_by = f"moe-stack compose --preset {preset.name} --engine {engine} --gpu nvidia" + (
        f" --config-dir {stack.config_dir}" if adapter.needs_config_dir else ""
    )
    # Checked against the flags recorded from the engine's server (none: KTransformers' legacy one).
    contract = recorded_contract(adapter)
    cpu = gpu_image.cpu.name
    facts = contract.facts_for(image, cpu, image.rpartition(":")[2]) if contract else None
    cpu_profile = None
    cpu_image = published_image(adapter, EXAMPLE_CPUS, gpu=False) if adapter.serves_on_cpu else None
    if cpu_image is not None:  # the same model CPU-only (`--profile cpu`), for when the GPU is busy
        cpu_stack = cpu_only(stack, image_tag(cpu_image))
        generated_by += f" --cpu-image {cpu_stack.image_ref}"
        cpu_facts = (
            contract.facts_for(
                cpu_stack.image_ref, cpu_image.cpu.name, cpu_stack.image_ref.rpartition(":")[2]
            )
            if contract
            else None
        )
        cpu_profile = (cpu_stack, cpu_facts)
    checked = f"; flags checked against {engine} {short_ref(contract.ref)}'s" if contract else ""
    driver = ".".join(map(str, MIN_DRIVER[gpu_image.cuda.version or ""]))
    stack_file = compose_stack(
        stack,
        f"{generated_by} (example host{checked}; its CUDA {gpu_image.cuda.version} image needs "
        f"NVIDIA driver >= {driver}; see presets.py)",
        facts,
        check_files=False,
        cpu_profile=cpu_profile,
    )
    return stack_file.to_yaml()
