"""Under load, faults and bad input the stacks and the builder keep working: 64 concurrent chats all
answered, a killed engine brought back by the restart policy, a missing model and a missing GPU named
clearly, a full disk leaving nothing half-written, an interrupted build resumed from its cache."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from python_on_whales import DockerClient

from builder.engines.base import StackSpec
from builder.images.image_facts import read_image_facts
from builder.models.model_files import DEMO_CHAT_TEMPLATE
from builder.stackfile.host_checks import free_local_port
from builder.stacks.compose import compose_stack, write_stack
from builder.stacks.demo import chat
from tests.cli import run_cli
from tests.integration.conftest import StackFactory, build_engine_image, need_root

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_64_concurrent_chats_all_answered(
    base_image: str, gemma_model: Path, start_stack: StackFactory
) -> None:
    stack = start_stack(
        build_engine_image("llama.cpp", "avx2", base_image),
        gemma_model,
        parallel=4,
        ctx_size=4096,
        chat_template=DEMO_CHAT_TEMPLATE,
    )

    def one(index: int) -> tuple[float, str]:
        started = time.monotonic()
        answer = chat(stack.port, f"Count from {index} to {index + 3}.", max_tokens=12)
        return time.monotonic() - started, answer.text

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=64) as pool:
        results = list(pool.map(one, range(64)))
    wall = time.monotonic() - started
    latencies = sorted(latency for latency, _ in results)
    assert len(results) == 64 and all(text.strip() for _, text in results), "a request went unanswered"
    p50, p90, p99 = (latencies[int(q * (len(latencies) - 1))] for q in (0.50, 0.90, 0.99))
    print(
        f"\n64 concurrent chats, 4 slots, 2 threads: wall {wall:.1f} s, latency p50 {p50:.2f} s, "
        f"p90 {p90:.2f} s, "
        f"p99 {p99:.2f} s, max {latencies[-1]:.2f} s, mean {statistics.mean(latencies):.2f} s"
    )
    assert stack.client.compose.ps()[0].restart_count == 0, "the engine restarted under load"


def test_killed_engine_comes_back_healthy(
    base_image: str, moe_model: Path, start_stack: StackFactory
) -> None:
    need_root("signal the engine's process from the host")
    stack = start_stack(build_engine_image("llama.cpp", "avx2", base_image), moe_model)
    container = stack.client.compose.ps()[0]
    os.kill(container.state.pid, signal.SIGKILL)  # what an OOM kill or a crash looks like
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        container.reload()
        health = container.state.health.status if container.state.health else None
        if container.restart_count >= 1 and health == "healthy":
            break
        time.sleep(1)
    assert container.restart_count >= 1, "the restart policy did not restart the engine"
    assert container.state.health.status == "healthy"
    with urllib.request.urlopen(f"{stack.url}/v1/models", timeout=30) as response:
        assert response.status == 200


def _restart_docker_daemon() -> None:
    """Stop the host's dockerd (SIGTERM, as a package upgrade or `systemctl restart docker` does) and start it
    again the way the suite's CI starts it (scripts/install-docker.sh)."""
    subprocess.run(["pkill", "-TERM", "-x", "dockerd"], check=True)
    deadline = time.monotonic() + 60
    while subprocess.run(["pgrep", "-x", "dockerd"], check=False, capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "dockerd did not stop within 60 s"
        time.sleep(0.5)
    subprocess.run(["bash", str(ROOT / "scripts/install-docker.sh")], check=True, capture_output=True)


def test_a_stack_comes_back_after_the_docker_daemon_restarts(
    base_image: str, moe_model: Path, start_stack: StackFactory
) -> None:
    """Issue 62: Docker's daemon restarted under a running stack; its containers stop with it, and the
    stack's restart policy (unless-stopped) brings the engine back healthy, serving, once the daemon is up."""
    need_root("restart the Docker daemon")
    if not os.environ.get("CI") and os.environ.get("MOE_STACK_RESTART_DOCKERD") != "1":
        pytest.skip("restarts this host's Docker daemon: CI only, or MOE_STACK_RESTART_DOCKERD=1")
    stack = start_stack(build_engine_image("llama.cpp", "avx2", base_image), moe_model)
    container = stack.client.compose.ps()[0]
    started = container.state.started_at
    _restart_docker_daemon()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        container.reload()
        health = container.state.health.status if container.state.health else None
        if container.state.started_at != started and health == "healthy":
            break
        time.sleep(1)
    assert container.state.started_at != started, "the engine was not started again with the daemon"
    assert container.state.health is not None and container.state.health.status == "healthy"
    with urllib.request.urlopen(f"{stack.url}/v1/models", timeout=30) as response:
        assert response.status == 200


def test_a_model_gone_from_under_a_running_stack_is_named(
    base_image: str, moe_model: Path, tmp_path: Path
) -> None:
    """The model file removed while its stack serves (a moved or unmounted directory): the server goes on
    with what it opened, smoke's model-file check names the file, and once stopped `up` refuses in one line
    before starting a container that would die loading it."""
    image = build_engine_image("llama.cpp", "avx2", base_image)
    models = tmp_path / "models"
    models.mkdir(mode=0o755)
    model = models / moe_model.name
    shutil.copy(moe_model, model)
    model.chmod(0o644)
    port = free_local_port()
    stack = StackSpec(
        project_name=f"mst-missing-{port}",
        engine="llama.cpp",
        image_ref=image.tag,
        model=model,
        port=port,
        cpu_threads=2,
        start_period_s=20,
    )
    compose_file = write_stack(
        compose_stack(stack, "pytest", read_image_facts(image.tag)), tmp_path / "compose.yaml"
    )
    try:
        assert run_cli("up", str(compose_file), "--timeout", "120", timeout=240).returncode == 0
        model.unlink()
        smoke = run_cli("smoke", str(compose_file), "--json")
        checks = {check["name"]: check for check in json.loads(smoke.stdout)}
        assert checks["healthy"]["passed"] and checks["completion"]["passed"], checks  # it still serves
        assert not checks["model-file"]["passed"]
        assert checks["model-file"]["seen"] == (
            f"{model} is gone from this host: the server reads what it opened, and its next start fails"
        )
        run_cli("down", str(compose_file))
        result = run_cli("up", str(compose_file), "--timeout", "60", timeout=180)
        assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert f"the stack's model {model} is not on this host (moved or deleted?)" in result.stderr
        assert not DockerClient(compose_files=[compose_file]).compose.ps(all=True)  # nothing was started
    finally:
        run_cli("down", str(compose_file))


def test_up_says_where_the_load_is_until_healthy(base_image: str, moe_model: Path, tmp_path: Path) -> None:
    """`moe-stack up` says the engine's newest log line as it loads (on stdout: stderr keeps a failure's
    one line), and once more when the stack is healthy."""
    image = build_engine_image("llama.cpp", "avx2", base_image)
    port = free_local_port()
    stack = StackSpec(
        project_name=f"mst-load-{port}",
        engine="llama.cpp",
        image_ref=image.tag,
        model=moe_model,
        port=port,
        cpu_threads=2,
    )
    compose_file = write_stack(
        compose_stack(stack, "pytest", read_image_facts(image.tag)), tmp_path / "compose.yaml"
    )
    try:
        result = run_cli("up", str(compose_file), "--timeout", "120", timeout=240)
        assert result.returncode == 0, result.stderr
        said = [line for line in result.stdout.splitlines() if line.startswith("loading (")]
        assert said and re.fullmatch(r"loading \(\d+ s\): \S.*", said[-1]), result.stdout
        assert "healthy:" in result.stdout.split("loading (")[-1]  # after the last load line
        # Each is a line of the engine's own log (the last one, its newest once healthy).
        log = DockerClient(compose_files=[compose_file]).compose.logs(no_log_prefix=True)
        shown = {" ".join(line.split()) for line in re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", log).splitlines()}
        assert all(line.split("): ", 1)[1].rstrip("…") in " ".join(shown) for line in said), (said, log)
    finally:
        run_cli("down", str(compose_file))


def test_gpu_stack_without_gpu_passthrough_is_refused(
    base_image: str, moe_model: Path, tmp_path: Path, docker_client: DockerClient
) -> None:
    if "nvidia" in (docker_client.system.info().runtimes or {}):
        pytest.skip("this Docker has the nvidia runtime")
    image = build_engine_image("llama.cpp", "avx2", base_image)
    stack = StackSpec(
        project_name="mst-gpu-refused",
        engine="llama.cpp",
        image_ref=image.tag,
        model=moe_model,
        port=free_local_port(),
        cpu_threads=2,
        gpu="nvidia",
    )
    compose_file = write_stack(compose_stack(stack, "pytest"), tmp_path / "compose.yaml")
    result = run_cli("up", str(compose_file))
    assert result.returncode == 1
    assert (
        "service engine asks for an NVIDIA GPU and this Docker has neither the nvidia runtime"
        in result.stderr
    )
    assert not docker_client.container.list(
        all=True, filters=[("label", "com.docker.compose.project=mst-gpu-refused")]
    )


def test_full_disk_during_render_leaves_nothing(tmp_path: Path) -> None:
    need_root("mount a small tmpfs")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], check=True)
    try:
        filler = disk / "filler"
        with filler.open("wb") as handle, pytest.raises(OSError):
            handle.write(b"x" * (64 * 1024 - 6000))  # leaves less than one rendered context
            handle.flush()
            os.fsync(handle.fileno())
            handle.write(b"x" * 4096 * 32)
            handle.flush()
        result = run_cli("render", "--engine", "ik_llama.cpp", "--cpu", "zen4", "--out", str(disk / "ctx"))
        assert result.returncode == 1
        assert "No space left on device" in result.stderr and "nothing was written" in result.stderr, (
            result.stderr
        )
        assert sorted(p.name for p in disk.iterdir()) == ["filler"], "a half-written context was left behind"
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_interrupted_build_resumes_from_cache(base_image: str, tmp_path: Path) -> None:
    """Ctrl-C during the compile of a changed engine tree: one line and exit 130, then the rerun
    finishes, its compiles served from the compiler cache."""
    from builder.engines import get_engine
    from builder.images.source import resolve_local

    adapter = get_engine("llama.cpp")
    tree = tmp_path / "tree"
    shutil.copytree(resolve_local(adapter, f"pypi:{adapter.sdist}"), tree, symlinks=True)
    with (tree / "ggml/src/ggml-alloc.c").open("a") as source:  # a small file: one cache miss
        source.write(f"\n// moe-stack interrupted-build test {time.time_ns()}\n")
    args = [
        "build",
        "--engine",
        "llama.cpp",
        "--cpu",
        "avx2",
        "--source",
        str(tree),
        "--ref",
        "interrupt-test",
        "--base-image",
        base_image,
        "--registry",
        "localhost",
        "--namespace",
        "moe-stack-test",
    ]
    log = tmp_path / "first.log"
    # Its own process group, which Ctrl-C signals as a whole: moe-stack and its docker buildx.
    first = subprocess.Popen(
        [sys.executable, "-m", "builder", *args, "--log", str(log)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and " Building C" not in (log.read_text() if log.exists() else ""):
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGINT)
    _, stderr = first.communicate(timeout=120)
    assert first.returncode == 130, stderr[-2000:]
    assert stderr.strip().splitlines()[-1] == (
        "moe-stack: error: interrupted; rerun the same command: builds resume from their cache"
    )
    second = run_cli(*args, "--log", str(tmp_path / "second.log"))
    assert second.returncode == 0, second.stderr[-2000:]
    hits = re.search(r"Hits:\s+(\d+) /", (tmp_path / "second.log").read_text())
    assert hits and int(hits[1]) > 0, "the rerun compiled everything again"
    DockerClient().image.remove("localhost/moe-stack-test/llama-cpp:interrupt-test-cpu-avx2", force=True)
