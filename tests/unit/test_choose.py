"""Which published variant `moe-stack pull` picks, for recorded hosts against the published matrix."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.distribute.choose import choose_variant
from builder.distribute.registry import RegistryError, repository
from builder.errors import SpecError
from builder.host.probe import probe
from builder.images.matrix import buildable
from builder.images.naming import Variant, parse_variant, variant_tag
from builder.platform.pins import pinned_ref
from tests.hosts import EPYC_9554_FLAGS, XEON_EMR_FLAGS, fake_host

AVX2_ONLY_FLAGS = "avx avx2 bmi1 bmi2 f16c fma abm movbe xsave fpu sse4_2 ht"


def _matrix(engine: str) -> list[Variant]:
    """What CI publishes for `engine` (moe-stack matrix), as a registry would list it."""
    return [parse_variant(variant_tag(spec)) for spec in buildable() if spec.engine.name == engine]


def _host(tmp_path: Path, flags: str, smi: str = ""):
    return probe(
        fake_host(tmp_path / "h", flags, sockets=1, cores=8, threads=2, node_gib=64), nvidia_smi_text=smi
    )


def test_zen4_with_a_4090_on_driver_570(tmp_path: Path) -> None:
    host = _host(tmp_path, EPYC_9554_FLAGS, "NVIDIA GeForce RTX 4090, 8.9, 570.86.15, 24564\n")
    choice = choose_variant(host, _matrix("ik_llama.cpp"))
    assert choice.offered.tag.endswith("-cuda12.8-zen4"), (
        "570.86 runs CUDA 12.8 (needs 570.26), not 13.0 (580.65)"
    )
    assert "sm_89" in choice.reason
    assert choose_variant(host, _matrix("ik_llama.cpp"), cpu_only=True).offered.tag.endswith("-cpu-zen4")


def test_xeon_amx_with_an_h200(tmp_path: Path) -> None:
    host = _host(tmp_path, XEON_EMR_FLAGS, "NVIDIA H200, 9.0, 580.159.04, 143771\n")
    assert choose_variant(host, _matrix("llama.cpp")).offered.tag.endswith("-cuda13.0-sapphirerapids")


def test_avx2_machine_without_a_gpu(tmp_path: Path) -> None:
    host = _host(tmp_path, AVX2_ONLY_FLAGS)
    assert choose_variant(host, _matrix("llama.cpp")).offered.tag.endswith("-cpu-avx2"), (
        "avx2 outranks portable"
    )
    only_portable = [o for o in _matrix("llama.cpp") if o.cpu == "portable" and o.cuda is None]
    assert choose_variant(host, only_portable).offered.cpu == "portable"


def test_richest_published_target_when_the_ideal_one_is_missing(tmp_path: Path) -> None:
    host = _host(tmp_path, EPYC_9554_FLAGS + " avx_vnni avx512_vp2intersect")  # Zen 5
    offered = [
        o for o in _matrix("llama.cpp") if o.cpu in ("avx2", "zen4", "sapphirerapids") and o.cuda is None
    ]
    choice = choose_variant(host, offered)
    assert choice.offered.cpu == "zen4" and "a zen5 build would fit it better" in choice.reason


def test_old_driver_falls_back_to_cpu_and_says_why(tmp_path: Path) -> None:
    host = _host(tmp_path, EPYC_9554_FLAGS, "NVIDIA GeForce RTX 4090, 8.9, 535.104.05, 24564\n")
    choice = choose_variant(host, _matrix("llama.cpp"))
    assert (
        choice.offered.tag.endswith("-cpu-zen4")
        and "no CUDA variant fits NVIDIA GeForce RTX 4090" in choice.reason
    )


def test_blackwell_needs_an_image_with_sm_120(tmp_path: Path) -> None:
    host = _host(tmp_path, EPYC_9554_FLAGS, "NVIDIA GeForce RTX 5090, 12.0, 580.65.06, 32607\n")
    assert choose_variant(host, _matrix("llama.cpp")).offered.cuda == "13.0"
    old = [o for o in _matrix("llama.cpp") if o.cuda in ("12.4", "12.6")]
    with pytest.raises(
        SpecError,
        match=r"nearest is \S+-cuda12\.6-zen4: a CUDA 12\.6 image: its GPU archs \(86,89,90\) lack sm_120",
    ):
        choose_variant(host, old)


def test_nothing_fits_names_the_missing_flags(tmp_path: Path) -> None:
    host = _host(tmp_path, AVX2_ONLY_FLAGS)
    zen4_only = [o for o in _matrix("ik_llama.cpp") if o.cpu == "zen4"]
    with pytest.raises(
        SpecError, match=r"nearest is \S+-cpu-zen4: it needs CPU flags this host lacks: avx512f"
    ):
        choose_variant(host, zen4_only)
    gpu_only = [o for o in _matrix("ik_llama.cpp") if o.cpu == "avx2" and o.cuda]
    with pytest.raises(SpecError, match="it is a CUDA image and this host has no NVIDIA GPU"):
        choose_variant(host, gpu_only)


def test_tags() -> None:
    assert parse_variant("0c1e57098-cuda12.8-zen4") == Variant(
        "0c1e57098-cuda12.8-zen4", "0c1e57098", "12.8", "zen4"
    )
    assert parse_variant("ikpy-0.1.5-cpu-avx2").ref == "ikpy-0.1.5"
    assert (
        parse_variant("cpu-avx2") is None
        and parse_variant("latest") is None
        and parse_variant("r-cpu-avx9") is None
    )
    assert parse_variant("ikpy-0.1.5-cpu-avx2").alias == "cpu-avx2"
    assert (
        repository("127.0.0.1:5000/moe-stack/llama-cpp").base_url
        == "http://127.0.0.1:5000/v2/moe-stack/llama-cpp"
    )
    assert repository("ghcr.io/acme/llama-cpp").base_url == "https://ghcr.io/v2/acme/llama-cpp"
    with pytest.raises(RegistryError, match="does not start with a registry host"):
        repository("moe-stack/llama-cpp")


def test_ktransformers_picks_the_amx_pin_on_a_xeon_and_needs_a_gpu(tmp_path: Path) -> None:
    xeon = _host(tmp_path / "x", XEON_EMR_FLAGS, "NVIDIA H200, 9.0, 580.159.04, 143771\n")
    assert (
        choose_variant(xeon, _matrix("ktransformers")).offered.tag
        == f"{pinned_ref('ktransformers')}-cuda12.8-sapphirerapids"
    )
    assert (
        choose_variant(xeon, _matrix("ktransformers-legacy")).offered.tag == "v0.2.4-cuda12.8-sapphirerapids"
    )
    epyc = _host(tmp_path / "e", EPYC_9554_FLAGS, "NVIDIA GeForce RTX 4090, 8.9, 570.86.15, 24564\n")
    assert (
        choose_variant(epyc, _matrix("ktransformers")).offered.tag
        == f"{pinned_ref('ktransformers')}-cuda12.8-zen4"
    )
    with pytest.raises(SpecError, match="it is a CUDA image and this host has no NVIDIA GPU"):
        choose_variant(_host(tmp_path / "n", EPYC_9554_FLAGS), _matrix("ktransformers"))
