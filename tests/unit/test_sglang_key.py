"""The KTransformers image's API key path: a stack with --api-key-file mounts the key as a secret and
names it in MOE_STACK_API_KEY_FILE (no key in the compose file or on a command line); the image's
launcher reads it into SGLang's parsed arguments.

SGLang itself cannot run here (its server needs the GPU): the launcher is run against a stand-in
`sglang` package with the two entry points sglang-kt 0.7.2's launch_server.py uses
(`prepare_server_args`, `run_server`; `kill_process_tree`), recording what the server and a spawned
worker would get, and logging the arguments as SGLang does (the key must show as the launcher's mask).
The real server with a key is for the GPU machine (issue 27; the device harness's `kt` measure records whether
its log holds the key)."""

from __future__ import annotations

import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import yaml

from builder.contract import API_KEY_FILE_ENV, API_KEY_PATH, API_KEY_SECRET
from builder.models.synth_moe import write_moe_gguf
from builder.models.synth_shapes import TINY_SHAPES
from tests.cli import run_cli_in_process

LAUNCHER = Path(__file__).parents[2] / "dockerfiles/ktransformers/moe-stack-sglang-with-key"
WRAPPER = Path(__file__).parents[2] / "dockerfiles/ktransformers/moe-stack-server"
RESULTS = Path(__file__).parents[2] / "bench/results"
STAND_IN = {
    "sglang/__init__.py": "",
    "sglang/srt/__init__.py": "",
    # As SGLang's server does: the root logger set up anew (force=True), `server_args=ServerArgs(...)`
    # logged, and the arguments pickled to a worker started by multiprocessing's spawn, which logs them too.
    "sglang/launch_server.py": """
import json, logging, multiprocessing, os

logger = logging.getLogger(__name__)


def record(server_args, name):
    logging.basicConfig(level=logging.INFO, force=True)
    logger.info(f"{server_args=}")
    with open(os.path.join(os.environ["RECORD"], name), "w") as out:
        json.dump({"argv": server_args.argv, "api_key": server_args.api_key,
                   "bearer": f"Bearer {server_args.api_key}",
                   "cmdline": open("/proc/self/cmdline").read().split(chr(0))}, out)


def run_server(server_args):
    record(server_args, "server.json")
    print(server_args, flush=True)
    worker = multiprocessing.get_context("spawn").Process(target=record, args=(server_args, "worker.json"))
    worker.start()
    worker.join()
""",
    "sglang/srt/server_args.py": """
import dataclasses


@dataclasses.dataclass
class ServerArgs:
    argv: list
    api_key: str | None = None


def prepare_server_args(argv):
    return ServerArgs(list(argv))
""",
    "sglang/srt/utils.py": "def kill_process_tree(pid, include_parent=True):\n    pass\n",
}
MASK = runpy.run_path(str(LAUNCHER))["MASK"]


def _stand_in(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    for name, text in STAND_IN.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def _launch(
    tmp_path: Path, key_text: str | None, *args: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    tmp_path.mkdir(exist_ok=True)
    key = tmp_path / "api-key"
    if key_text is not None:
        key.write_text(key_text)
    record = tmp_path / "record"
    record.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": str(_stand_in(tmp_path)),
        "RECORD": str(record),
        API_KEY_FILE_ENV: str(key),
        "MOE_STACK_SERVER_MODULE": "sglang.launch_server",
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    copy = tmp_path / "bin"
    copy.mkdir()
    for script in (WRAPPER, LAUNCHER):  # side by side, as the image installs them
        (copy / script.name).write_text(script.read_text())
        (copy / script.name).chmod(0o755)
    done = subprocess.run(
        ["sh", str(copy / WRAPPER.name), *args], capture_output=True, text=True, env=env, check=False
    )
    return done, record


def test_the_launcher_hands_sglang_the_key_and_no_command_line_holds_it(tmp_path: Path) -> None:
    done, record = _launch(tmp_path, "s3cret-key\n", "--model-path", "/model-config", "--port", "8080")
    assert done.returncode == 0, done.stderr
    for process in ("server", "worker"):
        seen = json.loads((record / f"{process}.json").read_text())
        assert seen["api_key"] == "s3cret-key" and seen["bearer"] == "Bearer s3cret-key"
        assert seen["argv"] == ["--model-path", "/model-config", "--port", "8080"]
        assert not any("s3cret" in arg for arg in seen["cmdline"])


def test_no_log_line_or_print_of_sglangs_arguments_holds_the_key(tmp_path: Path) -> None:
    done, record = _launch(tmp_path, "s3cret-key\n", "--port", "8080")
    assert done.returncode == 0, done.stderr
    assert json.loads((record / "worker.json").read_text())["api_key"] == "s3cret-key"
    assert "s3cret" not in done.stdout + done.stderr
    masked = f"api_key={MASK!r}"
    assert masked in done.stdout  # the print
    assert done.stderr.count(masked) == 2, done.stderr  # the server's log line and its worker's


def test_the_launcher_refuses_an_empty_key_file_and_a_key_on_the_command_line(tmp_path: Path) -> None:
    empty, _ = _launch(tmp_path / "a", "\n")
    assert empty.returncode == 1 and "is empty" in empty.stderr and "Traceback" not in empty.stderr
    given, _ = _launch(tmp_path / "b", "k\n", "--api-key", "k")
    assert given.returncode == 1 and "drop --api-key" in given.stderr
    missing, _ = _launch(tmp_path / "c", None)
    assert missing.returncode == 1 and "can't read the API key file" in missing.stderr


def test_a_ktransformers_stack_with_a_key_names_its_file_and_carries_no_key(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    model = write_moe_gguf(tmp_path / "m.gguf", TINY_SHAPES["qwen3moe"])  # compose reads its header
    model.chmod(0o644)
    hf = tmp_path / "hf"
    hf.mkdir(mode=0o755)
    for name in ("config.json", "model.safetensors"):
        (hf / name).write_text("{}")
        (hf / name).chmod(0o644)
    key = tmp_path / "key"
    key.write_text("s3cret-key\n")
    key.chmod(0o644)
    out = tmp_path / "kt.yaml"
    result = run_cli_in_process(
        "compose", "--engine", "ktransformers", "--model", str(model), "--config-dir", str(hf),
        "--gpu", "nvidia", "--image", "ghcr.io/moe-stack/ktransformers:0.7.2-cuda12.8-zen4",
        "--api-key-file", str(key), "--skip-image-checks", "--for-other-host", "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "s3cret" not in out.read_text()
    document = yaml.safe_load(out.read_text())
    engine = document["services"]["engine"]
    assert engine["environment"][API_KEY_FILE_ENV] == API_KEY_PATH
    assert engine["secrets"] == [API_KEY_SECRET] and document["secrets"][API_KEY_SECRET]["file"] == str(key)
    assert not any("api-key" in arg for arg in engine["command"])


SCRUBBED = "api_key=[scrubbed]"  # what a committed log holds where SGLang printed the key (or its mask)


def test_no_committed_server_log_holds_a_key() -> None:
    """SGLang's `server_args=ServerArgs(...)` lines kept in bench/results hold no key, not even a test one
    or the launcher's quoted mask (a string in a key's place reads as a key to a scanner): None, or the
    scrub marker."""
    leaks = []
    for path in sorted(RESULTS.rglob("*")):
        text = path.read_text(errors="replace") if path.is_file() else ""
        for found in re.finditer(r"\bapi_key=", text):
            if not text.startswith((SCRUBBED, "api_key=None"), found.start()):
                leaks.append(f"{path.relative_to(RESULTS)}:{text.count(chr(10), 0, found.start()) + 1}")
    assert not leaks, f"an API key in {leaks}: write {SCRUBBED} in its place"
