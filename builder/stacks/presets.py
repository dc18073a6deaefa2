"""Model presets (compose/presets.yaml): the seed's models as neutral stack options, and the example
stacks emitted from them into compose/ (an EPYC 9374F, 32 Zen 4 cores with SMT, + one RTX 4090/5090)."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml
from pydantic import ValidationError

from builder.engines import engine_names, get_engine
from builder.errors import SpecError
from builder.images.matrix import cuda_target
from builder.images.naming import image_spec, image_tag
from builder.images.recorded_contracts import recorded_contract
from builder.spec import EXPERTS_ON_CPU_RULE, EngineOptions, StackSpec
from builder.stacks.compose import compose_dict
from builder.stacks.document import cpu_only, start_period_for, to_yaml


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    architecture: str  # the GGUF architecture of the preset's model (general.architecture)
    example_model: str
    example_size_gb: int
    options: dict[str, object]  # neutral engine options common to all engines, and experts_on_cpu
    engines: dict[str, dict[str, object]]  # per-engine additions (ik_llama.cpp's fused MoE, MLA)

    def _check_engine(self, engine: str) -> None:
        if engine not in self.engines:
            raise SpecError(
                f"preset {self.name} has no settings for {engine}; it has {', '.join(self.engines)}"
            )

    def engine_options(self, engine: str) -> EngineOptions:
        """The engine options for `engine` (its entry may null a common one); SpecError if the preset
        has no such engine or its file holds a wrong value."""
        self._check_engine(engine)
        values = {key: value for key, value in self.options.items() if key in EngineOptions.model_fields}
        values.update(self.engines[engine])
        try:
            return EngineOptions.model_validate(values)
        except ValidationError as error:
            raise SpecError(
                f"preset {self.name} ({presets_file()}): {error.errors()[0]['loc'][0]}: "
                f"{error.errors()[0]['msg']}"
            ) from None

    def override_rules(self, engine: str) -> tuple[str, ...]:
        """The preset's -ot rules for `engine`: all routed experts on the CPU, where it takes rules."""
        self._check_engine(engine)
        wanted = bool(self.options.get("experts_on_cpu")) and get_engine(engine).takes_override_rules
        return (EXPERTS_ON_CPU_RULE,) if wanted else ()


def merge_options(
    preset: str | None, engine: str, given: EngineOptions
) -> tuple[EngineOptions, tuple[str, ...]]:
    """The engine options: the preset's for `engine`, overridden by those `given` (the fields set in
    it); and the preset's -ot rules, kept apart so a VRAM plan can replace them."""
    if preset is None:
        return given, ()
    chosen = get_preset(preset)
    return given.over(chosen.engine_options(engine)), chosen.override_rules(engine)


# A preset's keys that describe its model rather than set a stack option.
_DESCRIPTIVE = ("description", "architecture", "example_model", "example_size_gb", "engines")


def check_model_architecture(preset: str, arch: str, model: Path) -> None:
    """SpecError when `model` (of architecture `arch`) is not a model the preset is made for."""
    wanted = get_preset(preset).architecture
    if arch != wanted:
        fitting = [p.name for p in load_presets().values() if p.architecture == arch]
        raise SpecError(
            f"preset {preset} is for {wanted} models and {model.name} is {arch}: drop --preset, or pick "
            f"the preset of a {arch} model ({', '.join(fitting) or 'no preset has one'})"
        )


def presets_file() -> Path:
    packaged = Path(str(resources.files("builder"))) / "presets.yaml"
    return (
        packaged if packaged.is_file() else Path(__file__).resolve().parents[2] / "compose" / "presets.yaml"
    )


def load_presets() -> dict[str, Preset]:
    data = yaml.safe_load(presets_file().read_text())
    return {
        name: Preset(
            name=name,
            description=entry["description"],
            architecture=entry["architecture"],
            example_model=entry["example_model"],
            example_size_gb=entry["example_size_gb"],
            options={k: v for k, v in entry.items() if k not in _DESCRIPTIVE},
            engines={engine: dict(extra or {}) for engine, extra in entry["engines"].items()},
        )
        for name, entry in data.items()
    }


def get_preset(name: str) -> Preset:
    presets = load_presets()
    if name not in presets:
        raise SpecError(f"unknown preset {name!r}: choose one of {', '.join(presets)}")
    return presets[name]


# The example host: the seed's EPYC 9374F (32 Zen 4 cores, SMT siblings 32-63, NPS=1) and one RTX 4090
# or 5090, CUDA 12.8 images (arch 120 for the 5090).
EXAMPLE_THREADS = 32
EXAMPLE_CPUSET = "0-31"


def example_stacks() -> dict[str, str]:
    """compose/<preset>.<engine>.yaml text for every preset and engine (what the test keeps current)."""
    files = {}
    for preset in load_presets().values():
        for engine in engine_names():
            if engine not in preset.engines:
                continue
            adapter = get_engine(engine)
            image = image_tag(image_spec(engine, "zen4", cuda=cuda_target("12.8")))
            stack = StackSpec(
                project=f"{preset.name}-{engine.replace('.', '-').replace('_', '-')}",
                engine=engine,
                image=image,
                model=Path("/models") / preset.example_model,
                threads=EXAMPLE_THREADS,
                numa="interleave",
                cpuset=EXAMPLE_CPUSET,
                gpu="nvidia",
                start_period_s=start_period_for(preset.example_size_gb * 10**9),
                config_dir=Path("/models") / f"{preset.name}-hf" if adapter.needs_config_dir else None,
                override_tensors=preset.override_rules(engine),
                served_name=preset.name,
            ).with_options(preset.engine_options(engine))
            generated_by = f"moe-stack compose --preset {preset.name} --engine {engine} --gpu nvidia" + (
                f" --config-dir {stack.config_dir}" if adapter.needs_config_dir else ""
            )
            # Checked against the flags recorded from a built image of the engine (none for KTransformers).
            contract = recorded_contract(engine)
            facts = contract.facts_for(image, "zen4", image.rpartition(":")[2]) if contract else None
            cpu_profile = None
            if adapter.serves_on_cpu:  # the same model CPU-only (`--profile cpu`), for when the GPU is busy
                cpu_stack = cpu_only(stack, image_tag(image_spec(engine, "zen4")))
                generated_by += f" --cpu-image {cpu_stack.image}"
                cpu_facts = (
                    contract.facts_for(cpu_stack.image, "zen4", cpu_stack.image.rpartition(":")[2])
                    if contract
                    else None
                )
                cpu_profile = (cpu_stack, cpu_facts)
            checked = f"; flags checked against {engine} {contract.ref}'s" if contract else ""
            document = compose_dict(
                stack,
                f"{generated_by} (example host{checked}, see presets.py)",
                facts,
                check_files=False,
                cpu_profile=cpu_profile,
            )
            files[f"{preset.name}.{engine}.yaml"] = to_yaml(document)
    return files
