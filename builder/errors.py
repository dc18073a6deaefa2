"""The errors a user can cause or fix. `cli.py` catches `MoeStackError` once and prints one line."""

from __future__ import annotations


class MoeStackError(Exception):
    """A problem the user can act on; `str()` is the one line shown to them (problem + fix)."""


class SpecError(MoeStackError):
    """An invalid engine/target/source/stack choice."""


class SourceError(MoeStackError):
    """The engine source is missing, unreadable or not an engine tree."""


class ModelError(MoeStackError):
    """The model file is missing or not a GGUF."""


class DockerUnavailable(MoeStackError):
    """No Docker daemon (or a required plugin) can be reached."""


class BuildFailed(MoeStackError):
    """`docker buildx build` failed; carries the failing step's tail and the full log's path."""

    def __init__(self, message: str, tail: str = "", log_path: str | None = None) -> None:
        super().__init__(message)
        self.tail = tail
        self.log_path = log_path


INTERRUPTED_MESSAGE = "interrupted; rerun the same command: builds resume from their cache"


class Interrupted(MoeStackError):
    """The user stopped the command (Ctrl-C); what it cached so far is kept."""


class StackError(MoeStackError):
    """The compose stack can't be emitted or started (port in use, unhealthy...)."""


class BaseImageError(MoeStackError):
    """A base image could neither be pulled nor made locally."""
