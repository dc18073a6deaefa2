"""The table of a bench/device/decode_hybrid.sh run: each candidate's decode (median of the rounds, their
range), what it reads per token, and that read rate ÷ the bound read beside it; the CPU side's own rate
once the GPU side's time (the slice all on the GPU) is taken out. `--json` prints summary.json's rows.

    python bench/decode_hybrid_report.py bench/results/decode-bound-2026-12-03/hybrid [--json]
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

SHAPES = {
    "r1": "r1-12 (R1 widths, 3 dense + 9 MoE layers, 32 experts, top-8)",
    "q235": "q235-12 (Qwen3-235B widths, 12 MoE layers, 32 experts, top-8)",
}
# Bits per weight of the expert types, against Q4_0's 4.5 (the slices' routed bytes are Q4_0's).
BITS = {"Q4_0": 4.5, "Q4_0_R8": 4.5, "IQ4_XS": 4.25}


def decode_rates(csv_path: Path) -> dict[str, list[float]]:
    """Each candidate's tg rate per round, in round order."""
    rates: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for line in csv_path.read_text().splitlines():
        if not line.endswith('"tg64"'):
            continue
        candidate, round_, rest = line.split(",", 2)
        rates[candidate].append((int(round_), float(next(csv.reader([rest]))[-3])))
    return {c: [tps for _, tps in sorted(rows)] for c, rows in rates.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()
    bounds = [
        float(b)
        for b in re.findall(r"^read GB/s ([\d.]+)", (options.results / "bench.log").read_text(), re.MULTILINE)
    ]
    bound = statistics.median(bounds)
    routed = {
        m[1]: int(m[2])
        for m in re.finditer(
            r"^(\w+) routed_bytes_per_token (\d+)", (options.results / "models.txt").read_text(), re.MULTILINE
        )
    }
    rates = decode_rates(options.results / "bench.csv")
    gpu_s = {c.split(":")[0]: 1 / statistics.median(r) for c, r in rates.items() if c.endswith(":gpu")}
    rows: list[dict[str, Any]] = []
    for candidate, tps in rates.items():
        if candidate.endswith(":gpu"):
            continue
        slice_, quant, *levers = candidate.split(":")
        per_token = routed[slice_] * BITS[quant] / BITS["Q4_0"]
        median = statistics.median(tps)
        cpu_side = per_token / (1 / median - gpu_s[slice_]) / 1e9
        rows.append(
            {
                "shape": SHAPES[slice_],
                "engine": "ik_llama.cpp",
                "quant": " ".join([quant, *(f"-{lever.replace('=', ' ')}" for lever in levers)]),
                "mode": "hybrid: -ngl 99, routed experts on the CPU, 16 threads unless -t",
                "decode_tps": round(median, 2),
                "decode_tps_range": [round(min(tps), 2), round(max(tps), 2)],
                "routed_bytes_per_token": int(per_token),
                "ratio": round(per_token * median / 1e9 / bound, 3),
                "cpu_side_ratio": round(cpu_side / bound, 3),
                "bound_gbps": round(bound, 1),
            }
        )
    if options.json:
        print(json.dumps(rows, indent=1))
        return
    print(
        f"bound: median {bound:.1f} GB/s of the rounds' bests {bounds}; GPU side (all on the GPU): "
        + ", ".join(f"{s} {t * 1e3:.2f} ms/token" for s, t in gpu_s.items())
    )
    print("| candidate | decode t/s (range) | routed MB/token | routed ÷ bound | CPU side ÷ bound |")
    print("|---|---|---|---|---|")
    for row in rows:
        low, high = row["decode_tps_range"]
        print(
            f"| {row['shape'].split()[0]} {row['quant']} | {row['decode_tps']} ({low}-{high}) | "
            f"{row['routed_bytes_per_token'] / 1e6:.0f} | **{row['ratio']:.2f}** | "
            f"{row['cpu_side_ratio']:.2f} |"
        )


if __name__ == "__main__":
    main()
