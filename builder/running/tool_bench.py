"""`moe-stack bench --tool`: the engine's own benchmark (llama-bench, or ik_llama.cpp's
llama-sweep-bench) run from the tools image with the stack's flags. Pure: what to run and how to read
its output; `tool_run` runs it (in a container shaped like the stack's, or a native binary).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from builder.contract import MODEL_DIR, NUMA_ENV
from builder.engines.llama_bench import ToolArgs, llama_bench_args, sweep_bench_args
from builder.engines.llama_family import LlamaFamilyEngine
from builder.engines.tune_space import without
from builder.errors import StackError

TOOLS = ("llama-bench", "sweep-bench")


@dataclass(frozen=True)
class ToolOutput:
    stdout: str
    stderr: str  # its log; llama-sweep-bench prints its results here too


class Runner(Protocol):
    """Runs a tool and returns what it printed: in a container shaped like the stack's
    (tool_run.ContainerRunner) or a native build (NativeRunner), so what calls it never depends on
    where it runs."""

    def run(self, program: str, args: list[str], env: dict[str, str] | None = None) -> ToolOutput:
        """What the tool printed (`env`: overrides of the stack's environment, e.g. MOE_STACK_NUMA);
        StackError naming its last error line when it fails."""

    def help(self, program: str) -> str:
        """The tool's --help text, whatever its exit status."""


@dataclass(frozen=True)
class NativeRunner:
    """Tools of a native build (`moe-stack cmake-args`): `bin_dir` holds them, and the stack's model
    directory is `model_dir` here (container paths under /models are rewritten to it)."""

    bin_dir: Path
    model_dir: Path

    def _local(self, args: list[str]) -> list[str]:
        prefix = MODEL_DIR + "/"
        return [str(self.model_dir / arg[len(prefix) :]) if arg.startswith(prefix) else arg for arg in args]

    def run(self, program: str, args: list[str], env: dict[str, str] | None = None) -> ToolOutput:
        """`program` from `bin_dir`, else from PATH (bash, for a served trial), with `bin_dir` first on
        PATH as the tools image has its engine directory."""
        own = self.bin_dir / program
        command = [
            *numactl_prefix((env or {}).get(NUMA_ENV, "none")),
            str(own) if own.is_file() else program,
            *self._local(args),
        ]
        path = f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', os.defpath)}"
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, check=False, env={**os.environ, "PATH": path}
            )
        except OSError as err:  # not in bin_dir nor on PATH: a build without the tool
            raise StackError(f"{program} can't run from {self.bin_dir} ({err.strerror})") from None
        if done.returncode != 0:
            raise StackError(f"{program} failed (exit {done.returncode}): {last_error(done.stderr)}")
        return ToolOutput(done.stdout, done.stderr)

    def help(self, program: str) -> str:
        done = subprocess.run(
            [str(self.bin_dir / program), "--help"], capture_output=True, text=True, check=False
        )
        return done.stdout + done.stderr


def numactl_prefix(policy: str) -> list[str]:
    """numactl's options for a stack's NUMA policy (what the image's entrypoint runs), natively."""
    kind, _, nodes = policy.partition(":")
    options = {
        "none": [],
        "interleave": [f"--interleave={nodes or 'all'}"],
        "membind": [f"--membind={nodes}", f"--cpunodebind={nodes}"],
        "cpunodebind": [f"--cpunodebind={nodes}"],
    }
    if kind not in options:
        raise StackError(
            f"NUMA policy {policy!r}: none, interleave[:NODES], membind:NODES or cpunodebind:NODES"
        )
    return ["numactl", *options[kind]] if options[kind] else []


def last_error(text: str) -> str:
    """The line of a tool's output that says what went wrong (else its last line)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    said = [line for line in lines if "error" in line.lower() or "failed" in line.lower()]
    return (said or lines or ["(no output)"])[-1]


@dataclass(frozen=True)
class BenchRow:
    """One test of a tool run: prefill (`pp512`) or decode (`tg128`), at a KV depth."""

    test: str
    tokens: int
    depth: int
    samples_tps: tuple[float, ...]

    @property
    def tps(self) -> float:
        return statistics.mean(self.samples_tps)

    @property
    def spread(self) -> float:
        """Standard deviation of the samples (0 for one)."""
        return statistics.stdev(self.samples_tps) if len(self.samples_tps) > 1 else 0.0


def program(engine: LlamaFamilyEngine, tool: str) -> str:
    """The program of `tool` in `engine`'s tools image."""
    if tool == "llama-bench":
        return "llama-bench"
    if tool == "sweep-bench":
        if engine.sweep_tool is None:
            raise StackError(
                f"{engine.name} has no sweep-bench (ik_llama.cpp's llama-sweep-bench); use --tool llama-bench"
            )
        return engine.sweep_tool
    raise StackError(f"--tool {tool!r}: choose {' or '.join(TOOLS)}")


def tool_args(
    engine: LlamaFamilyEngine,
    tool: str,
    server_args: list[str],
    tool_flags: dict[str, str],
    prompt_tokens: int,
    generate: int,
    repetitions: int,
) -> ToolArgs:
    """The tool's full argument list for a stack running `server_args`; `tool_flags` is the tool's
    own flag contract (llama-bench's --help; for sweep-bench, the server's, whose parser it shares)."""
    if tool == "sweep-bench":
        translated = sweep_bench_args(server_args, tool_flags)
        # It measures each ubatch-sized window up to the context size, generating -n tokens in each.
        return ToolArgs(
            args=[*translated.args, "-n", str(generate), "--output-format", "jsonl"],
            left_out=translated.left_out,
        )
    translated = llama_bench_args(server_args, tool_flags, engine.bench_rule_separator)
    tests = ["-p", str(prompt_tokens), "-n", str(generate), "-r", str(repetitions), "-o", "json"]
    return ToolArgs(args=[*translated.args, *tests], left_out=translated.left_out)


# A served trial, for what llama-bench can't run (speculative decoding): the server with the setting's
# arguments on a port of its own, polled on /health until the model is loaded, then one /completion,
# whose HTTP reply is printed; bash alone (the image has no curl). Arguments: PORT BODY SERVER ARGS...
SERVER_TRIAL = r"""
set -u
port=$1 body=$2
shift 2
"$@" --host 127.0.0.1 --port "$port" >&2 &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null' EXIT
until { exec 3<>"/dev/tcp/127.0.0.1/$port"; } 2>/dev/null \
    && printf 'GET /health HTTP/1.0\r\n\r\n' >&3 && IFS= read -r -t 10 status <&3 \
    && [[ $status == HTTP/1.?" 200 "* ]]; do
  exec 3<&- 3>&-
  kill -0 "$server" 2>/dev/null || { echo "the server exited before it was ready" >&2; exit 1; }
  [ "$SECONDS" -lt 3600 ] || { echo "the server was not ready within an hour" >&2; exit 1; }
  sleep 0.5
done
exec 3<&- 3>&-
exec 3<>"/dev/tcp/127.0.0.1/$port"
printf 'POST /completion HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s' \
  "${#body}" "$body" >&3
cat <&3
"""
# The trial's prompt: plain words, so any vocabulary tokenizes it (its token count is in the reply).
TRIAL_WORDS = "the quick brown fox jumps over a lazy dog while seven wizards box and judge my quiz "


@dataclass(frozen=True)
class ServedTiming:
    prefill_tps: float
    decode_tps: float
    drafted: int  # tokens the draft proposed (0 without one)
    accepted: int


def server_trial_args(
    server: str, server_args: list[str], port: int, prompt_tokens: int, generate: int
) -> list[str]:
    """`bash` arguments for one served trial of `server_args` (the stack's address and API key left
    out: it answers on 127.0.0.1:`port` inside the trial alone)."""
    args = without(server_args, ("--host", "--port", "--api-key", "--api-key-file"))
    words = TRIAL_WORDS.split()
    prompt = " ".join(words[i % len(words)] for i in range(prompt_tokens))
    body = json.dumps(
        {"prompt": prompt, "n_predict": generate, "temperature": 0, "cache_prompt": False, "ignore_eos": True}
    )
    return ["-c", SERVER_TRIAL, "moe-stack-trial", str(port), body, server, *args]


def parse_server_trial(text: str) -> ServedTiming:
    """The /completion reply a served trial printed (HTTP status line, headers, JSON): its timings."""
    head, _, body = text.replace("\r\n", "\n").partition("\n\n")
    status = head.splitlines()[0] if head else "(no reply)"
    if " 200 " not in status:
        raise StackError(f"the server answered the trial's completion with {status!r}: {body.strip()[:200]}")
    try:
        timings = json.loads(body).get("timings") or {}
    except (ValueError, AttributeError):
        raise StackError(
            f"the server's completion reply is not a JSON object: {body.strip()[:200]!r}"
        ) from None
    if "predicted_per_second" not in timings:
        raise StackError("the server's completion reply has no timings; it can't be measured this way")
    return ServedTiming(
        prefill_tps=float(timings.get("prompt_per_second", 0.0)),
        decode_tps=float(timings["predicted_per_second"]),
        drafted=int(timings.get("draft_n", 0)),
        accepted=int(timings.get("draft_n_accepted", 0)),
    )


def last_json_array(text: str) -> list[dict[str, Any]] | None:
    """The last JSON array of objects that starts a line of `text`, or of its JSON lines alone (indented,
    or a bracket by itself): ik_llama.cpp's llama-bench prints its model-load messages ("Computed
    blk.0.attn_kv_b.weight ...") on stdout in the middle of its pretty-printed array."""
    json_lines = [line for line in text.splitlines() if line.strip() in ("[", "]") or line[:1].isspace()]
    decoder = json.JSONDecoder()
    for candidate in (text, "\n".join(json_lines)):
        found = None
        for match in re.finditer(r"^\[", candidate, re.MULTILINE):
            try:
                value, _ = decoder.raw_decode(candidate, match.start())
            except ValueError:
                continue
            if isinstance(value, list) and all(isinstance(row, dict) for row in value):
                found = value
        if found is not None:
            return found
    return None


def parse_llama_bench(text: str) -> list[BenchRow]:
    """llama-bench's `-o json` output: one row per test."""
    tests = last_json_array(text)
    if tests is None:
        raise StackError(f"llama-bench printed no JSON result: {text.strip()[-200:] or '(nothing)'}")
    rows = []
    for test in tests:
        prompt, gen = int(test.get("n_prompt", 0)), int(test.get("n_gen", 0))
        name = f"pp{prompt}" if gen == 0 else f"tg{gen}" if prompt == 0 else f"pp{prompt}+tg{gen}"
        samples = tuple(float(v) for v in test.get("samples_ts") or [test["avg_ts"]])
        rows.append(
            BenchRow(test=name, tokens=prompt or gen, depth=int(test.get("n_depth", 0)), samples_tps=samples)
        )
    return rows


def parse_sweep_bench(text: str) -> list[BenchRow]:
    """llama-sweep-bench's `--output-format jsonl` (in its log): a prefill and a decode row per window."""
    rows = []
    for line in text.splitlines():
        start = line.find('{"n_kv_max"')  # its log prefixes a timestamp ("[1796072781] {...}")
        if start < 0:
            continue
        window = json.loads(line[start:])
        for step in ("pp", "tg"):
            tokens, tps = int(window[step]), float(window[f"speed_{step}"])
            rows.append(
                BenchRow(test=f"{step}{tokens}", tokens=tokens, depth=int(window["n_kv"]), samples_tps=(tps,))
            )
    if not rows:
        raise StackError(f"llama-sweep-bench printed no result: {text.strip()[-200:] or '(nothing)'}")
    return rows


def parse(tool: str, output: ToolOutput) -> list[BenchRow]:
    if tool == "sweep-bench":
        return parse_sweep_bench(output.stdout + "\n" + output.stderr)
    return parse_llama_bench(output.stdout)
