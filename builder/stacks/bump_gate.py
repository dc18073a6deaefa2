"""What a bumped engine ref must prove before `moe-stack refs --bump` writes it: the candidate's image and
the current pin's, built the same way on this host, each serving the same model in a stack `compose`
makes; the candidate passes every smoke check the pin passes, and loses at most MAX_LOSS of decode or of
prefill in an A/B bench (the two stacks up side by side, the rounds alternating which goes first, each
engine's own timings, the medians compared). The verdict comes with its table, whichever way it goes.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from builder.engines import Engine
from builder.errors import StackError
from builder.host.probe import probe
from builder.images.baseimage import ensure_base
from builder.images.build import build_image
from builder.images.mirror import mirror_tree
from builder.images.naming import image_spec, short_ref
from builder.models.synth_moe import MoeShape, write_moe_gguf
from builder.running.benchmark import measure
from builder.running.run import down
from builder.running.smoke import Check, smoke
from builder.spec import BaseImages
from builder.stackfile.host_checks import free_local_port
from builder.stacks.assemble import plan_stack
from builder.stacks.compose import compose_stack, write_stack
from builder.stacks.options import StackOptions

MAX_LOSS = 0.05  # the most a candidate may lose of the pin's decode or prefill
ROUNDS = 3


@dataclass(frozen=True)
class Contender:
    """One side of the A/B: what it is (`pin`, `candidate`), its engine ref and its image."""

    label: str
    ref: str
    image: str


@dataclass
class Side:
    contender: Contender
    compose_file: Path
    port: int
    checks: list[Check] = field(default_factory=list)
    prefill: list[float] = field(default_factory=list)
    decode: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class Verdict:
    """The gate's finding: each side's smoke checks and timings, and why the candidate is refused (None:
    it may replace the pin)."""

    pin: Side
    candidate: Side
    bench_failure: str | None = None  # why a bench round failed (a side stopped answering)

    @property
    def ratios(self) -> tuple[float, float]:
        """Candidate ÷ pin, medians of the rounds: (decode, prefill)."""
        return (
            statistics.median(self.candidate.decode) / statistics.median(self.pin.decode),
            statistics.median(self.candidate.prefill) / statistics.median(self.pin.prefill),
        )

    @property
    def refused(self) -> str | None:
        passed = {check.name for check in self.candidate.checks if check.passed}
        lost = [check for check in self.pin.checks if check.passed and check.name not in passed]
        if lost:
            said = next((c.seen for c in self.candidate.checks if c.name == lost[0].name), "not run")
            return f"the candidate fails smoke's {lost[0].name} check, which the pin passes ({said})"
        if self.bench_failure is not None:
            return f"the bench failed: {self.bench_failure}"
        if not self.candidate.decode or not self.pin.decode:
            return "no bench rounds ran"
        for what, ratio in zip(("decode", "prefill"), self.ratios, strict=True):
            if ratio < 1 - MAX_LOSS:
                return (
                    f"the candidate's {what} is {ratio:.2f} of the pin's (at most {MAX_LOSS:.0%} may be lost)"
                )
        return None

    def table(self) -> list[str]:
        """Each side's rounds and medians, the ratios, the smoke checks where they differ: as printed."""
        lines = [f"{'':10} {'ref':14} {'decode t/s (rounds)':34} {'prefill t/s (rounds)':34}"]
        for side in (self.pin, self.candidate):
            decode = ", ".join(f"{v:.1f}" for v in side.decode)
            prefill = ", ".join(f"{v:.0f}" for v in side.prefill)
            lines.append(f"{side.contender.label:10} {side.contender.ref[:12]:14} {decode:34} {prefill:34}")
        if self.pin.decode and self.candidate.decode:
            ratio_decode, ratio_prefill = self.ratios
            lines.append(f"{'cand./pin':10} {'':14} {ratio_decode:<34.3f} {ratio_prefill:<34.3f}")
        pin = {check.name: check.passed for check in self.pin.checks}
        for check in self.candidate.checks:
            if pin.get(check.name) != check.passed:
                lines.append(f"smoke {check.name}: pin {pin.get(check.name)}, candidate {check.passed}")
        return lines


def prove(
    engine: Engine,
    pin: Contender,
    candidate: Contender,
    model: Path,
    workdir: Path,
    say: Callable[[str], None],
    rounds: int = ROUNDS,
) -> Verdict:
    """Run both sides on `model` (their stacks written under `workdir`, brought up by smoke and removed at
    the end) and judge."""
    sides = (_side(engine, pin, model, workdir), _side(engine, candidate, model, workdir))
    with ExitStack() as cleanup:
        for side in sides:
            cleanup.callback(down, side.compose_file)
            say(f"{side.contender.label} ({side.contender.ref[:12]}): smoke")
            side.checks = smoke(side.compose_file, start_timeout_s=600)
        if not all(check.passed for side in sides for check in side.checks if check.name == "healthy"):
            return Verdict(sides[0], sides[1])
        try:
            for number in range(rounds):
                for side in sides if number % 2 == 0 else sides[::-1]:  # who goes first alternates
                    speed = measure(side.port, repetitions=1)
                    side.prefill += speed.prefill_tps
                    side.decode += speed.decode_tps
                said = "; ".join(f"{side.contender.label} {side.decode[-1]:.1f} t/s" for side in sides)
                say(f"round {number + 1}: decode {said}")
        except StackError as err:
            return Verdict(sides[0], sides[1], str(err))
    return Verdict(sides[0], sides[1])


def _side(engine: Engine, contender: Contender, model: Path, workdir: Path) -> Side:
    port = free_local_port()
    options = StackOptions(
        model_path=model,
        engine=engine,
        image=contender.image,
        port=port,
        project=f"moe-stack-gate-{contender.label}-{port}",
    )
    plan = plan_stack(options, probe())
    compose_file = write_stack(
        compose_stack(plan.stack, f"moe-stack refs --bump ({contender.label})", plan.facts),
        workdir / contender.label / "compose.yaml",
    )
    return Side(contender, compose_file, port)


def gate_bump(
    engine: Engine,
    old: str,
    new: str,
    sources: Path | None,
    model: Path | None,
    workdir: Path,
    say: Callable[[str], None],
    cpu: str = "avx2",
) -> Verdict:
    """Build the pin's (`old`) and the candidate's (`new`) CPU images on this host, from the source
    mirror `sources` where given (else each ref's git clone), and `prove` the candidate on `model` (a tiny
    synthetic MoE where none is given)."""
    base = ensure_base()
    images = {}
    for label, ref in (("pin", old), ("candidate", new)):
        tree = mirror_tree(engine, ref, sources) if sources is not None else None
        spec = image_spec(
            engine, cpu, tree, ref, BaseImages(build=base, runtime=base), "localhost", "moe-stack-gate"
        )
        say(f"building the {label}'s image ({short_ref(ref)}{', from the mirror' if tree else ''})")
        images[label] = build_image(spec, tree, show=lambda line: None)
    return prove(
        engine,
        Contender("pin", old, images["pin"]),
        Contender("candidate", new, images["candidate"]),
        model or tiny_model(workdir, engine),
        workdir,
        say,
    )


def tiny_model(directory: Path, engine: Engine) -> Path:
    """A small Qwen3-MoE with random weights and a byte vocabulary (in `engine`'s format: GGUF), readable by
    the engine's user."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o755)
    model = write_moe_gguf(directory / f"gate-qwen3moe-q8_0{engine.model_format.suffix}", MoeShape())
    model.chmod(0o644)
    return model
