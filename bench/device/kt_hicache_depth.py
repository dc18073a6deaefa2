"""KTransformers' prompt cache across a restart at several depths of one preset's widths (kt_hicache.py
with KT_GPU_LAYERS), side by side: each depth's seconds to the first token of the long prompts cold and
after a restart (read back from the files), their ratio, and each time's line through the depths followed
to the model's own depth. A slice's fixed costs (the request, the scheduler) weigh on few layers; what
grows per layer (the prefill's work, the pages read back) is what a whole model pays 94 times.

Usage: kt_hicache_depth.py RUN_DIR... (each holding a kt-hicache.json)
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

# The models' depths (num_hidden_layers of their config.json on Hugging Face).
FULL_DEPTH = {"qwen3-235b-a22b": 94, "deepseek-r1-671b": 61}


def times(run_dir: Path) -> tuple[str, int, list[float], list[float]]:
    """(preset, layers, the long prompts' cold seconds, their seconds after the restart, from the files)."""
    result = json.loads((run_dir / "kt-hicache.json").read_text())
    shape = result["shape"]
    first, restarted = result["runs"]
    for entry in restarted["long"]:
        details = entry.get("cached_tokens_details") or {}
        if not details.get("storage"):
            raise SystemExit(f"{run_dir}: a restarted long prompt read nothing from the files: {entry}")
    return (
        result["preset"],
        int(shape[shape.index("--layers") + 1]),
        [entry["seconds"] for entry in first["long"]],
        [entry["seconds"] for entry in restarted["long"]],
    )


def line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares (intercept, slope) through (layers, seconds)."""
    slope, intercept = statistics.linear_regression([x for x, _ in points], [y for _, y in points])
    return intercept, slope


def main(run_dirs: list[Path]) -> None:
    rows = sorted(times(run_dir) for run_dir in run_dirs)
    presets = {preset for preset, *_ in rows}
    if len(presets) != 1 or len({layers for _, layers, *_ in rows}) < 2:
        raise SystemExit("give runs of one preset at two depths or more")
    print("layers  cold s (each)      restarted s (each)  restarted / cold (each)")
    for _, layers, cold, warm in rows:
        ratios = [w / c for w, c in zip(warm, cold, strict=True)]
        print(
            f"{layers:>6}  {statistics.mean(cold):6.2f} ({', '.join(f'{c:.2f}' for c in cold)})"
            f"  {statistics.mean(warm):6.2f} ({', '.join(f'{w:.2f}' for w in warm)})"
            f"  {statistics.mean(ratios):.3f} ({', '.join(f'{r:.3f}' for r in ratios)})"
        )
    full = FULL_DEPTH[presets.pop()]
    cold_line = line([(layers, c) for _, layers, cold, _ in rows for c in cold])
    warm_line = line([(layers, w) for _, layers, _, warm in rows for w in warm])
    print(
        f"per layer: cold {cold_line[1]:.3f} s, restarted {warm_line[1]:.3f} s "
        f"(fixed: {cold_line[0]:.2f} s, {warm_line[0]:.2f} s)"
    )
    at_full = [intercept + slope * full for intercept, slope in (cold_line, warm_line)]
    print(
        f"followed to {full} layers: cold {at_full[0]:.1f} s, restarted {at_full[1]:.1f} s, "
        f"restarted / cold {at_full[1] / at_full[0]:.3f}"
    )


if __name__ == "__main__":
    main([Path(arg) for arg in sys.argv[1:]])
