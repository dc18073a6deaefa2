"""The tables of a bench/device/decode_hybrid.sh run: each candidate's decode (median of the rounds, their
range), what it reads per token, and that read rate ÷ the bound read beside it; the CPU side's own rate
once the GPU side's time (the slice all on the GPU, same engine) is taken out. Then each prefill candidate
(`pp`) per prompt length, ÷ the seed's command on the same slice. `--json` prints summary.json's rows;
`--rounds 2,3` keeps those rounds alone (one disturbed by something else on the host).

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
    "r1p": "r1p-4 (R1 widths, 1 dense + 3 MoE layers, all 256 experts, top-8 of 4 groups)",
}
# The seed's command (ik_llama.cpp, -mla 3 -fa -fmoe, -ub 512 and its offload threshold by default) as a
# prefill candidate: what the presets' prefill is measured against.
SEED = "pp:ub=512"
# Bits per weight of the expert types, against Q4_0's 4.5 (the slices' routed bytes are Q4_0's).
BITS = {"Q4_0": 4.5, "Q4_0_R8": 4.5, "IQ4_XS": 4.25}
ENGINES = {"ik": "ik_llama.cpp", "ml": "llama.cpp"}


def bench_rates(csv_path: Path, rounds: set[int] | None) -> dict[tuple[str, int], list[float]]:
    """Each candidate's rate per prompt length (0: decode) and round, in round order (each engine's
    llama-bench csv, read by its own header: the two engines' columns differ; ik's log lines between are
    left out)."""
    rates: dict[tuple[str, int], list[tuple[int, float]]] = defaultdict(list)
    header: dict[str, list[str]] = {}
    for line in csv_path.read_text().splitlines():
        candidate, round_, rest = line.split(",", 2)
        fields = next(csv.reader([rest]))
        if fields[0] == "build_commit":
            header[candidate] = fields
        elif candidate in header and len(fields) == len(header[candidate]):
            row = dict(zip(header[candidate], fields, strict=True))
            if rounds is None or int(round_) in rounds:
                rates[candidate, int(row["n_prompt"])].append((int(round_), float(row["avg_ts"])))
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
    measured = bench_rates(options.results / "bench.csv", rounds)
    rows = decode_rows(options.results, rounds, {c: r for (c, prompt), r in measured.items() if not prompt})
    prefill = prefill_rows(options.results.name, {k: r for k, r in measured.items() if k[1]})
    if options.json:
        print(json.dumps(rows + prefill, indent=1))
        return
    print_decode(rows)
    print_prefill(prefill)


def decode_rows(
    results: Path, rounds: set[int] | None, rates: dict[str, list[float]]
) -> list[dict[str, Any]]:
    """summary.json's decode rows: each candidate's median and range, ÷ the bound read in the same rounds."""
    if not rates:
        return []
    reads = re.findall(r"^read GB/s ([\d.]+)", (results / "bench.log").read_text(), re.MULTILINE)
    bounds = [float(b) for n, b in enumerate(reads, 1) if rounds is None or n in rounds]
    bound = statistics.median(bounds)
    routed = {
        m[1]: int(m[2])
        for m in re.finditer(
            r"^(\w+) routed_bytes_per_token (\d+)", (results / "models.txt").read_text(), re.MULTILINE
        )
    }
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
                "bound_gbps_reads": bounds,
                "gpu_side_ms": round(gpu_s[engine, slice_] * 1e3, 2),
                "run": results.name,
            }
        )
    return rows


def prefill_rows(run: str, rates: dict[tuple[str, int], list[float]]) -> list[dict[str, Any]]:
    """summary.json's prefill rows: each candidate's median and range per prompt length, ÷ the seed's
    command on the same slice and prompt."""
    rows: list[dict[str, Any]] = []
    for (candidate, prompt), tps in rates.items():
        engine, slice_, quant, levers = split_candidate(candidate)
        seed = rates.get((f"ik/{slice_}:{quant}:{SEED}", prompt))
        rows.append(
            {
                "shape": SHAPES[slice_],
                "engine": engine,
                "quant": quant_label(quant, [lever for lever in levers if lever != "pp"]),
                "mode": "hybrid prefill: -ngl 99, routed experts in RAM, 16 threads",
                "prompt_tokens": prompt,
                "prefill_tps": round(statistics.median(tps), 1),
                "prefill_tps_range": [round(min(tps), 1), round(max(tps), 1)],
                "vs_seed": round(statistics.median(tps) / statistics.median(seed), 2) if seed else None,
                "run": run,
            }
        )
    return rows


def print_decode(rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    gpu_sides = sorted({f"{r['engine']} {r['shape'].split()[0]} {r['gpu_side_ms']} ms/token" for r in rows})
    print(
        f"bound: median {rows[0]['bound_gbps']:.1f} GB/s of the rounds' bests {rows[0]['bound_gbps_reads']}; "
        f"GPU side (all on the GPU): {', '.join(gpu_sides)}"
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


def print_prefill(rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    print("\n| engine | candidate | prompt | prefill t/s (range) | ÷ the seed's command |")
    print("|---|---|---|---|---|")
    for row in sorted(rows, key=lambda r: (r["prompt_tokens"], r["engine"], r["prefill_tps"])):
        low, high = row["prefill_tps_range"]
        ratio = "" if row["vs_seed"] is None else f"**{row['vs_seed']:.2f}**"
        print(
            f"| {row['engine']} | {row['shape'].split()[0]} {row['quant']} | {row['prompt_tokens']} | "
            f"{row['prefill_tps']} ({low}-{high}) | {ratio} |"
        )


if __name__ == "__main__":
    main()
