"""The one way moe-stack starts a container (a stack's `up`, a tool's `compose run`, a `docker run` of an
image, a command run in a stack's container, the chat page's sandbox): the start once more when the
container runtime lost the container's init, any other failure at once.

runc's init can lose the pipe to its parent on a loaded host before the program runs at all ("read
init-p: connection reset by peer": moby/moby#42953; gitpod retries it, gitpod-io/gitpod#9247). Nothing of
the container ran, so starting it again is safe; it is said on the caller's progress line (or stderr).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import TypeVar

from python_on_whales.exceptions import DockerException

RUNTIME_LOST_INIT = "read init-p: connection reset by peer"

Started = TypeVar("Started")


def runtime_lost_init(err: BaseException) -> bool:
    """Whether Docker failed to start a container because runc's init was cut off (a host hiccup)."""
    said = getattr(err, "stderr", None) or getattr(err, "stdout", None) or str(err)
    if isinstance(said, bytes):
        said = said.decode(errors="replace")
    return RUNTIME_LOST_INIT in str(said)


def start_container(
    start: Callable[[], Started], what: str, say: Callable[[str], None] | None = None
) -> Started:
    """`start()` (the whole run: a fresh call collects its own output), once more when Docker's runtime
    lost the container's init, saying so through `say` (else on stderr) with `what` it started."""
    try:
        return start()
    except (DockerException, subprocess.CalledProcessError) as err:
        if not runtime_lost_init(err):
            raise
        line = f"Docker could not start {what} (its runtime lost the container's init); starting it again"
        if say is not None:
            say(line)
        else:
            print(f"moe-stack: {line}", file=sys.stderr)
        return start()
