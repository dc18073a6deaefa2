"""The bilinear read of a compute buffer measured at a rectangle's corners (builder/engines/buffer_grid)."""

from __future__ import annotations

import pytest

from builder.engines.buffer_grid import MIB, Grid


def _mask_like(ctx: int, ubatch: int) -> float:
    """A buffer of a constant, a term per micro-batch token and the f16 mask (ub x ctx x 2 bytes), MiB."""
    return 100.0 + ubatch * 0.25 + ubatch * ctx * 2 / MIB


def test_the_corners_are_read_back_and_a_bilinear_buffer_between_them() -> None:
    corners = [_mask_like(c, u) for c, u in ((32768, 2048), (32768, 512), (8192, 2048))]
    grid = Grid("x", None, 32768, 8192, 2048, 512, *corners)
    for ctx, ubatch in ((32768, 2048), (32768, 512), (8192, 2048), (8192, 512), (16384, 1024)):
        size, inside = grid.size(ctx, ubatch)
        assert size == pytest.approx(_mask_like(ctx, ubatch) * MIB, rel=1e-9) and inside
    # Outside: along the same lines, said to be outside.
    size, inside = grid.size(131072, 4096)
    assert size == pytest.approx(_mask_like(131072, 4096) * MIB, rel=1e-9) and not inside


def test_a_term_in_the_context_alone_needs_the_fourth_corner() -> None:
    def mla(ctx: int, ubatch: int) -> float:  # ik's -mla 3 decompresses the whole cache: ctx alone
        return _mask_like(ctx, ubatch) + ctx * 0.18

    corners = [mla(c, u) for c, u in ((32768, 2048), (32768, 512), (8192, 2048), (8192, 512))]
    assert Grid("x", None, 32768, 8192, 2048, 512, *corners).size(16384, 1024)[0] == pytest.approx(
        mla(16384, 1024) * MIB
    )
    three = Grid("x", None, 32768, 8192, 2048, 512, *corners[:3]).size(8192, 512)[0]
    # Completed as the larger of the mask's form and one in the context alone: over, never under.
    assert three > mla(8192, 512) * MIB * 1.01


def test_a_completed_corner_is_never_under_either_form_of_the_context_term() -> None:
    """Three corners can't tell the mask's term (ub x ctx) from one in the context alone; the completed
    corner takes the larger, whichever micro-batch the preset has."""

    def alone(ctx: int, ubatch: int) -> float:
        return 100.0 + ubatch * 0.25 + ctx * 0.18

    for ubatch, other in ((2048, 512), (512, 2048)):
        for form in (_mask_like, alone):
            corners = [form(c, u) for c, u in ((32768, ubatch), (32768, other), (8192, ubatch))]
            completed = Grid("x", None, 32768, 8192, ubatch, other, *corners).size(8192, other)[0]
            assert completed >= form(8192, other) * MIB * (1 - 1e-9), (ubatch, form.__name__)
