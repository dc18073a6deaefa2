"""A container start that a busy host's runtime loses before anything runs ("read init-p: connection reset
by peer") is started once more and said; any other failure is reported at once. The fault is injected by a
`docker` first on PATH that fails the first start as runc does and hands everything else to Docker."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from python_on_whales import DockerClient

from builder.contract import IMAGE_UID
from builder.images.chat_page import SandboxRun, run_sandboxed, sandbox_user
from builder.models.model_files import DEMO_CHAT_TEMPLATE
from tests.cli import run_cli
from tests.integration.conftest import broken_tree, build_engine_image, emit_stack, image_with_program
from tests.integration.flaky_docker import flaky_docker

pytestmark = pytest.mark.integration
RETRIED = "lost the container's init); starting it again"


def _said(*texts: str) -> str:
    return " ".join(" ".join(texts).split())  # tables wrap their lines


@pytest.fixture
def tool_images(base_image: str, docker_client: DockerClient, tmp_path: Path) -> Iterator[dict[str, str]]:
    """Images whose moe-stack-bandwidth prints a figure, or fails; and whose npm builds a one-file page."""
    programs = {
        "prints": (
            "moe-stack-bandwidth",
            "printf 'read GB/s 12.5\\nread median GB/s 12.0\\nread min GB/s 11.0\\n'",
        ),
        "fails": ("moe-stack-bandwidth", "echo 'error: no memory' >&2; exit 1"),
        "page": ("npm", "mkdir -p dist && echo '<html></html>' >dist/index.html"),
    }
    tags = {
        name: image_with_program(
            docker_client,
            base_image,
            tmp_path / f"context-{name}",
            program,
            f"#!/bin/sh\n{body}\n",
            f"moe-stack-test/container-start:{name}-{uuid.uuid4().hex[:8]}",
        )
        for name, (program, body) in programs.items()
    }
    yield tags
    for tag in tags.values():
        docker_client.image.remove(tag, force=True)


def test_doctor_starts_an_image_once_more_when_its_init_was_lost(
    tool_images: dict[str, str], tmp_path: Path
) -> None:
    flaky = flaky_docker(tmp_path, lose_first=True)
    result = run_cli("doctor", "--bandwidth", tool_images["prints"], env={"PATH": flaky.path})
    assert result.returncode == 0, result.stderr
    assert flaky.lost.exists() and flaky.started() == 2
    assert "12.5 GB/s" in result.stdout
    assert RETRIED in _said(result.stderr)


def test_any_other_failure_is_reported_at_once(tool_images: dict[str, str], tmp_path: Path) -> None:
    flaky = flaky_docker(tmp_path, lose_first=False)
    result = run_cli("doctor", "--bandwidth", tool_images["fails"], env={"PATH": flaky.path})
    shown = " ".join((result.stdout + result.stderr).split())  # the table wraps its lines
    assert "error: no memory" in shown and "starting it again" not in shown
    assert flaky.started() == 1


def test_the_chat_pages_sandbox_starts_once_more_when_its_init_was_lost(
    tool_images: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    flaky = flaky_docker(tmp_path, lose_first=True)
    monkeypatch.setenv("PATH", flaky.path)
    work = tmp_path / "ui"
    work.mkdir()
    uid, gid = sandbox_user()
    if os.getuid() == 0:
        os.chown(work, IMAGE_UID, IMAGE_UID)
    run_sandboxed(SandboxRun(image=tool_images["page"], work=work, uid=uid, gid=gid), work)
    assert (work / "dist" / "index.html").is_file()
    assert flaky.lost.exists() and flaky.started() == 2
    assert "starting it again" in capsys.readouterr().err


def test_a_stack_comes_up_smokes_and_benches_through_lost_starts(
    base_image: str, gemma_model: Path, tmp_path: Path
) -> None:
    """`up` (compose up), `smoke` (its execs in the engine's container) and `bench --tool` (a compose run
    of the tools image) each meet a lost start first, and each starts it again and goes on."""
    server = build_engine_image("llama.cpp", "avx2", base_image)
    build_engine_image("llama.cpp", "avx2", base_image, tools=True)
    compose_file, _ = emit_stack(tmp_path, server, gemma_model, chat_template=DEMO_CHAT_TEMPLATE)
    try:
        up_docker = flaky_docker(tmp_path / "up", lose_first=True)
        up = run_cli("up", str(compose_file), env={"PATH": up_docker.path})
        assert up.returncode == 0 and up_docker.started() == 2, up.stderr
        assert RETRIED in _said(up.stdout, up.stderr)
        smoke_docker = flaky_docker(tmp_path / "smoke", lose_first=True)
        smoke = run_cli("smoke", str(compose_file), "--json", env={"PATH": smoke_docker.path})
        checks = {check["name"]: check for check in json.loads(smoke.stdout)}
        assert smoke_docker.lost.exists() and RETRIED in _said(smoke.stderr)
        assert checks["placement"]["passed"] and checks["flags"]["passed"], checks
    finally:
        run_cli("down", str(compose_file))
    bench_docker = flaky_docker(tmp_path / "bench", lose_first=True)
    bench = run_cli(
        "bench", str(compose_file), "--tool", "llama-bench", "-p", "16", "-n", "4", "-r", "1",
        env={"PATH": bench_docker.path},
    )  # fmt: skip
    assert bench.returncode == 0 and bench_docker.lost.exists(), bench.stderr
    assert RETRIED in _said(bench.stdout, bench.stderr)


def test_a_build_step_the_runtime_lost_is_built_again(base_image: str, tmp_path: Path) -> None:
    """BuildKit starts each build step's container through the same runtime: a build that lost one is run
    once more (its steps before it cached) and said; the build's own failure after it is reported as ever,
    not retried (a tree whose configure step fails)."""
    tree = broken_tree(tmp_path / "llama.cpp")
    docker = flaky_docker(tmp_path / "docker", lose_first=True, builds=True)
    args = ["--source", str(tree), "--ref", "lost-step", "--base-image", base_image]
    result = run_cli(
        "build",
        *args,
        "--namespace",
        "moe-stack-test",
        "--log",
        str(tmp_path / "build.log"),
        env={"PATH": docker.path},
    )
    assert docker.lost.exists() and docker.started() == 2, docker.starts.read_text()
    said = _said(result.stdout, result.stderr)
    assert "lost the container's init); building it again" in said, said[-2000:]
    assert result.returncode == 1 and "deliberate configure failure" in result.stderr, said[-2000:]
