"""An architecture an engine's pinned tree doesn't name is refused before anything is planned or written:
`plan` and a `compose` whose image isn't read here (`--skip-image-checks`) check the recorded contract, as
`compose` checks a present image's label."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.engines import get_engine
from builder.errors import StackError
from builder.host.probe import HostFacts
from builder.models.synth_catalog import TINY
from builder.models.synth_moe import write_moe_gguf
from builder.spec import EngineOptions
from builder.stacks.assemble import StackOptions, plan_stack
from builder.stacks.memory_report import MemoryAsk, memory_report
from tests.hosts import epyc_host

# DeepSeek-V4, DeepSeek-V3.2, Ling-3, Kimi-K3 and MiniMax-M3: mainline's pinned tree names them,
# ik_llama.cpp's doesn't.
MAINLINE_ONLY = ("deepseek4", "deepseek32", "bailingmoe3", "kimi-k3", "minimax-m3")


def _refused(arch: str) -> str:
    return rf"ik_llama.cpp 55d3c05bf7b3 can't load {arch} models .*; use --engine llama.cpp$"


@pytest.fixture(params=MAINLINE_ONLY)
def mainline_only(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Path]:
    arch: str = request.param
    return arch, write_moe_gguf(tmp_path / "models" / f"{arch}.gguf", TINY[arch])


def test_plan_refuses_it_on_ik_and_plans_it_on_mainline(mainline_only: tuple[str, Path]) -> None:
    arch, model = mainline_only
    ask = MemoryAsk((24.0,), 64.0, 1.0, 8192, "q8_0", False, 512, None, EngineOptions())
    with pytest.raises(StackError, match=_refused(arch)):
        memory_report(get_engine("ik_llama.cpp"), model, ask)
    assert memory_report(get_engine("llama.cpp"), model, ask).facts.arch == arch


def test_a_stack_of_the_pinned_image_unread_is_checked_against_its_record(
    mainline_only: tuple[str, Path], tmp_path: Path
) -> None:
    arch, model = mainline_only
    host: HostFacts = epyc_host(tmp_path / "h")
    options = StackOptions(model=model, engine="ik_llama.cpp", skip_image_checks=True)
    with pytest.raises(StackError, match=_refused(arch)):
        plan_stack(options, host)
    mainline = StackOptions(model=model, engine="llama.cpp", skip_image_checks=True)
    assert plan_stack(mainline, host).stack.engine.name == "llama.cpp"
