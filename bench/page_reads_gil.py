"""Why KTransformers' restored prompt reads back at 10-28 ms a page (bench/results/kt-hicache-2026-12-05):
the mechanism SGLang's code suggests, timed on this CPython. SGLang's prefetch thread reads each page file
in a few calls that let go of the interpreter's lock (a stat, an open, a read, a close, an allocation, a
copy), while its scheduler loop, waiting for that prefetch, runs Python without a pause. A thread that
let go of the lock gets it back only when the running thread's switch interval (5 ms by default) ends.

This reads `--pages` files of `--page-kib` each (from the page cache: read once before) in a thread, as
SGLang's file backend does, while the main thread waits (idle) or runs a Python loop (busy), at the
default switch interval and at shorter ones. Rounds alternate the candidates; it prints each one's
milliseconds a page (median and range) and its ratio to the idle reads, side by side.

Usage: python bench/page_reads_gil.py [--pages 120] [--page-kib 256] [--rounds 5]
(--page-kib 12288: a page of Qwen3-235B's 94 layers)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

DEFAULT_INTERVAL_S = sys.getswitchinterval()


def read_pages(paths: list[Path], page_bytes: int, pool: np.ndarray) -> None:
    """Each page as SGLang's HiCacheFile.get reads it (exists, open unbuffered, readinto a new buffer),
    then copied into the host pool."""
    for index, path in enumerate(paths):
        if not os.path.exists(path):
            raise FileNotFoundError(path)
        page = np.empty(page_bytes, dtype=np.uint8)
        with open(path, "rb", buffering=0) as handle:
            handle.readinto(page.data)
        np.copyto(pool[index], page)


def timed(paths: list[Path], page_bytes: int, busy: bool, interval_s: float) -> float:
    """Seconds a page, the reads in a thread while the main thread is busy in Python or waits."""
    pool = np.empty((len(paths), page_bytes), dtype=np.uint8)
    sys.setswitchinterval(interval_s)
    try:
        reader = threading.Thread(target=read_pages, args=(paths, page_bytes, pool))
        started = time.perf_counter()
        reader.start()
        while busy and reader.is_alive():  # a scheduler's poll: Python, no sleep
            pass
        reader.join()
        return (time.perf_counter() - started) / len(paths)
    finally:
        sys.setswitchinterval(DEFAULT_INTERVAL_S)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=120)
    parser.add_argument("--page-kib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    page_bytes = args.page_kib * 1024
    candidates = {  # name: (the main thread busy, its switch interval)
        "idle": (False, DEFAULT_INTERVAL_S),
        f"busy, {DEFAULT_INTERVAL_S * 1e3:g} ms": (True, DEFAULT_INTERVAL_S),
        "busy, 0.5 ms": (True, 5e-4),
        "busy, 0.1 ms": (True, 1e-4),
    }
    with tempfile.TemporaryDirectory(prefix="moe-stack-pages-") as directory:
        paths = [Path(directory) / f"page-{index}.bin" for index in range(args.pages)]
        for path in paths:
            path.write_bytes(os.urandom(page_bytes))
        read_pages(paths, page_bytes, np.empty((args.pages, page_bytes), dtype=np.uint8))  # warm-up
        seconds: dict[str, list[float]] = {name: [] for name in candidates}
        for _ in range(args.rounds):
            for name, (busy, interval_s) in candidates.items():
                seconds[name].append(timed(paths, page_bytes, busy, interval_s))
    idle = statistics.median(seconds["idle"])
    print(f"{args.pages} pages of {args.page_kib} KiB, {args.rounds} rounds, Python {sys.version.split()[0]}")
    print(f"{'main thread, switch interval':<30} {'ms a page (range)':<24} {'÷ idle':>7}")
    for name, values in seconds.items():
        median = statistics.median(values)
        spread = f"{median * 1e3:.2f} ({min(values) * 1e3:.2f}-{max(values) * 1e3:.2f})"
        print(f"{name:<30} {spread:<24} {median / idle:>7.1f}")


if __name__ == "__main__":
    main()
