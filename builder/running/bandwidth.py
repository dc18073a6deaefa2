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


@dataclass(frozen=True)
class DecodeBound:
    """Decode's ceiling where the weights stream from RAM: the read rate ÷ the bytes a token reads (the
    active experts in a hybrid stack, every active weight CPU-only). `tune` and `bench` both report
    their decode against it."""

    bandwidth: ReadBandwidth | None  # None: not measured (an image without the tool, too little memory)
    bytes_per_token: int  # weight bytes the CPU reads per decoded token
    hybrid: bool

    @property
    def bandwidth_gbps(self) -> float | None:
        """The bound's read rate: the probe's best round."""
        return self.bandwidth.best if self.bandwidth else None

    @property
    def bound_tps(self) -> float | None:
        """Decode's ceiling: read bandwidth ÷ bytes read per token."""
        return (
            self.bandwidth_gbps * 1e9 / self.bytes_per_token
            if self.bandwidth_gbps and self.bytes_per_token
            else None
        )

    def bound_ratio(self, decode_tps: float) -> float | None:
        bound = self.bound_tps
        return decode_tps / bound if bound else None

    def said(self, decode_tps: float) -> str | None:
        """`decode X t/s = R of the bandwidth bound (...)`, None without a measured bound."""
        ratio = self.bound_ratio(decode_tps)
        if ratio is None or self.bandwidth is None:
            return None
        return (
            f"decode {decode_tps:.2f} t/s = {ratio:.2f} of the bandwidth bound ({self.bandwidth.describe()} "
            f"÷ {self.bytes_per_token / 1e6:.1f} MB read per token)"
        )
