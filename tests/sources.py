"""The source mirror the suite builds engines from: MOE_STACK_SOURCES, else the one beside the checkout
(../shared/sources, as CI and the development machines have it); None where there is neither."""

from __future__ import annotations

from pathlib import Path

from builder.images.mirror import mirror_dir

SHARED_SOURCES = Path(__file__).resolve().parents[2] / "shared" / "sources"


def source_mirror() -> Path | None:
    return mirror_dir(None) or (SHARED_SOURCES if SHARED_SOURCES.is_dir() else None)
