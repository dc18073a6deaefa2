"""Bad input at the command line: one clear line, exit status 1, no traceback, nothing written."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest
import yaml

from builder.distribute.publish import no_variants
from builder.models.synth_moe import MoeShape, write_moe_gguf
from builder.stackfile.host_checks import free_local_port
from tests.cli import run_cli
from tests.specs import mainline_tree

EXAMPLES = Path(__file__).resolve().parents[2] / "compose"


def assert_one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("moe-stack: error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.cli
def test_unknown_engine(tmp_path: Path) -> None:
    result = run_cli("render", "--engine", "vllm", "--out", str(tmp_path / "out"))
    assert_one_line_error(result, "unknown engine 'vllm'", "llama.cpp, ik_llama.cpp")
    assert not (tmp_path / "out").exists()


@pytest.mark.cli
def test_unknown_isa(tmp_path: Path) -> None:
    assert_one_line_error(
        run_cli("render", "--cpu", "avx9", "--out", str(tmp_path / "o")), "unknown CPU target 'avx9'"
    )


@pytest.mark.cli
def test_bad_ref() -> None:
    assert_one_line_error(run_cli("render", "--ref", "a b"), "ref: 'a b' must be", "image tag")


@pytest.mark.cli
def test_source_missing(tmp_path: Path) -> None:
    result = run_cli("build", "--source", str(tmp_path / "missing"), "--dry-run")
    assert_one_line_error(result, "no such file or directory", "pypi:llama-cpp-python")


@pytest.mark.cli
def test_source_not_an_engine_tree(tmp_path: Path) -> None:
    result = run_cli("build", "--engine", "ik_llama.cpp", "--source", str(tmp_path), "--dry-run")
    assert_one_line_error(result, "is not a ik_llama.cpp source tree")


@pytest.mark.cli
def test_model_missing(tmp_path: Path) -> None:
    result = run_cli("compose", "--model", str(tmp_path / "none.gguf"), "--out", str(tmp_path / "c.yaml"))
    assert_one_line_error(result, "does not exist")
    assert not (tmp_path / "c.yaml").exists()


@pytest.mark.cli
def test_port_in_use(tmp_path: Path) -> None:
    """Said last, once the stack itself holds together (a broken model is said first)."""
    from builder.models.synth_moe import MoeShape, write_moe_gguf

    model = write_moe_gguf(tmp_path / "m.gguf", MoeShape(layers=2))
    tmp_path.chmod(0o755)  # uid 10001 reads the model
    model.chmod(0o644)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = run_cli(
            "compose",
            "--model",
            str(model),
            "--skip-image-checks",
            "--port",
            str(port),
            "--out",
            str(tmp_path / "c.yaml"),
        )
    assert_one_line_error(result, f"port {port} on 127.0.0.1 is already in use")
    assert not (tmp_path / "c.yaml").exists()


@pytest.mark.cli
@pytest.mark.parametrize("verb", ["up", "build", "base"])
def test_docker_daemon_unreachable(tmp_path: Path, verb: str) -> None:
    compose_file = tmp_path / "compose.yaml"
    compose_file.write_text(
        (EXAMPLES / "qwen3-235b-a22b.llama.cpp.yaml").read_text()
    )  # a stack file `up` reads
    args = {
        "up": ["up", str(compose_file)],
        "build": ["build", "--source", str(mainline_tree(tmp_path / "src"))],
        "base": ["base"],
    }[verb]
    result = run_cli(*args, env={"DOCKER_HOST": f"unix://{tmp_path}/no-daemon.sock"})
    assert_one_line_error(result, "can't reach the Docker daemon")


@pytest.mark.cli
def test_compose_emits_a_valid_file(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    model = write_moe_gguf(tmp_path / "m.gguf", MoeShape(layers=2))  # compose reads its header
    model.chmod(0o644)
    result = run_cli(
        "compose",
        "--model",
        str(model),
        "--out",
        str(tmp_path / "c.yaml"),
        "--experts-on-cpu",
        "--port",
        "18080",
        "--skip-image-checks",
        "--",
        "--no-warmup",
    )
    assert result.returncode == 0, result.stderr
    text = (tmp_path / "c.yaml").read_text()
    assert "127.0.0.1" in text and "blk\\.[0-9]+\\.ffn_.*_exps\\.weight=CPU" in text and "--no-warmup" in text


@pytest.mark.cli
@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (
            ["--cpu-image", "img:cpu"],
            "--cpu-image adds a CPU-only profile beside a GPU service: give --gpu nvidia",
        ),
        (["--hugetlbfs", "3M"], "--hugetlbfs: Input should be 'off', '2M' or '1G'"),
        (["--shm-size", "lots"], "--shm-size: 'lots' is not a size: give one like 1g"),
        # Named by the option given, not the model's field (ctx_size).
        (["--ctx-size", "5"], "--ctx-size: Input should be greater than or equal to 128"),
    ],
)
def test_compose_option_errors(tmp_path: Path, extra: list[str], needle: str) -> None:
    model = write_moe_gguf(tmp_path / "m.gguf", MoeShape(layers=2))
    result = run_cli(
        "compose",
        "--model",
        str(model),
        "--out",
        str(tmp_path / "c.yaml"),
        "--port",
        "18081",
        "--skip-image-checks",
        *extra,
    )
    assert_one_line_error(result, needle)
    assert not (tmp_path / "c.yaml").exists()


@pytest.mark.cli
def test_up_with_a_profile_the_file_lacks(tmp_path: Path) -> None:
    compose_file = tmp_path / "compose.yaml"
    compose_file.write_text((EXAMPLES / "qwen3-235b-a22b.ktransformers.yaml").read_text())  # no profiles
    assert_one_line_error(
        run_cli("up", str(compose_file), "--profile", "cpu"), "has no profile 'cpu' (it has: none)"
    )
    compose_file.write_text("services: {engine: {image: x}}\n")
    assert_one_line_error(
        run_cli("up", str(compose_file)), "was not written by `moe-stack compose` (no x-moe-stack record)"
    )


@pytest.mark.cli
def test_bundle_of_a_foreign_compose_file(tmp_path: Path) -> None:
    compose_file = tmp_path / "compose.yaml"
    compose_file.write_text("services: {web: {image: nginx}}\n")
    result = run_cli("bundle", str(compose_file), "--out", str(tmp_path / "b.tar"))
    assert_one_line_error(result, "was not written by `moe-stack compose`")
    assert not (tmp_path / "b.tar").exists()


@pytest.mark.cli
@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "does not exist"),
        (b"\x00" * 100, "is truncated or not a tar archive"),
    ],
)
def test_load_refuses_what_is_not_a_bundle(tmp_path: Path, content: bytes | None, needle: str) -> None:
    archive = tmp_path / "b.tar"
    if content is not None:
        archive.write_bytes(content)
    result = run_cli("load", str(archive), "--dest", str(tmp_path / "dest"), "--unverified")
    assert_one_line_error(result, needle)
    assert not (tmp_path / "dest" / "compose.yaml").exists()


@pytest.mark.cli
@pytest.mark.parametrize(
    ("source", "needle"),
    [
        ("acme", "does not start with a registry host"),
        ("127.0.0.1:9/x", "registry 127.0.0.1:9 is unreachable"),  # port 9 (discard): nothing listens
    ],
)
def test_pull_from_nowhere_says_so(source: str, needle: str) -> None:
    assert_one_line_error(run_cli("pull", "--from", source), needle)


@pytest.mark.cli
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--ctx-size", "64"], "--ctx-size: Input should be greater than or equal to 128"),
        (["--cache-type", "q9"], "--cache-type: Input should be 'f32'"),
        (["--ubatch-size", "0"], "--ubatch-size: Input should be greater than or equal to 1"),
    ],
)
def test_plan_holds_the_limits_a_stack_has(tmp_path: Path, args: list[str], needle: str) -> None:
    """`plan` takes its options' limits from the same declaration as `compose` (spec.NeutralOptions)."""
    model = tmp_path / "m.gguf"
    run_cli("synth-moe", str(model), "--tiny")
    assert_one_line_error(run_cli("plan", str(model), *args), needle)


def test_the_default_registry_is_said_to_hold_nothing_yet() -> None:
    """Nothing is published to ghcr.io/moe-stack until images.yml has run: `pull` says so, and what to do."""
    said = no_variants("ghcr.io/moe-stack/llama-cpp", "ghcr.io/moe-stack")
    assert "none has been published yet" in said and "moe-stack build" in said
    assert "published yet" not in no_variants("127.0.0.1:5000/me/llama-cpp", "127.0.0.1:5000/me")


@pytest.mark.cli
@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (
            ["base", "--cuda", "12.8"],
            ["no registry-free CUDA 12.8 base", "12.4 (--cuda-base debian)", "--cuda-base nvidia"],
        ),
        (
            ["base", "--cuda", "12.4", "--suite", "bookworm"],
            ["from Debian trixie's archive", "drop --suite bookworm"],
        ),
        (
            ["render", "--cuda", "12.6", "--cuda-base", "pypi"],
            ["CUDA 12.6 has no compiler in NVIDIA's PyPI wheels"],
        ),
        (["render", "--cuda", "12.4", "--cuda-base", "pypi"], ["--cuda-base debian has it"]),
        (["render", "--cuda-base", "debian"], ["goes with --cuda 12.4"]),
        (["render", "--cuda-base", "pypi"], ["goes with --cuda 13.0"]),
        (
            ["render", "--cuda", "13.0", "--cuda-base", "conda"],
            ["--cuda-base 'conda'", "nvidia", "pypi", "debian"],
        ),
        (
            ["render", "--engine", "ktransformers-legacy", "--cuda", "13.0", "--cuda-base", "pypi"],
            ["drop --cuda-base pypi"],
        ),
        (
            ["render", "--engine", "ktransformers", "--cuda", "13.0"],
            ["sgl_kernel", "link CUDA 12 (libcudart.so.12", "--cuda 12.8"],
        ),
    ],
)
def test_cuda_base_refusals(args: list[str], needles: list[str], tmp_path: Path) -> None:
    """Refused before any download, build or write."""
    if args[0] == "render":
        args = [*args, "--out", str(tmp_path / "out")]
    assert_one_line_error(run_cli(*args), *needles)
    assert not (tmp_path / "out").exists()


@pytest.mark.cli
def test_text_that_looks_like_markup_is_printed_as_is(tmp_path: Path) -> None:
    """A path holding `[/]` once crashed rich's markup parser (MarkupError, a traceback)."""
    out = tmp_path / "x[/]y[bold]"
    result = run_cli("render", "--out", str(out))
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "x[/]y[bold]/Dockerfile" in "".join(result.stdout.split())


@pytest.mark.cli
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["build", "--channel", "edge"], "--no-attest go with --push"),
        (["build", "--registry-cache", "ghcr.io/acme/cache"], "--registry-cache, --metadata-file"),
        (["build", "--no-attest"], "go with --push (CI's image workflows)"),
        (["build", "--push", "--channel", "Edge Nightly"], "a lowercase word such as edge"),
        (
            ["build", "--tools", "--engine", "ktransformers", "--cuda", "12.8", "--dry-run"],
            "ktransformers has no tools image",
        ),
        (["bench", "missing.yaml", "--tool", "llama-bench"], "compose file missing.yaml does not exist"),
        (["bench", "missing.yaml", "--tools-image", "x"], "--tools-image goes with --tool"),
    ],
)
def test_tools_and_channel_errors(args: list[str], needle: str) -> None:
    assert_one_line_error(run_cli(*args), needle)


@pytest.mark.cli
def test_refs_without_upstream_or_pins(tmp_path: Path) -> None:
    assert_one_line_error(run_cli("refs", "--pins", str(tmp_path / "none.yaml")), "no pins file")
    # No network here (nor in CI's sandbox): the first upstream read fails in one line, nothing written.
    pins = tmp_path / "pins.yaml"
    pins.write_text("ik_llama.cpp:\n  ref: 007d640\n  track: branch main\n")
    result = run_cli(
        "refs",
        "--bump",
        "--pins",
        str(pins),
        env={
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_CONFIG_GLOBAL": str(tmp_path / "nogit"),
            "https_proxy": "http://127.0.0.1:9",
        },
    )
    assert_one_line_error(result, "git ls-remote https://github.com/ikawrakow/ik_llama.cpp.git failed")
    assert pins.read_text() == "ik_llama.cpp:\n  ref: 007d640\n  track: branch main\n"


@pytest.mark.cli
def test_tune_refusals(tmp_path: Path) -> None:
    assert_one_line_error(
        run_cli("tune", str(tmp_path / "none.yaml"), "--native-bin", str(tmp_path)),
        "compose file",
        "does not exist",
    )
    assert_one_line_error(run_cli("tune", "x.yaml", "--decode", "--prefill"), "give one, or neither")
    assert_one_line_error(run_cli("tune", "x.yaml", "--budget", "soon"), "a duration such as 20m")
    assert_one_line_error(
        run_cli("tune", "x.yaml", "--model-dir", str(tmp_path)), "--model-dir goes with --native-bin"
    )
    tmp_path.chmod(0o755)  # the stack checks uid 10001 could read the model
    model = write_moe_gguf(tmp_path / "m.gguf", MoeShape(layers=2))
    model.chmod(0o644)
    stack = tmp_path / "s.yaml"
    port = str(free_local_port())  # never the default 8080, which the user's demo may hold
    assert (
        run_cli(
            "compose", "--model", str(model), "--skip-image-checks", "--port", port, "-o", str(stack)
        ).returncode
        == 0
    )
    assert_one_line_error(run_cli("tune", str(stack), "--native-bin", str(tmp_path)), "no llama-bench in")
    model.unlink()
    assert_one_line_error(
        run_cli("tune", str(stack), "--native-bin", str(tmp_path)), "is not on this host (moved or deleted?)"
    )


@pytest.mark.cli
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ((), "pass --expect-sha256 with the sha256 `moe-stack bundle` printed"),
        (("--unverified", "--expect-sha256", "00"), "contradict each other"),
        (("--unverified", "--bind", "everywhere"), "is not an IP address"),
    ],
)
def test_load_wants_a_digest_or_says_it_has_none(tmp_path: Path, args: tuple[str, ...], needle: str) -> None:
    archive = tmp_path / "b.tar"
    archive.write_bytes(b"")
    result = run_cli("load", str(archive), "--dest", str(tmp_path / "dest"), *args)
    assert_one_line_error(result, needle)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["b.tar"]


@pytest.mark.cli
@pytest.mark.parametrize("flag", ["--config-dir", "--draft-model", "--model"])
def test_a_tilde_of_no_user_is_one_line(tmp_path: Path, flag: str) -> None:
    """`~0` expands to user 0's home, and pathlib raises RuntimeError where there is no such user (a
    54-line traceback from `compose --config-dir '~0'`, found by an unseeded bad-input run)."""
    from builder.models.synth_moe import MoeShape, write_moe_gguf

    model = write_moe_gguf(tmp_path / "moe.gguf", MoeShape(layers=2))
    args = {"--model": ["--model", "~0"]}.get(flag, ["--model", str(model), flag, "~0"])
    result = run_cli(
        "compose",
        *args,
        "--skip-image-checks",
        "--port",
        str(free_local_port()),
        "--out",
        str(tmp_path / "c.yaml"),
    )
    assert_one_line_error(result, "~0 names no user")
    assert not (tmp_path / "c.yaml").exists()


def test_presets_refuses_a_file_with_terminal_sequences(tmp_path: Path) -> None:
    """A presets file is data: `presets` would print a description's escape sequences to the terminal
    (here a window title), so the file is refused in one line naming the preset and the key."""
    mine = tmp_path / "mine.yaml"
    mine.write_text('x:\n  description: "\\e]0;title\\a"\n  architecture: a\n  engines: {llama.cpp: {}}\n')
    assert yaml.safe_load(mine.read_text())["x"]["description"] == "\x1b]0;title\x07"  # YAML's escapes
    result = run_cli("presets", "--presets", str(mine))
    assert_one_line_error(result, f"presets file {mine}", "preset x: description: holds a control character")
    assert "\x1b" not in result.stdout + result.stderr and "title" not in result.stdout
