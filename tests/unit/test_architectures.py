"""An architecture an engine's pinned tree doesn't name is refused before anything is planned or written:
`plan` and a `compose` whose image isn't read here (`--skip-image-checks`) check the recorded contract, as
`compose` checks a present image's label."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.engines import get_engine
from builder.errors import StackError
from builder.host.probe import HostFacts
from builder.images.naming import short_ref
from builder.images.recorded_contracts import recorded_contract
from builder.models.synth_catalog import TINY
from builder.models.synth_moe import write_moe_gguf
from builder.spec import EngineOptions
from builder.stacks.assemble import plan_stack
from builder.stacks.memory_report import MemoryAsk, memory_report
from builder.stacks.options import StackOptions
from tests.hosts import epyc_host

# DeepSeek-V3.2 and Kimi-K3: mainline's pinned tree names them, ik_llama.cpp's (8337e4c) doesn't.
MAINLINE_ONLY = ("deepseek32", "kimi-k3")


def _refused(arch: str) -> str:
    contract = recorded_contract(get_engine("ik_llama.cpp"))  # the tree the message names: the recorded one
    assert contract is not None
    pin = short_ref(contract.ref)
    return rf"ik_llama.cpp {pin} can't load {arch} models .*; use --engine llama.cpp$"


def test_mainline_only_is_what_the_recorded_contracts_say() -> None:
    ik, mainline = (recorded_contract(get_engine(name)) for name in ("ik_llama.cpp", "llama.cpp"))
    assert ik is not None and mainline is not None
    assert {arch for arch in TINY if arch in mainline.architectures and arch not in ik.architectures} == set(
        MAINLINE_ONLY
    )


@pytest.fixture(params=MAINLINE_ONLY)
def mainline_only(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Path]:
    arch: str = request.param
    return arch, write_moe_gguf(tmp_path / "models" / f"{arch}.gguf", TINY[arch])


def test_plan_refuses_it_on_ik_and_plans_it_on_mainline(mainline_only: tuple[str, Path]) -> None:
    arch, model = mainline_only
    ask = MemoryAsk((24.0,), 64.0, 1.0, 8192, "q8_0", False, 512, None, EngineOptions())
    with pytest.raises(StackError, match=_refused(arch)):
        memory_report(get_engine("ik_llama.cpp"), get_engine("ik_llama.cpp").open_model(model), ask)
    assert (
        memory_report(get_engine("llama.cpp"), get_engine("llama.cpp").open_model(model), ask).facts.arch
        == arch
    )


def test_a_stack_of_the_pinned_image_unread_is_checked_against_its_record(
    mainline_only: tuple[str, Path], tmp_path: Path
) -> None:
    arch, model = mainline_only
    host: HostFacts = epyc_host(tmp_path / "h")
    options = StackOptions(model_path=model, engine="ik_llama.cpp", skip_image_checks=True)
    with pytest.raises(StackError, match=_refused(arch)):
        plan_stack(options, host)
    mainline = StackOptions(model_path=model, engine="llama.cpp", skip_image_checks=True)
    assert plan_stack(mainline, host).stack.engine.name == "llama.cpp"
