"""Spec validation: invalid combinations are refused with a message naming field and fix."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from builder.engines import get_engine
from builder.engines.base import ImageSpec, StackSpec
from builder.errors import SpecError
from builder.images.naming import image_spec, variant_tag
from builder.platform.targets import cpu_target
from builder.spec import CudaTarget, GitSource, LocalSource
from tests.specs import default_spec, demo_stack


def test_a_copy_takes_only_the_models_own_fields(tmp_path: Path) -> None:
    """pydantic's model_copy(update=) would set any key: a renamed field's old name (the spec's `image`,
    now `image_ref`) is refused by name, as a misspelt one is; the real field still copies."""
    stack = demo_stack(tmp_path)
    with pytest.raises(TypeError, match="StackSpec has no field imag_ref, image"):
        stack.model_copy(update={"image": "x", "imag_ref": "y"})
    with pytest.raises(TypeError, match="ImageSpec has no field march"):
        default_spec("llama.cpp").model_copy(update={"march": "znver4"})
    assert stack.model_copy(update={"image_ref": "img:2"}).image_ref == "img:2"


def test_variant_tag_shortens_full_commits() -> None:
    full = default_spec("ik_llama.cpp").model_copy(
        update={"source": GitSource(url="u", ref="007d640098cbea95157d81846ada7fe50b9fed08")}
    )
    assert variant_tag(full) == "007d640098cb-cpu-avx2"
    assert (
        variant_tag(
            default_spec("llama.cpp").model_copy(update={"source": GitSource(url="u", ref="0c1e57098")})
        )
        == "0c1e57098-cpu-avx2"
    )


def test_cuda_target_rules() -> None:
    assert CudaTarget().label == "cpu"
    assert CudaTarget(version="12.8", archs=(120,)).label == "cuda12.8"
    with pytest.raises(ValidationError, match="arch 120 needs CUDA >= 12.8"):
        CudaTarget(version="12.6", archs=(120,))
    with pytest.raises(ValidationError, match="cuda.archs is empty"):
        CudaTarget(version="12.8")
    with pytest.raises(ValidationError, match="CPU-only image"):
        CudaTarget(archs=(89,))
    with pytest.raises(ValidationError, match="not supported"):
        CudaTarget(version="11.8", archs=(86,))


def test_unknown_fields_are_refused() -> None:
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        GitSource(url="u", ref="main", branch="x")


@pytest.mark.parametrize("ref", ["", "has space", "a/b", "-leading"])
def test_refs_must_fit_in_a_tag(ref: str) -> None:
    with pytest.raises(ValidationError, match="becomes part of the image tag"):
        LocalSource(path=Path("/x"), ref=ref)


def test_unknown_engine_and_cpu_target() -> None:
    with pytest.raises(SpecError, match="unknown engine 'vllm': choose one of llama.cpp, ik_llama.cpp"):
        get_engine("vllm")
    with pytest.raises(SpecError, match="unknown CPU target 'avx9'"):
        cpu_target("avx9")
    with pytest.raises(SpecError, match="unknown engine 'vllm'"):
        image_spec(get_engine("vllm"))
    with pytest.raises(ValidationError):  # not even an engine name
        ImageSpec(engine="vllm; rm -rf", source=GitSource(url="u", ref="r"), cpu=cpu_target("avx2"))


def _stack(**update: object) -> StackSpec:
    values = {
        "project_name": "p",
        "engine": "llama.cpp",
        "image_ref": "i",
        "model": Path("/m.gguf"),
        "cpu_threads": 2,
    }
    return StackSpec(**(values | update))


def test_stack_override_rules_are_checked() -> None:
    assert _stack(override_tensors=(r"blk\.[0-9]+\.ffn_.*_exps\.weight=CPU",)).override_tensors
    with pytest.raises(ValidationError, match="must look like REGEX=BUFFER_TYPE"):
        _stack(override_tensors=("exps",))
    with pytest.raises(ValidationError, match="bad regex"):
        _stack(override_tensors=("ffn_(=CPU",))


def test_stack_defaults_are_safe() -> None:
    stack = _stack()
    assert stack.bind == "127.0.0.1" and stack.port == 8080
    with pytest.raises(ValidationError):
        _stack(port=70000)
