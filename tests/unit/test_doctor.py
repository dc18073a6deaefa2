"""Doctor findings for recorded hosts: each problem is named with the command that fixes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builder.host.probe import probe
from builder.models.facts import ModelFacts
from builder.platform.toolchain import highest_cuda
from builder.running.bandwidth import ReadBandwidth
from builder.stacks.doctor import Finding, bandwidth_finding, diagnose
from tests.cli import run_cli
from tests.hosts import EPYC_9554_FLAGS, XEON_EMR_FLAGS, fake_host
from tests.kt_layout import write_converted

GIB = 1024**3


def _by_topic(findings: list) -> dict:
    return {f.topic: f for f in findings}


def test_driver_to_cuda() -> None:
    assert highest_cuda("570.86.15") == "12.8"
    assert highest_cuda("580.159.04") == "13.0"
    assert highest_cuda("550.54.14") == "12.4"
    assert highest_cuda("535.183.01") is None


def test_epyc_4090_with_numa_balancing_on(tmp_path: Path) -> None:
    root = fake_host(
        tmp_path, EPYC_9554_FLAGS, sockets=2, cores=64, threads=2, node_gib=288, numa_balancing=1
    )
    host = probe(root, nvidia_smi_text="NVIDIA GeForce RTX 4090, 8.9, 570.86.15, 24564\n")
    found = _by_topic(
        diagnose(
            host, docker_ok=True, gpu_runtime_ok=False, free_disk_bytes=500 * GIB, model_bytes=355 * 10**9
        )
    )
    assert found["cpu"].message.startswith("best CPU target: zen4")
    assert "-t 128" in found["cores"].message
    assert (
        found["numa_balancing"].level == "WARN"
        and found["numa_balancing"].fix == "sudo sysctl -w kernel.numa_balancing=0"
    )
    assert "arch 89" in found["gpu"].message and "CUDA images up to 12.8" in found["gpu"].message
    # Driver 570: the 12.8 images, and why not 13.0; their base only from NVIDIA's registry.
    assert "stacks name the cuda12.8 images (cuda13.0 needs driver 580.65+)" in found["gpu"].message
    assert (
        "nvidia/cuda:12.8 image; without a registry, build cuda12.4 images on `moe-stack base --cuda 12.4` "
        "(Debian's non-free archive)" in found["gpu"].message
    )
    assert found["gpu_runtime"].level == "FAIL" and "nvidia-ctk runtime configure" in found["gpu_runtime"].fix
    assert found["model"].level == "OK"


def test_model_too_large_says_by_how_much(tmp_path: Path) -> None:
    root = fake_host(tmp_path, XEON_EMR_FLAGS, sockets=1, cores=56, threads=2, node_gib=256)
    host = probe(root, nvidia_smi_text="NVIDIA H200, 9.0, 580.159.04, 143771\n")
    found = _by_topic(diagnose(host, True, True, 500 * GIB, model_bytes=500 * GIB))
    # RAM 256 GiB + VRAM 143771 MiB (140.4 GiB) = 396.4 GiB; the model and the server's 8 GiB prompt
    # cache and 2 GiB of buffers: 510 - 396.4 = 113.6 GiB short
    model = found["model"]
    assert (
        model.level == "FAIL"
        and "need 510.0 GiB, 113.6 GiB more than RAM + VRAM (396.4 GiB)" in model.message
    )
    # With a GPU: what ik_llama.cpp and mainline's --no-mmap would pin, against the RAM
    assert found["pinned-memory"].level == "FAIL" and "page-locked" in found["pinned-memory"].message
    r1 = _by_topic(diagnose(host, True, True, 500 * GIB, model_bytes=200 * GIB))["pinned-memory"]
    assert r1.level == "WARN" and "--mmap" in r1.fix
    assert _by_topic(diagnose(host, True, True, 500 * GIB))["cpu"].message.startswith(
        "best CPU target: sapphirerapids"
    )
    gpu = _by_topic(diagnose(host, True, True, 500 * GIB))["gpu"].message
    assert (
        "stacks name the cuda13.0 images, their base needs no registry (`moe-stack base --cuda 13.0`" in gpu
    )


def test_two_sockets_say_what_each_placement_costs(tmp_path: Path) -> None:
    """The seed's dual-EPYC question: interleave, bind to one node, or a copy per node (2x the weights)."""
    root = fake_host(tmp_path, EPYC_9554_FLAGS, sockets=2, cores=32, threads=2, node_gib=384)
    host = probe(root, nvidia_smi_text="")
    r1 = _by_topic(diagnose(host, True, True, 500 * GIB, model_bytes=355 * GIB))
    assert "177.5 GiB of the weights on each node" in r1["numa-interleave"].message
    assert r1["numa-membind"].level == "OK" and "fit its RAM (384.0 GiB)" in r1["numa-membind"].message
    mirror = r1["numa-mirror"]
    assert mirror.level == "OK" and "would take 710.0 GiB of the 768.0 GiB RAM" in mirror.message
    assert "neither pinned engine has it" in mirror.message
    big = _by_topic(diagnose(host, True, True, 500 * GIB, model_bytes=400 * GIB))
    assert (
        big["numa-membind"].level == "WARN"
        and "exceed a node's RAM (384.0 GiB)" in big["numa-membind"].message
    )
    assert big["numa-mirror"].level == "WARN" and "more RAM" in big["numa-mirror"].fix
    one = probe(
        fake_host(tmp_path / "one", XEON_EMR_FLAGS, sockets=1, cores=56, threads=2, node_gib=256),
        nvidia_smi_text="",
    )
    assert not any(f.topic.startswith("numa-") for f in diagnose(one, True, True, 500 * GIB, model_bytes=GIB))


@pytest.mark.cli
def test_doctor_cli_on_a_recorded_tree(tmp_path: Path) -> None:
    root = fake_host(
        tmp_path / "host",
        EPYC_9554_FLAGS,
        sockets=2,
        cores=32,
        threads=2,
        node_gib=288,
        numa_balancing=1,
        thp="never",
    )
    result = run_cli("doctor", "--root", str(root), "--json")
    findings = {f["topic"]: f for f in json.loads(result.stdout)}
    assert findings["thp"]["level"] == "WARN" and "madvise" in findings["thp"]["fix"]
    assert findings["numa"]["message"].startswith("2 NUMA node(s) (node0: 32 cores")
    assert result.returncode == (1 if any(f["level"] == "FAIL" for f in findings.values()) else 0)


def test_cuda_bases_present_partial_or_absent(tmp_path: Path) -> None:
    host = probe(fake_host(tmp_path, EPYC_9554_FLAGS, sockets=1, cores=32, threads=2, node_gib=384))
    devel, runtime = "moe-stack/cuda:13.0-devel", "moe-stack/cuda:13.0-runtime"

    def finding(present: dict[str, bool] | None) -> object:
        return _by_topic(diagnose(host, True, True, 500 * GIB, cuda_bases=present)).get("cuda_base")

    both = finding({devel: True, runtime: True})
    assert both.level == "OK" and devel in both.message and "--cuda 13.0 --cuda-base pypi" in both.message
    debian = finding(
        {devel: True, runtime: True, "moe-stack/cuda:12.4-devel": True, "moe-stack/cuda:12.4-runtime": True}
    )
    assert "--cuda 12.4 --cuda-base debian" in debian.message
    # 12.4 absent altogether is no problem: only a release with one of its two images is
    assert finding({devel: True, runtime: True, "moe-stack/cuda:12.4-devel": False}).level == "OK"
    half = finding({devel: True, runtime: False})
    assert half.level == "WARN" and f"{runtime} is not" in half.message and "base --cuda 13.0" in half.fix
    none = finding({devel: False, runtime: False})
    assert (
        none.level == "OK"
        and "nvidia/cuda" in none.message
        and "moe-stack base --cuda 13.0 (driver 580+) or 12.4 (550+)" in none.fix
    )
    assert finding(None) is None, "without Docker there is nothing to say"


def test_an_amx_xeon_is_told_about_ktransformers_amx_weights_and_an_epyc_is_not(tmp_path: Path) -> None:
    findings = {}
    for name, flags in (("xeon", XEON_EMR_FLAGS), ("epyc", EPYC_9554_FLAGS)):
        host = probe(fake_host(tmp_path / name, flags, sockets=1, cores=32, threads=2, node_gib=256))
        findings[name] = _by_topic(
            diagnose(host, docker_ok=True, gpu_runtime_ok=False, free_disk_bytes=500 * GIB)
        )
    amx = findings["xeon"]["amx"]
    assert "AMXINT4/AMXINT8" in amx.message and amx.fix.startswith("moe-stack kt-convert --model CHECKPOINT")
    assert "amx" not in findings["epyc"]


def test_the_doctor_says_whether_a_checkpoints_amx_weights_are_converted(tmp_path: Path) -> None:
    host = probe(fake_host(tmp_path / "xeon", XEON_EMR_FLAGS, sockets=2, cores=32, threads=2, node_gib=256))
    checkpoint = tmp_path / "Qwen3-235B-A22B"

    def amx() -> Finding:
        findings = diagnose(host, True, False, 500 * GIB, checkpoint=checkpoint)
        return _by_topic(findings)["amx"]

    missing = amx()
    assert missing.level == "WARN" and "has no converted weights beside it" in missing.message
    assert missing.fix.startswith(f"moe-stack kt-convert --model {checkpoint} --source")
    write_converted(tmp_path / "Qwen3-235B-A22B-AMXINT8", pools=1, method="AMXINT8")
    wrong = amx()
    assert wrong.level == "WARN" and "converted for 1 NUMA pool(s); this host has 2" in wrong.message
    assert "--numa-pools 2" in wrong.fix
    write_converted(tmp_path / "Qwen3-235B-A22B-AMXINT4", pools=2)
    ready = amx()
    assert ready.level == "OK" and "Qwen3-235B-A22B-AMXINT4 (AMXINT4, 2 NUMA pool(s))" in ready.message


def test_doctor_names_a_registry_free_base_for_each_driver_and_gpu() -> None:
    """Issue 30: which CUDA images a driver runs, and which of them build without NVIDIA's registry."""
    from builder.stacks.doctor import _cuda_images

    # 580+: the newest images, on the PyPI base
    assert _cuda_images("13.0", "580.159.04", 90).endswith(
        "their base needs no registry (`moe-stack base --cuda 13.0`, from NVIDIA's PyPI wheels)"
    )
    # 550-559 (an RTX 4090 host on an older LTS driver): 12.4, from Debian's archive
    assert _cuda_images("12.4", "550.163.01", 89) == (
        "stacks name the cuda12.4 images (cuda13.0 needs driver 580.65+), their base needs no registry "
        "(`moe-stack base --cuda 12.4`, from Debian's non-free archive)"
    )
    # 560-579: 12.6/12.8 come from NVIDIA's registry; 12.4 builds without one for archs up to sm_90 ...
    assert _cuda_images("12.6", "565.57.01", 86).endswith(
        "nvidia/cuda:12.6 image; without a registry, build cuda12.4 images on `moe-stack base --cuda 12.4` "
        "(Debian's non-free archive)"
    )
    # ... but not for Blackwell (sm_120 needs 12.8): registry-only below driver 580
    assert _cuda_images("12.8", "570.86.15", 120).endswith(
        "no registry-free base runs arch 120 on this driver (CUDA 12.8 is registry-only here)"
    )


def test_the_bandwidth_finding_gives_decode_its_ceiling() -> None:
    # A read rate of 100 GB/s; a model whose layers hold 2 GB of routed experts each (8 of 256 read a
    # token) beside 10 GB of other weights: hybrid reads 60 x 62.5 MB, CPU-only 10 GB more.
    rate = ReadBandwidth(100.0, 90.0, 80.0)
    moe = ModelFacts("deepseek2", 60, (2 * 10**9,) * 60, 10 * 10**9, 1, 1, 1, None, 256, 8)
    found = bandwidth_finding("moe-stack/llama-cpp:cpu-zen4", rate, moe)
    assert found.level == "OK"
    assert found.message == (
        "memory read rate 100.0 GB/s (median 90.0, min 80.0), best of 5 rounds (moe-stack-bandwidth in "
        "moe-stack/llama-cpp:cpu-zen4); hybrid decode can't pass 26.7 t/s (3750.0 MB read a token), "
        "CPU-only decode can't pass 7.3 t/s (13750.0 MB read a token)"
    )
    dense = ModelFacts("llama", 32, (0,) * 32, 4 * 10**9, 8, 128, 128)
    assert bandwidth_finding("x", rate, dense).message.endswith(
        "; CPU-only decode can't pass 25.0 t/s (4000.0 MB read a token)"
    )
    assert bandwidth_finding("x", rate, None).message.endswith("(moe-stack-bandwidth in x)")
    refused = bandwidth_finding("x", "no image x in the Docker store", moe)
    assert (refused.level, refused.message) == ("WARN", "no read rate: no image x in the Docker store")
    assert "moe-stack images" in refused.fix
