"""The registry-free CUDA base (`moe-stack base --cuda`): its wheel set, its rendered Dockerfile, the
check that gates tagging, the driver stub script, and engine images built on it (`--cuda-base pypi`)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from builder.errors import SpecError
from builder.images.cuda_base import CHECK_ARCH, check_report, render_files
from builder.images.matrix import cuda_target
from builder.images.naming import image_spec
from builder.images.render import image_labels
from builder.images.render import render_files as render_engine
from builder.platform.cuda_wheels import PYPI_CUDA, pypi_cuda
from builder.platform.toolchain import toolchain
from builder.spec import BaseImages
from tests.tools import dependency_command

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests/golden/cuda-base-13.0.Dockerfile"
CREATED = datetime(2026, 11, 30, tzinfo=UTC)
CUDA13 = PYPI_CUDA["13.0"]
PYPI = BaseImages(cuda="pypi")


def _wheel_files() -> dict[str, Path]:
    return {
        w.name: Path(f"{w.name.replace('-', '_')}-{w.version}-py3-none-manylinux_2_27_x86_64.whl")
        for w in CUDA13.wheels
    }


def _render() -> dict[str, str]:
    return render_files(CUDA13, "moe-stack/debian:trixie", _wheel_files(), CREATED)


def test_base_dockerfile_matches_golden() -> None:
    text = _render()["Dockerfile"]
    if os.environ.get("MOE_STACK_UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(text)
    assert GOLDEN.read_text() == text, "re-render with MOE_STACK_UPDATE_GOLDEN=1"


@pytest.mark.lint
def test_base_dockerfile_is_hadolint_clean(tmp_path: Path) -> None:
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(_render()["Dockerfile"])
    result = subprocess.run(
        [dependency_command("hadolint"), "--no-color", str(dockerfile)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_wheel_is_pinned_checked_and_labelled() -> None:
    files = _render()
    sums = files["cuda-wheels.sha256"].splitlines()
    assert len(sums) == len(CUDA13.wheels) == 7
    for wheel, line in zip(CUDA13.wheels, sums, strict=True):
        assert re.fullmatch(r"[0-9a-f]{64}", wheel.sha256)
        assert line == f"{wheel.sha256}  /wheels/{_wheel_files()[wheel.name].name}"
        assert (
            f'io.moe-stack.wheel.{wheel.name}="{wheel.version} sha256:{wheel.sha256}"' in files["Dockerfile"]
        )
    assert "sha256sum --check --strict" in files["Dockerfile"]


def test_runtime_base_carries_only_what_a_server_loads() -> None:
    text = _render()["Dockerfile"]
    runtime = text[text.index("AS runtime") : text.index("AS check-build")]
    # cudart and cuBLAS labelled, not the compiler's wheels; the toolkit reads NVIDIA_DRIVER_CAPABILITIES
    assert "io.moe-stack.wheel.nvidia-cublas=" in runtime and "nvidia-cuda-nvcc" not in runtime
    assert 'NVIDIA_DRIVER_CAPABILITIES="compute,utility"' in runtime
    assert 'NVIDIA_REQUIRE_CUDA="cuda>=13.0"' in runtime
    assert CUDA13.runtime_libs == ("libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13")
    assert "libcuda.so" not in " ".join(CUDA13.runtime_libs), "the driver's library must come from the host"


def test_check_report_accepts_only_the_driver_library_missing() -> None:
    good = "\tlibcublas.so.13 => /usr/local/cuda/lib64/libcublas.so.13 (0x7f)\n\tlibcuda.so.1 => not found\n"
    elf = "ELF file    1: moe-stack-cuda-check.1.sm_90.cubin\n"
    assert check_report(good, elf, 90) == []
    bad = good + "\tlibcublasLt.so.13 => not found\n"
    assert check_report(bad, elf, 90) == ["the runtime image can't resolve libcublasLt.so.13"]
    assert check_report(good, elf.replace("sm_90", "sm_89"), 90) == [
        "the check program holds sm_89 code, not sm_90"
    ]
    assert check_report(good, "", CHECK_ARCH) == [f"the check program holds no code, not sm_{CHECK_ARCH}"]


def test_cuda_12_has_no_pypi_base() -> None:
    with pytest.raises(SpecError, match=r"CUDA 12.8 has no compiler on PyPI.*--cuda-base nvidia"):
        pypi_cuda("12.8")
    with pytest.raises(SpecError, match="no compiler on PyPI"):
        toolchain(image_spec("llama.cpp", "zen4").cpu, cuda_target("12.8"), PYPI)


def test_engine_on_the_pypi_base_builds_on_debian_with_its_gcc() -> None:
    spec = image_spec("llama.cpp", "zen5", cuda=cuda_target("13.0", [89, 120]), base=PYPI)
    tools = toolchain(spec.cpu, spec.cuda, spec.base)
    # trixie's GCC 14 knows znver5 and nvcc 13.0 takes it: no extra gcc-N, unlike Ubuntu 24.04's 13
    assert (tools.build_image, tools.runtime_image, tools.gcc_major) == (
        "moe-stack/cuda:13.0-devel",
        "moe-stack/cuda:13.0-runtime",
        None,
    )
    nvidia = toolchain(spec.cpu, spec.cuda, BaseImages())
    assert nvidia.build_image.startswith("nvidia/cuda:13.0") and nvidia.gcc_major == 14
    assert image_labels(spec)["io.moe-stack.cuda-base"] == "pypi"
    assert image_labels(image_spec("llama.cpp", "zen4"))["io.moe-stack.cuda-base"] == "none"
    dockerfile = render_engine(spec)["Dockerfile"]
    assert "FROM moe-stack/cuda:13.0-devel AS toolchain" in dockerfile
    assert "FROM moe-stack/cuda:13.0-runtime AS runtime" in dockerfile
    assert "FROM toolchain AS configure" in dockerfile and "FROM configure AS build" in dockerfile


def test_pypi_base_needs_cuda_and_is_refused_for_ktransformers() -> None:
    with pytest.raises(ValueError, match="goes with --cuda 13.0"):
        image_spec("llama.cpp", "zen4", base=PYPI)
    with pytest.raises(SpecError, match="drop --cuda-base pypi"):
        render_engine(image_spec("ktransformers-legacy", "zen4", cuda=cuda_target("13.0"), base=PYPI))
    with pytest.raises(SpecError, match="link CUDA 12"):  # and the current one has no CUDA 13 image
        render_engine(image_spec("ktransformers", "zen4", cuda=cuda_target("13.0"), base=PYPI))


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs a C compiler")
def test_stub_script_defines_every_entry_point_and_refuses_other_headers(tmp_path: Path) -> None:
    script = ROOT / "dockerfiles/cuda-base/make-cuda-stub.sh"
    header = tmp_path / "cuda.h"
    # The shapes cuda.h uses: declarations, _v2 renames, per-thread-stream variants.
    lines = [f"CUresult CUDAAPI cuFunc{i}(int x);" for i in range(400)]
    lines += [
        "#define cuCtxCreate cuCtxCreate_v2",
        "CUresult CUDAAPI cuCtxCreate(CUcontext *pctx);",
        "    #define cuMemcpy __CUDA_API_PTDS(cuMemcpy)",
        "    #define cuMemsetD8 __CUDA_API_PTSZ(cuMemsetD8_v2)",
    ]
    header.write_text("\n".join(lines) + "\n")
    stub = tmp_path / "libcuda.so"
    result = subprocess.run(
        ["sh", str(script), str(header), str(stub)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    symbols = subprocess.run(
        ["nm", "-D", "--defined-only", str(stub)], capture_output=True, text=True, check=False
    ).stdout
    for name in (
        "cuFunc0",
        "cuFunc399",
        "cuCtxCreate",
        "cuCtxCreate_v2",
        "cuMemcpy_ptds",
        "cuMemsetD8_v2_ptsz",
    ):
        assert re.search(rf" T {name}$", symbols, re.MULTILINE), name
    soname = subprocess.run(["objdump", "-p", str(stub)], capture_output=True, text=True, check=False).stdout
    assert re.search(r"SONAME\s+libcuda\.so\.1", soname)
    header.write_text("int main(void);\n")
    result = subprocess.run(
        ["sh", str(script), str(header), str(tmp_path / "x.so")], capture_output=True, text=True, check=False
    )
    assert result.returncode == 1 and "is it cuda.h?" in result.stderr
