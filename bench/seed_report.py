"""Tables of the seed-models device run (bench/device/seed_models.sh): per case the decode and prefill
speed (median, min-max of the rounds), decode against the memory-bandwidth bound (the routed-expert bytes
a token reads from RAM over the read GB/s measured in the same call), GPU memory, the per-layer decode
cost from the two depths and the full-depth estimate beside the seed's own ratio.

  python3 bench/seed_report.py bench/results/seed-models-2026-12-01
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

# The full models' routed-expert bytes a token reads (8 of 256 experts × 58 MoE layers, or 10 of 512 ×
# 48 layers, of the real widths at Q4_0's 4.5 bits: builder.models.synth_moe.token_read_bytes).
FULL = {"r1": (61, 11_494_490_112), "qn": (48, 849_346_560)}
# The seed: ik_llama.cpp, DeepSeek-R1 IQ4_XS (4.25 bits), 15.8 t/s on ~460 GB/s.
SEED_RATIO = 15.8 * 11_494_490_112 * 4.25 / 4.5 / 460e9


def _bandwidth(folder: Path, call: str) -> float:
    text = (folder / f"{call}-bandwidth.txt").read_text()
    return float(re.search(r"read GB/s ([\d.]+)", text).group(1)) * 1e9  # type: ignore[union-attr]


def main(folder: Path) -> None:
    runs = []
    for path in sorted(folder.glob("call*-results.jsonl")):
        call = path.name.split("-")[0]
        for line in path.read_text().splitlines():
            run = json.loads(line)
            run["bandwidth"] = _bandwidth(folder, call)
            runs.append(run)
    print(
        "| case | decode t/s (min-max) | bound t/s | decode / bound | prefill t/s | GPU MiB | CUDA0 compute "
        "MiB |"
    )
    print("|---|---|---|---|---|---|---|")
    for run in runs:
        decode, prefill = run["decode_tps"], run["prefill_tps"]
        bound = run["bandwidth"] / run["token_ram_bytes"]
        compute = sum(
            mib for where, kind, mib in run["buffers_mib"] if where == "CUDA0" and kind == "compute"
        )
        print(
            f"| {run['case']} | {statistics.median(decode):.1f} ({min(decode):.1f}-{max(decode):.1f}) "
            f"| {bound:.1f} "
            f"| {statistics.median(decode) / bound:.2f} | {statistics.median(prefill):.0f} "
            f"| {run['gpu_used_mib']} "
            f"| {compute:.0f} |"
        )
    print()
    print(
        "| engine | model | per-layer decode ms | of which bandwidth ms | full-depth t/s (est.) | full bound "
        "t/s "
        "| full decode / bound | seed's ratio |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for engine in ("ik_llama.cpp", "llama.cpp"):
        for family in ("r1", "qn"):
            times = {}
            for depth in (8, 16):
                decodes = [
                    d
                    for run in runs
                    if run["case"] == f"{engine}:{family}-{depth}"
                    for d in run["decode_tps"]
                ]
                times[depth] = 1 / statistics.median(decodes)
            shallow = next(run for run in runs if run["case"] == f"{engine}:{family}-8")
            deep = next(run for run in runs if run["case"] == f"{engine}:{family}-16")
            per_layer = (times[16] - times[8]) / 8
            per_layer_bytes = (deep["token_ram_bytes"] - shallow["token_ram_bytes"]) / 8
            layers, full_bytes = FULL[family]
            full = 1 / (times[8] + (layers - 8) * per_layer)
            bound = shallow["bandwidth"] / full_bytes
            print(
                f"| {engine} | {family} | {per_layer * 1e3:.2f} "
                f"| {per_layer_bytes / shallow['bandwidth'] * 1e3:.2f} "
                f"| {full:.2f} | {bound:.2f} | {full / bound:.2f} | {SEED_RATIO:.2f} (R1) |"
            )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
