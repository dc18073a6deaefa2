"""What `up` says while the engine loads a model (a 150-400 GB model takes minutes, and `compose up
--wait` says nothing until it is healthy): the engine's newest log line, with the seconds since `up`
began, each time it changes. The log is read beside the wait, never instead of it."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from python_on_whales import DockerClient
from python_on_whales.exceptions import DockerException

from builder.untrusted_text import printable

POLL_S = 1.0
WIDTH = 160  # a line is cut to this many characters
# A loader's progress dots (llama.cpp's "....") alone on a line.
_DOTS = re.compile(r"^[.\s]*$")


def newest_line(log: str) -> str | None:
    """The log's last line worth showing (terminal controls out, cut to WIDTH); None when it has none."""
    for line in reversed(printable(log).splitlines()):
        if not _DOTS.match(line):
            text = " ".join(line.split())
            return text if len(text) <= WIDTH else text[: WIDTH - 1] + "…"
    return None


@contextmanager
def watching_load(client: DockerClient, service: str, say: Callable[[str], None]) -> Iterator[None]:
    """While the block runs (compose's wait), `say` the service's newest log line whenever it changes,
    and once more when it ends (a load faster than one poll still says where it got)."""
    stop = threading.Event()
    started = time.monotonic()
    shown: list[str] = []

    def tell() -> None:
        try:
            log = client.compose.logs(services=[service], tail="20", no_log_prefix=True)
        except DockerException:
            return  # not created yet, or going away: the wait says what went wrong
        line = newest_line(str(log))
        if line is not None and line not in shown[-1:]:
            say(f"loading ({time.monotonic() - started:.0f} s): {line}")
            shown.append(line)

    def watch() -> None:
        while not stop.wait(POLL_S):
            tell()

    thread = threading.Thread(target=watch, name=f"watch-{service}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        tell()
