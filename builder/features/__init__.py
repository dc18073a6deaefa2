"""What a stack may be asked to do beside serving its model, each feature a module owning all of it: its
checks against the model, what it adds to the GPU's and the host's memory, its part of the engine's service
(mounts, environment, stop grace), the volumes and services it adds to the file, and where it can't go (a
Kubernetes manifest, a router of several models). Engine flags stay in the adapters: a feature writes none.

compose asks the features in FEATURES' order (features/all.py): `refuse` where one can't go, `host_bytes`
for the host's memory (memory_use), `service_part` for the engine's service, `services` for the file; the
volumes follow from the services' mounts (service_parts.stack_document).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from builder.engines.base import StackSpec
from builder.errors import StackError
from builder.stackfile.stack_file import Service, StackFiles

Where = Literal["kubernetes", "router"]


class Feature:
    """A feature that asks for nothing: each module's subclass says what it adds."""

    # Why it can't go where it can't, as the user reads it (one line).
    refusals: ClassVar[dict[Where, str]] = {}

    def asked(self, stack: StackSpec) -> bool:
        raise NotImplementedError

    def host_bytes(self, stack: StackSpec) -> int:
        """Ordinary host memory it takes beside the engine's own (weights, caches, buffers)."""
        return 0

    def service_part(self, stack: StackSpec, service: Service, image: str, files: StackFiles) -> Service:
        """The engine's service with this feature's part (`image`: the one it runs, digest and all; `files`:
        the host files it mounts)."""
        return service

    def services(self, stack: StackSpec, engines: list[str]) -> dict[str, Service]:
        """Services of its own beside the engine's (`engines`: the engine services' names)."""
        return {}


def refuse(features: tuple[Feature, ...], stack: StackSpec, where: Where) -> None:
    """StackError naming the first feature `stack` asks for that can't go `where`."""
    for feature in features:
        if where in feature.refusals and feature.asked(stack):
            raise StackError(feature.refusals[where])
