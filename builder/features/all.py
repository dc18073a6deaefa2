"""Every stack feature, in the order compose asks them (the service's parts are added in this order)."""

from __future__ import annotations

from builder.features import Feature
from builder.features.hugepages import Hugepages
from builder.features.keep_prompts import KeepPrompts
from builder.features.monitoring import Monitoring
from builder.features.speculative import Speculative
from builder.features.vision import Vision

FEATURES: tuple[Feature, ...] = (Hugepages(), KeepPrompts(), Monitoring(), Speculative(), Vision())
