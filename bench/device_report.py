"""Turn the device benchmark's raw output (bench/device/hybrid.sh) into the ratios issue 7 asks for,
as a markdown table and PNG charts beside the raw files.

    python bench/device_report.py bench/results/device-2026-11-30b
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def runs(bench_md: str) -> dict[str, dict[str, float]]:
    """label -> {test: t/s} from the llama-bench markdown tables."""
    found: dict[str, dict[str, float]] = {}
    for block in bench_md.split("## ")[1:]:
        label, _, body = block.partition("\n")
        for row in body.splitlines():
            cells = [c.strip() for c in row.strip("|").split("|")]
            match = re.match(r"^(pp|tg)\d+$", cells[-2]) if len(cells) > 2 else None
            if match:
                found.setdefault(label.strip(), {})[cells[-2]] = float(cells[-1].split("±")[0])
    return found


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def report(directory: Path) -> str:
    results = runs((directory / "bench.md").read_text())
    found = re.search(r"read GB/s ([\d.]+)", (directory / "bandwidth.txt").read_text())
    if found is None:
        raise SystemExit(f"{directory / 'bandwidth.txt'} holds no 'read GB/s' figure")
    bandwidth = float(found[1])
    models = {m["model"]: m for m in map(json.loads, (directory / "models.txt").read_text().splitlines())}
    lines = [
        f"# Device benchmarks ({directory.name})",
        "",
        (
            "Memory read bandwidth (dockerfiles/common/moe-stack-bandwidth.c, 16 threads, best of 5): "
            f"**{bandwidth:.1f} GB/s**."
        ),
        "",
    ]

    # P2: ISA payoff, alternating rounds of the same engine built for two CPU targets.
    lines += [
        "## P2: ISA payoff (llama.cpp CPU-only, A3B 48 layers, 16 threads)",
        "",
        "| round | test | avx2 t/s | sapphirerapids t/s | ratio |",
        "|---|---|---|---|---|",
    ]
    ratios: dict[str, list[float]] = {"pp64": [], "tg32": []}
    for round_ in (1, 2):
        avx2 = results.get(f"P2 round {round_}: llama.cpp cpu-avx2, CPU only, A3B 48 layers", {})
        spr = results.get(f"P2 round {round_}: llama.cpp cpu-sapphirerapids, CPU only, A3B 48 layers", {})
        for test, measured in ratios.items():
            if test in avx2 and test in spr:
                measured.append(spr[test] / avx2[test])
                lines.append(
                    f"| {round_} | {test} | {avx2[test]:.1f} | {spr[test]:.1f} "
                    f"| {spr[test] / avx2[test]:.2f} |"
                )
    for test, measured in ratios.items():
        if measured:
            lines.append(
                f"| all | {test} | | | **{geomean(measured):.2f}** (geometric mean; target ≥ 1.15) |"
            )

    # P3: hybrid decode against the bandwidth bound.
    lines += [
        "",
        "## P3: hybrid decode vs the memory-bandwidth bound (experts on CPU, rest on the H200)",
        "",
        "| engine | model | decode t/s | active expert bytes/token | bound t/s | ratio (target ≥ 0.70) |",
        "|---|---|---|---|---|---|",
    ]
    chart = []
    for engine in ("llama.cpp", "ik_llama.cpp"):
        for model, label in (
            ("a3b", f"P3/P7 {engine} A3B 48l: stack settings (16 threads)"),
            ("q235b", f"P3/P7 {engine} 235B-shape slice: stack settings"),
        ):
            tg = results.get(label, {}).get("tg64")
            if tg is None:
                continue
            per_token = models[model]["active_expert_bytes_per_token"]
            bound = bandwidth * 1e9 / per_token
            chart.append((f"{engine}\n{model}", tg / bound))
            lines.append(
                f"| {engine} | {model} | {tg:.1f} | {per_token / 1e6:.0f} MB "
                f"| {bound:.1f} | {tg / bound:.2f} |"
            )

    lines += [
        "",
        "## Settings (decode t/s; each line one change from the stack's settings)",
        "",
        "| run | t/s |",
        "|---|---|",
    ]
    for label, values in results.items():
        if label.startswith("P3 ") and "tg64" in values:
            lines.append(f"| {label[3:]} | {values['tg64']:.1f} |")

    lines += ["", "## P7: hybrid prefill (t/s)", "", "| run | pp256 | pp512 |", "|---|---|---|"]
    prefill = []
    for label, values in results.items():
        if "pp512" in values and ("P7" in label):
            pp256 = values.get("pp256")
            lines.append(
                f"| {label} | {pp256:.0f} | {values['pp512']:.0f} |"
                if pp256
                else f"| {label} | – | {values['pp512']:.0f} |"
            )
            if pp256:
                prefill.append(
                    (
                        label.split(":")[0].replace("P3/P7 ", "").replace("P7 ", "")
                        + ("\noffload-batch-size=2" if "offload" in label else "\ndefault"),
                        pp256,
                        values["pp512"],
                    )
                )
    _charts(directory, chart, prefill)
    return "\n".join(lines) + "\n"


def _charts(
    directory: Path, decode: list[tuple[str, float]], prefill: list[tuple[str, float, float]]
) -> None:
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    left.bar([name for name, _ in decode], [ratio for _, ratio in decode], color="#4c72b0")
    left.axhline(0.70, color="red", linestyle="--", label="target 0.70")
    left.set_ylabel("decode ÷ (bandwidth ÷ active expert bytes)")
    left.set_title("P3: hybrid decode vs its bandwidth bound")
    left.legend()
    names = [name for name, _, _ in prefill]
    positions = range(len(names))
    right.bar([p - 0.2 for p in positions], [pp256 for _, pp256, _ in prefill], width=0.4, label="pp256")
    right.bar([p + 0.2 for p in positions], [pp512 for _, _, pp512 in prefill], width=0.4, label="pp512")
    right.set_xticks(list(positions), names, fontsize=7)
    right.set_ylabel("prompt tokens/s")
    right.set_title("P7: hybrid prefill, 235B-shape slice")
    right.legend()
    figure.tight_layout()
    figure.savefig(directory / "device-benchmarks.png", dpi=120)


if __name__ == "__main__":
    target = Path(sys.argv[1])
    text = report(target)
    (target / "report.md").write_text(text)
    sys.stdout.write(text)
