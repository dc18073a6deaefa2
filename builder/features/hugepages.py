"""Weights from the host's reserved hugepages: `--hugepages` (ik_llama.cpp maps them itself: its -thp, the
adapter's flag) or `--hugetlbfs 2M|1G` (any engine that maps its weights: the image's entrypoint copies the
model onto a hugetlbfs volume of that page size at start, so the mapping is backed by the pool). The pool
is the host's: placement checks it holds the model before anything is written."""

from __future__ import annotations

from typing import ClassVar

from builder.contract import HUGETLBFS_DIR, HUGETLBFS_ENV, IMAGE_UID
from builder.engines.base import StackSpec
from builder.features import Feature, Where
from builder.stackfile.stack_file import Mount, Service, StackFiles, Volume

HUGETLBFS_VOLUME = "hugepages"
HUGETLBFS_MOUNT = Mount(type="volume", source=HUGETLBFS_VOLUME, target=HUGETLBFS_DIR)


class Hugepages(Feature):
    refusals: ClassVar[dict[Where, str]] = {
        "router": "a stack of several models has one service and no hugetlbfs copy of each: drop --hugetlbfs",
    }

    def asked(self, stack: StackSpec) -> bool:
        """The model staged on a hugetlbfs volume (-thp is the adapter's alone: no part of the service)."""
        return stack.hugetlbfs != "off"

    def service_part(self, stack: StackSpec, service: Service, image: str, files: StackFiles) -> Service:
        """The volume the entrypoint copies the model onto (where: staging_environment, which every
        container of the stack gets with the entrypoint's other variables)."""
        if not self.asked(stack):
            return service
        return service.model_copy(update={"volumes": (*(service.volumes or ()), HUGETLBFS_MOUNT)})


def staging_environment(stack: StackSpec) -> dict[str, str]:
    """What tells the image's entrypoint to stage the model on the hugetlbfs volume."""
    return {HUGETLBFS_ENV: HUGETLBFS_DIR} if stack.hugetlbfs != "off" else {}


def hugetlbfs_volume(page_size: str | None) -> dict[str, Volume]:
    """The hugetlbfs volume of `page_size` pages, by name ({}: none): a mount the engine's user owns; Docker
    mounts it at the first start and unmounts it (its pages back to the pool) when the last container using
    it stops."""
    if page_size is None:
        return {}
    options = {
        "type": "hugetlbfs",
        "device": "hugetlbfs",
        "o": f"pagesize={page_size},uid={IMAGE_UID},gid={IMAGE_UID},mode=0700",
    }
    return {HUGETLBFS_VOLUME: Volume(driver="local", driver_opts=options)}
