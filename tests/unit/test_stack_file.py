"""The stack file as one typed model (stackfile/stack_file.py): what compose writes reads back as typed
values and is written again byte for byte, and a part a hand edit broke is one line naming it."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from builder.contract import NUMA_ENV
from builder.errors import StackError
from builder.stackfile.stack_file import StackFile, StackFileError
from builder.stacks.compose import compose_stack, write_stack
from tests.specs import compose_dict, demo_stack

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "compose").glob("*.*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.stem)
def test_an_example_reads_back_and_is_written_again_byte_for_byte(path: Path) -> None:
    assert StackFile.read(path).to_yaml() == path.read_text()


def test_what_compose_wrote_reads_back(tmp_path: Path) -> None:
    stack = demo_stack(
        tmp_path,
        gpu="nvidia",
        numa_policy="interleave",
        cpuset="0-3",
        port=18123,
        extra_args=("--system-prompt-file", "cost$5"),
    )
    document = compose_dict(stack, generated_by="test")
    assert document["services"]["engine"]["command"][-1] == "cost$$5"
    read = StackFile.read(write_stack(compose_stack(stack, "test"), tmp_path / "compose.yaml"))
    engine = read.service("engine")
    assert engine.image == "img:1" and engine.wants_gpu and engine.cpuset == "0-3"
    assert engine.published == (("127.0.0.1", 18123),)
    assert engine.env[NUMA_ENV] == "interleave"
    assert engine.args[-2:] == ["--system-prompt-file", "cost$5"]  # as meant: compose's `$$` undone
    assert engine.runs_under([]) and engine.pull_policy is None
    assert read.record.serves["engine"].threads == 4 and read.record.model == stack.model.path
    cpu = compose_stack(stack.model_copy(update={"gpu": "none"}), generated_by="test")
    assert not cpu.service("engine").wants_gpu


def test_compose_s_other_forms_and_a_broken_edit(tmp_path: Path) -> None:
    emitted = compose_dict(demo_stack(tmp_path), "test")

    def edited(**change: object) -> dict[str, object]:
        document = copy.deepcopy(emitted)
        document["services"]["engine"].update(change)
        return document

    engine = StackFile.parse(edited(environment=["A=1", "B=x=y"], profiles=["gpu"])).service("engine")
    assert engine.env == {"A": "1", "B": "x=y"}
    assert engine.runs_under(["gpu"]) and not engine.runs_under(["cpu"])
    with pytest.raises(StackFileError, match=r"s.yaml has a services.engine.command moe-stack never writes"):
        StackFile.parse(edited(command="--model m"), "s.yaml")
    with pytest.raises(StackFileError, match=r"services.engine.ports.0.published moe-stack never writes"):
        StackFile.parse(edited(ports=[{"target": 8080, "published": "eighty"}]))
    with pytest.raises(StackFileError, match=r"has services.engine.privileged, which moe-stack never writes"):
        StackFile.parse(edited(privileged=True))
    with pytest.raises(StackError, match="s.yaml has no cpu service"):
        StackFile.parse(emitted, "s.yaml").service("cpu")
    with pytest.raises(StackFileError, match="lacks services"):
        StackFile.parse({key: value for key, value in emitted.items() if key != "services"})
    with pytest.raises(StackFileError, match="not written by `moe-stack compose`"):
        StackFile.parse({"services": {}})


def test_a_missing_or_broken_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(StackError, match="does not exist; emit one with `moe-stack compose`"):
        StackFile.read(tmp_path / "none.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump({"name": "x", "x-moe-stack": {"engine": "llama.cpp"}, "services": {}}))
    with pytest.raises(StackError, match=r"broken.yaml lacks x-moe-stack.generated-by.*emit it again"):
        StackFile.read(broken)
    # An alias that refers to itself: a reader recursing into it ran out of stack (a traceback).
    looped = tmp_path / "looped.yaml"
    looped.write_text("name: &n [*n]\nservices: {}\n")
    with pytest.raises(StackError, match=r"looped.yaml is not plain YAML: an alias \(\*name\)") as said:
        StackFile.read(looped)
    assert "\n" not in str(said.value)
