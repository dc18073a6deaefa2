"""CPU/CUDA targets, toolchains and the published matrix: what each combination compiles with."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from builder.engines import get_engine
from builder.engines.ktransformers import kt_variant
from builder.errors import SpecError
from builder.images.matrix import buildable, ci_rows, cuda_target, default_image_spec, published, variants
from builder.images.naming import image_spec, short_ref, variant_tag
from builder.images.render import configure_args
from builder.platform.pins import pinned_ref
from builder.platform.targets import CPU_TARGETS, best_cpu_target, cpu_target, fallback_cost
from builder.platform.toolchain import toolchain
from tests.cli import run_cli


def _args(engine: str, cpu: str, cuda: str | None = None) -> list[str]:
    return configure_args(image_spec(get_engine(engine), cpu, cuda=cuda_target(cuda)))


def test_named_targets_compile_for_their_cpu_never_native() -> None:
    for name in ("avx2", "zen4", "zen5", "sapphirerapids"):
        args = _args("ik_llama.cpp", name)
        assert "-DGGML_NATIVE=OFF" in args and f"-DCMAKE_C_FLAGS=-march={cpu_target(name).march}" in args
        assert not any("native" in a.lower() and a != "-DGGML_NATIVE=OFF" for a in args)
    zen4 = _args("ik_llama.cpp", "zen4")
    # ik's HAVE_FANCY_SIMD needs AVX512 F+VNNI+VL+BW+DQ: -march=znver4 defines them all
    assert {"-DGGML_AVX512=ON", "-DGGML_AVX512_VNNI=ON", "-DGGML_AVX512_BF16=ON"} <= set(zen4)
    assert "-DGGML_AMX_INT8=ON" in _args("llama.cpp", "sapphirerapids")


def test_portable_is_runtime_dispatch_of_mainline_and_kt_kernel_only() -> None:
    args = _args("llama.cpp", "portable")
    assert {"-DGGML_BACKEND_DL=ON", "-DGGML_CPU_ALL_VARIANTS=ON", "-DBUILD_SHARED_LIBS=ON"} <= set(args)
    assert not any(a.startswith("-DCMAKE_C_FLAGS=-march") for a in args)
    with pytest.raises(SpecError, match="needs runtime CPU dispatch, which ik_llama.cpp lacks") as refused:
        image_spec(get_engine("ik_llama.cpp"), "portable")
    named = refused.value.args[0].rsplit("(", 1)[1].rstrip(")").split(", ")  # every named target, none stale
    assert set(named) == {name for name, target in CPU_TARGETS.items() if not target.runtime_dispatch}
    assert {"icelake", "zen5", "sapphirerapids"} <= set(named)
    with pytest.raises(SpecError, match="which ktransformers-legacy lacks"):
        image_spec(get_engine("ktransformers-legacy"), "portable", cuda=cuda_target("12.8"))
    assert image_spec(get_engine("ktransformers"), "portable").cpu.runtime_dispatch


def test_toolchains_pick_a_compiler_that_knows_the_cpu() -> None:
    assert toolchain(cpu_target("zen5"), cuda_target(None)).build_image == "debian:trixie-slim"
    jammy = toolchain(cpu_target("zen4"), cuda_target("12.4"))
    assert jammy.build_image == "nvidia/cuda:12.4.1-devel-ubuntu22.04" and jammy.gcc_major == 12
    assert "-DCMAKE_CUDA_HOST_COMPILER=g++-12" in jammy.compiler_args(cuda_target("12.4"))
    noble = toolchain(cpu_target("zen5"), cuda_target("12.8"))
    assert noble.runtime_image == "nvidia/cuda:12.8.1-runtime-ubuntu24.04" and noble.gcc_major == 14
    with pytest.raises(
        SpecError, match="nvcc 12.6 accepts host compilers up to GCC 13; use CUDA 12.8 or newer"
    ):
        toolchain(cpu_target("zen5"), cuda_target("12.6"))


def test_cuda_archs_follow_the_release() -> None:
    assert cuda_target("12.6").archs == (86, 89, 90)
    assert cuda_target("12.8").archs == (86, 89, 90, 120)
    assert "-DCMAKE_CUDA_ARCHITECTURES=86-real;89-real;90-real;120-real" in _args("llama.cpp", "avx2", "13.0")
    with pytest.raises(SpecError, match="unknown CUDA version 11.8"):
        cuda_target("11.8")


def test_best_target_for_a_host() -> None:
    assert best_cpu_target(frozenset(cpu_target("zen4").required_flags)).name == "zen4"
    assert best_cpu_target(frozenset(cpu_target("sapphirerapids").required_flags)).name == "sapphirerapids"
    assert best_cpu_target(frozenset({"sse2", "avx"})) is None
    assert all(
        set(cpu_target("avx2").required_flags) <= set(t.required_flags)
        for t in CPU_TARGETS.values()
        if not t.runtime_dispatch
    )


def test_matrix_lists_every_combination_and_why_some_are_not_built() -> None:
    known = (
        "llama.cpp",
        "ik_llama.cpp",
        "ktransformers",
        "ktransformers-legacy",
    )  # a new engine adds its own
    everything = [v for v in variants() if v.engine in known]
    # llama.cpp family: engines × (cpu + 4 CUDA) × 7 targets + mainline portable; KTransformers: CUDA
    # 12.8 × (7 targets + portable); its legacy 0.2.4: CUDA 12.8 × 7 targets
    assert Counter(v.engine for v in everything) == {
        "llama.cpp": 5 * 7 + 5,
        "ik_llama.cpp": 5 * 7,
        "ktransformers": 8,
        "ktransformers-legacy": 7,
    }
    refused = [(v.engine, v.cuda, v.cpu) for v in everything if v.spec is None]
    assert sorted(refused) == sorted(
        (e, c, "zen5") for e in ("llama.cpp", "ik_llama.cpp") for c in ("12.4", "12.6")
    )
    rows = ci_rows([spec for spec in buildable() if spec.engine.name in known])
    assert len(rows) == 86
    ik = pinned_ref("ik_llama.cpp")
    assert {
        "engine": "ik_llama.cpp",
        "ref": ik,
        "cuda": "12.8",
        "cuda_archs": "86,89,90,120",
        "cpu": "zen5",
        "variant": f"{ik[:12]}-cuda12.8-zen5",
        "tag": f"ghcr.io/moe-stack/ik-llama-cpp:{ik[:12]}-cuda12.8-zen5",
        "tools": "true",
        "timeout_minutes": "259",
    } in rows


@pytest.mark.cli
def test_matrix_json_for_ci() -> None:
    result = run_cli("matrix", "--json")
    assert result.returncode == 0
    assert json.loads(result.stdout)["include"] == ci_rows(buildable())


@pytest.mark.cli
def test_the_default_publish_set_and_its_job_limits() -> None:
    """What every push to main publishes (matrix.yaml's `published`): the variants built before, by the
    suite or a recorded run (tests/unit/test_published.py holds each to its evidence). Each job's limit
    comes from the measured build minutes, inside GitHub's 6 hours."""
    result = run_cli("matrix", "--json", "--set", "default")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)["include"]
    assert len(rows) == len(published()) == 11
    # The image a stack names when given none is published: CPU-only on any host; with a GPU on the hosts
    # a published CUDA image fits (a Zen 4 host, a driver of CUDA 13.0).
    variants_published = {r["variant"] for r in rows}
    zen4 = frozenset(cpu_target("zen4").required_flags)
    for engine, gpu in [(e, g) for e in ("llama.cpp", "ik_llama.cpp") for g in (False, True)] + [
        ("ktransformers", True)
    ]:
        chosen = default_image_spec(get_engine(engine), gpu, "580.95.05", zen4 if gpu else None)
        assert variant_tag(chosen) in variants_published, (engine, gpu)
    limits = {(r["engine"], r["cuda"], r["cpu"]): int(r["timeout_minutes"]) for r in rows}
    assert all(0 < m <= 360 for m in limits.values())
    # mainline CPU: 1.5 x (20 + 4 x 1.25); ik CUDA, four archs: 1.5 x (20 + 3.2 x (16.1 + 4 x 5.5) x 1.25)
    assert limits[("llama.cpp", "none", "avx2")] == 38
    assert limits[("ik_llama.cpp", "13.0", "zen4")] == 259
    assert limits[("ik_llama.cpp", "13.0", "zen4")] > limits[("llama.cpp", "13.0", "zen4")]
    wrong = run_cli("matrix", "--set", "some")
    assert wrong.returncode == 1 and "choose default" in wrong.stderr and "Traceback" not in wrong.stderr


@pytest.mark.cli
def test_the_matrix_table_at_80_columns_cuts_no_tag() -> None:
    """Long cells fold onto more lines instead of ending in an ellipsis (`<ref>-cpu-porta…` before)."""
    result = run_cli("matrix", env={"COLUMNS": "80"})
    assert result.returncode == 0 and "…" not in result.stdout
    assert max(map(len, result.stdout.splitlines())) <= 80
    rows = result.stdout.splitlines()
    tag = f"{short_ref(pinned_ref('llama.cpp'))}-cpu-avx2"
    assert any(row.split()[-1:] == [tag] for row in rows)


RECORDED = {
    name.strip(): frozenset(flags.split())
    for name, _, flags in (
        line.partition(":")
        for line in (Path(__file__).parent / "data/cpuinfo-flags.txt").read_text().splitlines()
        if line and not line.startswith("#")
    )
}


@pytest.mark.parametrize(
    ("family", "target", "kt_kernel"),
    [
        ("skylake-sp", "skylakesp", "avx512_base"),
        ("cascade-lake", "cascadelake", "avx512_vnni"),
        ("ice-lake-sp", "icelake", "avx512_vbmi"),
        ("sapphire-rapids", "sapphirerapids", "amx"),
        ("emerald-rapids", "sapphirerapids", "amx"),
        ("zen4", "zen4", "avx512_bf16"),
        ("zen5", "zen5", "avx512_bf16"),
        ("zen3-desktop", "avx2", "avx2"),
    ],
)
def test_recorded_hosts_get_their_target(family: str, target: str, kt_kernel: str) -> None:
    """Real flag lines of each family: the richest target each runs, and kt-kernel's variant there."""
    flags = RECORDED[family]
    chosen = best_cpu_target(flags)
    assert chosen is not None and chosen.name == target
    assert kt_variant(flags) == kt_kernel
    # ik_llama.cpp's HAVE_FANCY_SIMD needs AVX-512 F, VNNI, VL, BW, DQ: every AVX-512 target but Skylake-SP
    fancy = {"avx512f", "avx512_vnni", "avx512vl", "avx512bw", "avx512dq"} <= set(chosen.required_flags)
    assert fancy == (target not in ("avx2", "skylakesp"))


def test_xeon_targets_compile_for_their_generation() -> None:
    assert "-DCMAKE_C_FLAGS=-march=cascadelake" in _args("ik_llama.cpp", "cascadelake")
    icelake = _args("llama.cpp", "icelake")
    assert "-DCMAKE_C_FLAGS=-march=icelake-server" in icelake and "-DGGML_AVX512_BF16=OFF" in icelake
    assert "-DGGML_AVX512_VNNI=ON" in icelake and "-DGGML_AVX512_VNNI=OFF" in _args("llama.cpp", "skylakesp")


def test_what_a_lesser_target_costs() -> None:
    cost = fallback_cost(cpu_target("cascadelake"), cpu_target("avx2"))
    assert (
        cost.startswith("AVX-512 VNNI (ik_llama.cpp's HAVE_FANCY_SIMD path), AVX-512 left unused")
        and "1.28x" in cost
    )
    assert fallback_cost(cpu_target("zen4"), cpu_target("icelake")).startswith("AVX-512 BF16 left unused")
    assert fallback_cost(cpu_target("icelake"), cpu_target("icelake")) == ""
