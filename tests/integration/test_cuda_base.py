"""CI's CUDA check, minutes instead of the hour a CUDA engine compile takes on 2 cores: the
registry-free CUDA 13.0 base is made from NVIDIA's PyPI wheels (its own check compiles and links a
kernel + cuBLAS program for sm_90 and resolves it in the runtime image), and a CUDA engine image's
real Dockerfile, on that base, gets through cmake's configure with CUDA on."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from python_on_whales import DockerClient

from builder.engines import get_engine
from builder.images.build_plan import BuildPlan, stream_build
from builder.images.matrix import cuda_target
from builder.images.naming import image_spec
from builder.images.render import render
from builder.images.source import resolve_local
from builder.platform.cuda_wheels import PYPI_CUDA
from builder.spec import BaseImages
from tests.cli import run_cli
from tests.integration.starts import run_image

pytestmark = pytest.mark.integration
CUDA = PYPI_CUDA["13.0"]


@pytest.fixture(scope="module")
def cuda_base(docker_client: DockerClient, base_image: str) -> str:
    """`moe-stack base --cuda 13.0`, as a user runs it; its output. Made here (CI's cold run), its
    check must have run; made before with the same wheels, it is kept (its image IDs, and so every
    engine build cache on it, survive)."""
    present = all(docker_client.image.exists(CUDA.image(flavour)) for flavour in ("devel", "runtime"))
    before = docker_client.image.inspect(CUDA.image("devel")).id if present else None
    result = run_cli("base", "--cuda", "13.0")
    assert result.returncode == 0, result.stderr[-3000:]
    said = " ".join(result.stdout.split())
    assert (
        ("kept: moe-stack/cuda:13.0-devel" in said)
        if present
        else ("checked: a kernel + cuBLAS program built for sm_90" in said)
    ), said
    if present:
        assert docker_client.image.inspect(CUDA.image("devel")).id == before, "a kept base keeps its ID"
    return said


def test_base_is_checked_laid_out_and_labelled(
    docker_client: DockerClient, cuda_base: str, base_image: str
) -> None:
    devel = docker_client.image.inspect(CUDA.image("devel"))
    runtime = docker_client.image.inspect(CUDA.image("runtime"))
    for wheel in CUDA.packages:
        label = f"{wheel.version} sha256:{wheel.sha256}"
        assert devel.config.labels[f"io.moe-stack.wheel.{wheel.name}"] == label
        assert runtime.config.labels.get(f"io.moe-stack.wheel.{wheel.name}") == (
            label if wheel.runtime else None
        )
    nvcc = run_image(docker_client, CUDA.image("devel"), ["nvcc", "--version"], remove=True)
    assert "release 13.0, V13.0.88" in str(nvcc)
    layout = run_image(
        docker_client,
        CUDA.image("devel"),
        [
            "sh",
            "-c",
            (
                "readlink /usr/local/cuda /usr/local/cuda/lib64; ls "
                "/usr/local/cuda/lib64/stubs; ls /usr/local/cuda/nvvm"
            ),
        ],
        remove=True,
    )
    assert str(layout).split() == ["cuda-13.0", "lib", "libcuda.so", "bin", "libdevice"]
    # The runtime base holds the libraries a server loads and no compiler: at most cuBLAS's 596.5 MB
    # (CUDA-FROM-PYPI.md) over the Debian base.
    added = runtime.size - docker_client.image.inspect(base_image).size
    assert 590e6 < added < 600e6, f"the runtime base adds {added / 1e6:.1f} MB"
    env = dict(item.split("=", 1) for item in runtime.config.env)
    assert (
        env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility" and env["NVIDIA_REQUIRE_CUDA"] == "cuda>=13.0"
    )
    absent = run_image(
        docker_client,
        CUDA.image("runtime"),
        ["sh", "-c", ("ls /usr/local/cuda/bin 2>&1; ldconfig -p | grep -c libcublasLt.so.13")],
        remove=True,
    )
    assert "No such file" in str(absent) and str(absent).strip().endswith("1")


@pytest.fixture
def configure_image(docker_client: DockerClient, cuda_base: str, tmp_path: Path) -> Iterator[str]:
    """The `configure` stage of llama.cpp's CUDA 13.0 sm_90 image on the PyPI base, loaded under a
    unique tag (removed afterwards)."""
    engine = get_engine("llama.cpp")
    tree = resolve_local(engine, f"pypi:{engine.sdist}")
    spec = image_spec(
        get_engine("llama.cpp"),
        "sapphirerapids",
        tree=tree,
        ref=engine.sdist_ref,
        cuda=cuda_target("13.0", [90]),
        base=BaseImages(cuda="pypi"),
    )
    tag = f"moe-stack-test/cuda-configure:{uuid.uuid4().hex[:8]}"
    plan = BuildPlan(
        context=render(spec, tmp_path / "ctx"),
        tags=(tag,),
        target="configure",
        build_contexts={"engine-src": str(tree)},
    )
    with (tmp_path / "build.log").open("w") as log:
        stream_build(docker_client, plan, log, tmp_path / "build.log", lambda line: None)
    yield tag
    docker_client.image.remove(tag, force=True)


def test_cuda_engine_configures_on_the_pypi_base(docker_client: DockerClient, configure_image: str) -> None:
    cache = str(
        run_image(
            docker_client,
            configure_image,
            [
                "grep",
                "-E",
                ("^(CMAKE_CUDA_COMPILER|CMAKE_CUDA_ARCHITECTURES|GGML_CUDA):"),
                "/build/CMakeCache.txt",
            ],
            remove=True,
        )
    )
    assert "CMAKE_CUDA_COMPILER:FILEPATH=/usr/local/cuda/bin/nvcc" in cache
    assert (
        re.search(r"^CMAKE_CUDA_ARCHITECTURES:\w+=90-real$", cache, re.MULTILINE)
        and "GGML_CUDA:BOOL=ON" in cache
    )
    # What nvcc is told to embed: sm_90 machine code alone, no compute_90 PTX beside it.
    codes = str(
        run_image(
            docker_client,
            configure_image,
            ["sh", "-c", "grep -oE 'code=\\[[^]]*\\]' /build/build.ninja | sort -u"],
            remove=True,
        )
    )
    assert codes.split() == ["code=[sm_90]"]
    ninja = str(
        run_image(
            docker_client,
            configure_image,
            ["grep", "-c", "ggml-cuda.dir/.*\\.cu\\.o:", "/build/build.ninja"],
            remove=True,
        )
    )
    assert int(ninja) > 50, "ggml's CUDA backend is in the build graph"
