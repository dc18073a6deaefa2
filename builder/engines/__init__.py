"""Engine adapters, one module per engine; `get_engine` is the only way in."""

from __future__ import annotations

from builder.engines.base import ADAPTERS, Engine, EngineField
from builder.engines.ik_llama_cpp import IkLlamaCpp
from builder.engines.ktransformers import KTransformers, KTransformersLegacy
from builder.engines.llama_cpp import LlamaCpp
from builder.engines.llama_family import LlamaFamilyEngine
from builder.errors import SpecError, StackError

# The two engines that code names outright: mainline is the default engine (the demo's, doctor's
# reference run), KTransformers the only one that converts weights (`kt-convert`).
LLAMA_CPP = LlamaCpp()
KTRANSFORMERS = KTransformers()
ADAPTERS.update({e.name: e for e in (LLAMA_CPP, IkLlamaCpp(), KTRANSFORMERS, KTransformersLegacy())})


def get_engine(name: str) -> Engine:
    """The adapter for `name`, or a SpecError listing the known engines."""
    try:
        return ADAPTERS[name]
    except KeyError:
        raise SpecError(f"unknown engine {name!r}: choose one of {', '.join(ADAPTERS)}") from None


def engine_names() -> list[str]:
    return list(ADAPTERS)


def adapters() -> tuple[Engine, ...]:
    """Every engine's adapter, in the registry's order."""
    return tuple(ADAPTERS.values())


def bench_engine(engine: Engine) -> LlamaFamilyEngine:
    """`engine` as an engine whose tools image has llama-bench (tune and `bench --tool` drive it), or
    a StackError saying to measure the server instead."""
    if not isinstance(engine, LlamaFamilyEngine) or not engine.tool_targets:
        raise StackError(
            f"{engine.name} has no tools image with llama-bench; measure its server with "
            "`moe-stack bench FILE` (no --tool)"
        )
    return engine


__all__ = [
    "KTRANSFORMERS",
    "LLAMA_CPP",
    "Engine",
    "EngineField",
    "adapters",
    "bench_engine",
    "engine_names",
    "get_engine",
]
