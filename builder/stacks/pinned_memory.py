"""Page-locked host memory: with a GPU, ik_llama.cpp's CUDA build keeps every tensor placed on the CPU in
CUDA_Host (pinned) buffers, and mainline does with `--load-mode none` (both seen in their logs on the
H200). Pinned memory can't be swapped, reclaimed or shared: a DeepSeek-R1 stack pins about 340 GB, which
a host must hold besides everything else, and allocations that large are known to fail. Compose and
doctor say what a stack pins, and refuse what the host can't hold."""

from __future__ import annotations

from typing import Literal

from builder.engines import Engine
from builder.engines.base import StackSpec
from builder.errors import SpecError
from builder.models.planner import size
from builder.stacks.document import engine_pins

# Left to the kernel, the engine's own buffers and the page cache beside the pinned weights.
HEADROOM_BYTES = 8 * 1024**3
# Pinning more than this share of RAM is said (not refused): the rest of the host runs in what is left.
WARN_SHARE = 0.5


def pinned_bytes(stack: StackSpec) -> int:
    """The CPU weights `stack`'s engine keeps page-locked (0: mapped from the page cache), at most the
    routed experts and the token embeddings."""
    if not engine_pins(stack):
        return 0
    facts = stack.engine.loaded_model(stack.model, stack.mtp)
    return sum(facts.expert_bytes) + facts.embedding_bytes


def pinning_fix(engine: Engine) -> str:
    """What avoids pinning, for `engine`."""
    if not engine.pins_cpu_weights(True, gpu=True):
        return "keep the weights mapped (--mmap)"
    return (
        f"no setting of {engine} avoids it: use a host with more RAM, a smaller quant, or mainline llama.cpp "
        "(mapped weights, --mmap)"
    )


def pinned_finding(model_bytes: int, ram_bytes: int) -> tuple[Literal["OK", "WARN", "FAIL"], str]:
    """(level, message) for a GPU host and a model: what ik_llama.cpp (always) and mainline with
    --no-mmap would pin, at most the whole model."""
    pinned = (
        f"ik_llama.cpp's CUDA build (always) and mainline llama.cpp with --no-mmap keep the CPU weights, up "
        f"to the model's {size(model_bytes)}, in page-locked memory; this host has {size(ram_bytes)} of RAM"
    )
    if model_bytes > ram_bytes - HEADROOM_BYTES:
        return "FAIL", pinned
    return ("WARN" if model_bytes > WARN_SHARE * ram_bytes else "OK"), pinned


def check_pinned(stack: StackSpec, ram_bytes: int) -> str | None:
    """SpecError when the pinned weights don't fit in `ram_bytes` beside the headroom; a note when they
    take more than half of it; None otherwise."""
    pinned = pinned_bytes(stack)
    if not pinned or not ram_bytes:
        return None
    if pinned > ram_bytes - HEADROOM_BYTES:
        raise SpecError(
            f"{stack.engine} would keep {size(pinned)} of CPU weights in page-locked (pinned) memory and "
            f"this host has {size(ram_bytes)} of RAM ({size(HEADROOM_BYTES)} must stay free); "
            f"{pinning_fix(stack.engine)}"
        )
    if pinned > WARN_SHARE * ram_bytes:
        return (
            f"{stack.engine} keeps {size(pinned)} of CPU weights in page-locked (pinned) memory, "
            f"{pinned / ram_bytes:.0%} of this host's RAM: it can't be swapped or shared with other processes"
        )
    return None
