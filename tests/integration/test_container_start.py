"""A container start that a busy host's runtime loses before anything runs ("read init-p: connection reset
by peer") is started once more and said; any other failure is reported at once. The fault is injected by a
`docker` first on PATH that fails the first start as runc does and hands everything else to Docker."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from python_on_whales import DockerClient

from builder.container_start import RUNTIME_LOST_INIT
from builder.contract import IMAGE_UID
from builder.images.chat_page import SandboxRun, run_sandboxed, sandbox_user
from tests.cli import run_cli

pytestmark = pytest.mark.integration

LOST = (
    "docker: Error response from daemon: failed to create task for container: failed to create shim task: "
    "OCI runtime create failed: runc create failed: unable to start container process: error during "
    f"container init: {RUNTIME_LOST_INIT}: unknown"
)


@dataclass(frozen=True)
class FlakyDocker:
    path: str  # PATH with the stand-in first
    lost: Path  # exists once the stand-in failed a start
    starts: Path  # a line per container start asked of it

    def started(self) -> int:
        return len(self.starts.read_text().splitlines()) if self.starts.exists() else 0


def _flaky_docker(directory: Path, lose_first: bool) -> FlakyDocker:
    real = shutil.which("docker")
    assert real is not None
    bin_dir = directory / "bin"
    bin_dir.mkdir()
    flaky = FlakyDocker(f"{bin_dir}:{os.environ['PATH']}", directory / "lost", directory / "starts")
    if not lose_first:
        flaky.lost.touch()
    script = bin_dir / "docker"
    script.write_text(
        "#!/bin/sh\n"
        "starts=no\n"
        'case "$1" in\n'
        "  run|exec) starts=yes ;;\n"
        '  container) case "$2" in run|exec|start) starts=yes ;; esac ;;\n'
        '  compose) for word in "$@"; do case "$word" in up|run) starts=yes ;; esac; done ;;\n'
        "esac\n"
        f'if [ "$starts" = yes ]; then echo "$1" >>{flaky.starts}; fi\n'
        f'if [ "$starts" = yes ] && [ ! -e {flaky.lost} ]; then\n'
        f"  : >{flaky.lost}\n"
        f'  echo "{LOST}" >&2\n'
        "  exit 125\n"
        "fi\n"
        f'exec {real} "$@"\n'
    )
    script.chmod(0o755)
    return flaky


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
    tags = {}
    for name, (program, body) in programs.items():
        context = tmp_path / f"context-{name}"
        context.mkdir()
        (context / "tool").write_text(f"#!/bin/sh\n{body}\n")
        (context / "Dockerfile").write_text(
            f"FROM {base_image}\nCOPY --chmod=0755 tool /usr/local/bin/{program}\n"
        )
        tags[name] = f"moe-stack-test/container-start:{name}-{uuid.uuid4().hex[:8]}"
        docker_client.buildx.build(context, tags=[tags[name]], load=True, progress=False)
    yield tags
    for tag in tags.values():
        docker_client.image.remove(tag, force=True)


def test_doctor_starts_an_image_once_more_when_its_init_was_lost(
    tool_images: dict[str, str], tmp_path: Path
) -> None:
    flaky = _flaky_docker(tmp_path, lose_first=True)
    result = run_cli("doctor", "--bandwidth", tool_images["prints"], env={"PATH": flaky.path})
    assert result.returncode == 0, result.stderr
    assert flaky.lost.exists() and flaky.started() == 2
    assert "12.5 GB/s" in result.stdout
    assert "lost the container's init); starting it again" in " ".join(result.stderr.split())


def test_any_other_failure_is_reported_at_once(tool_images: dict[str, str], tmp_path: Path) -> None:
    flaky = _flaky_docker(tmp_path, lose_first=False)
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
    flaky = _flaky_docker(tmp_path, lose_first=True)
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
