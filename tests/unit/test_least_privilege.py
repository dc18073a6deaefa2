"""Least privilege in every variant's Dockerfile (published or built by users): hadolint clean, a
non-root final user,
no secrets in build arguments, environment or labels; every shell script shellcheck-clean."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from builder.contract import IMAGE_UID
from builder.images.render import render_files
from tests.tools import dependency_command
from tests.unit.variants import UNPUBLISHED, all_specs

SECRET_WORDS = re.compile(r"(?i)(token|secret|passw|api[_-]?key|credential|auth)")


def _dockerfiles(tmp_path: Path) -> dict[str, Path]:
    files = {}
    for name, spec in all_specs().items():
        path = tmp_path / f"{name}.Dockerfile"
        path.write_text(render_files(spec)["Dockerfile"])
        files[path.name] = path
    return files


@pytest.mark.lint
def test_every_variant_is_hadolint_clean(tmp_path: Path) -> None:
    files = _dockerfiles(tmp_path)
    assert len(files) == 86 + len(UNPUBLISHED)  # 71 llama.cpp-family, 15 KTransformers published
    result = subprocess.run(
        [dependency_command("hadolint"), "--no-color", *map(str, files.values())],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_variant_runs_as_the_unprivileged_user_and_carries_no_secrets(tmp_path: Path) -> None:
    for name, path in _dockerfiles(tmp_path).items():
        text = path.read_text()
        # The image stages (runtime; tools after it) each end as the unprivileged user.
        for stage in re.split(r"^FROM ", text.split(" AS runtime", 1)[1], flags=re.MULTILINE):
            if stage.startswith("build "):  # the tools' compile stage, not an image
                continue
            users = re.findall(r"^USER (\S+)", stage, re.MULTILINE)
            assert users and users[-1] == f"{IMAGE_UID}:{IMAGE_UID}", f"{name}: stage users {users}"
        assert not re.search(
            r"^ARG ", text.replace("ARG DEBIAN_FRONTEND=noninteractive", ""), re.MULTILINE
        ), f"{name}: build arguments could carry secrets into the image history"
        for line in re.findall(r"^(?:ENV|LABEL)\b.*(?:\n\s+.*)*", text, re.MULTILINE):
            assert not SECRET_WORDS.search(line.replace("moe-stack-api-key", "")), f"{name}: {line[:80]}"


@pytest.mark.lint
def test_shell_scripts_pass_shellcheck() -> None:
    root = Path(__file__).resolve().parents[2]
    scripts = [
        root / ".ci/run",
        *sorted(root.glob("scripts/**/*.sh")),
        *sorted(root.glob("bench/**/*.sh")),
        *sorted(root.glob("dockerfiles/llama-cpp-family/*.sh")),
        *sorted(root.glob("dockerfiles/cuda-base/*.sh")),
        root / "dockerfiles/common/moe-stack-entrypoint",
        root / "dockerfiles/common/moe-stack-health",
        root / "dockerfiles/ktransformers/moe-stack-server",
    ]
    result = subprocess.run(
        [dependency_command("shellcheck"), "--severity=warning", *map(str, scripts)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert len(scripts) > 8 and result.returncode == 0, result.stdout + result.stderr
