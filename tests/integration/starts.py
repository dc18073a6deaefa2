"""The suite's own container starts (a command in a running stack's container, a fresh container of an
image), each through builder.container_start like the product's: a busy host's runtime can lose a
container's init before anything ran ("read init-p: connection reset by peer"), and a test that reports
that as the image's failure fails CI on a hiccup (stop 66's CI lost test_keep_prompts to it)."""

from __future__ import annotations

import shlex
import subprocess
from typing import Any

from python_on_whales import Container, DockerClient

from builder.container_start import RUNTIME_LOST_INIT, start_container


def run_in(container: Container, command: list[str]) -> str:
    """What `command` prints run in the running `container`."""
    return str(start_container(lambda: container.execute(command), f"{command[0]} in {container.name}"))


def run_image(client: DockerClient, image: str, command: list[str], **options: Any) -> str:
    """What `command` prints run in a fresh container of `image` (python-on-whales' `run` options)."""
    return str(start_container(lambda: client.run(image, command, **options), f"a container of {image}"))


def docker_run(args: list[str], timeout: int) -> subprocess.CompletedProcess[str]:
    """`docker run --rm ARGS`: its exit status and output as the program left them (the refusals these
    tests read), started again when the runtime lost the container's init."""

    def run() -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            ["docker", "run", "--rm", *args], capture_output=True, text=True, timeout=timeout, check=False
        )
        if RUNTIME_LOST_INIT in result.stderr:
            raise subprocess.CalledProcessError(result.returncode, result.args, result.stdout, result.stderr)
        return result

    return start_container(run, f"`docker run {shlex.join(args)}`")
