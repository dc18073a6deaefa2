"""The README's timing of its own two commands is the newest run of bench/readme_figures.sh, not a figure
written by hand: the demo's and the suite's minutes, the suite's count, the demo still serving."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _newest_figures(busy: bool = False) -> dict[str, object]:
    """The newest run on a quiet host that timed both commands, or (`busy`) the newest beside neighbours."""
    runs = [
        json.loads(path.read_text())
        for path in sorted(ROOT.glob("bench/results/readme-figures-*/figures.json"))
    ]
    chosen = [
        run
        for run in runs
        if bool(run.get("neighbours", 0)) == busy and ("not run" not in run["tests_summary"] or busy)
    ]
    assert chosen, "bench/readme_figures.sh has never recorded such a run"
    return dict(chosen[-1])


def test_the_readme_quotes_the_newest_measured_run() -> None:
    figures = _newest_figures()
    readme = " ".join((ROOT / "README.md").read_text().split())  # one line: wrapped text compares whole
    # scripts/test.sh's last line: all four counts since 2026-12-06, passed and failed before
    counts = re.search(
        r"\d+ passed, \d+ failed(, \d+ skipped, \d+ deselected)?", str(figures["tests_summary"])
    )
    assert counts, figures["tests_summary"]
    cold = "cold" if figures["cold"] in ("1", "isolated") else "warm"
    quoted = (
        f"{cold}, on {figures['cores']} cores ({figures['date']}): the demo {figures['demo_minutes']} min, "
        f"the suite {figures['tests_minutes']} min ({counts[0]}"
    )
    assert quoted in readme, quoted
    assert ("the demo still serving at the end" in readme) == bool(figures["demo_still_serving"])


def test_the_readme_quotes_the_newest_demo_beside_a_busy_neighbour() -> None:
    figures = _newest_figures(busy=True)
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert figures["demo_still_serving"] and figures["neighbours"] >= 2  # type: ignore[operator]
    quoted = (
        f"beside {figures['neighbours']} CPU-bound neighbours ({figures['date']}) the demo took "
        f"{figures['demo_minutes']} min"
    )
    assert quoted in readme, quoted
