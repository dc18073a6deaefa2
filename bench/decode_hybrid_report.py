"""The table of a bench/device/decode_hybrid.sh run: each candidate's decode (median of the rounds, their
range), what it reads per token, and that read rate ÷ the bound read beside it; the CPU side's own rate
once the GPU side's time (the slice all on the GPU, same engine) is taken out. `--json` prints
summary.json's rows; `--rounds 2,3` keeps those rounds alone (one disturbed by something else on the host).

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
ENGINES = {"ik": "ik_llama.cpp", "ml": "llama.cpp"}


def decode_rates(csv_path: Path, rounds: set[int] | None) -> dict[str, list[float]]:
    """Each candidate's decode rate per round, in round order (each engine's llama-bench csv, read by its
    own header: the two engines' columns differ)."""
    rates: dict[str, list[tuple[int, float]]] = defaultdict(list)
    header: dict[str, list[str]] = {}
    for line in csv_path.read_text().splitlines():
        candidate, round_, rest = line.split(",", 2)
        fields = next(csv.reader([rest]))
        if fields[0] == "build_commit":
            header[candidate] = fields
        elif candidate in header and len(fields) == len(header[candidate]):
            row = dict(zip(header[candidate], fields, strict=True))
            if row["n_prompt"] == "0" and (rounds is None or int(round_) in rounds):
                rates[candidate].append((int(round_), float(row["avg_ts"])))
    return {c: [tps for _, tps in sorted(rows)] for c, rows in rates.items()}


def split_candidate(candidate: str) -> tuple[str, str, str, list[str]]:
    """ENGINE/SLICE:TYPE[:LEVER...] (the first run's candidates have no ENGINE: ik_llama.cpp's)."""
    engine, _, rest = candidate.rpartition("/")
    slice_, quant, *levers = rest.split(":")
    return ENGINES[engine or "ik"], slice_, quant, levers


def quant_label(quant: str, levers: list[str]) -> str:
    """`exps=Q4_0_R8 -gr 1`: the type and the flags, as the table says them."""
    words = [quant.replace("exps=", "experts ") if quant.startswith("exps=") else quant]
    return " ".join([*words, *(f"-{lever.lstrip('-').replace('=', ' ')}" for lever in levers)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--rounds", help="comma-separated round numbers to keep (default: all)")
    options = parser.parse_args()
    rounds = {int(r) for r in options.rounds.split(",")} if options.rounds else None
    bounds = [
        float(b)
        for n, b in enumerate(
            re.findall(r"^read GB/s ([\d.]+)", (options.results / "bench.log").read_text(), re.MULTILINE), 1
        )
        if rounds is None or n in rounds
    ]
    bound = statistics.median(bounds)
    routed = {
        m[1]: int(m[2])
        for m in re.finditer(
            r"^(\w+) routed_bytes_per_token (\d+)", (options.results / "models.txt").read_text(), re.MULTILINE
        )
    }
    rates = decode_rates(options.results / "bench.csv", rounds)
    gpu_s = {split_candidate(c)[:2]: 1 / statistics.median(r) for c, r in rates.items() if c.endswith(":gpu")}
    rows: list[dict[str, Any]] = []
    for candidate, tps in rates.items():
        if candidate.endswith(":gpu"):
            continue
        engine, slice_, quant, levers = split_candidate(candidate)
        per_token = routed[slice_] * BITS[quant.removeprefix("exps=")] / BITS["Q4_0"]
        median = statistics.median(tps)
        cpu_side = per_token / (1 / median - gpu_s[engine, slice_]) / 1e9
        rows.append(
            {
                "shape": SHAPES[slice_],
                "engine": engine,
                "quant": quant_label(quant, levers),
                "mode": "hybrid: -ngl 99, routed experts on the CPU, 16 threads unless -t",
                "decode_tps": round(median, 2),
                "decode_tps_range": [round(min(tps), 2), round(max(tps), 2)],
                "routed_bytes_per_token": int(per_token),
                "ratio": round(per_token * median / 1e9 / bound, 3),
                "cpu_side_ratio": round(cpu_side / bound, 3),
                "bound_gbps": round(bound, 1),
                "run": options.results.name,
            }
        )
    if options.json:
        print(json.dumps(rows, indent=1))
        return
    print(
        f"bound: median {bound:.1f} GB/s of the rounds' bests {bounds}; GPU side (all on the GPU): "
        + ", ".join(f"{e} {s} {t * 1e3:.2f} ms/token" for (e, s), t in gpu_s.items())
    )
    print("| engine | candidate | decode t/s (range) | routed MB/token | routed ÷ bound | CPU side ÷ bound |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        low, high = row["decode_tps_range"]
        print(
            f"| {row['engine']} | {row['shape'].split()[0]} {row['quant']} | "
            f"{row['decode_tps']} ({low}-{high}) | "
            f"{row['routed_bytes_per_token'] / 1e6:.0f} | **{row['ratio']:.2f}** | "
            f"{row['cpu_side_ratio']:.2f} |"
        )


if __name__ == "__main__":
    main()
