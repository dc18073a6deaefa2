"""The host's memory read rate as moe-stack-bandwidth (dockerfiles/common/moe-stack-bandwidth.c) prints
it: the best round (the bound of hybrid decode, which streams the routed experts once per token) and the
spread of the rounds, for `tune` and the bench reports."""

from __future__ import annotations

import re
from dataclasses import dataclass

TOOL = "moe-stack-bandwidth"
ARRAY_MIB = 2048  # far beyond any L3 (Genoa-X has 1152 MB, Emerald Rapids 320 MB)

_LINE = re.compile(r"^read(?: (median|min))? GB/s ([\d.]+)$", re.MULTILINE)


@dataclass(frozen=True)
class ReadBandwidth:
    """GB/s: the best round and, from a tool that prints them, the median and the slowest round."""

    best: float
    median: float | None = None
    low: float | None = None

    def describe(self) -> str:
        spread = f" (median {self.median:.1f}, min {self.low:.1f})" if self.median and self.low else ""
        return f"{self.best:.1f} GB/s{spread}"


def parse_bandwidth(printed: str) -> ReadBandwidth | None:
    """The figures in the tool's output; None when it holds no "read GB/s" line. An older tool printed
    the best round alone."""
    found = {kind or "best": float(value) for kind, value in _LINE.findall(printed)}
    if "best" not in found:
        return None
    return ReadBandwidth(found["best"], found.get("median"), found.get("min"))
