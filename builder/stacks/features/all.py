"""Every stack feature, in the order compose asks them (the service's parts are added in this order)."""

from __future__ import annotations

from builder.stacks.features import Feature
from builder.stacks.features.hugepages import Hugepages
from builder.stacks.features.keep_prompts import KeepPrompts
from builder.stacks.features.monitoring import Monitoring
from builder.stacks.features.speculative import Speculative
from builder.stacks.features.vision import Vision

FEATURES: tuple[Feature, ...] = (Hugepages(), KeepPrompts(), Monitoring(), Speculative(), Vision())
