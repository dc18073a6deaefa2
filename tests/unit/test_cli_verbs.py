"""The verbs that need no Docker daemon, run as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
import yaml

from builder.engines import get_engine
from builder.engines.compute_buffers import gpu_reserve
from builder.images.matrix import cuda_target
from builder.images.naming import image_spec
from builder.images.render import configure_args
from builder.models.gguf_facts import read_facts
from builder.models.planner import GIB
from builder.stackfile.host_checks import free_local_port
from tests.cli import run_cli
from tests.specs import mainline_tree


def _tiny_model(directory: Path) -> Path:
    """`synth-moe --tiny` into `directory`, readable by the image's user."""
    directory.chmod(0o755)
    model = directory / "m.gguf"
    run_cli("synth-moe", str(model), "--tiny")
    model.chmod(0o644)
    return model


@pytest.mark.cli
def test_render_writes_a_build_context(tmp_path: Path) -> None:
    result = run_cli(
        "render",
        "--engine",
        "ik_llama.cpp",
        "--cpu",
        "zen4",
        "--cuda",
        "12.8",
        "--out",
        str(tmp_path / "ctx"),
    )
    assert result.returncode == 0, result.stderr
    names = sorted(p.name for p in (tmp_path / "ctx").iterdir())
    assert names == [
        "Dockerfile",
        "build-info.sh",
        "ccache-objects.sh",
        "ccache.conf",
        "cuda-no-lineinfo.sh",
        "image.json",
        "moe-stack-bandwidth.c",
        "moe-stack-entrypoint",
        "moe-stack-health",
        "moe-stack-hugecopy.c",
        "moe-stack-prompts",
        "required-cpu-flags",
    ]
    assert json.loads((tmp_path / "ctx/image.json").read_text())["cuda_archs"] == [86, 89, 90, 120]


@pytest.mark.cli
def test_dry_run_prints_both_build_calls(tmp_path: Path) -> None:
    tree = mainline_tree(tmp_path / "src")
    result = run_cli(
        "build",
        "--source",
        str(tree),
        "--ref",
        "mine",
        "--dry-run",
        env={"XDG_CACHE_HOME": str(tmp_path / "cache")},
    )
    assert result.returncode == 0, result.stderr
    contract, image = result.stdout.strip().splitlines()
    assert contract.startswith("docker buildx build ") and "--target contract" in contract
    assert f"--build-context engine-src={tree}" in image and "--load" in image
    context = image.split()[-1]
    assert Path(context).parent == tmp_path / "cache/moe-stack/contexts"
    assert (
        Path(context).name.startswith("llama-cpp-mine-cpu-avx2-") and (Path(context) / "Dockerfile").is_file()
    )


@pytest.mark.cli
def test_a_render_never_changes_what_a_build_reads(tmp_path: Path) -> None:
    """A dry run (or a build) of the same variant on another base used to overwrite the first build's
    Dockerfile while it compiled; each set of files now has its own directory, and the same files
    are found, not written again."""
    tree = mainline_tree(tmp_path / "src")
    cache = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    contexts = []
    for base in ("debian:trixie-slim", "mirror.local/debian:trixie-slim", "debian:trixie-slim"):
        result = run_cli(
            "build", "--source", str(tree), "--ref", "mine", "--dry-run", "--base-image", base, env=cache
        )
        assert result.returncode == 0, result.stderr
        contexts.append(Path(result.stdout.strip().splitlines()[-1].split()[-1]))
        if len(contexts) == 1:
            first = (contexts[0] / "Dockerfile").read_text()
            written = (contexts[0] / "Dockerfile").stat().st_mtime_ns
    assert contexts[0] != contexts[1] and contexts[0] == contexts[2]
    assert (contexts[0] / "Dockerfile").read_text() == first and "FROM debian:trixie-slim" in first
    assert (contexts[0] / "Dockerfile").stat().st_mtime_ns == written, "the same files are not written again"
    assert "FROM mirror.local/debian:trixie-slim" in (contexts[1] / "Dockerfile").read_text()


@pytest.mark.cli
def test_cmake_args_match_the_image(tmp_path: Path) -> None:
    result = run_cli(
        "cmake-args",
        "--engine",
        "ik_llama.cpp",
        "--cpu",
        "sapphirerapids",
        "--cuda",
        "13.0",
        "--cuda-archs",
        "90",
        "--no-ccache",
    )
    assert result.returncode == 0, result.stderr
    spec = image_spec(get_engine("ik_llama.cpp"), "sapphirerapids", cuda=cuda_target("13.0", (90,)))
    assert result.stdout.splitlines() == [a for a in configure_args(spec) if "_COMPILER_LAUNCHER=" not in a]


@pytest.mark.cli
def test_synth_moe_and_plan(tmp_path: Path) -> None:
    model = tmp_path / "tiny.gguf"
    made = run_cli("synth-moe", str(model), "--tiny", "--layers", "2", "--experts", "4")
    assert made.returncode == 0 and model.is_file(), made.stderr
    assert len(gguf.GGUFReader(str(model)).tensors) == 1 + 12 * 2 + 2
    planned = run_cli("plan", str(model), "--vram-gb", "80", "--ram-gb", "8", "--json")
    assert planned.returncode == 0, planned.stderr
    doc = json.loads(planned.stdout)
    assert doc["layers"] == 2 and doc["gpu_expert_layers"] == 2 and doc["override_tensor"] == []
    # RAM: the weights left there, the engine's 8 GiB prompt cache and 2 GiB of its own buffers
    assert doc["prompt_cache_bytes"] == 8 * 2**30
    assert doc["ram_total_bytes"] == doc["cpu_bytes"] + 10 * 2**30
    assert doc["kept_prompts_disk_bytes"] == doc["kv_bytes"] > 0  # --keep-prompts: at most the KV cache
    refused = run_cli("synth-moe", str(tmp_path / "x.gguf"), "--tiny", "--hidden", "100")
    assert refused.returncode == 1 and "multiple of 32" in refused.stderr


@pytest.mark.cli
def test_synth_moe_writes_a_projector_that_plan_and_compose_take(tmp_path: Path) -> None:
    model, projector = tmp_path / "tiny.gguf", tmp_path / "mmproj-tiny.gguf"
    made = run_cli("synth-moe", str(model), "--tiny", "--mmproj", str(projector))
    assert made.returncode == 0 and projector.is_file(), made.stderr
    plain = json.loads(run_cli("plan", str(model), "--json").stdout)
    planned = run_cli("plan", str(model), "--mmproj", str(projector), "--json")
    assert planned.returncode == 0, planned.stderr
    doc = json.loads(planned.stdout)
    assert doc["projector_bytes"] > 0 and doc["gpu_bytes"] - plain["gpu_bytes"] == doc["projector_bytes"]
    out = tmp_path / "c.yaml"
    tmp_path.chmod(0o755)  # the engine's user reads the model's directory
    composed = run_cli(
        "compose", "--model", str(model), "--mmproj", str(projector), "--skip-image-checks",
        "--out", str(out), "--port", str(free_local_port()),
    )  # fmt: skip
    assert composed.returncode == 0, composed.stderr
    stack = yaml.safe_load(out.read_text())
    command = stack["services"]["engine"]["command"]
    assert command[command.index("--mmproj") + 1] == "/models/mmproj-tiny.gguf"
    assert stack["x-moe-stack"]["serves"]["engine"]["images"] is True
    refused = run_cli(
        "synth-moe", str(tmp_path / "hf"), "--tiny", "--format", "hf", "--mmproj", str(projector)
    )
    assert refused.returncode == 1 and refused.stderr.strip().endswith("drop --format hf")


@pytest.mark.cli
def test_compose_fits_experts_to_vram(tmp_path: Path) -> None:
    model = _tiny_model(tmp_path)
    # 0.0105 GiB over llama.cpp's compute reserve for this model (-ub 512, 4096 tokens) = 11,274,289 B;
    # minus other weights (1,065,120 B) and the f16 KV cache (2 heads × 128 × 4096 × 4 layers × 2 B =
    # 8,388,608 B) leaves 1,820,561 B: two expert layers of 835,584 B fit, three do not
    reserve = gpu_reserve(get_engine("llama.cpp").buffer_fits, read_facts(model), 4096, 512, latent=False)
    out = tmp_path / "c.yaml"
    result = run_cli(
        "compose",
        "--model",
        str(model),
        "--skip-image-checks",
        "--out",
        str(out),
        "--port",
        str(free_local_port()),
        "--gpu",
        "nvidia",
        "--fit-vram-gb",
        str((reserve + 1.0105 * GIB) / GIB),  # and the 1 GiB margin the plan keeps free
        "-c",
        "4096",
        "-ub",
        "512",  # a GPU stack's derived -ub is 2048
        "--cache-type",
        "f16",
    )
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    assert (
        "blk\\.(0|1)\\.ffn_.*_exps\\.weight=CUDA0" in text
        and "blk\\.[0-9]+\\.ffn_.*_exps\\.weight=CPU" in text
    )


@pytest.mark.cli
def test_compose_for_ktransformers_from_a_preset_and_a_vram_plan(tmp_path: Path) -> None:
    model = _tiny_model(tmp_path)
    config = tmp_path / "hf"
    config.mkdir(mode=0o755)
    (config / "config.json").write_text("{}")
    (config / "config.json").chmod(0o644)
    (config / "model.safetensors").write_bytes(b"")  # SGLang loads the non-expert weights from here
    out = tmp_path / "c.yaml"
    result = run_cli(
        "compose",
        "--engine",
        "ktransformers",
        "--model",
        str(model),
        "--skip-image-checks",
        "--out",
        str(out),
        "--port",
        str(free_local_port()),
        "--preset",
        "qwen3-235b-a22b",
        "--kt-method",
        "LLAMAFILE",
        "--config-dir",
        str(config),
        "--gpu",
        "nvidia",
        "--fit-vram-gb",
        "3.0105",  # as above, with the 1 GiB margin
        "-c",
        "4096",
        "--numa",
        "none",
    )
    assert result.returncode == 0, result.stderr
    command = yaml.safe_load(out.read_text())["services"]["engine"]["command"]
    # The same 1,820,561 B the llama.cpp plan above fits two expert layers into, as experts of every
    # layer: one expert in all 4 layers is 4 × 835,584 / 8 B, so 4 per layer.
    assert command[command.index("--kt-num-gpu-experts") + 1] == str(1_820_561 // (4 * 835_584 // 8)) == "4"
    assert command[command.index("--context-length") + 1] == "4096"
    assert "--override-tensor" not in command and "--cache-type-k" not in command


@pytest.mark.cli
def test_thinking_is_one_option_each_engine_writes_its_own_way(tmp_path: Path) -> None:
    """`--thinking off` on the Qwen3 preset: mainline's --reasoning off, ik_llama.cpp's --reasoning-budget 0;
    a token budget ik_llama.cpp lacks, a contradiction, a bad value: one line each, exit 1."""
    model = _tiny_model(tmp_path)
    out = tmp_path / "c.yaml"
    common = ["compose", "--model", str(model), "--skip-image-checks", "--port", "18563", "-o", str(out)]
    common += ["--preset", "qwen3-235b-a22b"]
    for engine, written in (
        ("llama.cpp", ["--reasoning", "off"]),
        ("ik_llama.cpp", ["--reasoning-budget", "0"]),
    ):
        emitted = run_cli(*common, "--engine", engine, "--thinking", "off")
        assert emitted.returncode == 0, emitted.stderr
        command = yaml.safe_load(out.read_text())["services"]["engine"]["command"]
        at = command.index(written[0])
        assert command[at : at + 2] == written, command
    for given, said in (
        (["--engine", "ik_llama.cpp", "--reasoning-budget", "512"], "--reasoning-budget is a switch"),
        (["--thinking", "off", "--reasoning-budget", "512"], "--thinking off with --reasoning-budget 512"),
        (["--thinking", "maybe"], "--thinking: Input should be 'on', 'off' or 'auto'"),
    ):
        refused = run_cli(*common, *given)
        assert refused.returncode == 1 and said in refused.stderr, refused.stderr
        assert refused.stderr.count("\n") == 1, refused.stderr


@pytest.mark.cli
def test_idle_unload_is_a_duration_mainline_reads_and_others_refuse(tmp_path: Path) -> None:
    model = _tiny_model(tmp_path)
    out = tmp_path / "c.yaml"
    common = ["compose", "--model", str(model), "--skip-image-checks", "--port", "18562", "-o", str(out)]
    emitted = run_cli(*common, "--idle-unload", "10m")
    assert emitted.returncode == 0, emitted.stderr
    command = yaml.safe_load(out.read_text())["services"]["engine"]["command"]
    assert command[command.index("--sleep-idle-seconds") + 1] == "600"
    refused = run_cli(*common, "--engine", "ik_llama.cpp", "--idle-unload", "10m")
    assert refused.returncode == 1 and "does not read --idle-unload" in refused.stderr, refused.stderr
    bad = run_cli(*common, "--idle-unload", "soon")
    assert bad.returncode == 1 and "--idle-unload: 'soon' is not a duration" in bad.stderr, bad.stderr
