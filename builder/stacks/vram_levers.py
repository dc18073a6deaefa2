"""A VRAM plan for an engine's stack, and what to give up when it does not fit the GPU: each lever with
the VRAM it frees, in the order of what it costs the user (a smaller micro-batch costs prefill speed; a
shorter context, prompt length; a smaller cache type, some quality), so a refusal can say which one is
enough."""

from __future__ import annotations

from dataclasses import dataclass, replace

from builder.engines import Engine
from builder.engines.compute_buffers import gpu_reserve
from builder.errors import SpecError
from builder.models.facts import ModelFacts
from builder.models.kv_cache import CacheLayout, kv_cache_bytes
from builder.models.planner import Plan, VramShortfall, plan, size

SMALLEST_UBATCH = 512  # both engines' default micro-batch: below it prefill slows for little VRAM
SHORTEST_CONTEXT = 4096
# The next smaller KV cache type a lever offers (quality falls with each step).
SMALLER_CACHE = {"f32": "f16", "f16": "q8_0", "bf16": "q8_0", "q8_0": "q4_0"}


@dataclass(frozen=True)
class Lever:
    option: str  # as the user gives it, e.g. "-ub 1024"
    saves: int  # VRAM bytes it frees


@dataclass(frozen=True)
class GpuDemand:
    """What the GPU's fixed part depends on that a user can change."""

    engine: Engine
    facts: ModelFacts
    ctx: int
    ubatch: int
    cache_type: str
    layout: CacheLayout  # what the engine caches with the stack's settings
    sequences: int = 1  # the server's slots (--parallel)

    def bytes(self) -> int:
        kv = kv_cache_bytes(
            self.facts, self.ctx, self.cache_type, self.layout, self.sequences, ubatch=self.ubatch
        )
        return kv + gpu_reserve(
            self.engine.buffer_fits, self.facts, self.ctx, self.ubatch, self.layout.latent
        )


def vram_plan(
    demand: GpuDemand,
    vram_bytes: list[int],
    ram_bytes: int,
    margin: int,
    beside: int = 0,
    cache_type_v: str | None = None,
) -> Plan:
    """The plan for `demand` on GPUs of `vram_bytes`: the engine's measured compute buffer (and `beside`,
    what the stack's other models take: a draft model, a vision projector) reserved, then experts into
    what is left; SpecError naming the levers when even the fixed part does not fit."""
    reserve = (
        gpu_reserve(demand.engine.buffer_fits, demand.facts, demand.ctx, demand.ubatch, demand.layout.latent)
        + beside
    )
    try:
        return plan(
            demand.facts,
            vram_bytes,
            ram_bytes,
            demand.ctx,
            demand.cache_type,
            demand.layout,
            gpu_reserve=reserve,
            cache_type_v=cache_type_v,
            margin=margin,
            ubatch=demand.ubatch,
            sequences=demand.sequences,
        )
    except VramShortfall as shortfall:
        raise SpecError(advice(shortfall, demand)) from None


def levers(demand: GpuDemand) -> list[Lever]:
    """Halving -ub (to 512 at least), halving the context (to 4096 at least), the next smaller cache type:
    each alone, with what it saves, cheapest first."""
    now, found = demand.bytes(), []
    for option, smaller in _steps(demand):
        found.append(Lever(option, now - smaller.bytes()))
    return [lever for lever in found if lever.saves > 0]


def enough(demand: GpuDemand, missing: int) -> tuple[GpuDemand, int]:
    """The least change that frees `missing` bytes, taking the levers in order and each as far as it goes
    before the next (-ub down to 512, then the context down to 4096, then the cache type): the stack it
    leaves and what it frees; if all of them together are not enough, that stack and what it frees."""
    now, current = demand.bytes(), demand
    while (steps := _steps(current)) and now - current.bytes() < missing:
        current = steps[0][1]
    return current, now - current.bytes()


def _steps(demand: GpuDemand) -> list[tuple[str, GpuDemand]]:
    """The next step of each lever still open, cheapest first."""
    steps = []
    if demand.ubatch > SMALLEST_UBATCH:
        ubatch = max(SMALLEST_UBATCH, demand.ubatch // 2)
        steps.append((f"-ub {ubatch}", replace(demand, ubatch=ubatch)))
    if demand.ctx > SHORTEST_CONTEXT:
        ctx = max(SHORTEST_CONTEXT, demand.ctx // 2)
        steps.append((f"--ctx-size {ctx}", replace(demand, ctx=ctx)))
    if demand.cache_type in SMALLER_CACHE:
        cache = SMALLER_CACHE[demand.cache_type]
        steps.append((f"--cache-type {cache}", replace(demand, cache_type=cache)))
    return steps


def advice(shortfall: VramShortfall, demand: GpuDemand) -> str:
    """The refusal with its levers: what each frees alone, cheapest first, and the least change that is
    enough (or that none is)."""
    alone = ", ".join(f"{lever.option} frees {size(lever.saves)}" for lever in levers(demand))
    least, frees = enough(demand, shortfall.missing)
    if frees >= shortfall.missing:
        fix = f"taken in that order, enough: {_changed(demand, least)} (frees {size(frees)})"
    else:
        together = _changed(demand, least) or "no lever"
        fix = f"even {together} together frees only {size(frees)}: use a larger GPU"
    return f"{shortfall.need}. Alone, cheapest first: {alone or 'no lever left'}; {fix}"


def _changed(before: GpuDemand, after: GpuDemand) -> str:
    """The options that turn `before` into `after`, as the user gives them."""
    options = []
    if after.ubatch != before.ubatch:
        options.append(f"-ub {after.ubatch}")
    if after.ctx != before.ctx:
        options.append(f"--ctx-size {after.ctx}")
    if after.cache_type != before.cache_type:
        options.append(f"--cache-type {after.cache_type}")
    return " ".join(options)
