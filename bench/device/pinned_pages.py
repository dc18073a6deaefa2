"""What reading a stored prompt back costs SGLang before any byte is read, on the GPU machine: sglang-kt
0.7.2's file backend gets each page into a new zeroed page-locked tensor (memory_pool_host.py's
get_dummy_flat_data_page, `pin_memory=True`, one per page of a prefetch), then copies it into the host
pool. This times those allocations for the pages of a 12.9k-token prompt (201 pages of 64 tokens) at the
widths of the kt-restart measure's 2-layer slice and of the whole model (Qwen3-235B: 94 layers, 4 KV heads
of 128, bf16), fresh and again (torch's host allocator keeps freed pinned blocks), beside unpinned ones.

Usage: python3 pinned_pages.py [OUT_DIR] (prints one JSON line; OUT_DIR/pinned-pages.json as well).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

PAGES, PAGE_TOKENS, KV_HEADS, HEAD_DIM = 201, 64, 4, 128


def seconds_to_allocate(layers: int, pinned: bool) -> float:
    """Seconds to allocate PAGES zeroed pages of `layers` layers' K and V (bf16), all held at once."""
    started = time.perf_counter()
    held = [
        torch.zeros((2, layers, PAGE_TOKENS, KV_HEADS, HEAD_DIM), dtype=torch.bfloat16, pin_memory=pinned)
        for _ in range(PAGES)
    ]
    elapsed = time.perf_counter() - started
    del held
    return round(elapsed, 3)


def main(out: Path | None) -> None:
    torch.cuda.init()
    result: dict[str, object] = {"pages": PAGES}
    for name, layers in (("slice", 2), ("qwen3-235b", 94)):
        page_bytes = 2 * layers * PAGE_TOKENS * KV_HEADS * HEAD_DIM * 2
        result[name] = {
            "page_bytes": page_bytes,
            "pinned_fresh_s": seconds_to_allocate(layers, True),
            "pinned_again_s": seconds_to_allocate(layers, True),
            "unpinned_s": seconds_to_allocate(layers, False),
        }
    line = json.dumps(result)
    print(line, flush=True)
    if out is not None:
        (out / "pinned-pages.json").write_text(line + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else None)
