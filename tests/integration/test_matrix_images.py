"""Images for named CPUs: the instructions really are in the binaries, the guard and the emitter
refuse hosts that lack them, and each image carries its engine's flag contract."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from python_on_whales import DockerClient

from builder.host.probe import missing_flags, read_cpu
from builder.images.image_facts import read_image_facts
from builder.platform.targets import cpu_target
from builder.spec import EXPERTS_ON_CPU_RULE
from tests.cli import run_cli
from tests.integration.conftest import BuiltImage, StackFactory, build_engine_image, free_port
from tests.integration.starts import docker_run, run_image

pytestmark = pytest.mark.integration


def _disassembly(docker_client: DockerClient, image: BuiltImage, tmp_path: Path) -> str:
    objdump = shutil.which("objdump")
    assert objdump, "objdump (binutils) is needed to read the engine binary"
    tmp_path.mkdir(parents=True, exist_ok=True)
    container = docker_client.container.create(image.tag)
    try:
        docker_client.container.copy((container, "/opt/engine/bin/llama-server"), tmp_path / "llama-server")
    finally:
        container.remove()
    return subprocess.run(
        [objdump, "-d", "--no-show-raw-insn", str(tmp_path / "llama-server")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_avx512_vnni_only_in_avx512_images(
    docker_client: DockerClient, zen4_image: BuiltImage, base_image: str, tmp_path: Path
) -> None:
    avx2_image = build_engine_image(zen4_image.engine, "avx2", base_image)
    zen4 = _disassembly(docker_client, zen4_image, tmp_path / "zen4")
    avx2 = _disassembly(docker_client, avx2_image, tmp_path / "avx2")
    assert zen4.count("vpdpbusd") > 10, "zen4 build lacks AVX-512 VNNI dot products"
    assert "zmm" in zen4
    assert avx2.count("vpdpbusd") == 0 and "zmm" not in avx2, "avx2 build uses instructions x86-64-v3 lacks"


def test_avx512_vnni_and_amx_only_in_the_sapphirerapids_image(
    docker_client: DockerClient, amx_image: BuiltImage, base_image: str, tmp_path: Path
) -> None:
    """Every run's proof of a targeted build (the zen4 ones are nightly): mainline's sapphirerapids
    llama-server holds AVX-512 VNNI dot products and AMX tile ops; its avx2 build holds neither."""
    avx2_image = build_engine_image("llama.cpp", "avx2", base_image)
    spr = _disassembly(docker_client, amx_image, tmp_path / "spr")
    avx2 = _disassembly(docker_client, avx2_image, tmp_path / "avx2")
    assert spr.count("vpdpbusd") > 10 and "zmm" in spr, "the sapphirerapids build lacks AVX-512 VNNI"
    assert spr.count("tdpbssd") > 0, "the sapphirerapids build lacks AMX INT8 tile ops"
    assert not any(op in avx2 for op in ("vpdpbusd", "zmm", "tdpbssd")), (
        "avx2 build uses what x86-64-v3 lacks"
    )


@pytest.mark.slow
def test_ik_zen4_gets_the_fast_avx512_path(
    base_image: str, moe_model: Path, start_stack: StackFactory
) -> None:
    lacking = missing_flags(cpu_target("zen4").required_flags, read_cpu())
    if lacking:
        pytest.skip(f"this host can't run zen4 code (lacks {' '.join(lacking)})")
    image = build_engine_image("ik_llama.cpp", "zen4", base_image)
    stack = start_stack(image, moe_model, override_tensors=(EXPERTS_ON_CPU_RULE,))
    logs = str(stack.client.compose.logs())
    assert "HAVE_FANCY_SIMD is defined" in logs


def test_ik_avx2_lacks_the_avx512_path(base_image: str, moe_model: Path, start_stack: StackFactory) -> None:
    stack = start_stack(build_engine_image("ik_llama.cpp", "avx2", base_image), moe_model)
    assert "HAVE_FANCY_SIMD is NOT defined" in str(stack.client.compose.logs())


def test_guard_refuses_a_cpu_without_amx(amx_image: BuiltImage) -> None:
    lacking = missing_flags(cpu_target("sapphirerapids").required_flags, read_cpu())
    if not lacking:
        pytest.skip("this host has AMX: it can run the sapphirerapids image")
    result = docker_run([amx_image.tag, "--version"], timeout=120)
    assert result.returncode == 78
    assert result.stderr.startswith("moe-stack: this image needs CPU flags this host lacks: ")
    for flag in lacking:
        assert flag in result.stderr
    assert "Illegal instruction" not in result.stderr


def test_emitter_refuses_an_image_this_host_cannot_run(
    amx_image: BuiltImage, moe_model: Path, tmp_path: Path
) -> None:
    if not missing_flags(cpu_target("sapphirerapids").required_flags, read_cpu()):
        pytest.skip("this host has AMX")
    out = tmp_path / "compose.yaml"
    args = [
        "compose",
        "--model",
        str(moe_model),
        "--image",
        amx_image.tag,
        "--port",
        str(free_port()),
        "--out",
        str(out),
    ]
    refused = run_cli(*args)
    assert (
        refused.returncode == 1
        and "needs CPU flags this host lacks: " in refused.stderr
        and "amx_tile" in refused.stderr
    )
    assert not out.exists()
    assert run_cli(*args, "--for-other-host").returncode == 0 and out.exists()


def test_images_carry_their_flag_contract(docker_client: DockerClient, engine_image: BuiltImage) -> None:
    facts = read_image_facts(engine_image.tag)
    assert {"--model", "--host", "--port", "-ot", "-fa"} <= set(facts.server_flags)
    help_text = run_image(
        docker_client, engine_image.tag, ["/etc/moe-stack/server-help.txt"], entrypoint="cat", remove=True
    )
    assert "--threads" in help_text


def test_emit_time_flag_contract(engine_image: BuiltImage, moe_model: Path, tmp_path: Path) -> None:
    """The seed's `-fmoe` is refused at emit time by engines that lack it; neutral options are written
    in each engine version's syntax."""
    out = tmp_path / "compose.yaml"
    base = [
        "compose",
        "--engine",
        engine_image.engine,
        "--model",
        str(moe_model),
        "--image",
        engine_image.tag,
        "--port",
        str(free_port()),
        "--out",
        str(out),
    ]
    refused = run_cli(*base, "--", "-fmoe")
    assert refused.returncode == 1 and "does not accept -fmoe" in refused.stderr, refused.stderr
    assert not out.exists()
    if engine_image.engine == "ik_llama.cpp":
        assert run_cli(*base, "--flash-attention", "on", "--fused-moe", "--mla", "3").returncode == 0
        assert "- -fa\n    - 'on'\n    - -mla\n    - '3'\n" in out.read_text()
        assert "-fmoe" not in out.read_text()
    else:
        refused = run_cli(*base, "--fused-moe")
        assert refused.returncode == 1 and "llama.cpp does not read --fused-moe" in refused.stderr, (
            refused.stderr
        )
