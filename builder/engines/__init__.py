"""Engine adapters, one module per engine; `get_engine` is the only way in."""

from __future__ import annotations

from builder.engines.base import Engine
from builder.engines.ik_llama_cpp import IkLlamaCpp
from builder.engines.ktransformers import KTransformers, KTransformersLegacy
from builder.engines.llama_cpp import LlamaCpp
from builder.engines.llama_family import LlamaFamilyEngine
from builder.errors import SpecError, StackError

_ENGINES: dict[str, Engine] = {
    e.name: e for e in (LlamaCpp(), IkLlamaCpp(), KTransformers(), KTransformersLegacy())
}


def get_engine(name: str) -> Engine:
    """The adapter for `name`, or a SpecError listing the known engines."""
    try:
        return _ENGINES[name]
    except KeyError:
        raise SpecError(f"unknown engine {name!r}: choose one of {', '.join(_ENGINES)}") from None


def engine_names() -> list[str]:
    return list(_ENGINES)


def bench_engine(name: str) -> LlamaFamilyEngine:
    """The adapter of an engine whose tools image has llama-bench (tune and `bench --tool` drive it), or
    a StackError saying to measure the server instead."""
    engine = get_engine(name)
    if not isinstance(engine, LlamaFamilyEngine) or not engine.tool_targets:
        raise StackError(
            f"{name} has no tools image with llama-bench; measure its server with `moe-stack bench FILE` "
            "(no --tool)"
        )
    return engine


__all__ = ["Engine", "bench_engine", "engine_names", "get_engine"]
