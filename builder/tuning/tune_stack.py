"""`moe-stack tune FILE`: the search of tune.py run for one stack file, from its tools image (or
native builds), with the host's memory bandwidth and the model's bytes per token for the decode bound,
and the winner written back as a stack file with `x-moe-stack.tuned`."""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from builder.contract import NUMA_ENV
from builder.engines import bench_engine
from builder.engines.tune_space import speculates
from builder.errors import StackError
from builder.host.probe import probe
from builder.images.naming import tools_image_of
from builder.platform.flags import parse_help
from builder.running.bandwidth import ARRAY_MIB, TOOL, DecodeBound, ReadBandwidth, parse_bandwidth
from builder.running.run import check_model_here
from builder.running.tool_bench import NativeRunner, Runner
from builder.running.tool_run import ContainerRunner, stack_server_args
from builder.stackfile.record import Bound, Rates, Ratios, Record, Served, Tuning
from builder.stackfile.service_parts import engine_service_name
from builder.stackfile.stack_file import StackFile
from builder.tuning.tune import CPU_PROMPT_TOKENS, HYBRID_PROMPT_TOKENS, Objective, Tuner, TuneResult, chosen


@dataclass(frozen=True)
class Tuned(DecodeBound):
    """A finished search and the bound it is measured against (the probe's read rate)."""

    result: TuneResult


def read_bandwidth(
    runner: Runner, env: dict[str, str], progress: Callable[[str], None], tries: int = 2
) -> ReadBandwidth | None:
    """The read rate moe-stack-bandwidth measures where the trials run (on the CPUs they may use);
    None (and why, to `progress`) when it can't in `tries` runs: an image that predates it, too little
    memory. A second run covers a one-off failure on a busy host (CI lost the figure once, unexplained)."""
    for attempt in range(1, tries + 1):
        try:
            printed = runner.run(TOOL, [str(ARRAY_MIB)], env).stdout
        except StackError as err:
            why = str(err)
        else:
            found = parse_bandwidth(printed)
            if found is not None:
                progress(f"memory read rate {found.describe()}")
                return found
            why = f"{TOOL} printed {printed.strip()[-120:]!r}"
        then = "once more" if attempt < tries else "so no bound ratio"
        progress(f"no bandwidth figure ({why}); {then}")
    return None


def tune_stack(
    compose_file: Path,
    budget_s: float,
    objective: Objective,
    tools_image: str | None = None,
    native_bin: Path | None = None,
    model_dir: Path | None = None,
    profile: str | None = None,
    prompt_tokens: int | None = None,
    generate: int = 64,
    only: tuple[str, ...] = (),
    progress: Callable[[str], None] = lambda line: None,
) -> Tuned:
    """Search `compose_file`'s stack for `budget_s` seconds (its tools image in a container shaped like
    the stack's, or the native builds in `native_bin`, the model's directory being `model_dir`, by
    default the stack's), after probing the memory bandwidth the same way; `only`: these dimensions
    alone (none: all); prefill on a prompt of `prompt_tokens` (None: the stack's kind's default)."""
    document = StackFile.read(compose_file)
    served_by, image, args = stack_server_args(document, compose_file, profile)
    engine = bench_engine(served_by)  # an engine with llama-bench, else one line
    name = engine_service_name(profile)
    check_model_here(document, compose_file)
    model = document.record.model
    tools = tools_image or tools_image_of(image)
    runner = _runner(compose_file, tools, profile, native_bin, model_dir or model.parent, progress)
    env = {NUMA_ENV: document.service(name).env.get(NUMA_ENV, "none")}
    hybrid = _served(document.record, name, compose_file).gpu_layers not in (None, 0)
    tuner = Tuner(
        engine=engine,
        runner=runner,
        bench_flags=_bench_flags(runner),
        args=args,
        env=env,
        dimensions=chosen(engine.tune_dimensions(args, len(probe().nodes), hybrid), only),
        objective=objective,
        prompt_tokens=prompt_tokens or (HYBRID_PROMPT_TOKENS if hybrid else CPU_PROMPT_TOKENS),
        generate=generate,
        progress=progress,
        served=speculates(args),
    )
    if tuner.served:
        progress(
            "the stack drafts tokens, which llama-bench can't: each trial serves it, timing a completion"
        )
    progress("measuring memory bandwidth (moe-stack-bandwidth, where the trials run)")
    bandwidth = read_bandwidth(runner, env, progress)
    return Tuned(
        result=tuner.run(budget_s),
        bandwidth=bandwidth,
        bytes_per_token=engine.model_format.facts(model).read_per_token(hybrid),
        hybrid=hybrid,
    )


def _runner(
    compose_file: Path,
    tools_image: str,
    profile: str | None,
    native_bin: Path | None,
    model_dir: Path,
    progress: Callable[[str], None],
) -> Runner:
    """Where the trials run: the native builds in `native_bin`, else the tools image in a container shaped
    like the stack's (checked present, and the stack stopped)."""
    if native_bin is not None:
        if not (native_bin / "llama-bench").is_file():
            raise StackError(
                f"no llama-bench in {native_bin}: build it with `cmake --build BUILD --target llama-bench` "
                "(configure with `moe-stack cmake-args`)"
            )
        return NativeRunner(native_bin, model_dir)
    container = ContainerRunner(compose_file, tools_image, profile, progress)
    container.check_image()
    container.check_stopped()
    return container


def _bench_flags(runner: Runner) -> dict[str, str]:
    """The flags the runner's llama-bench takes, read from its usage."""
    flags = parse_help(runner.help("llama-bench"))
    if "-m" not in flags:
        raise StackError(
            "the tools image's llama-bench printed no usage; rebuild it with `moe-stack build --tools`"
        )
    return flags


def _served(record: Record, name: str, compose_file: Path) -> Served:
    served = record.serves.get(name)
    if served is None:
        raise StackError(
            f"{compose_file} records nothing of what it serves (x-moe-stack.serves); emit it again with "
            "this moe-stack's `compose`"
        )
    return served


def tuned_document(
    document: StackFile,
    service_name: str,
    tuned: Tuned,
    generated_by: str,
    now: datetime | None = None,
    host: str | None = None,
) -> StackFile:
    """The stack's file with the winner's arguments and environment, and what tuning found recorded
    under `x-moe-stack.tuned`."""
    result = tuned.result
    service = document.service(service_name)
    changed: dict[str, object] = {"command": tuple(result.best.args)}
    numa = result.best.env.get(NUMA_ENV)
    if numa is not None and numa != service.env.get(NUMA_ENV, "none"):
        changed["environment"] = {**service.env, NUMA_ENV: numa}
    serves = dict(document.record.serves)
    served = serves.get(service_name)
    if served is not None and str(result.best.values.get("threads", "")).isdigit():  # the winner's --threads
        serves[service_name] = served.model_copy(update={"threads": int(result.best.values["threads"])})
    record = document.record.model_copy(
        update={"serves": serves, "tuned": _tuned_record(tuned, generated_by, now, host)}
    )
    services = {**document.services, service_name: service.model_copy(update=changed)}
    return document.model_copy(update={"record": record, "services": services})


def _tuned_record(tuned: Tuned, generated_by: str, now: datetime | None, host: str | None) -> Tuning:
    """x-moe-stack.tuned: where and when, the settings that won, what they gained, the decode bound."""
    result = tuned.result
    ratio_prefill, ratio_decode = result.ratios
    (pre_low, pre_high), (dec_low, dec_high) = result.ratio_spread
    return Tuning(
        host=host or socket.gethostname(),
        date=(now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        by=generated_by,
        objective=result.objective,
        settings=dict(result.best.values),
        changed={
            name: f"{result.baseline.values[name]} -> {value}"
            for name, value in result.best.values.items()
            if value != result.baseline.values[name]
        },
        trials=len(result.trials),
        seconds=round(result.seconds),
        prompt_tokens=result.prompt_tokens,
        stack_tps=Rates(prefill=round(result.baseline_tps[0], 1), decode=round(result.baseline_tps[1], 2)),
        tuned_tps=Rates(prefill=round(result.tuned_tps[0], 1), decode=round(result.tuned_tps[1], 2)),
        tuned_over_stack=Ratios(
            prefill=f"{ratio_prefill:.2f} ({pre_low:.2f}-{pre_high:.2f})",
            decode=f"{ratio_decode:.2f} ({dec_low:.2f}-{dec_high:.2f})",
        ),
        left_out=tuple(result.skipped),
        not_confirmed=dict(result.not_confirmed),
        failed=dict(result.failed),
        bound=_bound(tuned) if tuned.bandwidth_gbps else None,
    )


def _bound(tuned: Tuned) -> Bound:
    ratio = tuned.bound_ratio(tuned.result.tuned_tps[1])
    return Bound(
        read_gbps=tuned.bandwidth_gbps or 0.0,
        read_median_gbps=tuned.bandwidth.median if tuned.bandwidth else None,
        read_min_gbps=tuned.bandwidth.low if tuned.bandwidth else None,
        bytes_per_token=tuned.bytes_per_token,
        weights_read="active experts (the rest on the GPU)" if tuned.hybrid else "all active weights",
        bound_tps=round(tuned.bound_tps or 0.0, 2),
        decode_over_bound=round(ratio, 3) if ratio is not None else None,
    )
