"""What a stack takes of its host's memory, summed once (stacks/memory_use.py) for every preset and
engine: the model's files, the engine's prompt cache (8 GiB unless --cache-ram), its own buffers, a
CPU-only stack's KV cache, and the model as hugepages instead of memory where it is staged there."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.engines import get_engine
from builder.host.probe import HostFacts
from builder.models.kv_cache import DEFAULT_UBATCH, kv_cache_bytes
from builder.models.planner import GIB
from builder.models.synth_catalog import TINY
from builder.models.synth_moe import write_moe_gguf
from builder.spec import EngineOptions
from builder.stacks.assemble import assemble_stack
from builder.stacks.memory_use import BUFFERS_BYTES, memory_use
from builder.stacks.options import StackOptions
from builder.stacks.presets import load_presets
from tests.hosts import epyc_host
from tests.specs import preset_engines

MIB = 1024**2


@pytest.fixture
def host(tmp_path: Path) -> HostFacts:
    return epyc_host(tmp_path / "h", node_gib=576)


@pytest.mark.parametrize(("preset", "engine"), preset_engines())
def test_each_presets_stack_adds_up(tmp_path: Path, host: HostFacts, preset: str, engine: str) -> None:
    chosen = load_presets()[preset]
    model = write_moe_gguf(tmp_path / "models" / "m.gguf", TINY[chosen.architecture])
    size = model.stat().st_size

    def use(**changes: object) -> tuple[int, int]:
        options = StackOptions(
            model_path=model, engine=engine, preset=preset, skip_image_checks=True, for_other_host=True
        )
        stack = assemble_stack(options.model_copy(update=changes), host)
        found = memory_use(stack)
        return found.memory_bytes, found.hugepage_bytes

    default = get_engine(engine).prompt_cache_default_mib * MIB
    assert use(gpu="nvidia") == (size + default + BUFFERS_BYTES, 0)
    three_gib = EngineOptions(cache_ram="3g")
    assert use(gpu="nvidia", engine_options=three_gib) == (size + 3 * GIB + BUFFERS_BYTES, 0)
    # Staged on 1G pages (which back the mapping): the model is hugepages, not memory as well
    mapped = EngineOptions(mmap=True)
    assert use(gpu="nvidia", hugetlbfs="1G", engine_options=mapped) == (default + BUFFERS_BYTES, size)
    # CPU-only: its KV cache (the preset's context and cache type, the model as the engine loads it) is in
    # RAM too
    options = chosen.engine_options(get_engine(engine))
    kv = kv_cache_bytes(
        get_engine(engine).loaded_model(get_engine(engine).open_model(model), options.mtp),
        options.ctx_size,
        options.cache_type or "f16",
        get_engine(engine).cache_layout(options.mla),
        ubatch=options.ubatch_size or DEFAULT_UBATCH,
    )
    assert use() == (size + kv + default + BUFFERS_BYTES, 0)


def test_cache_ram_is_emitted_in_mib_for_both_llama_engines(tmp_path: Path, host: HostFacts) -> None:
    model = write_moe_gguf(tmp_path / "models" / "m.gguf", TINY["qwen3moe"])
    for engine in ("llama.cpp", "ik_llama.cpp"):
        options = StackOptions(
            model_path=model,
            engine=engine,
            engine_options=EngineOptions(cache_ram="0"),
            skip_image_checks=True,
        )
        args = get_engine(engine).server_args(assemble_stack(options, host), None)
        assert args[args.index("--cache-ram") + 1] == "0"
        assert memory_use(assemble_stack(options, host)).prompt_cache_bytes == 0
