"""What an image prints reaches the terminal without its escape sequences and control characters: a
hostile image's moe-stack-bandwidth, as `doctor --bandwidth` runs it, could otherwise set the terminal's
title, write its clipboard (OSC 52) or clear the screen."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from python_on_whales import DockerClient

from tests.cli import run_cli
from tests.integration.conftest import image_with_program

pytestmark = pytest.mark.integration

# Printed to stdout (a figure among sequences), then to stderr before a failed exit.
HOSTILE = "\\033]0;pwned\\007\\033]52;c;aGk=\\007\\302\\2332J\\033[31m"
SCRIPTS = {
    "prints": "#!/bin/sh\nprintf '"
    f"read GB/s 12.5{HOSTILE}\\nread median GB/s 12.0\\nread min GB/s 11.0\\n'\n",
    "fails": f"#!/bin/sh\nprintf 'error: no memory{HOSTILE}\\n' >&2\nexit 1\n",
}


@pytest.fixture
def hostile_images(base_image: str, docker_client: DockerClient, tmp_path: Path) -> Iterator[dict[str, str]]:
    tags = {
        name: image_with_program(
            docker_client,
            base_image,
            tmp_path / name,
            "moe-stack-bandwidth",
            script,
            f"moe-stack-test/hostile-output:{name}-{uuid.uuid4().hex[:8]}",
        )
        for name, script in SCRIPTS.items()
    }
    yield tags
    for tag in tags.values():
        docker_client.image.remove(tag, force=True)


def test_doctor_shows_an_images_output_without_its_terminal_controls(hostile_images: dict[str, str]) -> None:
    for name, tag in hostile_images.items():
        result = run_cli("doctor", "--bandwidth", tag)
        shown = result.stdout + result.stderr
        assert "Traceback" not in shown, shown
        assert not any(c in shown for c in "\x1b\x07\x9b"), repr(shown)
        said = "12.5 GB/s (median 12.0, min 11.0)" if name == "prints" else "error: no memory"
        assert said in " ".join(shown.split()), repr(shown)
