"""`moe-stack tune`: this host's fastest settings for a stack, found by the engine's own llama-bench
with the stack's model and flags, and written back into the stack.

The search is a coordinate search. The stack's own settings are the incumbent. One dimension at a
time (the engine adapter's: threads, -ub, mmap, ik_llama.cpp's switches, the NUMA policy on several
nodes), every candidate value is measured in rounds whose order alternates (forward, then backward),
after one warm-up trial that pays the model's page-in. A candidate replaces the incumbent only when
its median beats the incumbent's by more than the incumbent's own spread between rounds (and by at
least MIN_GAIN): on a shared host single runs differ by 10 %. A confirm round then alternates the
winner with the stack's original settings, and its ratio is what the table reports; a winner that
does not beat the stack there by MIN_GAIN is dropped (the stack is kept, and the result says so).

Trials run through a Runner (tool_bench): a container shaped like the stack's, or native builds, so
the search does not depend on Docker being where the benchmark runs. A trial is one llama-bench run,
or, for a stack that drafts tokens (llama-bench has no speculative decoding), the server itself with
the setting's arguments answering one completion (`served`): its own timings are the figures.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from builder.engines.llama_bench import ToolArgs
from builder.engines.llama_family import LlamaFamilyEngine
from builder.engines.tune_space import Args, Dimension, Env
from builder.errors import StackError
from builder.running.tool_bench import (
    Runner,
    parse_llama_bench,
    parse_server_trial,
    server_trial_args,
    tool_args,
)
from builder.stackfile.host_checks import free_local_port

Objective = Literal["decode", "prefill", "both"]
MIN_GAIN = 0.03  # a winner must beat the incumbent by at least this much, whatever the spread
ROUNDS = 3  # samples per candidate (fewer when the budget is short; never below MIN_ROUNDS)
MIN_ROUNDS = 2

# The prefill test's prompt: on a GPU stack, long (each micro-batch copies a layer's CPU experts to the GPU,
# so the micro-batch decides prefill only on prompts longer than it: an 8192-token prompt on R1's widths
# went 6285 → 11056 t/s from -ub 2048 to 8192, a 2048-token one not at all, bench/results/
# decode-bound-2026-12-03/prefill-search); on the CPU, llama-bench's usual 512, which keeps each of the
# search's trials short where prefill is slow.
HYBRID_PROMPT_TOKENS = 8192
CPU_PROMPT_TOKENS = 512


@dataclass(frozen=True)
class Setting:
    """One point of the search: a value per dimension, the server's arguments and environment."""

    values: dict[str, str]
    args: Args
    env: Env


@dataclass(frozen=True)
class Trial:
    dimension: str  # "warm-up", a dimension's name, or "confirm"
    value: str
    prefill_tps: float
    decode_tps: float
    seconds: float

    @property
    def label(self) -> str:
        return f"{self.dimension}={self.value}"


@dataclass(frozen=True)
class Plan:
    """What the budget allows: the dimensions searched, in order, and the rounds each gets."""

    dimensions: list[Dimension]
    skipped: list[str]
    rounds: int
    trials: int


@dataclass
class TuneResult:
    objective: Objective
    baseline: Setting
    best: Setting
    trials: list[Trial] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    # The confirm round: (baseline, tuned) medians of prefill and decode, and their ratios' spread.
    baseline_tps: tuple[float, float] = (0.0, 0.0)
    tuned_tps: tuple[float, float] = (0.0, 0.0)
    ratio_spread: tuple[tuple[float, float], tuple[float, float]] = ((0.0, 0.0), (0.0, 0.0))
    seconds: float = 0.0
    prompt_tokens: int = CPU_PROMPT_TOKENS  # the prefill test's length (its rates are of this prompt)
    # What the search picked but the confirm round did not bear out (the stack is kept then).
    not_confirmed: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # "dimension=value" → why its trial failed

    @property
    def ratios(self) -> tuple[float, float]:
        """tuned ÷ baseline, prefill and decode (confirm-round medians)."""
        return (
            _ratio(self.tuned_tps[0], self.baseline_tps[0]),
            _ratio(self.tuned_tps[1], self.baseline_tps[1]),
        )


def _ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


def score(objective: Objective, prefill: float, decode: float) -> float:
    if objective == "decode":
        return decode
    if objective == "prefill":
        return prefill
    return math.sqrt(max(prefill, 0.0) * max(decode, 0.0))


def searched(dimensions: list[Dimension], objective: Objective) -> list[Dimension]:
    """The dimensions that can move `objective` (a decode search skips prefill-only ones)."""
    return [d for d in dimensions if d.affects in ("both", objective) or objective == "both"]


def chosen(dimensions: list[Dimension], names: tuple[str, ...]) -> list[Dimension]:
    """The dimensions `names` asks for, in the search's own order (none asked: all); a name the stack
    has no dimension for is refused in one line that lists those it has."""
    if not names:
        return dimensions
    known = [d.name for d in dimensions]
    unknown = [name for name in names if name not in known]
    if unknown:
        raise StackError(
            f"--only {','.join(unknown)}: this stack has no such setting to tune; it has {', '.join(known)}"
        )
    return [d for d in dimensions if d.name in names]


def plan_search(dimensions: list[Dimension], budget_s: float, trial_s: float) -> Plan:
    """The rounds and dimensions that fit `budget_s` at `trial_s` a trial (warm-up done), confirm
    round included; dimensions that don't fit are dropped from the end and named."""
    if trial_s <= 0:
        raise StackError("a trial took no time; the benchmark did not run")
    if not dimensions:
        return Plan([], [], MIN_ROUNDS, 0)
    affordable = int(budget_s // trial_s)
    for rounds in range(ROUNDS, MIN_ROUNDS - 1, -1):
        kept = list(dimensions)
        while kept:
            needed = rounds * (sum(len(d.values) for d in kept) + 2)
            if needed <= affordable:
                return Plan(kept, [d.name for d in dimensions[len(kept) :]], rounds, needed)
            if rounds > MIN_ROUNDS:
                break  # first try fewer rounds over every dimension
            kept.pop()
    one = MIN_ROUNDS * (len(dimensions[0].values) + 2) if dimensions else 0
    raise StackError(
        f"--budget {budget_s:.0f}s is too small: one trial takes about {trial_s:.0f}s here and the first "
        f"dimension alone needs {one} trials; give --budget {math.ceil(one * trial_s / 60) + 1}m or more"
    )


@dataclass
class Tuner:
    """The search over `dimensions` for the stack running `args`, measured through `runner`."""

    engine: LlamaFamilyEngine
    runner: Runner
    bench_flags: dict[str, str]
    args: Args
    env: Env
    dimensions: list[Dimension]
    objective: Objective = "both"
    prompt_tokens: int = CPU_PROMPT_TOKENS
    generate: int = 64
    progress: Callable[[str], None] = lambda line: None
    served: bool = False  # trials serve the stack (a completion's timings), not llama-bench
    _baseline_trials: list[Trial] = field(default_factory=list)

    def measure(self, setting: Setting) -> tuple[float, float, float]:
        """(prefill, decode, seconds) of one trial of `setting`."""
        started = time.monotonic()
        if self.served:
            trial_args = server_trial_args(
                self.engine.server_target,
                setting.args,
                free_local_port(),
                self.prompt_tokens,
                self.generate,
            )
            timing = parse_server_trial(self.runner.run("bash", trial_args, setting.env).stdout)
            if timing.drafted:
                self.progress(f"the draft proposed {timing.drafted} tokens, {timing.accepted} accepted")
            return timing.prefill_tps, timing.decode_tps, time.monotonic() - started
        rows = parse_llama_bench(
            self.runner.run("llama-bench", self._bench_args(setting).args, setting.env).stdout
        )
        took = time.monotonic() - started
        prefill = next((r.tps for r in rows if r.test.startswith("pp")), 0.0)
        decode = next((r.tps for r in rows if r.test.startswith("tg")), 0.0)
        return prefill, decode, took

    def _bench_args(self, setting: Setting) -> ToolArgs:
        """One llama-bench run of `setting`: its flags as the tool takes them, one repetition."""
        return tool_args(
            self.engine, "llama-bench", setting.args, self.bench_flags, self.prompt_tokens, self.generate, 1
        )

    def _trial(self, result: TuneResult, dimension: str, value: str, setting: Setting) -> Trial:
        prefill, decode, took = self.measure(setting)
        trial = Trial(dimension, value, prefill, decode, took)
        result.trials.append(trial)
        if setting is result.baseline and dimension != "warm-up":
            self._baseline_trials.append(trial)
        self.progress(
            f"trial {len(result.trials)}: {dimension}={value}: prefill {prefill:.1f} t/s, "
            f"decode {decode:.1f} t/s ({took:.0f} s)"
        )
        return trial

    def run(self, budget_s: float) -> TuneResult:
        started = time.monotonic()
        baseline = Setting({d.name: d.values[0] for d in self.dimensions}, list(self.args), dict(self.env))
        result = TuneResult(
            objective=self.objective, baseline=baseline, best=baseline, prompt_tokens=self.prompt_tokens
        )
        warm = self._trial(result, "warm-up", "stack", baseline)  # pays the model's page-in; not compared
        timing = self._trial(result, "warm-up", "stack", baseline)  # what a warm trial takes
        measurable, unmeasurable = [], []
        for dimension in searched(self.dimensions, self.objective):
            lacking = self._lacking(dimension, baseline)
            if lacking:
                unmeasurable.append(f"{dimension.name} ({lacking})")
            else:
                measurable.append(dimension)
        plan = plan_search(measurable, budget_s - warm.seconds - timing.seconds, max(timing.seconds, 0.1))
        result.skipped = unmeasurable + plan.skipped
        self.progress(
            f"searching {', '.join(d.name for d in plan.dimensions)}: {plan.trials} trials of about "
            f"{timing.seconds:.0f} s, {plan.rounds} rounds each"
            + (f" (left out for the budget: {', '.join(plan.skipped)})" if plan.skipped else "")
        )
        best = baseline
        for dimension in plan.dimensions:
            best = self._dimension(result, dimension, best, plan.rounds)
        result.best = best
        if best is baseline:  # nothing beat the stack: its own trials are the figures, the ratio 1
            result.baseline_tps = result.tuned_tps = _medians(self._baseline_trials)
            result.ratio_spread = ((1.0, 1.0), (1.0, 1.0))
        else:
            self._confirm(result, baseline, best, plan.rounds)
        result.seconds = time.monotonic() - started
        return result

    def _lacking(self, dimension: Dimension, baseline: Setting) -> str:
        """What llama-bench can't be given for some value of `dimension` (its contract lacks the flag),
        beyond what it already can't for the stack's own settings; '' when every value is expressible
        (always, for served trials: the server takes its own arguments)."""
        if self.served:
            return ""
        already = set(self._bench_args(baseline).left_out)
        for value in dimension.values[1:]:
            extra = set(self._bench_args(self._with(baseline, dimension, value)).left_out) - already
            if extra:
                return ", ".join(sorted(extra))
        return ""

    def _dimension(
        self, result: TuneResult, dimension: Dimension, incumbent: Setting, rounds: int
    ) -> Setting:
        """Measure every value of `dimension` on top of `incumbent`; the winner's setting. A candidate that
        fails (a repack or a no-mmap load that doesn't fit, say) is out, and said; the incumbent failing
        is the stack failing, which ends the search."""
        current = incumbent.values[dimension.name]
        candidates = {value: self._with(incumbent, dimension, value) for value in dimension.values}
        scores: dict[str, list[float]] = {value: [] for value in candidates}
        failed: set[str] = set()
        for round_ in range(rounds):
            order = list(candidates) if round_ % 2 == 0 else list(reversed(candidates))
            for value in (v for v in order if v not in failed):
                try:
                    trial = self._trial(result, dimension.name, value, candidates[value])
                except StackError as err:
                    if value == current:
                        raise
                    failed.add(value)
                    result.failed[f"{dimension.name}={value}"] = str(err)
                    self.progress(f"{dimension.name}={value} failed, left out: {err}")
                    continue
                scores[value].append(self._score(trial))
        return candidates[winner({v: s for v, s in scores.items() if v not in failed}, current)]

    def _with(self, incumbent: Setting, dimension: Dimension, value: str) -> Setting:
        if value == incumbent.values[dimension.name]:
            return incumbent
        args, env = dimension.apply(list(incumbent.args), dict(incumbent.env), value)
        return Setting({**incumbent.values, dimension.name: value}, args, env)

    def _confirm(self, result: TuneResult, baseline: Setting, best: Setting, rounds: int) -> None:
        """Alternate the stack's settings with the winner; the ratios of each pair, and their medians."""
        samples: dict[str, list[Trial]] = {"stack": [], "tuned": []}
        for round_ in range(rounds):
            order = [("stack", baseline), ("tuned", best)]
            for name, setting in order if round_ % 2 == 0 else reversed(order):
                samples[name].append(self._trial(result, "confirm", name, setting))
        pairs = list(zip(samples["tuned"], samples["stack"], strict=True))
        pre = [t.prefill_tps / b.prefill_tps for t, b in pairs if b.prefill_tps]
        dec = [t.decode_tps / b.decode_tps for t, b in pairs if b.decode_tps]
        gains = [self._score(t) / self._score(b) for t, b in pairs if self._score(b) > 0]
        result.baseline_tps, result.tuned_tps = _medians(samples["stack"]), _medians(samples["tuned"])
        result.ratio_spread = (
            (min(pre, default=0.0), max(pre, default=0.0)),
            (min(dec, default=0.0), max(dec, default=0.0)),
        )
        if not gains or statistics.median(gains) < 1 + MIN_GAIN:  # a winner of the search's noise
            result.not_confirmed = {
                name: value for name, value in best.values.items() if value != baseline.values[name]
            }
            # The stack kept: its figures on both sides, the ratio 1 and no spread (not the confirm
            # rounds', which a record then showed beside a ratio of 1.00).
            result.best, result.tuned_tps = baseline, result.baseline_tps
            result.ratio_spread = ((1.0, 1.0), (1.0, 1.0))

    def _score(self, trial: Trial) -> float:
        return score(self.objective, trial.prefill_tps, trial.decode_tps)


def _medians(trials: list[Trial]) -> tuple[float, float]:
    """Median prefill and decode of `trials`."""
    if not trials:
        return 0.0, 0.0
    return statistics.median(t.prefill_tps for t in trials), statistics.median(t.decode_tps for t in trials)


def winner(scores: dict[str, list[float]], incumbent: str) -> str:
    """The candidate whose median beats the incumbent's by more than the incumbent's own spread (its
    rounds' (max - min) ÷ median) and MIN_GAIN; else the incumbent."""
    base = statistics.median(scores[incumbent])
    best = max(scores, key=lambda value: statistics.median(scores[value]))
    if base <= 0:
        return best if statistics.median(scores[best]) > 0 else incumbent
    margin = max((max(scores[incumbent]) - min(scores[incumbent])) / base, MIN_GAIN)
    return best if statistics.median(scores[best]) > base * (1 + margin) else incumbent
