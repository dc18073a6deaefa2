"""KTransformers' persistent prompt cache (`compose --keep-prompts`): SGLang's hierarchical cache with its
file backend, as sglang-kt 0.7.2 serves it (its mem_cache/hiradix_cache.py, hicache_storage.py and
managers/cache_controller.py; run on the H200: bench/results/kt-hicache-2026-12-05).

A prompt's KV cache is copied to a pool in host memory when its prefill ends, and from there to a file
per page of tokens. A server started on the same directory looks a new prompt's pages up in the files
and reads them back instead of prefilling them. The image's moe-stack-prompts
(dockerfiles/ktransformers) names the directory, removes other keys' files and keeps them within the
bound: SGLang removes none."""

from __future__ import annotations

from builder.engines.base import PromptStore
from builder.errors import StackError
from builder.models.facts import ModelFacts
from builder.platform.flags import check_choice, has_flag

# The host pool as a multiple of the GPU's KV pool (SGLang's default --hicache-ratio; it must be over 1):
# page-locked memory beside the weights.
HOST_RATIO = 2
# Tokens a page, and so a file (SGLang's default of 1 writes a file a token).
PAGE_TOKENS = 64
# The files at most, as KV caches of the stack's context: the four longest prompts it can take.
DISK_SHARE = 4.0
STORE = PromptStore(disk_share=DISK_SHARE, host_share=float(HOST_RATIO))

# Each flag and its value (None: a switch):
# - the storage backend works only under the hierarchical cache (the flag alone stops the scheduler);
# - write_through copies each prompt to the host pool as its prefill ends (write_back only on eviction,
#   so a prompt still on the GPU at a stop would never reach a file);
# - wait_complete reads a stored prefix back before the request runs (best_effort reads what arrived by
#   the time it is scheduled: almost nothing on an idle server);
# - no binding of the scheduler to the GPU's NUMA node, which a container without SYS_NICE can't do.
FLAGS: tuple[tuple[str, str | None], ...] = (
    ("--enable-hierarchical-cache", None),
    ("--hicache-ratio", str(HOST_RATIO)),
    ("--hicache-storage-backend", "file"),
    ("--hicache-write-policy", "write_through"),
    ("--hicache-storage-prefetch-policy", "wait_complete"),
    ("--page-size", str(PAGE_TOKENS)),
    ("--disable-hicache-numa-detect", None),
)


def hicache_args(facts: ModelFacts, flags: dict[str, str] | None, who: str) -> list[str]:
    """The server's flags that keep the prompts of a model with `facts`, checked against the image's
    contract `flags`; StackError where its cache can't be kept whole."""
    if facts.recurrent_state_bytes:
        raise StackError(
            f"{who} can't keep {facts.arch}'s prompts: SGLang's hierarchical cache holds attention's KV "
            "cache only (MHA and MLA), not the recurrent layers' state; drop --keep-prompts"
        )
    if facts.indexer_dim or facts.indexer_layers:
        raise StackError(
            f"{who} can't keep {facts.arch}'s prompts: SGLang's files hold the attention cache but not the "
            "sparse-attention indexer's keys, which a prompt read back would lack; drop --keep-prompts"
        )
    args: list[str] = []
    for flag, value in FLAGS:
        if not has_flag(flags, flag):
            raise StackError(
                f"this {who} build has no {flag}, which --keep-prompts needs: drop --keep-prompts"
            )
        if value is not None:
            check_choice(flags, flag, value, who)
        args += [flag] if value is None else [flag, value]
    return args
