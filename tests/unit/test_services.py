"""A stack file's services read back as typed values (stacks/services.py): what compose wrote, and one
line for a part a hand edit broke."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.contract import NUMA_ENV
from builder.engines.specs import StackSpec
from builder.errors import StackError
from builder.stacks.compose import compose_dict
from builder.stacks.services import read_services, service_named


def _stack(tmp_path: Path, **update: object) -> StackSpec:
    model = tmp_path / "models" / "m.gguf"
    model.parent.mkdir(exist_ok=True, mode=0o755)
    model.write_bytes(b"GGUF")
    model.chmod(0o644)
    values = {"project": "demo", "engine": "llama.cpp", "image": "img:1", "model": model, "threads": 4}
    return StackSpec(**(values | update))


def test_what_compose_wrote_reads_back(tmp_path: Path) -> None:
    stack = _stack(
        tmp_path,
        gpu="nvidia",
        numa="interleave",
        cpuset="0-3",
        port=18123,
        extra_args=("--system-prompt-file", "cost$5"),
    )
    document = compose_dict(stack, generated_by="test")
    assert document["services"]["engine"]["command"][-1] == "cost$$5"
    engine = service_named(document, "engine")
    assert engine.image == "img:1" and engine.wants_gpu and engine.cpuset == "0-3"
    assert engine.ports == (("127.0.0.1", 18123),)
    assert engine.environment[NUMA_ENV] == "interleave"
    assert engine.command[-2:] == ("--system-prompt-file", "cost$5")  # as meant: compose's `$$` undone
    assert engine.runs_under([]) and not engine.pull_never
    cpu = compose_dict(stack.model_copy(update={"gpu": "none"}), generated_by="test")
    assert not service_named(cpu, "engine").wants_gpu


def test_compose_s_other_forms_and_a_broken_edit() -> None:
    document = {"services": {"engine": {"image": "i", "environment": ["A=1", "B=x=y"], "profiles": ["gpu"]}}}
    engine = read_services(document)["engine"]
    assert engine.environment == {"A": "1", "B": "x=y"} and engine.command == ()
    assert engine.runs_under(["gpu"]) and not engine.runs_under(["cpu"])
    with pytest.raises(StackError, match="s.yaml: service engine's command is not a list"):
        read_services({"services": {"engine": {"command": "--model m"}}}, "s.yaml")
    with pytest.raises(StackError, match="service engine's ports is not host ports of numbers"):
        read_services({"services": {"engine": {"ports": [{"published": "eighty"}]}}})
    with pytest.raises(StackError, match="s.yaml has no engine service"):
        service_named({"services": {}}, "engine", "s.yaml")
    with pytest.raises(StackError, match="has no services"):
        read_services({"x-moe-stack": {}})
