"""The wheelhouse the KTransformers CPU kernel image is built from, made once into the cache: exactly the
wheels of dockerfiles/ktransformers/kt-kernel-cpu.lock (kt-kernel, torch 2.13.0's CPU build from this
kind of host's pip find-links, numpy, gguf, safetensors and what they need), each checked by pip against
its sha256."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from builder.engines.kt_wheels import download_locked, lock_path
from builder.files import cache_dir, file_sha256


def make_kt_wheelhouse() -> Path:
    """The lock's wheels in a directory named after the lock's own sha256 (a new lock, a new one)."""
    target = cache_dir() / "wheelhouses" / f"kt-kernel-cpu-{file_sha256(lock_path())[:16]}"
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".wheelhouse-", dir=target.parent))
    try:
        download_locked(staging)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
