"""A stack's llama-server arguments as llama-bench or llama-sweep-bench arguments: the same model,
threads, placement (-ngl, -ot, -ts), batch sizes, KV cache type and engine switches, so the tool
measures what the stack runs. Each flag is written only where the tool's own --help lists it; what
changes speed but has no spelling in the tool is reported, never silently dropped.

The two tools parse differently. llama-bench (both engines) takes each setting as a list to compare
(`-ub 512,2048`), so a switch is `-fmoe 1`, several -ot rules go into one argument (mainline joins
them with `;` and keeps `,` for alternatives; ik_llama.cpp joins them with `,`) and a tensor split
is written `3/1`. llama-sweep-bench (ik_llama.cpp) parses the server's own common arguments, so it
takes the server's flags as they are, context size included (it sweeps over the whole context).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A token that is a flag, not a value such as "-1".
_FLAG = re.compile(r"^-{1,2}[A-Za-z]")

# Serving only: no bearing on a benchmark's speed (network, API, sampling defaults, slots).
SERVING_ONLY = frozenset({
    "--host", "--port", "-np", "--parallel", "-a", "--alias", "--jinja", "--no-jinja", "--metrics",
    "--chat-template", "--api-key", "--api-key-file", "--temp", "--top-p", "--top-k", "--min-p",
    "--models-preset", "--models-max"
})  # fmt: skip
# llama-bench has no context size: a test's context is its prompt plus what it generates.
_CONTEXT = frozenset({"-c", "--ctx-size"})

# Server spellings of a valued setting → llama-bench's flag for it (each group's first).
_VALUED = {
    spelling: spellings[0]
    for spellings in (
        ("-m", "--model"), ("-t", "--threads"), ("-ngl", "--n-gpu-layers", "--gpu-layers"),
        ("-b", "--batch-size"), ("-ub", "--ubatch-size"), ("-ctk", "--cache-type-k"),
        ("-ctv", "--cache-type-v"), ("-mla", "--mla-use"), ("-amb", "--attention-max-batch"),
        ("-cuda", "--cuda-params"), ("--n-cpu-moe", "-ncmoe"), ("-sm", "--split-mode"), ("-mg", "--main-gpu"),
        ("--numa",), ("-lm", "--load-mode"), ("-ser", "--smart-expert-reduction"),
    )
    for spelling in spellings
}  # fmt: skip
# Server on/off switches → llama-bench's flag and value for them; where spellings differ between
# versions, the first the tool lists (mainline replaced -mmp with -lm, its load mode).
_SWITCHES: dict[str, tuple[tuple[str, str], ...]] = {
    "-fmoe": (("-fmoe", "1"),),
    "--fused-moe": (("-fmoe", "1"),),
    "-no-fmoe": (("-fmoe", "0"),),
    "--no-fused-moe": (("-fmoe", "0"),),
    "-rtr": (("-rtr", "1"),),
    "--run-time-repack": (("-rtr", "1"),),
    "--no-mmap": (("-mmp", "0"), ("-lm", "none")),
    "-thp": (("-thp", "1"),),
    "--transparent-huge-pages": (("-thp", "1"),),
    "-nkvo": (("-nkvo", "1"),),
    "--no-kv-offload": (("-nkvo", "1"),),
}
_OVERRIDE = frozenset({"-ot", "--override-tensor"})
_SPLIT = frozenset({"-ts", "--tensor-split"})
_FLASH = frozenset({"-fa", "--flash-attn"})


@dataclass(frozen=True)
class ToolArgs:
    """A tool's arguments for a stack, and the server settings it could not be given."""

    args: list[str]
    left_out: list[str]


def server_settings(args: list[str]) -> list[tuple[str, str | None]]:
    """`--flag value` / `--switch` pairs of a server command line (a value is the next token that
    doesn't look like a flag; `--flag=value` is split)."""
    pairs: list[tuple[str, str | None]] = []
    at = 0
    while at < len(args):
        token = args[at]
        if "=" in token and _FLAG.match(token) and token.startswith("--"):
            flag, value = token.split("=", 1)
            pairs.append((flag, value))
            at += 1
            continue
        if at + 1 < len(args) and not _FLAG.match(args[at + 1]):
            pairs.append((token, args[at + 1]))
            at += 2
        else:
            pairs.append((token, None))
            at += 1
    return pairs


def llama_bench_args(server_args: list[str], bench_flags: dict[str, str], rule_separator: str) -> ToolArgs:
    """llama-bench arguments for the stack whose server runs `server_args`; `bench_flags` is the
    tool's --help, parsed (flag → its placeholder)."""
    args: list[str] = []
    left_out: list[str] = []
    rules: list[str] = []

    def put(flag: str, value: str, said: str) -> None:
        if flag in bench_flags:
            args.extend([flag, value])
        else:
            left_out.append(f"{said} (this llama-bench has no {flag})")

    for flag, value in server_settings(server_args):
        said = flag if value is None else f"{flag} {value}"
        if flag in SERVING_ONLY or flag in _CONTEXT:
            continue
        if flag in _OVERRIDE and value is not None:
            if rule_separator in value:
                left_out.append(f"{said} (its {rule_separator!r} would split it in llama-bench's -ot)")
            else:
                rules.append(value)
        elif flag in _SPLIT and value is not None:
            put("-ts", value.replace(",", "/"), said)
        elif flag in _FLASH:
            mode = value or "on"
            numeric = "on" not in bench_flags.get("-fa", "on")  # `<0|1>`: ik_llama.cpp's llama-bench
            if numeric and mode == "auto":
                left_out.append(f"{said} (this llama-bench's -fa is 0 or 1; it runs its default)")
            else:
                put("-fa", {"on": "1", "off": "0"}.get(mode, mode) if numeric else mode, said)
        elif flag in _VALUED and value is not None:
            put(_VALUED[flag], value, said)
        elif flag in _SWITCHES and value is None:
            spellings = _SWITCHES[flag]
            put(*next((pair for pair in spellings if pair[0] in bench_flags), spellings[0]), said)
        else:
            left_out.append(said)
    if rules:
        put("-ot", rule_separator.join(rules), " ".join(f"-ot {rule}" for rule in rules))
    return ToolArgs(args=args, left_out=left_out)


def sweep_bench_args(server_args: list[str], sweep_flags: dict[str, str]) -> ToolArgs:
    """llama-sweep-bench arguments: the server's own, less the serving-only ones; a flag the tool's
    parser lacks is reported instead of passed (it would refuse to start)."""
    args: list[str] = []
    left_out: list[str] = []
    for flag, value in server_settings(server_args):
        said = flag if value is None else f"{flag} {value}"
        if flag in SERVING_ONLY:
            continue
        if flag not in sweep_flags:
            left_out.append(f"{said} (this llama-sweep-bench has no {flag})")
            continue
        args.extend([flag] if value is None else [flag, value])
    return ToolArgs(args=args, left_out=left_out)
