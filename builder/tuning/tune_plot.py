"""`moe-stack tune --plot`: every trial's prefill and decode speed, grouped by the setting it tried,
the stack's and the tuned settings' confirm trials last."""

from __future__ import annotations

from pathlib import Path

from builder.errors import SpecError
from builder.tuning.tune import TuneResult


def plot(result: TuneResult, path: Path) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
    except ImportError:
        raise SpecError("--plot needs matplotlib: pip install 'moe-stack[bench]'") from None
    labels = list(dict.fromkeys(trial.label for trial in result.trials))
    figure, axes = pyplot.subplots(2, 1, figsize=(max(6.0, 0.5 * len(labels) + 2), 7), sharex=True)
    for axis, name, pick in ((axes[0], "prefill t/s", 0), (axes[1], "decode t/s", 1)):
        for trial in result.trials:
            value = (trial.prefill_tps, trial.decode_tps)[pick]
            tuned = trial.dimension == "confirm" and trial.value == "tuned"
            axis.scatter(labels.index(trial.label), value, s=18, color="tab:green" if tuned else "tab:blue")
        axis.set_ylabel(name)
        axis.grid(axis="y", alpha=0.3)
    axes[1].set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize=8)
    prefill, decode = result.ratios
    axes[0].set_title(
        f"moe-stack tune ({result.objective}): tuned ÷ stack prefill {prefill:.2f}, decode {decode:.2f}"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    pyplot.close(figure)
    return path
