"""A model is opened once per compose (models/opened.py): the stack's steps (its preset's check, the
derivation, the VRAM plan, placement, the prompt cache's key, the mounts, the memory sum) take the
OpenedModel, so its GGUF header is read once, however many ask; a draft model likewise."""

from __future__ import annotations

import collections
from pathlib import Path

import gguf
import pytest

from builder.models import gguf_facts
from builder.models.synth_catalog import TINY
from builder.models.synth_moe import write_moe_gguf
from builder.spec import EngineOptions
from builder.stacks.assemble import plan_stack
from builder.stacks.compose import compose_stack
from builder.stacks.memory_use import memory_use
from builder.stacks.options import StackOptions
from tests.hosts import epyc_host


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    """How often each GGUF's header is read (gguf's reader made), by file name."""
    counted: collections.Counter[str] = collections.Counter()
    real = gguf.GGUFReader

    class Counting(real):  # type: ignore[misc, valid-type]
        def __init__(self, path: str, *args: object, **kwargs: object) -> None:
            counted[Path(path).name] += 1
            super().__init__(path, *args, **kwargs)

    monkeypatch.setattr(gguf_facts.gguf, "GGUFReader", Counting)
    return counted


@pytest.mark.parametrize("engine", ["llama.cpp", "ik_llama.cpp"])
def test_one_compose_reads_each_gguf_once(
    tmp_path: Path, reads: collections.Counter[str], engine: str
) -> None:
    models = tmp_path / "models"
    models.mkdir(mode=0o755)
    tmp_path.chmod(0o755)
    model = write_moe_gguf(models / "m.gguf", TINY["qwen3moe"])
    draft = write_moe_gguf(models / "draft.gguf", TINY["qwen3moe"])
    for path in (model, draft):
        path.chmod(0o644)
    host = epyc_host(tmp_path / "host", cores=8, threads=1, node_gib=64)
    options = StackOptions(
        model_path=model,
        engine=engine,
        preset="qwen3-235b-a22b",
        gpu="nvidia",
        fit_vram_gb=(24.0,),
        keep_prompts=True,
        skip_image_checks=True,
        engine_options=EngineOptions(draft_model=draft),
    )
    reads.clear()
    plan = plan_stack(options, host)
    compose_stack(plan.stack, "pytest", plan.facts)
    memory_use(plan.stack)
    assert reads == {"m.gguf": 1, "draft.gguf": 1}
