"""Two trees of one engine side by side from the device harness's results (`rounds N`, the trees' cases
alternating): per round each tree's decode, decode ÷ that round's read bound and prefill at each length,
then new ÷ pin round by round, with the median and the range.

  python3 bench/ab_report.py RESULTS.jsonl PIN_TREE NEW_TREE
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def paired(results: list[dict], pin: str, new: str) -> dict[str, dict[int, dict[str, dict]]]:
    """{case without its tree: {round: {tree: result}}} for the speed cases (a prompt-length list)."""
    table: dict[str, dict[int, dict[str, dict]]] = defaultdict(lambda: defaultdict(dict))
    for result in results:
        tree, _, rest = result["case"].partition(":")
        if tree in (pin, new) and ":pp=" in result["case"] and result.get("measure", "serve") == "serve":
            table[rest][result.get("round", 1)][tree] = result
    return table


def spread(ratios: list[float]) -> str:
    if not ratios:
        return "no pair"
    low, high = min(ratios), max(ratios)
    return f"median {statistics.median(ratios):.2f} (range {low:.2f}-{high:.2f}, {len(ratios)} rounds)"


def report(results: list[dict], pin: str, new: str) -> None:
    for case, rounds in paired(results, pin, new).items():
        print(f"## {case}: {new} against {pin}")
        decode: list[float] = []
        prefill: dict[str, list[float]] = defaultdict(list)
        for number, trees in sorted(rounds.items()):
            for tree in (pin, new):
                result = trees.get(tree, {})
                if "decode_median" not in result:
                    print(f"round {number} {tree}: {result.get('error', 'not run')}")
                    continue
                bound = result["bound_gbps"] * 1e9 / result["token_ram_bytes"]
                lengths = " ".join(f"{n}:{tps:.0f}" for n, (_, tps) in result["prefill_at"].items())
                print(
                    f"round {number} {tree}: decode {result['decode_median']:.2f} t/s, "
                    f"÷ bound {result['decode_median'] / bound:.2f} (read {result['bound_gbps']} GB/s), "
                    f"prefill {lengths}"
                )
            if all("decode_median" in trees.get(tree, {}) for tree in (pin, new)):
                decode.append(trees[new]["decode_median"] / trees[pin]["decode_median"])
                for length, (_, tps) in trees[new]["prefill_at"].items():
                    prefill[length].append(tps / trees[pin]["prefill_at"][length][1])
        print(f"decode new ÷ pin: {spread(decode)}")
        for length, ratios in prefill.items():
            print(f"prefill at {length} new ÷ pin: {spread(ratios)}")
        print()


if __name__ == "__main__":
    report(rows(Path(sys.argv[1])), sys.argv[2], sys.argv[3])
