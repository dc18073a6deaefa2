"""How a Dockerfile's source stage gets an engine's git ref."""

from __future__ import annotations

import re

from builder.spec import FULL_SHA

_SHORT_SHA = re.compile(r"^[0-9a-f]{7,39}$")


def clone_commands(url: str, ref: str) -> list[str]:
    """Shell commands that put `url` at `ref` into /src, fetching as little history as possible."""
    if _SHORT_SHA.fullmatch(ref):
        # An abbreviated commit can't be fetched by name: clone, then resolve it locally.
        return [f"git clone --quiet {url} /src", f"git -C /src checkout --quiet --detach {ref}"]
    if FULL_SHA.fullmatch(ref):
        return [
            "git init --quiet /src",
            f"git -C /src fetch --quiet --depth 1 {url} {ref}",
            "git -C /src checkout --quiet --detach FETCH_HEAD",
        ]
    return [f"git clone --quiet --depth 1 --branch {ref} {url} /src"]
