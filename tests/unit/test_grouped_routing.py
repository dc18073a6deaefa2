"""A model whose experts are routed within groups is served that way by every engine: mainline applies the
GGUF's groups itself, ik_llama.cpp only on its -ger switch and for Ling's bailingmoe2 only, so a stack of
such a model turns it on there, and never for a model without groups (ik_llama.cpp dies of SIGFPE)."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.engines import get_engine
from builder.errors import StackError
from builder.host.probe import HostFacts
from builder.models.synth_catalog import TINY, synth_shape
from builder.models.synth_moe import write_moe_gguf
from builder.stacks.assemble import assemble_stack
from builder.stacks.options import StackOptions
from tests.hosts import epyc_host
from tests.specs import compose_dict


def _command(model: Path, engine: str, host: HostFacts) -> list[str]:
    options = StackOptions(model_path=model, engine=engine, skip_image_checks=True)
    stack = assemble_stack(options, host)
    command: list[str] = compose_dict(stack, "x")["services"]["engine"]["command"]
    return command


def test_ik_routes_lings_experts_within_their_groups_and_mainline_does_it_itself(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)  # the engine's user reads the models
    host = epyc_host(tmp_path / "host")
    ling = write_moe_gguf(tmp_path / "ling.gguf", TINY["bailingmoe2"])  # 2 of 4 groups
    assert "-ger" in _command(ling, "ik_llama.cpp", host)
    assert not {"-ger", "--grouped-expert-routing"} & set(_command(ling, "llama.cpp", host))
    # DeepSeek's groups: ik_llama.cpp's -ger reads them for bailingmoe2 only.
    r1 = write_moe_gguf(tmp_path / "r1.gguf", TINY["deepseek2"])
    assert "-ger" not in _command(r1, "ik_llama.cpp", host)
    ungrouped = synth_shape("bailingmoe2", tiny=True, expert_groups=0, groups_used=0)
    plain = write_moe_gguf(tmp_path / "plain.gguf", ungrouped)
    assert "-ger" not in _command(plain, "ik_llama.cpp", host)


def test_a_build_without_the_switch_is_refused(tmp_path: Path) -> None:
    ik = get_engine("ik_llama.cpp")
    with pytest.raises(StackError, match="no -ger switch.*use mainline llama.cpp"):
        ik.grouped_routing_args({"-fa": ""})
    assert ik.grouped_routing_args({"-ger": ""}) == ["-ger"]
