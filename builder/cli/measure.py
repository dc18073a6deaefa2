"""`moe-stack bench | tune | smoke`: a stack measured and checked: its speed, its fastest settings on this
host, and whether it does what its file says."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from builder.cli.common import out, raw_stderr, text_table
from builder.cli.options import declared, takes_options
from builder.errors import SpecError
from builder.running.bandwidth import DecodeBound
from builder.running.benchmark import measure, running_bound
from builder.running.run import published_ports, stack_api_key
from builder.running.run import up as stack_up
from builder.running.tool_run import ToolBench, bench_with_tool, engine_service_name
from builder.spec import duration_seconds
from builder.stackfile.stack_file import StackFile
from builder.stacks.compose import write_stack
from builder.tuning.tune import Objective, TuneResult
from builder.tuning.tune_plot import plot
from builder.tuning.tune_stack import Tuned, tune_stack, tuned_document

# tune's options, each once
TuneBudgetOpt = Annotated[
    str, typer.Option("--budget", help="how long the search may take, e.g. 20m, 90s, 1h")
]
TuneDecodeOpt = Annotated[bool, typer.Option("--decode", help="tune for decode speed only")]
TunePrefillOpt = Annotated[bool, typer.Option("--prefill", help="tune for prefill speed only")]
TuneWriteOpt = Annotated[
    bool,
    typer.Option("--write", help="write the winner into FILE itself (default: FILE.tuned.yaml beside it)"),
]
TuneOutFileOpt = Annotated[Path | None, typer.Option("--out", "-o", help="where to write the tuned stack")]
TunePlotFileOpt = Annotated[Path | None, typer.Option("--plot", help="also a PNG chart of every trial")]
TunePromptTokensOpt = Annotated[
    int | None,
    typer.Option(
        "--prompt-tokens",
        "-p",
        help="prefill test length (default: 8192 on a GPU stack, whose prefill the micro-batch decides on "
        "long prompts; 512 on the CPU)",
    ),
]
TuneGenerateOpt = Annotated[int, typer.Option("--generate", "-n", help="decode test length")]
TuneOnlyOpt = Annotated[
    str | None,
    typer.Option("--only", help="tune these settings alone, comma-separated (e.g. fmoe,amb; default: all)"),
]
TuneToolsImageOpt = Annotated[
    str | None,
    typer.Option(
        "--tools-image", help="the tools image (default: the stack's image's repository with -tools)"
    ),
]
TuneNativeBinOpt = Annotated[
    Path | None,
    typer.Option(
        "--native-bin",
        help="run native builds from this directory instead of the tools image (hosts without Docker)",
    ),
]
TuneModelDirOpt = Annotated[
    Path | None,
    typer.Option("--model-dir", help="with --native-bin: the model's directory here (default: the stack's)"),
]


@takes_options()
def bench(
    compose_file: Annotated[
        Path, typer.Argument(help="compose file of the stack (started if it isn't running)")
    ] = Path("compose.yaml"),
    prompt_words: Annotated[
        int,
        typer.Option(
            "--prompt-words", "-p", help="prompt length (about one token per word; with --tool, tokens)"
        ),
    ] = 256,
    generate: Annotated[int, typer.Option("--generate", "-n", help="tokens to generate")] = 64,
    repetitions: Annotated[int, typer.Option("--repetitions", "-r", help="runs; the median is shown")] = 3,
    tool: Annotated[
        str | None,
        typer.Option(
            "--tool",
            help="llama-bench, or sweep-bench (ik_llama.cpp): the engine's own benchmark from the tools "
            "image, with the stack's flags, the stack stopped",
        ),
    ] = None,
    tools_image: Annotated[
        str | None,
        typer.Option(
            "--tools-image",
            help="with --tool: the tools image (default: the stack's image's repository with -tools, same "
            "tag)",
        ),
    ] = None,
    profile: str | None = declared(),
) -> None:
    """Prefill and decode tokens/s of a stack, as its engine reports them, with exactly the stack's flags."""
    if tool is not None:
        asked = (compose_file, tool, tools_image, prompt_words, generate, repetitions, profile)
        _show_tool_bench(bench_with_tool(*asked, starting=raw_stderr))
        return
    if tools_image is not None:
        raise SpecError("--tools-image goes with --tool llama-bench or --tool sweep-bench")
    stack_up(compose_file, 1800, profile)
    (bind, port), *_ = published_ports(compose_file)
    speed = measure(
        port,
        prompt_words,
        generate,
        repetitions,
        host="127.0.0.1" if bind == "0.0.0.0" else bind,
        api_key=stack_api_key(compose_file),
    )
    table = text_table("", "tokens", "median t/s", "runs t/s")
    table.add_row(
        "prefill",
        str(speed.prompt_tokens),
        f"{speed.prefill:.1f}",
        " ".join(f"{v:.1f}" for v in speed.prefill_tps),
    )
    table.add_row(
        "decode",
        str(speed.generated_tokens),
        f"{speed.decode:.1f}",
        " ".join(f"{v:.1f}" for v in speed.decode_tps),
    )
    out.print(table)
    bound = running_bound(compose_file, profile)
    said = bound.said(speed.decode) if isinstance(bound, DecodeBound) else f"no bandwidth bound: {bound}"
    out.print(said or "no bandwidth bound: the read rate was not measured", highlight=False, soft_wrap=True)


def _show_tool_bench(result: ToolBench) -> None:
    out.print(Text(f"{result.image}: {result.program} {' '.join(result.args)}", style="dim"), soft_wrap=True)
    for note in result.left_out:
        out.print(Text(f"not given to {result.program}: {note}", style="yellow"), soft_wrap=True)
    table = text_table("test", "depth", "mean t/s", "± sd", "runs t/s")
    for row in result.rows:
        table.add_row(
            row.test,
            str(row.depth),
            f"{row.tps:.1f}",
            f"{row.spread:.1f}",
            " ".join(f"{v:.1f}" for v in row.samples_tps),
        )
    out.print(table)


@takes_options()
def tune(
    compose_file: Annotated[
        Path, typer.Argument(help="compose file of the stack (stopped: tune measures its model and cores)")
    ] = Path("compose.yaml"),
    budget: TuneBudgetOpt = "20m",
    decode: TuneDecodeOpt = False,
    prefill: TunePrefillOpt = False,
    write: TuneWriteOpt = False,
    out_file: TuneOutFileOpt = None,
    plot_file: TunePlotFileOpt = None,
    prompt_tokens: TunePromptTokensOpt = None,
    generate: TuneGenerateOpt = 64,
    only: TuneOnlyOpt = None,
    tools_image: TuneToolsImageOpt = None,
    native_bin: TuneNativeBinOpt = None,
    model_dir: TuneModelDirOpt = None,
    profile: str | None = declared(),
) -> None:
    """Find this host's fastest settings for a stack (threads, batch sizes, mmap, ik_llama.cpp's repacking,
    fused MoE and offload batch, NUMA policy, a draft's length) with the engine's llama-bench (a drafting
    stack: its server, timing a completion), and write them into the stack."""
    if decode and prefill:
        raise SpecError("--decode and --prefill: give one, or neither to tune for both")
    objective: Objective = "decode" if decode else "prefill" if prefill else "both"
    if out_file is not None and write:
        raise SpecError("--write replaces FILE; --out writes elsewhere: give one")
    if model_dir is not None and native_bin is None:
        raise SpecError("--model-dir goes with --native-bin")
    tuned = tune_stack(
        compose_file,
        parse_duration(budget),
        objective,
        tools_image,
        native_bin,
        model_dir,
        profile,
        prompt_tokens,
        generate,
        tuple(name.strip() for name in only.split(",") if name.strip()) if only else (),
        progress=raw_stderr,
    )
    _print_tuned(tuned)
    document = StackFile.read(compose_file)
    name = engine_service_name(profile)
    target = compose_file if write else out_file or compose_file.with_suffix(".tuned.yaml")
    path = write_stack(tuned_document(document, name, tuned, " ".join(["moe-stack", *sys.argv[1:]])), target)
    out.print(f"wrote {path} (x-moe-stack.tuned records the run)", highlight=False)
    if plot_file is not None:
        out.print(f"wrote {plot(tuned.result, plot_file)}", highlight=False)


def _print_tuned(tuned: Tuned) -> None:
    """Every trial, the winner and how sure it is, what was left out, and the bandwidth bound."""
    result = tuned.result
    _print_trials(result)
    changed = {k: v for k, v in result.best.values.items() if v != result.baseline.values[k]}
    (pre_low, pre_high), (dec_low, dec_high) = result.ratio_spread
    out.print(
        f"{len(result.trials)} trials in {result.seconds:.0f} s; winner: "
        f"{', '.join(f'{k}={v}' for k, v in changed.items()) or 'the stack as it is'}",
        highlight=False,
    )
    if changed:
        out.print(
            f"tuned ÷ stack (confirm rounds, alternating): prefill of {result.prompt_tokens} tokens "
            f"{result.ratios[0]:.2f} "
            f"({pre_low:.2f}-{pre_high:.2f}), decode {result.ratios[1]:.2f} ({dec_low:.2f}-{dec_high:.2f})",
            highlight=False,
        )
    else:
        out.print(
            f"the stack's own trials (median): prefill of {result.prompt_tokens} tokens "
            f"{result.baseline_tps[0]:.1f} t/s, decode "
            f"{result.baseline_tps[1]:.2f} t/s",
            highlight=False,
        )
    if result.not_confirmed:
        out.print(
            Text(
                "not confirmed, so not taken: "
                f"{', '.join(f'{k}={v}' for k, v in result.not_confirmed.items())} "
                "(the confirm rounds measured it within noise of the stack)",
                style="yellow",
            ),
            soft_wrap=True,
        )
    for setting, why in result.failed.items():
        out.print(Text(f"failed, left out: {setting}: {why}", style="yellow"), soft_wrap=True)
    if result.skipped:
        out.print(Text(f"left out: {'; '.join(result.skipped)}", style="yellow"), soft_wrap=True)
    bound = tuned.said(result.tuned_tps[1])
    if bound is not None:
        out.print(bound, highlight=False, soft_wrap=True)


def _print_trials(result: TuneResult) -> None:
    table = text_table("#", "setting", "prefill t/s", "decode t/s", "s")
    for number, trial in enumerate(result.trials, 1):
        table.add_row(
            str(number),
            trial.label,
            f"{trial.prefill_tps:.1f}",
            f"{trial.decode_tps:.2f}",
            f"{trial.seconds:.0f}",
        )
    out.print(table)


def parse_duration(text: str) -> float:
    """`20m`, `90s`, `1h`, `1h30m` or plain seconds → seconds."""
    seconds = duration_seconds(text)
    if seconds is None:
        raise SpecError(f"--budget {text!r}: a duration such as 20m, 90s or 1h30m")
    return float(seconds)


@takes_options()
def smoke(
    compose_file: Annotated[
        Path, typer.Argument(help="compose file of the stack (started if it isn't running)")
    ] = Path("compose.yaml"),
    profile: str | None = declared(),
    timeout: Annotated[
        int, typer.Option("--timeout", help="seconds the stack may take to become healthy")
    ] = 1800,
    as_json: Annotated[bool, typer.Option("--json", help="the checks as JSON")] = False,
) -> None:
    """Check a stack does what its file says: healthy, its served name, a completion, each API its engine
    serves through the official openai and anthropic clients (chat, streaming, tool calls, Responses,
    Messages, token count), the command it runs, its threads/cpuset/NUMA policy and GPU from inside,
    metrics. Exit 1 on a failure."""
    # Here, not at the top: the official clients take most of the CLI's start-up to import (openai
    # and anthropic 1.8 of 2.5 s on 2 busy cores), and only smoke asks through them.
    from builder.running.smoke import smoke as run_smoke

    checks = run_smoke(compose_file, profile, timeout)
    if as_json:
        sys.stdout.write(json.dumps([asdict(check) for check in checks], indent=2) + "\n")
    else:
        table = text_table("check", "", "seen")
        for check in checks:
            table.add_row(
                check.name,
                Text("ok", style="green") if check.passed else Text("FAIL", style="red"),
                check.seen,
            )
        out.print(table)
    if not all(check.passed for check in checks):
        raise typer.Exit(1)
