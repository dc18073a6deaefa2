"""The GPU machine's harness: every llama.cpp-family measurement there is a case list that this runs.

On the device (no Docker, no network), from the checkout's root, with .device/seed carried:

    python3 bench/device/harness.py CASES_FILE…

A case list holds one case a line (`#` starts a comment; each recorded run keeps its own list beside
its results, bench/results/*/cases):

    MEASURE TREE:MODEL[:OPTION=VALUE…]

TREE    an engine (llama.cpp, ik_llama.cpp) or ENGINE@NAME, another tree of it: the carried
        .device/seed/ENGINE[@NAME].tar.xz, built natively with the configure arguments its image uses
        (builder.images.render.configure_args for CUDA 13.0, sm_90 and the sapphirerapids CPU target;
        TREE+cpu-TARGET: the CPU-only image's, for TARGET). The trees build one after the other on
        every core, in the background: a build outlives the call that started it, and a case waits
        for its own tree while the cases of built ones run.
MODEL   a name of models.MODELS (written once per machine); NAME~TYPE is it requantized to TYPE by
        ik_llama.cpp's llama-quantize (--pure), NAME~exps=TYPE its routed experts alone.
MEASURE one of measures.MEASURES: serve, restart, bench, tune, bandwidth.

`rounds N` runs the list N times over, the cases alternating, the host's read rate measured at the
start of each round. A case done on this machine is not run again; each call runs what is left
until BUDGET_S (default 560 s) and writes to $OUT the eight files a device call brings back:
results.jsonl (every row so far), logs.tar.xz (the engines' and tools' logs), facts.txt,
builds.txt, models.jsonl, bandwidth.txt. A call's rows also print as they come.

What a call carries (git-ignored, made on the development machine; 64 MiB a call at most):
  .device/seed/TREE.tar.xz  the engine tree an image builds: llama-cpp-python's vendor/llama.cpp for
                            mainline, the source mirror's tarball for ik_llama.cpp@REF (../shared/sources)
  .device/seed/whl/         the builder's dependencies for the device's CPython 3.12: `pip download
                            --only-binary :all: --python-version 3.12 --no-deps gguf pydantic pydantic-core
                            python-on-whales typer click rich ... -d .device/seed/whl`
  .device/kt/               the kt measures' packages (bench/device/prepare_kt_gpu.sh)
`harness.py --check CASES_FILE…` says what is wrong with a list short of the machine (a unit test runs it
over every recorded list).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Self

REPO = Path(__file__).resolve().parents[2]
CARRIED = REPO / ".device/seed"
WORK = Path(os.environ.get("DEVICE_WORK", "/tmp/moe-device"))
OUT = Path(os.environ.get("OUT", "/tmp/moe-device-out"))
CUDA, CUDA_ARCHS, CPU = "13.0", (90,), "sapphirerapids"  # the GPU machine: an H100 or H200, Emerald Rapids
# The machine's rule: NVLink multicast stays off in every process (the device's KINDS.md).
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def on_path() -> None:
    sys.path[:0] = [str(REPO), str(Path(__file__).parent)]


def with_builder_deps() -> None:
    """The checkout and the builder's own dependencies on the path: where .device/seed/whl was carried
    (the device), those wheels, installed once per machine, before the machine's own packages."""
    on_path()
    wheels = sorted(str(p) for p in (CARRIED / "whl").glob("*.whl"))
    site = WORK / "site"
    if wheels and not (site / ".installed").is_file():
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
        subprocess.run([*pip, "--target", str(site), *wheels], check=True)
        (site / ".installed").touch()
    if wheels:
        sys.path.insert(0, str(site))


def builder_env() -> dict[str, str]:
    """A child process's environment that imports the builder as this one does (the carried wheels first)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(WORK / "site"), str(REPO)])}


# ----- trees, built as their images build them ----------------------------------------------------


@dataclass(frozen=True)
class Tree:
    name: str  # ENGINE[@NAME][+cpu-TARGET]

    @property
    def source(self) -> str:
        return self.name.partition("+")[0]

    @property
    def engine_name(self) -> str:
        return self.source.partition("@")[0]

    @property
    def cpu_only(self) -> bool:
        return self.name.partition("+")[2].startswith("cpu-")

    @property
    def home(self) -> Path:
        return WORK / "trees" / self.name

    def tool(self, name: str) -> Path:
        return self.home / "build/bin" / name

    @property
    def state(self) -> str:
        done = WORK / "trees" / f"{self.name}.done"
        return done.read_text().strip() if done.is_file() else "building"

    def configure_args(self) -> list[str]:
        """The image's configure arguments for this tree (its ref, when one is named), compiler launchers
        left out."""
        from builder.engines import get_engine
        from builder.images.matrix import cuda_target
        from builder.images.naming import image_spec
        from builder.images.render import configure_args

        cpu = self.name.partition("+")[2].removeprefix("cpu-") or CPU
        cuda = cuda_target(None) if self.cpu_only else cuda_target(CUDA, CUDA_ARCHS)
        ref = self.source.partition("@")[2] or None
        spec = image_spec(get_engine(self.engine_name), cpu, ref=ref, cuda=cuda)
        return [arg for arg in configure_args(spec) if "_COMPILER_LAUNCHER=" not in arg]

    def build(self, targets: list[str], jobs: int) -> bool:
        """Unpack, the image's source steps, configure and build `targets`: what `build` says ends in
        trees/TREE.done (ok or failed), its output in trees/TREE.log."""
        from builder.engines import get_engine

        engine = get_engine(self.engine_name)
        shutil.rmtree(self.home, ignore_errors=True)
        self.home.mkdir(parents=True)
        family = REPO / "dockerfiles/llama-cpp-family"
        steps = [
            [
                "tar",
                "-C",
                str(self.home),
                "--strip-components=1",
                "-xJf",
                str(CARRIED / f"{self.source}.tar.xz"),
            ]
        ]
        if getattr(engine, "needs_build_info_shim", False):  # as its images: ik's sdists lack the step
            steps.append(
                ["sh", str(family / "build-info.sh"), str(self.home), self.source.partition("@")[2] or "pin"]
            )
        if getattr(engine, "drops_cuda_lineinfo", False) and not self.cpu_only:
            steps.append(["sh", str(family / "cuda-no-lineinfo.sh"), str(self.home)])
        steps.append(
            [
                "cmake",
                "-S",
                str(self.home),
                "-B",
                str(self.home / "build"),
                "-G",
                "Ninja",
                *self.configure_args(),
            ]
        )
        steps.append(
            ["cmake", "--build", str(self.home / "build"), "--target", *targets, "--parallel", str(jobs)]
        )
        ok = all(subprocess.run(step, check=False).returncode == 0 for step in steps)
        (WORK / "trees" / f"{self.name}.done").write_text("ok\n" if ok else "failed\n")
        return ok


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


# ----- the engine's process and the GPU ----------------------------------------------------------


def serve(binary: Path, args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`binary ARGS` in a process group of its own (`stop` ends all of it), its output in `log`."""
    with log.open("w") as sink:
        return subprocess.Popen(
            [str(binary), *args],
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **MULTICAST_OFF, **(env or {})},
        )


def stop(server: subprocess.Popen, grace_s: float = 30, leader_first: bool = False) -> None:
    """The server's whole process group ended and waited for: the next case needs its port and GPU memory
    (2026-12-02: a case found the last one's port still bound, another its aborted server's 2 GiB still
    on the GPU). `leader_first`: its first process alone is asked first and given `grace_s`, as `docker
    stop` asks a container's (a stack's image helper stops the server itself)."""
    if leader_first:
        server.terminate()
        try:
            server.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    for sig in (signal.SIGTERM, signal.SIGKILL):  # KILL for what TERM left: a hung abort, its children
        try:
            os.killpg(server.pid, sig)
            server.wait(timeout=grace_s)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


_port = [19000 + int(time.time()) % 500 * 2]  # a port of its own each server: one can outlive its server


def next_port() -> int:
    _port[0] += 1
    return _port[0]


def healthy(port: int, server: subprocess.Popen, deadline: float) -> bool:
    from builder.errors import StackError
    from builder.running.api import EngineApi

    while time.time() < deadline and server.poll() is None:
        try:
            EngineApi(port, timeout_s=2).get("/health")
            return True
        except StackError:
            time.sleep(0.5)
    return False


def nvidia_smi(*query: str) -> list[list[str]]:
    try:
        text = subprocess.run(
            ["nvidia-smi", *query, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [[cell.strip() for cell in line.split(",")] for line in text.splitlines() if line.strip()]


def gpu_used_mib() -> int:
    rows = nvidia_smi("--query-gpu=memory.used")
    return int(rows[0][0]) if rows else -1


class GpuPeak:
    """The GPU's used memory every 0.5 s while a case runs (nvidia-smi, in a thread), kept at its peak."""

    def __init__(self) -> None:
        self.peak_mib, self.samples, self._done = 0, 0, threading.Event()

    def _sample(self) -> None:
        while not self._done.wait(0.5):
            self.peak_mib, self.samples = max(self.peak_mib, gpu_used_mib()), self.samples + 1

    def __enter__(self) -> Self:
        threading.Thread(target=self._sample, daemon=True).start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()


def read_rate_gbs() -> float | None:
    """The host's memory read rate now (the image's moe-stack-bandwidth, its best round, GB/s)."""
    tool = WORK / "moe-stack-bandwidth"
    if not tool.is_file():
        source = REPO / "dockerfiles/common/moe-stack-bandwidth.c"
        subprocess.run(["gcc", "-O3", "-fopenmp", "-ffast-math", "-o", str(tool), str(source)], check=True)
    printed = subprocess.run(
        [str(tool), "4096"], capture_output=True, text=True, timeout=120, check=False
    ).stdout
    with (OUT / "bandwidth.txt").open("a") as sink:
        sink.write(printed)
    found = re.search(r"^read GB/s ([\d.]+)$", printed, re.MULTILINE)
    return float(found.group(1)) if found else None


# ----- case lists and the loop -------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    measure: str
    line: str  # TREE:MODEL[:OPTION=VALUE…], the case's name in the results
    tree: Tree
    model: str
    options: dict[str, str]

    @staticmethod
    def parse(text: str) -> Case:
        measure, _, spec = text.strip().partition(" ")
        tree, model, *rest = spec.strip().split(":")
        options = dict(item.split("=", 1) for item in rest)
        return Case(measure, spec.strip(), Tree(tree), model, options)

    def key(self, round_: int) -> str:
        return f"{self.measure} {self.line} #{round_}"


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
    text = "".join(
        subprocess.run(c, shell=True, capture_output=True, text=True, check=False).stdout for c in commands
    )
    (OUT / "facts.txt").write_text(text)


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
    from models import ensure_models, quantizer_of

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
    start_builds(needed)
    ensure_models(
        sorted({case.model.partition("~")[0] for case in cases if case.tree in needed}), OUT / "models.jsonl"
    )
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
