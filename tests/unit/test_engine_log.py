"""What `moe-stack up` quotes of an engine's log when the stack does not become healthy."""

from pathlib import Path

from python_on_whales.exceptions import DockerException

from builder.container_start import runtime_lost_init
from builder.engines import get_engine
from builder.running.run import log_error_summary

DATA = Path(__file__).parent / "data"
RESULTS = Path(__file__).resolve().parents[2] / "bench/results"

# ik_llama.cpp 0.1.5 on `-ot ffn_.*_exps=NO_SUCH_BUFFER`: two error lines, then the engine restarts.
IK_ATTEMPT = (
    "error: Invalid tensor buffer type override: ffn_.*_exps=NO_SUCH_BUFFER\n"
    "error: invalid parameter for argument: --override-tensor\n"
)


def test_a_restarting_engine_is_quoted_the_same_whichever_attempt_was_cut_short() -> None:
    whole = (
        "error: Invalid tensor buffer type override: ffn_.*_exps=NO_SUCH_BUFFER / "
        "error: invalid parameter for argument: --override-tensor"
    )
    assert log_error_summary(IK_ATTEMPT) == whole
    assert log_error_summary(IK_ATTEMPT * 2) == whole
    assert log_error_summary(IK_ATTEMPT * 2 + IK_ATTEMPT.splitlines()[0]) == whole


def test_the_error_is_found_before_a_usage_text_and_without_terminal_codes() -> None:
    log = (
        "\x1b[32mloading\x1b[0m\nerror: invalid argument: --no-mmap\n"
        "usage: llama-server [options]\n  -h, --help\n"
    )
    assert log_error_summary(log) == "error: invalid argument: --no-mmap"


def test_a_log_without_an_error_gives_its_last_line() -> None:
    assert log_error_summary("main: loading model\nkilled\n") == "killed"
    assert log_error_summary("") == "(empty)"


def test_each_engine_log_says_what_it_put_on_the_gpu() -> None:
    """Recorded logs: mainline (-lv 4) and ik on the H200, mainline's CPU image given -ngl 99, SGLang."""
    mainline, ik, kt = get_engine("llama.cpp"), get_engine("ik_llama.cpp"), get_engine("ktransformers")
    h200 = (DATA / "llama.cpp-0c1e57098-h200-lv4-load.txt").read_text()
    assert mainline.gpu_use(h200) == (True, "offloaded 9/9 layers, CUDA0 weights 1565 MiB")
    fell_back = (DATA / "llama.cpp-0c1e57098-cpu-image-ngl99.txt").read_text()
    assert mainline.gpu_use(fell_back) == (False, "its log says 'no usable GPU found'")
    assert mainline.gpu_use("0.01.182.790 I srv  llama_server: model loaded\n")[0] is None  # default -lv
    assert mainline.gpu_use("load_tensors: offloaded 0/9 layers to GPU\n")[0] is False
    ik_log = (RESULTS / "cuda-images-2026-11-30/ik_llama.cpp-p1-run1/image-server-log.txt").read_text()
    assert ik.gpu_use(ik_log) == (True, "offloaded 5/5 layers, CUDA0 weights 162 MiB")
    sglang = (RESULTS / "kt-amx-2026-12-01/kt-amx-server.log").read_text()
    assert kt.gpu_use(sglang) == (True, "weights 0.38 GB on the GPU, KV cache of 32978591 tokens")
    assert kt.gpu_use("KTransformers EP is enabled.\n")[0] is None
    assert get_engine("ktransformers-legacy").gpu_use(sglang)[0] is None  # its log is not read


def test_only_a_lost_container_init_counts_as_the_hosts_hiccup() -> None:
    """`up` starts the stack again only when Docker's runtime lost the container's init (the engine never
    ran); an engine that failed is reported at once."""
    lost = (
        b"Error response from daemon: failed to create task for container: failed to create shim task: OCI "
        b"runtime create failed: runc create failed: unable to start container process: waiting for init "
        b"preliminary setup: read init-p: connection reset by peer: unknown\n"
    )
    unhealthy = b"container mst-engine-1 is unhealthy\n"
    assert runtime_lost_init(DockerException(["docker", "compose", "up"], 1, stderr=lost))
    assert not runtime_lost_init(DockerException(["docker", "compose", "up"], 1, stderr=unhealthy))
