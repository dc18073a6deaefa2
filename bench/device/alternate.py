"""Two llama-server instances measured alternately (P1: the image's binary against a native build),
or one OpenAI-style completion:

    alternate.py --complete PORT
    alternate.py --ports 8080 8081 --names image native [--rounds 5] [--prompt-words 512] [-n 64]

Each round measures both, in alternating order (AB, BA, ...), after one warm-up request each (the
first pays the model's page-in and CUDA's lazy set-up). Prints one JSON line per measurement, then a
summary line: per-server medians and spreads of prefill and decode tokens/s (the engine's own
/completion timings) and the ratios first ÷ second.
"""

from __future__ import annotations

import argparse
import json
import statistics
import urllib.request

from builder.running.benchmark import measure


def complete(port: int) -> dict[str, object]:
    body = {"prompt": "The expert router sends each token to", "max_tokens": 24, "temperature": 0}
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.load(response)


def spread(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 2),
        "min": round(min(values), 2),
        "max": round(max(values), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--complete", type=int)
    parser.add_argument("--ports", type=int, nargs=2)
    parser.add_argument("--names", nargs=2, default=["a", "b"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompt-words", type=int, default=512)
    parser.add_argument("-n", type=int, default=64)
    args = parser.parse_args()
    if args.complete:
        print(json.dumps(complete(args.complete)))
        return
    servers = list(zip(args.names, args.ports, strict=True))
    for _name, port in servers:  # warm-up, not recorded
        measure(port, args.prompt_words, args.n, repetitions=1)
    runs: dict[str, dict[str, list[float]]] = {name: {"prefill": [], "decode": []} for name, _ in servers}
    for round_ in range(args.rounds):
        for name, port in servers if round_ % 2 == 0 else servers[::-1]:
            speed = measure(port, args.prompt_words, args.n, repetitions=1)
            runs[name]["prefill"].append(speed.prefill)
            runs[name]["decode"].append(speed.decode)
            print(
                json.dumps(
                    {
                        "round": round_,
                        "server": name,
                        "prompt_tokens": speed.prompt_tokens,
                        "prefill_tps": round(speed.prefill, 2),
                        "decode_tps": round(speed.decode, 2),
                    }
                )
            )
    first, second = args.names
    summary: dict[str, object] = {
        name: {kind: spread(values) for kind, values in kinds.items()} for name, kinds in runs.items()
    }
    for kind in ("prefill", "decode"):
        ratios = [a / b for a, b in zip(runs[first][kind], runs[second][kind], strict=True)]
        summary[f"{kind}_ratio_{first}_over_{second}"] = spread(ratios)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
