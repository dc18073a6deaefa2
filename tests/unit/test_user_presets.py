"""Presets of the user's own: `--presets FILE` (or $MOE_STACK_PRESETS) merged over the packaged ones,
checked with the same rules, every mistake one line naming the file, the preset and the key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from builder.engines import get_engine
from builder.errors import SpecError
from builder.host.probe import HostFacts
from builder.models.synth_moe import MoeShape, write_moe_gguf
from builder.stacks.assemble import assemble_stack
from builder.stacks.options import StackOptions
from builder.stacks.presets import PRESETS_ENV, load_presets, presets_file
from tests.cli import run_cli
from tests.hosts import epyc_host

MINE = """
glm-air-like:
  description: my own qwen3moe-shaped model
  architecture: qwen3moe
  ctx_size: 65536
  cache_type: q8_0
  experts_on_cpu: true
  engines:
    llama.cpp: {temperature: 0.3}
    ik_llama.cpp: {fused_moe: true}
deepseek-r1-671b:
  ctx_size: 16384            # a packaged preset, one key changed
  engines:
    ik_llama.cpp: {mla: 2}   # and one engine's key; its other keys stay
"""


@pytest.fixture
def host(tmp_path: Path) -> HostFacts:
    return epyc_host(tmp_path / "h", cores=16, node_gib=256)


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    return path


def test_a_new_preset_is_added_and_a_packaged_one_changed(tmp_path: Path, host: HostFacts) -> None:
    mine = _file(tmp_path, MINE)
    presets = load_presets(mine)
    assert set(presets) == {*load_presets(), "glm-air-like"} and presets["glm-air-like"].source == mine
    r1 = presets["deepseek-r1-671b"].engine_options(get_engine("ik_llama.cpp"))
    assert (r1.ctx_size, r1.mla, r1.fused_moe, r1.ubatch_size) == (16384, 2, True, 2048)
    assert load_presets()["deepseek-r1-671b"].engine_options(get_engine("ik_llama.cpp")).ctx_size == 32768

    model = write_moe_gguf(tmp_path / "models" / "m.gguf", MoeShape(layers=2))
    options = StackOptions(
        model_path=model, preset="glm-air-like", presets_file=mine, gpu="nvidia", skip_image_checks=True
    )
    stack = assemble_stack(options, host)
    assert (stack.ctx_size, stack.cache_type, stack.temperature) == (65536, "q8_0", 0.3)
    assert stack.override_tensors and stack.served_name == "glm-air-like"  # its experts-on-CPU rule


def test_the_environment_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PRESETS_ENV, str(_file(tmp_path, MINE)))
    assert "glm-air-like" in load_presets()
    assert "glm-air-like" not in load_presets(presets_file())  # a file given explicitly wins over it


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            "x:\n  description: d\n  architecture: qwen3moe\n  ctx_sise: 9\n  engines: {llama.cpp: {}}\n",
            "preset x: ctx_sise: Extra inputs are not permitted",
        ),
        (
            "deepseek-r1-671b:\n  engines: {ik_llama.cpp: {mla: 9}}\n",
            "preset deepseek-r1-671b: engines.ik_llama.cpp.mla: Input should be less than or equal to 3",
        ),
        (
            "x:\n  description: d\n  architecture: a\n  engines: {vllm: {}}\n",
            "preset x: engines.vllm: no such engine",
        ),
        ("x:\n  architecture: a\n  engines: {llama.cpp: {}}\n", "preset x: description: missing"),
        ("x: [1, 2]\n", "each preset is a mapping"),
        # Terminal sequences (`presets` prints the text): a title, a clipboard write (OSC 52), a C1 CSI.
        (
            'x:\n  description: "\\e]0;title\\a"\n  architecture: a\n  engines: {llama.cpp: {}}\n',
            "preset x: description: holds a control character",
        ),
        (
            'x:\n  description: d\n  architecture: a\n  engines: {llama.cpp: {alias: "\\e]52;c;aGk=\\a"}}\n',
            "preset x: engines.llama.cpp.alias: holds a control character",
        ),
        (
            'x:\n  description: d\n  architecture: "\\x9b2J"\n  engines: {llama.cpp: {}}\n',
            "preset x: architecture: holds a control character",
        ),
        (
            'x:\n  description: d\n  architecture: a\n  "ctx\\x7f": 1\n  engines: {llama.cpp: {}}\n',
            "preset x: 'ctx\\x7f': holds a control character",
        ),
        ('"x\\e[2J":\n  description: d\n', "the preset name 'x\\x1b[2J' holds a control character"),
        ("x: {description: d\n", "is not plain YAML: "),
        # An alias that refers to itself (a reader recursing into it ran out of stack: a traceback once),
        # and any alias at all: presets are written out in full.
        ("x: &a\n  description: *a\n", "is not plain YAML: an alias (*name): write the value out in full"),
        (
            "d: &d {description: d}\nx: *d\n",
            "is not plain YAML: an alias (*name): write the value out in full (line 2)",
        ),
        (
            "x:\n  description: d\n  architecture: deepseek2\n  example_shape: {expertz: 3}\n  engines: {}\n",
            "preset x: example_shape: no field expertz; a shape has context, dense_ffn",
        ),
        (
            "x:\n  description: d\n  architecture: deepseek2\n  example_shape: {experts: x}\n  engines: {}\n",
            "preset x: example_shape: a mapping of a synth shape's fields",
        ),
    ],
)
def test_a_mistake_is_one_line_naming_file_preset_and_key(tmp_path: Path, text: str, said: str) -> None:
    mine = _file(tmp_path, text)
    with pytest.raises(SpecError, match="presets file " + str(mine).replace(".", r"\.")) as error:
        load_presets(mine)
    assert said in str(error.value) and "\n" not in str(error.value)
    assert not re.search(r"[\x00-\x1f\x7f-\x9f]", str(error.value))  # named, never echoed


@pytest.mark.cli
def test_compose_and_presets_take_the_file(tmp_path: Path) -> None:
    mine = _file(tmp_path, MINE)
    listed = run_cli("presets", "--presets", str(mine))
    assert listed.returncode == 0 and "glm-air-like" in listed.stdout, listed.stderr
    model = write_moe_gguf(tmp_path / "models" / "m.gguf", MoeShape(layers=2))
    out = tmp_path / "c.yaml"
    emitted = run_cli(
        "compose",
        "--model",
        str(model),
        "--preset",
        "glm-air-like",
        "--presets",
        str(mine),
        "--skip-image-checks",
        "--port",
        "18561",
        "-o",
        str(out),
    )
    assert emitted.returncode == 0, emitted.stderr
    assert "'65536'" in out.read_text()
    missing = run_cli(
        "compose",
        "--model",
        str(model),
        "--presets",
        str(tmp_path / "none.yaml"),
        "--preset",
        "glm-air-like",
        "--skip-image-checks",
        "-o",
        str(out),
    )
    assert missing.returncode == 1 and "presets file" in missing.stderr and "Traceback" not in missing.stderr


def test_a_description_may_span_lines(tmp_path: Path) -> None:
    """Newlines and tabs are text, not terminal sequences: a block scalar's description keeps them."""
    mine = _file(
        tmp_path,
        "x:\n  description: |\n    first line\n    \tsecond, indented\n  architecture: qwen3moe\n"
        "  engines: {llama.cpp: {}}\n",
    )
    assert load_presets(mine)["x"].description == "first line\n\tsecond, indented\n"
