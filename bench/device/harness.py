"""The GPU machine's harness: every llama.cpp-family measurement there is a case list that this runs.

On the device (no Docker, no network), from the checkout's root, with .device/seed carried:

    python3 bench/device/harness.py CASES_FILE…

A case list holds one case a line (`#` starts a comment; each recorded run keeps its own list beside
its results, bench/results/*/cases):

    MEASURE TREE:MODEL[:OPTION=VALUE…]

TREE    an engine (llama.cpp, ik_llama.cpp) or ENGINE@NAME, another tree of it: the carried
        .device/seed/ENGINE[@NAME].tar.xz, built natively with the configure arguments its image uses
        (builder.images.render.configure_args for CUDA 13.0, sm_90 and the sapphirerapids CPU target;
        TREE+cpu-TARGET: the CPU-only image's, for TARGET; TREE+lineinfo: CUDA code keeping -lineinfo).
        The trees build one after the other on every core, in the background: a build outlives the
        call that started it, and a case waits for its own tree while the cases of built ones run.
        ENGINE@NAME+image: a built image of the engine instead, its root filesystem carried in parts
        (.device/seed/TREE/, made by bench/device/carry_image.sh; each call carries what fits) and
        entered as a container runtime enters it once whole (machine.enter; `serve` only).
MODEL   a name of models.MODELS (written once per machine); NAME~TYPE is it requantized to TYPE by
        ik_llama.cpp's llama-quantize (--pure), NAME~exps=TYPE its routed experts alone.
MEASURE one of measures.MEASURES: serve, restart, bench, tune, bandwidth, pinned-pages, fatbin (kt.py's:
        kt, kt-restart, kt-check).

`rounds N` runs the list N times over, the cases alternating, the host's read rate measured at the
start of each round. A case done on this machine is not run again; each call runs what is left
until BUDGET_S (default 560 s) and writes to $OUT what a device call brings back: results.jsonl
(every row so far), logs.tar.xz (the engines' and tools' logs), facts.txt, builds.txt, models.jsonl,
bandwidth.txt, an image's TREE.binds.txt (what was bound in). A call's rows also print as they come.

What a call carries (git-ignored, made on the development machine; 64 MiB a call at most):
  .device/seed/TREE.tar.xz  the engine tree an image builds: llama-cpp-python's vendor/llama.cpp for
                            mainline, the source mirror's tarball for ik_llama.cpp@REF (../shared/sources)
  .device/seed/whl/         the builder's dependencies for the device's CPython 3.12: `pip download
                            --only-binary :all: --python-version 3.12 --no-deps gguf pydantic pydantic-core
                            python-on-whales typer click rich ... -d .device/seed/whl`
  .device/kt/               the kt measures' packages (bench/device/prepare_kt_gpu.sh)
  .device/seed/TREE/        an image's root filesystem in parts (bench/device/carry_image.sh)
`harness.py --check CASES_FILE…` says what is wrong with a list short of the machine (a unit test runs it
over every recorded list).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from machine import OUT, WORK, Case, Tree, on_path, output, read_rate_gbs, unpack_image, with_builder_deps


def start_builds(needed: dict[Tree, set[str]]) -> None:
    """The trees not yet started on this machine, built one after the other on every core, in a process
    of their own (it outlives this call)."""
    (WORK / "trees").mkdir(parents=True, exist_ok=True)
    todo = [tree for tree in needed if not (WORK / "trees" / f"{tree.name}.log").exists()]
    if not todo:
        return
    plan = json.dumps([[tree.name, sorted(needed[tree])] for tree in todo])
    log = (WORK / "trees" / f"{todo[0].name}.log").open("w")
    for tree in todo[1:]:
        (WORK / "trees" / f"{tree.name}.log").touch()
    subprocess.Popen(
        [sys.executable, __file__, "--build", plan],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def build_in_turn(plan: str) -> None:
    with_builder_deps()
    for name, targets in json.loads(plan):
        with (WORK / "trees" / f"{name}.log").open("a") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            Tree(name).build(targets, os.cpu_count() or 16)


# ----- case lists and the loop -------------------------------------------------------------------


def read_cases(paths: list[Path]) -> tuple[list[Case], int]:
    """The cases of the lists, in order, and the rounds they ask for."""
    cases, rounds = [], 1
    for path in paths:
        for raw in path.read_text().splitlines():
            line = raw.split("#", 1)[0].strip()
            if line.startswith("rounds "):
                rounds = int(line.split()[1])
            elif line:
                cases.append(Case.parse(line))
    return cases, rounds


def facts() -> None:
    commands = [
        "nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader",
        "lscpu | grep -E '^(Model name|CPU\\(s\\)|Thread|Core|Socket|NUMA node|L3)'",
        "grep -E 'MemTotal|Huge' /proc/meminfo; gcc --version | head -1; nvcc --version | tail -1",
        "df -h /tmp | tail -1",
    ]
    (OUT / "facts.txt").write_text("".join(map(output, commands)))


def collect() -> None:
    """What a call brings back: the rows so far, the logs in one archive, the builds' last lines."""
    if (WORK / "results.jsonl").is_file():
        shutil.copy(WORK / "results.jsonl", OUT / "results.jsonl")
    with tarfile.open(OUT / "logs.tar.xz", "w:xz") as archive:
        archive.add(WORK / "logs", arcname="logs")
    lines = []
    for log in sorted((WORK / "trees").glob("*.log")):
        tail = log.read_text(errors="replace")[-300:].replace("\n", " | ")
        lines.append(f"{log.stem}: {Tree(log.stem).state}: {tail}")
    (OUT / "builds.txt").write_text("\n".join(lines) + "\n")


def run(paths: list[Path]) -> None:
    with_builder_deps()
    import measures  # bench/device, beside this file
    from models import MODELS, ensure_models, quantizer_of

    deadline = time.time() + float(os.environ.get("BUDGET_S", "560")) - 20
    for directory in (OUT, WORK / "logs"):
        directory.mkdir(parents=True, exist_ok=True)
    cases, rounds = read_cases(paths)
    needed: dict[Tree, set[str]] = {}
    for case in cases:
        if measures.MEASURES[case.measure].targets:
            needed.setdefault(case.tree, set()).update(measures.MEASURES[case.measure].targets)
        if "~" in case.model:
            needed.setdefault(quantizer_of(case.tree), set()).add("llama-quantize")
    facts()
    start_builds({tree: targets for tree, targets in needed.items() if not tree.is_image})
    for image in (tree for tree in needed if tree.is_image):
        unpack_image(image)
    models = {case.model.partition("~")[0] for case in cases if case.tree in needed}
    ensure_models(sorted(models & set(MODELS)), OUT / "models.jsonl")
    kept = WORK / "results.jsonl"
    done = {row["key"] for row in map(json.loads, kept.read_text().splitlines())} if kept.is_file() else set()
    try:
        for round_ in range(1, rounds + 1):
            bound = read_rate_gbs()
            waiting = [case for case in cases if case.key(round_) not in done]
            while waiting and time.time() < deadline:
                ready = [case for case in waiting if case.tree not in needed or case.tree.state != "building"]
                chosen = next((c for c in ready if measures.needs_s(c) < deadline - time.time()), None)
                if chosen is None and len(ready) == len(waiting):
                    break  # none left fits in what the call has left: the next call runs them
                if chosen is None:  # a tree still building: its cases may fit once it is built
                    time.sleep(5)
                    continue
                waiting.remove(chosen)
                row = measures.run_case(chosen, round_, bound, deadline)
                with kept.open("a") as sink:
                    sink.write(json.dumps({"key": chosen.key(round_), **row}) + "\n")
                print(
                    json.dumps({k: v for k, v in row.items() if k not in ("command", "log_lines")}),
                    flush=True,
                )
                collect()  # after each case: a call cut off by its limit still brings back what ran
            if waiting:
                print(f"deadline: {len(waiting)} cases of round {round_} left for the next call", flush=True)
                break
    finally:
        collect()


def check(paths: list[Path]) -> list[str]:
    """What is wrong with the case lists (nothing: each case would run), short of the machine."""
    on_path()
    import measures

    problems = []
    for case in read_cases(paths)[0]:
        try:
            measures.check(case)
        except Exception as err:  # noqa: BLE001  (each case's problem, said; the next still checked)
            problems.append(f"{case.measure} {case.line}: {' '.join(str(err).split())}")
    return problems


if __name__ == "__main__":
    if sys.argv[1] == "--build":
        build_in_turn(sys.argv[2])
    elif sys.argv[1] == "--check":
        print("\n".join(check([Path(arg) for arg in sys.argv[2:]])) or "every case would run")
    else:
        run([Path(arg) for arg in sys.argv[1:]])
