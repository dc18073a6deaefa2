"""An architecture an engine's pinned tree doesn't name is refused before anything is planned or written:
`plan` and a `compose` whose image isn't read here (`--skip-image-checks`) check the recorded contract, as
`compose` checks a present image's label."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.engines import get_engine
from builder.errors import StackError
from builder.host.probe import HostFacts
from builder.models.synth_families import TINY
from builder.models.synth_moe import write_moe_gguf
from builder.spec import EngineOptions
from builder.stacks.assemble import StackOptions, plan_stack
from builder.stacks.memory_report import MemoryAsk, memory_report
from tests.hosts import epyc_host

REFUSED = r"ik_llama.cpp 55d3c05bf7b3 can't load deepseek4 models .*; use --engine llama.cpp$"


@pytest.fixture
def deepseek4(tmp_path: Path) -> Path:
    return write_moe_gguf(tmp_path / "models" / "v4.gguf", TINY["deepseek4"])


def test_plan_refuses_deepseek_v4_on_ik_and_plans_it_on_mainline(deepseek4: Path) -> None:
    ask = MemoryAsk((24.0,), 64.0, 1.0, 8192, "q8_0", False, 512, None, EngineOptions())
    with pytest.raises(StackError, match=REFUSED):
        memory_report(get_engine("ik_llama.cpp"), deepseek4, ask)
    assert memory_report(get_engine("llama.cpp"), deepseek4, ask).facts.arch == "deepseek4"


def test_a_stack_of_the_pinned_image_unread_is_checked_against_its_record(
    deepseek4: Path, tmp_path: Path
) -> None:
    host: HostFacts = epyc_host(tmp_path / "h")
    options = StackOptions(model=deepseek4, engine="ik_llama.cpp", skip_image_checks=True)
    with pytest.raises(StackError, match=REFUSED):
        plan_stack(options, host)
    mainline = StackOptions(model=deepseek4, engine="llama.cpp", skip_image_checks=True)
    assert plan_stack(mainline, host).stack.engine.name == "llama.cpp"
