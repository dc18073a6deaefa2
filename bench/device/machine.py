"""What the GPU machine's harness stands on (bench/device/harness.py runs the lists; measures.py, kt.py and
models.py use these): where things are, the builder on the path, an engine tree built as its image
builds it or an image's root filesystem entered as a container runtime enters it, an engine's process,
the GPU's memory, the host's read rate, and a case."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

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
    # ENGINE[@NAME][+cpu-TARGET|+lineinfo], or ENGINE@NAME+image: an image of it (its rootfs carried)
    name: str

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
    def is_image(self) -> bool:
        return self.name.endswith("+image")

    @property
    def keeps_lineinfo(self) -> bool:
        """+lineinfo: built without the image's cuda-no-lineinfo.sh step (CUDA code with -lineinfo)."""
        return self.name.endswith("+lineinfo")

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

        cpu = self.name.partition("+")[2].removeprefix("cpu-") if self.cpu_only else CPU
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
        home, build = str(self.home), str(self.home / "build")
        steps = [["tar", "-C", home, "--strip-components=1", "-xJf", str(CARRIED / f"{self.source}.tar.xz")]]
        if getattr(engine, "needs_build_info_shim", False):  # as its images: ik's sdists lack the step
            steps.append(["sh", str(family / "build-info.sh"), home, self.source.partition("@")[2] or "pin"])
        if getattr(engine, "drops_cuda_lineinfo", False) and not (self.cpu_only or self.keeps_lineinfo):
            steps.append(["sh", str(family / "cuda-no-lineinfo.sh"), home])
        steps.append(["cmake", "-S", home, "-B", build, "-G", "Ninja", *self.configure_args()])
        steps.append(["cmake", "--build", build, "--target", *targets, "--parallel", str(jobs)])
        ok = all(subprocess.run(step, check=False).returncode == 0 for step in steps)
        (WORK / "trees" / f"{self.name}.done").write_text("ok\n" if ok else "failed\n")
        return ok


# ----- images, run as a container runtime runs them ----------------------------------------------

# What NVIDIA's container toolkit binds in for NVIDIA_DRIVER_CAPABILITIES=compute,utility: the host
# driver's own libraries.
DRIVER_LIBRARIES = ("libcuda.so.1", "libcudadebugger.so.1", "libnvidia-nvvm.so.4",
                    "libnvidia-ptxjitcompiler.so.1", "libnvidia-gpucomp.so", "libnvidia-ml.so.1")  # fmt: skip
DRIVER_DIRS = (
    "/usr/local/nvidia",
    "/usr/lib/x86_64-linux-gnu",
)  # where a library not in the cache is looked for
LIBRARY_DIR = "/usr/lib/x86_64-linux-gnu"


def host_files(name: str, roots: tuple[str, ...]) -> list[Path]:
    """This host's files named `name` (a glob): the loader's cache first, then under `roots`, resolved."""
    cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False).stdout
    found = [line.rpartition(" => ")[2] for line in cache.splitlines()
             if "x86-64" in line and Path(line.split(" ", 1)[0].strip()).match(name)]  # fmt: skip
    found += [str(path) for root in roots if Path(root).is_dir() for path in Path(root).rglob(name)]
    return list(dict.fromkeys(Path(path).resolve() for path in found if Path(path).is_file()))


def image_binds(removed: Path) -> tuple[list[str], list[str]]:
    """HOST=PATH binds into an image and what each is: the driver's libraries, and each file its carry left
    out (REMOVED: `sha256 bytes /path` a line, cuBLAS of a CUDA 13 image) from the host's copy, the one
    with the image's bytes where there is one."""
    binds, said = [], []
    for soname in DRIVER_LIBRARIES:
        found = host_files(soname, ()) or host_files(soname.partition(".so")[0] + ".so*", DRIVER_DIRS)
        if found:
            binds.append(f"{found[0]}={LIBRARY_DIR}/{soname}")
            said.append(f"driver: {found[0]}")
    for line in removed.read_text().splitlines() if removed.is_file() else []:
        sha, _, path = line.split(" ", 2)
        copies = host_files(Path(path).name, ("/usr/local", "/opt", "/usr/lib"))
        if not copies:
            raise OSError(f"no {Path(path).name} on this host to bind at {path}")
        same = [copy for copy in copies if hashlib.sha256(copy.read_bytes()).hexdigest() == sha]
        binds.append(f"{(same or copies)[0]}={path}")
        said.append(f"{path}: {(same or copies)[0]} ({'the same bytes' if same else 'OTHER bytes'})")
    return binds, said


def unpack_image(tree: Tree) -> None:
    """The parts of the image's root filesystem this call carried (.device/seed/TREE/), gathered with the
    earlier calls'; once whole (rootfs.sha256), unpacked and readied for enter(): what enter.sh binds
    placed, the loader's cache refreshed (the toolkit's hook does so for what it adds)."""
    gathered = tree.home / "carried"
    if tree.state != "building" or not (CARRIED / tree.name).is_dir():
        return
    shutil.copytree(CARRIED / tree.name, gathered, dirs_exist_ok=True)
    parts = sorted(gathered.glob("rootfs.tar.xz.part-*"))
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.read_bytes())
    if digest.hexdigest() != (gathered / "rootfs.sha256").read_text().split()[0]:
        print(f"{tree.name}: {len(parts)} parts so far; the next call carries more", flush=True)
        return
    rootfs = tree.home / "rootfs"
    shutil.rmtree(rootfs, ignore_errors=True)
    rootfs.mkdir(parents=True)
    with subprocess.Popen(["cat", *map(str, parts)], stdout=subprocess.PIPE) as joined:
        untar = ["tar", "-C", str(rootfs), "--numeric-owner", "-xJf", "-"]
        unpacked = subprocess.run(untar, stdin=joined.stdout, check=False)
    for mount_point in ("proc", "tmp", "dev", "models"):
        (rootfs / mount_point).mkdir(exist_ok=True)
    binds, said = image_binds(gathered / "removed.txt")
    for bind in binds:
        target = rootfs / bind.partition("=")[2].lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch()
    subprocess.run(["chroot", str(rootfs), "ldconfig"], check=False)
    (tree.home / "binds.txt").write_text("".join(bind + "\n" for bind in binds))
    (OUT / f"{tree.name}.binds.txt").write_text("".join(line + "\n" for line in said))
    (WORK / "trees" / f"{tree.name}.done").write_text("ok\n" if unpacked.returncode == 0 else "failed\n")


def enter(tree: Tree, models: Path, args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """The image's entrypoint with `args`, its environment the image's own (env.txt) and `env`, `models`
    at /models, in new mount and PID namespaces as enter.sh makes them (`stop` ends all of it)."""
    image_env = (tree.home / "carried/env.txt").read_text().splitlines()
    files = {"env": [*image_env, *(f"{key}={value}" for key, value in env.items())], "args": args}
    for name, lines in files.items():
        (tree.home / f"{name}.txt").write_text("".join(line + "\n" for line in lines))
    enter_sh = [str(Path(__file__).with_name("enter.sh")), str(tree.home / "rootfs"), str(models)]
    enter_sh += [str(tree.home / f"{name}.txt") for name in ("binds", "env", "args")]
    return serve(Path("unshare"), ["--mount", "--pid", "--fork", "--kill-child", "bash", *enter_sh], log)


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


def output(command: list[str] | str, **how: Any) -> str:
    """What `command` prints (a string runs in the shell), whatever its exit."""
    shell = isinstance(command, str)
    return subprocess.run(command, shell=shell, capture_output=True, text=True, check=False, **how).stdout


def gpu_used_mib() -> int:
    """The first GPU's used memory (-1: no nvidia-smi answer)."""
    try:
        used = output(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"], timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return -1
    return int(used.split()[0]) if used.strip() else -1


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
    from builder.running.bandwidth import parse_bandwidth

    printed = output([str(tool), "4096"], timeout=120)
    with (OUT / "bandwidth.txt").open("a") as sink:
        sink.write(printed)
    found = parse_bandwidth(printed)
    return found.best if found else None


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
