"""A stack's compose file: its files checked on this host, its StackFile built, written atomically."""

from __future__ import annotations

from pathlib import Path

from builder.engines.base import StackSpec
from builder.files import write_file_atomically
from builder.images.image_facts import ImageFacts
from builder.stackfile.host_checks import router_files, stack_files
from builder.stackfile.stack_file import StackFile
from builder.stacks.document import compose_document


def compose_stack(
    stack: StackSpec,
    generated_by: str,
    facts: ImageFacts | None = None,
    check_files: bool = True,
    cpu_profile: tuple[StackSpec, ImageFacts | None] | None = None,
    routed: tuple[StackSpec, ...] = (),
) -> StackFile:
    """`compose_document` for `stack` with its files checked here (`check_files=False`: example stacks
    whose model lives on another machine, paths taken as given); `routed`: several models, one server."""
    files = router_files(stack, routed) if routed else stack_files(stack, check_files)
    return compose_document(stack, generated_by, files, facts, cpu_profile, routed)


def write_stack(stack: StackFile, path: Path) -> Path:
    """Write the compose file atomically; returns its resolved path."""
    return write_file_atomically(path, stack.to_yaml())
