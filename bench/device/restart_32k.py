"""Time to first token after a restart for a 32k-token prompt on the R1-width slice (issue 61, point 5).

The server of a `seed_models.sh run` case (the command that case recorded, with `--slot-save-path` added):
the prompt cold, then again on the same server (cached), its slot saved, the server stopped and started
three times with the slot restored before the prompt, and once more without the restore. Each line: the
wall time of the request and the engine's own `prompt_n` (1 where the restored cache was used).

  PYTHONPATH=<site>:<repo> python3 bench/device/restart_32k.py TREE CASE   (from bench/device/)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from seed_models import SENTENCE

ROOT = Path("/tmp/moe-seed")  # seed_models.sh's work directory: the builds, results.jsonl
SLOTS = Path("/tmp/slots")
PORT = 18990
PROMPT_SENTENCES = 618  # 32754 tokens of the synthetic vocabulary (53 a sentence)


def post(path: str, body: dict) -> tuple[dict, float]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{PORT}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    started = time.time()
    with urllib.request.urlopen(request, timeout=300) as reply:
        return json.load(reply), time.time() - started


def start(server: Path, args: list[str], log: Path) -> tuple[subprocess.Popen, float]:
    started = time.time()
    with log.open("w") as sink:
        process = subprocess.Popen(
            [str(server), *args], stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=2):
                return process, time.time() - started
        except OSError:
            time.sleep(0.5)


def stop(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGTERM)
    process.wait(60)


def show(run: str, reply: dict, wall: float, **more: object) -> None:
    timings = reply["timings"]
    line = {"run": run, "wall_s": round(wall, 3), "prompt_n": timings["prompt_n"]}
    print(json.dumps(line | {"prompt_ms": round(timings["prompt_ms"], 1), **more}), flush=True)


def main(tree: str, case: str) -> None:
    recorded = (json.loads(line) for line in (ROOT / "results.jsonl").read_text().splitlines())
    args = next(run["command"] for run in recorded if run["case"] == case)
    args[args.index("--port") + 1] = str(PORT)
    SLOTS.mkdir(exist_ok=True)
    args += ["--slot-save-path", f"{SLOTS}/"]
    server, out = ROOT / tree / "build/bin/llama-server", Path(os.environ.get("OUT", "/tmp"))
    query = {
        "prompt": " ".join([SENTENCE] * PROMPT_SENTENCES),
        "n_predict": 1,
        "cache_prompt": True,
        "id_slot": 0,
    }

    process, load = start(server, args, out / "first.log")
    post("/completion", {"prompt": "hello", "n_predict": 4})
    show("cold", *post("/completion", query), load_s=round(load, 1))
    show("same server, cached", *post("/completion", query))
    saved, wall = post("/slots/0?action=save", {"filename": "r1.bin"})
    print(
        json.dumps(
            {
                "run": "save",
                "wall_s": round(wall, 2),
                "reply": saved,
                "bytes": (SLOTS / "r1.bin").stat().st_size,
            }
        )
    )
    stop(process)
    for number in range(3):
        process, load = start(server, args, out / f"restart{number}.log")
        restored, restore_wall = post("/slots/0?action=restore", {"filename": "r1.bin"})
        show(
            f"restart {number}: restored, then the prompt",
            *post("/completion", query),
            load_s=round(load, 1),
            restore_s=round(restore_wall, 2),
            restore=restored,
        )
        stop(process)
    process, load = start(server, args, out / "nocache.log")
    show("restart without restore", *post("/completion", query), load_s=round(load, 1))
    stop(process)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
