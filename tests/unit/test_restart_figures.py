"""The restart figures the README and docs/usage.md quote at a size users meet (issue 61, point 5) are the
recorded device runs, and those runs prove what they are quoted for: each llama.cpp engine's pinned tree
has a 32k-token prompt timed cold, after restarts with its slot restored (the engine's own `prompt_n`
saying the restored cache served it) and without the restore; KTransformers' restart is timed at the
helper's 0.5 ms switch interval beside Python's 5 ms, rounds alternating."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench/results"
LONG_PROMPT = 32000  # tokens: a prompt "at the size users meet"


def _readme() -> str:
    return " ".join((ROOT / "README.md").read_text().split())


def _usage() -> str:
    return " ".join((ROOT / "docs/usage.md").read_text().split())


# Each llama.cpp engine's record, by the tree it ran (the pins when they ran: a later bump keeps them).
RECORDS = {
    "llama.cpp": "restart-32k-2026-12-06/callB/restart-32k-0c1e57098.jsonl",
    "ik_llama.cpp": "ik-ab-2026-12-06/restart-32k-8337e4c.jsonl",
}


def _restart_runs(engine: str) -> list[dict[str, object]]:
    """`engine`'s 32k restart record (restart_32k.py's lines: the harness's `restart` now)."""
    return [json.loads(line) for line in (RESULTS / RECORDS[engine]).read_text().splitlines()]


@pytest.mark.parametrize("engine", sorted(RECORDS))
def test_each_llama_cpp_engine_serves_a_32k_prompt_from_its_restored_slot(engine: str) -> None:
    runs = _restart_runs(engine)
    cold = next(run for run in runs if run["run"] == "cold")
    saved = next(run["reply"] for run in runs if run["run"] == "save")
    restored = [run for run in runs if str(run["run"]).endswith("restored, then the prompt")]
    fresh = next(run for run in runs if run["run"] == "restart without restore")
    assert int(cold["prompt_n"]) >= LONG_PROMPT and int(fresh["prompt_n"]) >= LONG_PROMPT  # type: ignore[call-overload]
    assert len(restored) >= 3
    for run in restored:
        restore = run["restore"]
        assert isinstance(restore, dict) and isinstance(saved, dict), run
        assert restore["n_restored"] == saved["n_saved"] >= LONG_PROMPT, run  # the whole prompt came back
        assert int(run["prompt_n"]) <= 2, run  # type: ignore[call-overload]  # the cache served it
    worst = max(float(run["wall_s"]) for run in restored) / float(cold["wall_s"])  # type: ignore[arg-type]
    assert worst < 0.05
    quoted = f"{worst:.3f}"
    assert quoted in _readme() and quoted in _usage(), (engine, quoted)


def _kt_runs() -> dict[str, list[list[dict[str, object]]]]:
    """Each whole KTransformers restart run of the re-timing (both servers), by its switch interval: the
    helper's (0.5 ms) or Python's 0.005 s. c2's lines were transcribed from the call's output, which its
    kt-hicache.json did not come back with."""
    folder = RESULTS / "restart-32k-2026-12-06"
    runs: dict[str, list[list[dict[str, object]]]] = {}
    for path in sorted(folder.glob("call*/*/kt-hicache.json")):
        recorded = json.loads(path.read_text())
        runs.setdefault(str(recorded["switch_interval_s"]), []).append(recorded["runs"])
    lines = (folder / "callC/c2/kt-hicache-runs-from-reply.jsonl").read_text().splitlines()
    runs.setdefault("0.005", []).append([json.loads(line) for line in lines[1:]])
    return {interval: [run for run in found if len(run) == 2] for interval, found in runs.items()}


def test_ktransformers_restart_is_retimed_at_the_helpers_interval_beside_pythons() -> None:
    ratios: dict[str, list[float]] = {}
    for interval, runs in _kt_runs().items():
        for first, restarted in runs:
            for cold, read_back in zip(first["long"], restarted["long"], strict=True):  # type: ignore[call-overload]
                assert cold["cached_tokens"] == 0 and read_back["prompt_tokens"] == cold["prompt_tokens"]
                # every whole page of it, from the files
                assert read_back["cached_tokens_details"]["storage"] >= 12800
                ratios.setdefault(interval, []).append(read_back["seconds"] / cold["seconds"])
    helpers, pythons = sorted(ratios["the helper's"]), sorted(ratios["0.005"])
    assert len(helpers) == 2 and len(pythons) == 4  # one whole run at 0.5 ms, two at 5 ms
    said = (
        f"0.05-{helpers[-1]:.2f} (one run), 0.05-{pythons[-1]:.2f} at Python's 5 ms in the two runs beside it"
    )
    assert f"{helpers[0]:.2f}" == f"{pythons[0]:.2f}" == "0.05" and said in _readme(), said
    # the interval's gain is not shown: the ranges overlap
    assert helpers[-1] > pythons[0] and pythons[-1] > helpers[0]
