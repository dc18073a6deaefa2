"""`compose --keep-prompts`: the server's prompt cache kept across restarts on the stack's own volume, under a
key of the engine build, the model's content and the cache's shape (a cache of another model or build is
never restored). The engine's store (Engine.prompt_store) says what it keeps: a file per slot, saved and
restored by the image's moe-stack-prompts (the llama.cpp engines), or page files the server writes as it
serves, pruned to a bound (KTransformers' SGLang). The service waits for the last save when it stops."""

from __future__ import annotations

import hashlib
from typing import ClassVar

from builder.contract import PROMPTS_DIR, PROMPTS_ENV, PROMPTS_MAX_ENV, PROMPTS_QUIET_ENV, SLOTS_ENV
from builder.engines.base import StackSpec
from builder.features import Feature, Where
from builder.stackfile.stack_file import Mount, Service, StackFiles

PROMPTS_VOLUME = "prompts"
PROMPTS_MOUNT = Mount(type="volume", source=PROMPTS_VOLUME, target=PROMPTS_DIR)
# How long a stop waits for the server's slots to be saved before Docker kills it (its default is 10 s):
# a long context's cache is gigabytes (Qwen3-235B's f16 KV at 128k tokens: 12 GB), a minute on a slow disk.
PROMPTS_STOP_GRACE = "5m"


class KeepPrompts(Feature):
    refusals: ClassVar[dict[Where, str]] = {
        "router": "--keep-prompts keeps one model's slots: drop it for a stack of several models",
        "kubernetes": "--keep-prompts keeps the slots on a compose volume; a pod would need a "
        "PersistentVolumeClaim (not written yet): drop it for Kubernetes",
    }

    def asked(self, stack: StackSpec) -> bool:
        return stack.keep_prompts

    def host_bytes(self, stack: StackSpec) -> int:
        """The page-locked pool its engine keeps for the kept prompts (KTransformers' host cache)."""
        return kept_prompts_bytes(stack)[1]

    def service_part(self, stack: StackSpec, service: Service, image: str, files: StackFiles) -> Service:
        if not self.asked(stack):
            return service
        environment = service.env | prompts_environment(stack, prompts_key(stack, image, files))
        return with_kept_prompts(service.model_copy(update={"environment": environment}))


def with_kept_prompts(service: Service) -> Service:
    """`service` with the prompts volume mounted and the time its last save takes when it stops (`load`
    rebuilds a bundle's through it too)."""
    return service.model_copy(
        update={"volumes": (*(service.volumes or ()), PROMPTS_MOUNT), "stop_grace_period": PROMPTS_STOP_GRACE}
    )


def prompts_environment(stack: StackSpec, key: str) -> dict[str, str]:
    """What the image's moe-stack-prompts reads for a stack that keeps its prompts under `key`: for an
    engine that saves a file per slot, how many and when a quiet server's are saved; for one that writes
    its files as it serves, the MiB they are pruned to."""
    store = stack.engine.prompt_store
    environment = {PROMPTS_ENV: key}
    if store is not None and store.per_slot:
        environment[SLOTS_ENV] = str(stack.parallel)
        if stack.prompts_saved_after_s is not None:
            environment[PROMPTS_QUIET_ENV] = str(stack.prompts_saved_after_s)
    else:
        environment[PROMPTS_MAX_ENV] = str(max(1, kept_prompts_bytes(stack)[0] // 1024**2))
    return environment


def prompts_key(stack: StackSpec, image: str, files: StackFiles) -> str:
    """The prompt cache's name: the image (its digest where pinned: the engine build), the model (by its
    content: the hash of its headers and tensor index; a stack for another machine by its file's name and
    size; and the checkpoint KTransformers' attention comes from, by its directory's name and weights'
    size) and what shapes a slot's KV cache. A slot saved under one key is restored only into a server
    started under the same: never another model's or build's."""
    shape = (stack.ctx_size, stack.parallel, stack.cache_type, stack.cache_type_v, stack.mla)
    model = files.model_identity or f"{files.model.name}|{files.model_bytes}"
    text = f"{image}|{model}|{shape}"
    if stack.config_dir is not None:
        text += f"|{stack.config_dir.name}|{files.config_weights_bytes}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def kept_prompts_bytes(stack: StackSpec) -> tuple[int, int]:
    """(disk, host memory) of the stack's kept prompts: its engine's files at most, on the stack's volume,
    and the page-locked pool it keeps for them beside the weights; (0, 0) without."""
    store = stack.engine.prompt_store
    if not stack.keep_prompts or store is None:
        return 0, 0
    return store.sizes(stack.kv_bytes())
