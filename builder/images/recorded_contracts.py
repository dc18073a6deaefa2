"""Flag contracts recorded from built images (dockerfiles/contracts/<engine>.json): what the example
stacks in compose/ are checked against, so an example never carries a flag its engine lacks (mainline's
`--no-mmap`, gone at 0c1e57098, once did). The integration suite compares each record with the image it
builds from the same source, and rewrites it with MOE_STACK_UPDATE_GOLDEN=1."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from builder.engines import Engine, adapters
from builder.errors import StackError
from builder.files import templates_root
from builder.images.image_facts import ImageFacts
from builder.images.naming import short_ref
from builder.platform.targets import cpu_target


@dataclass(frozen=True)
class RecordedContract:
    engine: Engine
    ref: str  # the engine ref of the image it was read from
    source: str  # where that image's engine came from (a PyPI sdist)
    flags: dict[str, str]
    architectures: tuple[str, ...] = ()  # the GGUF architectures it loads

    def facts_for(self, image: str, cpu: str, variant: str) -> ImageFacts:
        """What an image of this engine would say about itself, for a stack emitted without it."""
        return ImageFacts(
            image=image,
            engine=self.engine,
            engine_ref=self.ref,
            variant=variant,
            cpu_target=cpu,
            required_cpu_flags=cpu_target(cpu).required_flags,
            server_flags=self.flags,
            architectures=self.architectures,
        )


def contract_path(engine: Engine) -> Path:
    return templates_root() / "contracts" / f"{engine.name}.json"


def recorded_contract(engine: Engine) -> RecordedContract | None:
    """The contract recorded for `engine`, None where none is (the legacy KTransformers server has no
    --help contract). KTransformers' is SGLang's --help as read on the GPU machine
    (bench/results/kt-gpu-2026-12-01): no image of it is built where the tests run."""
    path = contract_path(engine)
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return RecordedContract(
        engine=engine,
        ref=data["ref"],
        source=data["source"],
        flags=data["flags"],
        architectures=tuple(data.get("architectures", ())),
    )


def check_pinned_architecture(engine: Engine, arch: str) -> None:
    """StackError when `engine` at its pinned ref can't load `arch` models (its recorded tree names no
    such architecture), naming the engines whose pins can."""
    pinned = recorded_contract(engine)
    if pinned is None or not pinned.architectures or arch in pinned.architectures:
        return
    able = [
        other.name
        for other in adapters()
        if (contract := recorded_contract(other)) is not None and arch in contract.architectures
    ]
    instead = f"use --engine {' or '.join(able)}" if able else "no pinned engine here loads it"
    raise StackError(
        f"{engine} {short_ref(pinned.ref)} can't load {arch} models (its llama-arch.cpp names no {arch}); "
        f"{instead}"
    )


def contract_text(contract: RecordedContract) -> str:
    """The record's file text (sorted, one flag a line: a change reads as a diff)."""
    return (
        json.dumps(
            {
                "engine": contract.engine.name,
                "ref": contract.ref,
                "source": contract.source,
                "flags": contract.flags,
                "architectures": list(contract.architectures),
            },
            indent=1,
            sort_keys=True,
        )
        + "\n"
    )
