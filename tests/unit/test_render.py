"""Rendering: deterministic, structured as designed, host-independent, lint-clean."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from builder.errors import MoeStackError
from builder.files import templates_root
from builder.images.matrix import cuda_target
from builder.images.render import render, render_files
from builder.platform.pins import pinned_ref
from builder.spec import BaseImages
from tests.specs import default_spec
from tests.tools import dependency_command

ENGINES = ["llama.cpp", "ik_llama.cpp"]


@pytest.mark.parametrize("engine", ENGINES)
def test_render_is_deterministic(engine: str) -> None:
    assert render_files(default_spec(engine)) == render_files(default_spec(engine))


@pytest.mark.parametrize("engine", ENGINES)
def test_stages_in_cache_order_and_labels_last(engine: str) -> None:
    dockerfile = render_files(default_spec(engine))["Dockerfile"]
    assert not re.search(r"^#\s*syntax=", dockerfile, re.MULTILINE), (
        "a syntax line needs the frontend image pulled"
    )
    stages = re.findall(r"^FROM \S+ AS (\S+)$", dockerfile, re.MULTILINE)
    page = ["chat-page"] if engine == "llama.cpp" else []  # the built chat page's context (chat_page.py)
    assert stages == [
        "toolchain",
        "engine-src-git",
        "engine-src",
        *page,
        "configure",
        "build",
        "contract",
        "ccache-seed",  # the compile cache's way in and out (ccache_carry), no stage of the image
        "ccache-import",
        "ccache-run",
        "ccache-copy",
        "ccache-export",
        "helpers",
        "runtime",
        "tools-build",
        "tools",
    ]
    instructions = [line.split()[0] for line in dockerfile.splitlines() if re.match(r"^[A-Z]+\s", line)]
    assert instructions[-1] == "LABEL"
    assert "USER 10001:10001" in dockerfile
    assert "HEALTHCHECK" in dockerfile and "--target llama-server" in dockerfile


@pytest.mark.parametrize("engine", ENGINES)
def test_targeted_build_never_native(engine: str) -> None:
    dockerfile = render_files(default_spec(engine))["Dockerfile"]
    assert "-DGGML_NATIVE=OFF" in dockerfile
    assert "native" not in dockerfile.replace("GGML_NATIVE=OFF", "")
    assert "-DCMAKE_C_FLAGS=-march=x86-64-v3" in dockerfile
    assert "-DGGML_AVX2=ON" in dockerfile and "-DGGML_AVX512=OFF" in dockerfile


def test_ik_gets_examples_and_build_info_shim() -> None:
    files = render_files(default_spec("ik_llama.cpp"))
    assert "-DLLAMA_BUILD_EXAMPLES=ON" in files["Dockerfile"]
    assert "build-info.sh" in files and "moe-stack-build-info.sh /src" in files["Dockerfile"]
    assert "build-info.sh" not in render_files(default_spec("llama.cpp"))


def test_ik_cuda_builds_drop_lineinfo(tmp_path: Path) -> None:
    """ik's CUDA builds take -lineinfo out of its CUDA flags (line tables, no machine code); its CPU
    builds and mainline's (no -lineinfo outside GGML_CUDA_DEBUG) are left alone."""
    step = "sh /tmp/moe-stack-cuda-no-lineinfo.sh /src"
    cuda = cuda_target("13.0", (90,))
    files = render_files(default_spec("ik_llama.cpp").model_copy(update={"cuda": cuda}))
    assert step in files["Dockerfile"] and "-DCMAKE_CUDA_ARCHITECTURES=90-real" in files["Dockerfile"]
    assert step not in render_files(default_spec("ik_llama.cpp"))["Dockerfile"]
    assert step not in render_files(default_spec("llama.cpp").model_copy(update={"cuda": cuda}))["Dockerfile"]

    # The script on the line as ik's ggml/src/CMakeLists.txt has it, then on a tree that has it not.
    script = files["cuda-no-lineinfo.sh"]
    cmake = tmp_path / "ggml/src/CMakeLists.txt"
    cmake.parent.mkdir(parents=True)
    line = "    set(CUDA_FLAGS -use_fast_math -extended-lambda{})\n    list(APPEND CUDA_FLAGS -O3)\n"
    cmake.write_text(line.format(" -lineinfo"))
    run = subprocess.run(
        ["sh", "-c", script, "sh", str(tmp_path)], capture_output=True, text=True, check=True
    )
    assert cmake.read_text() == line.format("") and "without -lineinfo" in run.stdout
    run = subprocess.run(
        ["sh", "-c", script, "sh", str(tmp_path)], capture_output=True, text=True, check=True
    )
    assert cmake.read_text() == line.format("") and "kept as it is" in run.stdout


def test_base_images_are_placed_per_stage() -> None:
    spec = default_spec("llama.cpp").model_copy(
        update={"base": BaseImages(build="mirror/b:1", runtime="mirror/r:2")}
    )
    dockerfile = render_files(spec)["Dockerfile"]
    assert "FROM mirror/b:1 AS toolchain" in dockerfile and "FROM mirror/r:2 AS runtime" in dockerfile


def test_manifest_and_flags_file_agree_with_labels() -> None:
    files = render_files(default_spec("llama.cpp"))
    manifest = json.loads(files["image.json"])
    assert manifest["required_cpu_flags"] == files["required-cpu-flags"].split()
    assert (
        f'io.moe-stack.required-cpu-flags="{" ".join(manifest["required_cpu_flags"])}"' in files["Dockerfile"]
    )
    assert manifest["engine_ref"] == pinned_ref("llama.cpp") and manifest["cuda"] is None


def test_render_refuses_a_foreign_directory(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(MoeStackError, match="not rendered by moe-stack"):
        render(default_spec("llama.cpp"), tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_render_replaces_its_own_output(tmp_path: Path) -> None:
    out = tmp_path / "ctx"
    render(default_spec("llama.cpp"), out)
    render(default_spec("ik_llama.cpp"), out)
    assert (out / "build-info.sh").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["ctx"], "no staging leftovers"


def test_templates_are_found() -> None:
    assert (templates_root() / "llama-cpp-family/Dockerfile.j2").is_file()


@pytest.mark.lint
@pytest.mark.parametrize("engine", ENGINES)
def test_hadolint_clean(engine: str, tmp_path: Path) -> None:
    hadolint = dependency_command("hadolint")
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(render_files(default_spec(engine))["Dockerfile"])
    result = subprocess.run(
        [hadolint, "--no-color", str(dockerfile)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_wheel_ships_the_templates(tmp_path: Path) -> None:
    """An installed moe-stack (no checkout) finds dockerfiles/ inside the package."""
    import sys
    import zipfile

    root = Path(__file__).resolve().parents[2]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--quiet",
            "--wheel-dir",
            str(tmp_path),
            str(root),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("moe_stack-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {str(p.relative_to(root)) for p in (root / "dockerfiles").rglob("*") if p.is_file()}
    assert {f"builder/{name}" for name in shipped} <= names
    assert "builder/presets.yaml" in names
