"""Every architecture `synth-moe` writes, full size and tiny: the seed's three, the families beside them
(synth_families.py), inclusionAI's Ling (synth_ling.py) and Kimi-K3 (synth_delta.py); `synth_shape` gives
one with changes."""

from __future__ import annotations

from dataclasses import replace

from builder.models.synth_delta import KIMI_K3, KIMI_K3_TINY
from builder.models.synth_families import FAMILY_SHAPES
from builder.models.synth_families import FAMILY_TINY_SHAPES as _FAMILY_TINY
from builder.models.synth_ling import LING_SHAPES, LING_TINY_SHAPES
from builder.models.synth_shapes import SEED_SHAPES, TINY_SHAPES, MoeShape

SHAPES: dict[str, MoeShape] = {**SEED_SHAPES, **FAMILY_SHAPES, **LING_SHAPES, "kimi-k3": KIMI_K3}
# Small models of every architecture beyond the seed's three (the suite serves each) and of all of them.
FAMILY_TINY_SHAPES: dict[str, MoeShape] = {**_FAMILY_TINY, **LING_TINY_SHAPES, "kimi-k3": KIMI_K3_TINY}
TINY: dict[str, MoeShape] = {**TINY_SHAPES, **FAMILY_TINY_SHAPES}


def synth_shape(arch: str, tiny: bool = False, **changes: object) -> MoeShape:
    """An architecture's full-size (or tiny) shape with `changes` (ValueError names what is wrong). Fewer
    layers keep as many dense leading layers as still leave one MoE layer; fewer experts than the groups
    can route in route plain top-k."""
    shapes = TINY if tiny else SHAPES
    if arch not in shapes:
        raise ValueError(f"unknown architecture {arch!r}: choose one of {', '.join(shapes)}")
    shape = shapes[arch]
    if hasattr(shape, "dense_layers") and "dense_layers" not in changes:
        layers = int(str(changes.get("layers", shape.layers)))
        changes["dense_layers"] = min(shape.dense_layers, layers - 1)
    if "experts" in changes and "experts_used" not in changes:
        changes["experts_used"] = min(shape.experts_used, int(str(changes["experts"])))
    groups = shape.expert_groups
    if groups and "experts" in changes:
        experts, used = int(str(changes["experts"])), int(str(changes["experts_used"]))
        if experts % groups or used > shape.groups_used * (experts // groups):
            changes.setdefault("expert_groups", 0)  # too few experts to group: plain top-k
            changes.setdefault("groups_used", 0)
    return replace(shape, **changes)  # type: ignore[arg-type]
