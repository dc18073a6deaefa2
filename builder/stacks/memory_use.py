"""What a stack takes of its host's memory, summed once: the model's files (page cache, or the engine's
own or pinned memory, or hugepages where the stack stages it there), a CPU-only stack's KV cache, the
engine's host prompt cache and its own CPU buffers, and what its features take (Feature.host_bytes: a
CPU-only stack's vision projector, the pool of kept prompts). The Kubernetes requests are made from it."""

from __future__ import annotations

from dataclasses import dataclass

from builder.engines import Engine
from builder.engines.base import StackSpec
from builder.features.all import FEATURES
from builder.models.planner import GIB

MIB = 1024**2
# The engine's CPU compute buffers and its process beside the weights and caches (ik_llama.cpp's CPU
# build logged 0.5-5.8 GB of compute buffer for the seed's shapes: bench/results).
BUFFERS_BYTES = 2 * GIB


@dataclass(frozen=True)
class MemoryUse:
    model_bytes: int  # the model's files
    on_hugepages: bool  # staged onto hugetlbfs, or read from reserved hugepages: not counted as memory
    kv_bytes: int  # the KV cache a CPU-only stack keeps in RAM (a GPU stack's is on the GPU)
    prompt_cache_bytes: int  # the engine's host prompt cache (--cache-ram, or the engine's default)
    buffers_bytes: int = BUFFERS_BYTES
    features_bytes: int = 0  # what the stack's features take (Feature.host_bytes)

    @property
    def memory_bytes(self) -> int:
        """Ordinary memory: everything but the hugepages."""
        model = 0 if self.on_hugepages else self.model_bytes
        return model + self.kv_bytes + self.prompt_cache_bytes + self.buffers_bytes + self.features_bytes

    @property
    def hugepage_bytes(self) -> int:
        return self.model_bytes if self.on_hugepages else 0


NOTHING_KNOWN = MemoryUse(model_bytes=0, on_hugepages=False, kv_bytes=0, prompt_cache_bytes=0)


def prompt_cache_bytes(engine: Engine, cache_ram_mib: int | None = None) -> int:
    """The engine's host prompt cache: `cache_ram_mib` where the stack sizes it, else its default."""
    mib = cache_ram_mib if cache_ram_mib is not None else engine.prompt_cache_default_mib
    return max(mib, 0) * MIB


def beside_model_bytes(engine: Engine) -> int:
    """What `engine`'s server keeps in RAM beside the weights, unless told otherwise: its default prompt
    cache and its buffers (for plan and doctor, which have no stack)."""
    return prompt_cache_bytes(engine) + BUFFERS_BYTES


def memory_use(stack: StackSpec) -> MemoryUse:
    adapter = stack.engine
    return MemoryUse(
        model_bytes=stack.model.size,
        on_hugepages=stack.hugetlbfs != "off" or stack.hugepages,
        kv_bytes=stack.kv_bytes() if stack.gpu == "none" else 0,
        prompt_cache_bytes=prompt_cache_bytes(adapter, stack.cache_ram),
        features_bytes=sum(feature.host_bytes(stack) for feature in FEATURES),
    )
