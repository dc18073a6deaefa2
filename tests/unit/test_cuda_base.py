"""The registry-free CUDA bases (`moe-stack base --cuda`): 13.0's wheel set and 12.4's Debian packages,
their rendered Dockerfiles, the check that gates tagging, the driver stub script, and engine images
built on them (`--cuda-base pypi|debian`)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from builder.engines import get_engine
from builder.errors import SpecError
from builder.images.cuda_base import (
    CHECK_ARCH,
    HOST_DRIVER_LIBRARIES,
    check_report,
    render_debian_files,
    render_files,
)
from builder.images.matrix import cuda_target
from builder.images.naming import image_spec
from builder.images.render import image_labels
from builder.images.render import render_files as render_engine
from builder.platform.cuda_wheels import PYPI_CUDA
from builder.platform.debian_cuda import DEBIAN_CUDA
from builder.platform.local_cuda import any_local_cuda, local_cuda
from builder.platform.toolchain import toolchain
from builder.spec import BaseImages
from tests.tools import dependency_command

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests/golden/cuda-base-13.0.Dockerfile"
DEBIAN_GOLDEN = ROOT / "tests/golden/cuda-base-12.4.Dockerfile"
MIRROR = "http://deb.debian.org/debian"
CREATED = datetime(2026, 11, 30, tzinfo=UTC)
CUDA13 = PYPI_CUDA["13.0"]
CUDA124 = DEBIAN_CUDA["12.4"]
PYPI = BaseImages(cuda="pypi")
DEBIAN = BaseImages(cuda="debian")


def _wheel_files() -> dict[str, Path]:
    return {
        w.name: Path(f"{w.name.replace('-', '_')}-{w.version}-py3-none-manylinux_2_27_x86_64.whl")
        for w in CUDA13.packages
    }


def _render() -> dict[str, str]:
    return render_files(CUDA13, "moe-stack/debian:trixie", _wheel_files(), CREATED)


def _render_debian() -> dict[str, str]:
    return render_debian_files(CUDA124, "moe-stack/debian:trixie", MIRROR, CREATED)


@pytest.mark.parametrize(("golden", "text"), [(GOLDEN, _render), (DEBIAN_GOLDEN, _render_debian)])
def test_base_dockerfile_matches_golden(golden: Path, text: object) -> None:
    assert callable(text)
    rendered = text()["Dockerfile"]
    if os.environ.get("MOE_STACK_UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(rendered)
    assert golden.read_text() == rendered, "re-render with MOE_STACK_UPDATE_GOLDEN=1"


@pytest.mark.lint
@pytest.mark.parametrize("text", [_render, _render_debian])
def test_base_dockerfile_is_hadolint_clean(tmp_path: Path, text: object) -> None:
    assert callable(text)
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(text()["Dockerfile"])
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
    assert len(sums) == len(CUDA13.packages) == 7
    for wheel, line in zip(CUDA13.packages, sums, strict=True):
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


def test_each_cuda_release_names_where_its_base_comes_from() -> None:
    with pytest.raises(
        SpecError, match=r"CUDA 12.8 has no compiler in NVIDIA's PyPI wheels.*--cuda-base nvidia"
    ):
        local_cuda("pypi", "12.8")
    with pytest.raises(
        SpecError, match=r"CUDA 12.4 has no compiler in NVIDIA's PyPI wheels.*--cuda-base debian has it"
    ):
        local_cuda("pypi", "12.4")
    with pytest.raises(
        SpecError, match=r"13.0 has no compiler in Debian's non-free archive: --cuda-base pypi has it"
    ):
        toolchain(image_spec(get_engine("llama.cpp"), "zen4").cpu, cuda_target("13.0"), DEBIAN)
    with pytest.raises(
        SpecError, match=r"no registry-free CUDA 12.6 base: they exist for 13.0 \(--cuda-base pypi\), 12.4"
    ):
        any_local_cuda("12.6")
    assert any_local_cuda("12.4") is CUDA124 and any_local_cuda("13.0") is CUDA13
    with pytest.raises(
        SpecError, match="--cuda-base debian is the CUDA toolkit's base: it goes with --cuda 12.4"
    ):
        image_spec(get_engine("llama.cpp"), "zen4", base=DEBIAN)


def test_debian_base_pins_its_packages_in_a_list_of_its_own() -> None:
    files = _render_debian()
    text = files["Dockerfile"]
    # The archive's own list (non-free, the base's mirror and keyring); the system's sources untouched.
    assert files["moe-stack-cuda.sources"] == (
        f"Types: deb\nURIs: {MIRROR}\nSuites: trixie\nComponents: non-free\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
    )
    assert "COPY moe-stack-cuda.sources /etc/apt/sources.list.d/" in text and "sources.list " not in text
    devel = text[text.index("AS devel") : text.index("AS runtime")]
    runtime = text[text.index("AS runtime") : text.index("AS check-build")]
    for package in CUDA124.packages:
        assert f"{package.name}={package.version}" in devel
        assert (f"{package.name}={package.version}" in runtime) == package.runtime
        assert f'io.moe-stack.deb.{package.name}="{package.version}"' in devel
    assert [p.name for p in CUDA124.packages if p.runtime] == ["libcudart12", "libcublas12", "libcublaslt12"]
    assert 'NVIDIA_REQUIRE_CUDA="cuda>=12.4"' in runtime and f'io.moe-stack.base-mirror="{MIRROR}"' in runtime
    assert "g++" not in text[text.index("AS check-build") :], "nvcc's g++-13 comes with the toolkit"


def test_the_driver_stands_in_by_name_only() -> None:
    """nvidia-cuda-dev depends on the driver's libraries; the package that satisfies it holds no file,
    so an image never carries a libcuda.so.1 of its own to shadow the host driver's."""
    control = _render_debian()["host-driver.control"]
    provides = next(line for line in control.splitlines() if line.startswith("Provides:"))
    assert provides == "Provides: libcuda.so.1 (= 550), libnvidia-ml.so.1 (= 550)"
    assert HOST_DRIVER_LIBRARIES == ("libcuda.so.1", "libnvidia-ml.so.1")
    text = _render_debian()["Dockerfile"]
    assert "dpkg-deb --build /pkg" in text and "COPY host-driver.control /pkg/DEBIAN/control" in text


def test_engine_on_the_debian_base_compiles_cuda_with_gcc_13() -> None:
    """trixie's GCC 14 builds the CPU code; nvcc 12.4 accepts GCC up to 13, so it gets trixie's g++-13."""
    spec = image_spec(get_engine("llama.cpp"), "sapphirerapids", cuda=cuda_target("12.4", [90]), base=DEBIAN)
    tools = toolchain(spec.cpu, spec.cuda, spec.base)
    assert (tools.build_image, tools.runtime_image, tools.gcc_major, tools.cuda_host_gcc) == (
        "moe-stack/cuda:12.4-devel",
        "moe-stack/cuda:12.4-runtime",
        None,
        13,
    )
    assert tools.compiler_args(spec.cuda) == ["-DCMAKE_CUDA_HOST_COMPILER=g++-13"]
    assert {"gcc-13", "g++-13"} <= set(tools.build_packages)
    dockerfile = render_engine(spec)["Dockerfile"]
    assert "FROM moe-stack/cuda:12.4-devel AS toolchain" in dockerfile
    assert "-DCMAKE_CUDA_HOST_COMPILER=g++-13" in dockerfile
    assert image_labels(spec)["io.moe-stack.cuda-base"] == "debian"
    with pytest.raises(SpecError, match="needs GCC 14, but nvcc 12.4 accepts host compilers up to GCC 13"):
        toolchain(image_spec(get_engine("llama.cpp"), "zen5").cpu, cuda_target("12.4"), DEBIAN)


def test_engine_on_the_pypi_base_builds_on_debian_with_its_gcc() -> None:
    spec = image_spec(get_engine("llama.cpp"), "zen5", cuda=cuda_target("13.0", [89, 120]), base=PYPI)
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
    assert image_labels(image_spec(get_engine("llama.cpp"), "zen4"))["io.moe-stack.cuda-base"] == "none"
    dockerfile = render_engine(spec)["Dockerfile"]
    assert "FROM moe-stack/cuda:13.0-devel AS toolchain" in dockerfile
    assert "FROM moe-stack/cuda:13.0-runtime AS runtime" in dockerfile
    assert "FROM toolchain AS configure" in dockerfile and "FROM configure AS build" in dockerfile


def test_pypi_base_needs_cuda_and_is_refused_for_ktransformers() -> None:
    with pytest.raises(SpecError, match="goes with --cuda 13.0"):
        image_spec(get_engine("llama.cpp"), "zen4", base=PYPI)
    with pytest.raises(SpecError, match="drop --cuda-base pypi"):
        render_engine(
            image_spec(get_engine("ktransformers-legacy"), "zen4", cuda=cuda_target("13.0"), base=PYPI)
        )
    with pytest.raises(SpecError, match="link CUDA 12"):  # and the current one has no CUDA 13 image
        render_engine(image_spec(get_engine("ktransformers"), "zen4", cuda=cuda_target("13.0"), base=PYPI))


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
