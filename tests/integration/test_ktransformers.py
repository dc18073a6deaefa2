"""KTransformers' CPU kernel image, built for real from the same kt-kernel wheel the CUDA images
install, and run under the stack's own security settings: kt-kernel loads the variant its loader
picks for this CPU (or the one a named target pins, or the KT_KERNEL_CPU_VARIANT override), and its
CPU MoE forward on a tiny random expert set matches a NumPy float64 reference.

(SGLang's server, which needs the GPU, is not built here: no nvidia/cuda base image can be pulled.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from python_on_whales import DockerClient

from builder.engines import get_engine
from builder.engines.kt_wheels import canonical_name, read_lock
from builder.engines.ktransformers import kt_variant
from builder.host.probe import probe
from builder.images.build import build_image
from builder.images.image_facts import read_image_facts
from builder.images.naming import image_spec
from builder.models.kt_weights import read_checkpoint, read_converted
from builder.models.synth_hf import write_hf_checkpoint
from builder.models.synth_shapes import TINY_SHAPES
from builder.spec import BaseImages
from tests.cli import run_cli
from tests.hosts import XEON_EMR_FLAGS, fake_host
from tests.integration.flaky_docker import flaky_docker
from tests.integration.starts import docker_run, run_image

pytestmark = pytest.mark.integration

# The stack's container settings (compose._service): no capabilities but the one kt-kernel needs.
LOCKED_DOWN = [
    "--cap-drop",
    "ALL",
    "--security-opt",
    "no-new-privileges:true",
    "--read-only",
    "--tmpfs",
    "/tmp",
]
NUMA_DENIED = "Operation not permitted"


@pytest.fixture(scope="module")
def kt_image(bookworm_base: str, kt_wheelhouse: Path) -> Callable[[str], str]:
    """The kernel image for a CPU target, built from the wheelhouse (once per target)."""
    built: dict[str, str] = {}

    def build(cpu: str) -> str:
        if cpu not in built:
            spec = image_spec(
                get_engine("ktransformers"),
                cpu,
                tree=kt_wheelhouse,
                ref="0.7.2",
                base=BaseImages(build=bookworm_base, runtime=bookworm_base),
                registry="localhost",
                namespace="moe-stack-test",
            )
            built[cpu] = build_image(spec, kt_wheelhouse, show=lambda line: None)
        return built[cpu]

    return build


def run_check(image: str, *docker_args: str) -> tuple[int, dict | None, str]:
    """Run the image (its entrypoint runs moe-stack-kt-check): exit status, the JSON report, all output."""
    result = docker_run([*docker_args, image], timeout=300)
    output = result.stdout + result.stderr
    report = next((json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")), None)
    return result.returncode, report, output


def test_kernel_image_is_the_wheel_not_a_server(
    kt_image: Callable[[str], str], docker_client: DockerClient
) -> None:
    image = kt_image("portable")
    facts = read_image_facts(image)
    assert facts.engine.name == "ktransformers" and facts.cpu_target == "portable"
    assert facts.server_flags == {}  # no SGLang in a CPU-only image
    config = docker_client.image.inspect(image).config
    assert config.user == "10001:10001"
    assert "KT_KERNEL_CPU_VARIANT" not in " ".join(config.env)  # portable: kt-kernel's loader chooses
    listing = run_image(
        docker_client, image, ["-m", "pip", "list", "--format=json"], entrypoint="python3", remove=True
    )
    versions = {canonical_name(p["name"]): p["version"] for p in json.loads(str(listing))}
    assert (
        versions["kt-kernel"] == "0.7.2"
        and versions["torch"].endswith("+cpu")
        and "sglang-kt" not in versions
    )
    # Exactly the hash lock's wheels (and the venv's own pip).
    assert versions == {"pip": versions["pip"], **{wheel.name: wheel.version for wheel in read_lock()}}


def test_portable_image_loads_the_variant_this_cpu_has_and_matches_the_reference(
    kt_image: Callable[[str], str],
) -> None:
    code, report, output = run_check(kt_image("portable"), *LOCKED_DOWN, "--cap-add", "SYS_NICE")
    assert code == 0, output
    assert report is not None and report["kt_kernel"] == "0.7.2"
    # kt-kernel's own rule on this host's /proc/cpuinfo flags (avx512_bf16 on this Zen 5; avx2 on
    # an AVX2-only host; amx on a Xeon with AMX).
    assert report["cpu_variant"] == kt_variant(probe().cpu.flags)
    assert report["ok"] is True and report["errors"]["llamafile"] < 1e-2
    assert NUMA_DENIED not in output  # with SYS_NICE kt-kernel binds its thread pool's memory


def test_the_variant_override_works(kt_image: Callable[[str], str]) -> None:
    code, report, output = run_check(
        kt_image("portable"), *LOCKED_DOWN, "--cap-add", "SYS_NICE", "-e", "KT_KERNEL_CPU_VARIANT=avx2"
    )
    assert code == 0, output
    assert report is not None and report["cpu_variant"] == "avx2" and report["ok"] is True


def test_a_named_target_pins_its_variant(kt_image: Callable[[str], str]) -> None:
    code, report, output = run_check(kt_image("avx2"), *LOCKED_DOWN, "--cap-add", "SYS_NICE")
    assert code == 0, output
    assert report is not None and report["cpu_variant"] == "avx2" and report["ok"] is True


def test_without_sys_nice_the_numa_binding_fails_quietly(kt_image: Callable[[str], str]) -> None:
    """Why KTransformers stacks always get SYS_NICE: without it kt-kernel still runs, unbound, and only
    prints the failure (the silent slowdown ENGINE-FACTS warns about)."""
    code, report, output = run_check(kt_image("portable"), *LOCKED_DOWN)
    assert code == 0 and report is not None and report["ok"] is True
    assert NUMA_DENIED in output


def test_an_amx_image_refuses_this_cpu_at_start_and_at_emit_time(
    kt_image: Callable[[str], str], tmp_path: Path, gemma_model: Path
) -> None:
    if {"amx_tile", "amx_int8", "amx_bf16"} <= probe().cpu.flags:
        pytest.skip("this host has AMX")
    image = kt_image("sapphirerapids")
    code, report, output = run_check(image, *LOCKED_DOWN, "--cap-add", "SYS_NICE")
    assert code == 78 and report is None and "amx_tile" in output
    config = tmp_path / "hf"
    config.mkdir()
    (config / "config.json").write_text("{}")
    (config / "model.safetensors").write_bytes(b"")  # SGLang's weights: a complete --config-dir
    result = run_cli(
        "compose",
        "--engine",
        "ktransformers",
        "--image",
        image,
        "--model",
        str(gemma_model),
        "--gpu",
        "nvidia",
        "--config-dir",
        str(config),
        "-o",
        str(tmp_path / "c.yaml"),
    )
    assert result.returncode == 1
    assert "needs CPU flags this host lacks" in result.stderr and "amx_tile" in result.stderr
    assert not (tmp_path / "c.yaml").exists()


def test_a_stack_from_the_kernel_image_is_refused_in_one_line(
    kt_image: Callable[[str], str], tmp_path: Path, gemma_model: Path
) -> None:
    config = tmp_path / "hf"
    config.mkdir()
    (config / "config.json").write_text("{}")
    (config / "model.safetensors").write_bytes(b"")  # SGLang's weights: a complete --config-dir
    out = tmp_path / "c.yaml"
    common = [
        "compose",
        "--engine",
        "ktransformers",
        "--image",
        kt_image("portable"),
        "--model",
        str(gemma_model),
        "--config-dir",
        str(config),
        "-o",
        str(out),
    ]
    no_gpu = run_cli(*common)
    assert no_gpu.returncode == 1 and "has no CPU-only server: give --gpu nvidia" in no_gpu.stderr
    assert len(no_gpu.stderr.strip().splitlines()) == 1
    no_server = run_cli(*common, "--gpu", "nvidia")
    assert no_server.returncode == 1 and "has no server" in no_server.stderr
    assert not out.exists()


def test_kt_kernel_alone_lacks_the_gpu_kernels_the_build_step_needs(
    kt_wheelhouse: Path, tmp_path: Path
) -> None:
    """The released kt-kernel wheel, unpacked as pip would: sgl_kernel's payload manifest is read from
    it, and the GPU library step refuses it in one line, naming the parts only `ktransformers[sglang]`
    brings (what the CUDA images installed before: kt-kernel and sglang-kt, no meta wheel)."""
    wheel = next(kt_wheelhouse.glob("kt_kernel-*.whl"))
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as unpacked:
        unpacked.extractall(site)
    script = Path(__file__).parents[2] / "dockerfiles/ktransformers/moe-stack-kt-gpu-libs"
    result = subprocess.run(
        [sys.executable, str(script), "--archs", "90", "--site-packages", str(site)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    for part in ("transformers_kt_sgl_kernel_payload", "sglang_kt_sgl_kernel_payload"):
        assert part in result.stderr
    assert "ktransformers_sgl_kernel_payload" in result.stderr and "ktransformers[sglang]" in result.stderr
    assert (site / "sgl_kernel_kt_payload_core/payload.part").is_file()  # kt-kernel's own part is there


STANDIN_TREE = Path(__file__).parent / "data/kt-converter-standin"


def test_kt_convert_runs_the_converter_in_the_image_and_renames_what_it_wrote(
    kt_image: Callable[[str], str], tmp_path: Path
) -> None:
    """`moe-stack kt-convert` for real through Docker, with a stand-in for kt-kernel's converter (which no
    package ships: see the stand-in's docstring) on a recorded two-node AMX host."""
    tmp_path.chmod(0o755)  # as root, the run is the image's user, which reads the checkpoint
    image = kt_image("portable")
    root = fake_host(tmp_path / "host", XEON_EMR_FLAGS, sockets=2, cores=4, threads=1, node_gib=64)
    checkpoint = write_hf_checkpoint(tmp_path / "Qwen3-tiny", TINY_SHAPES["qwen3moe"])
    for path in [checkpoint, *checkpoint.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    args = ["kt-convert", "--model", str(checkpoint), "--source", str(STANDIN_TREE), "--image", image]
    result = run_cli(*args, "--root", str(root))
    assert result.returncode == 0, result.stderr
    seen = json.loads(next(line for line in result.stderr.splitlines() if line.startswith("{")))
    assert seen["uid"] == (os.getuid() or 10001) and seen["network"] == "none" and seen["variant"] == "amx"
    assert seen["args"] == [
        "--input-path", "/model", "--input-type", "fp16", "--output", "/out", "--quant-method", "int4",
        "--cpuinfer-threads", "8", "--threadpool-count", "2",
    ]  # fmt: skip
    assert "config.json" in seen["model_files"] and "model.safetensors" in seen["model_files"]
    layer = read_checkpoint(checkpoint).layer_bytes("AMXINT4")
    assert abs(seen["shm_bytes"] - (2 * layer + 1024**3)) < 4096  # Docker's 64 MiB would not hold a layer
    output = tmp_path / "Qwen3-tiny-AMXINT4"
    weights = read_converted(output)
    assert (weights.numa_pools, weights.moe_layers, weights.method) == (
        2,
        TINY_SHAPES["qwen3moe"].layers,
        "AMXINT4",
    )
    assert (
        output.stat().st_uid == os.getuid()
        and (output / "moe-stack-kt-weights.json").stat().st_uid == os.getuid()
    )
    assert "serve it with: moe-stack compose --engine ktransformers" in result.stdout
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".Qwen3-tiny-AMXINT4")]  # no staging left
    again = run_cli(*args, "--root", str(root))
    assert again.returncode == 1 and "exists; remove it or give another --out" in again.stderr
    # A busy host's runtime losing the converter's start: started once more, said, and converted.
    flaky = flaky_docker(tmp_path / "flaky-docker", lose_first=True)
    retried = run_cli(
        *args, "--root", str(root), "--out", str(tmp_path / "retried"), env={"PATH": flaky.path}
    )
    assert retried.returncode == 0 and flaky.started() == 2, retried.stderr
    assert "lost the container's init); starting it again" in " ".join(retried.stderr.split())
    assert read_converted(tmp_path / "retried").moe_layers == TINY_SHAPES["qwen3moe"].layers

    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps({**config, "moe_stack_standin_fail": "out of memory"}))
    failed = run_cli(*args, "--root", str(root), "--out", str(tmp_path / "failed"))
    assert failed.returncode == 1
    assert failed.stderr.splitlines()[-1] == (
        f"moe-stack: error: kt-kernel's converter failed in {image}: Error during conversion: out of memory"
    )
    assert not (tmp_path / "failed").exists() and not [
        p for p in tmp_path.iterdir() if p.name.startswith(".failed")
    ]
