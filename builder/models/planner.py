"""GGUF memory plan: what a hybrid run puts in VRAM and in RAM, and the `-ot` rules that say so.

Reads only the GGUF header and tensor table (gguf.GGUFReader memory-maps the file; no weights are
loaded). Routed experts (`blk.N.ffn_{gate,up,down,gate_up}_exps`) go to CPU RAM by default; all other
weights, the KV cache and a compute reserve go to the GPU; VRAM left over takes the experts of the
first layers, layer by layer.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate

from builder.errors import SpecError
from builder.models.facts import ModelFacts
from builder.models.kv_cache import (
    DEFAULT_UBATCH,
    PER_HEAD,
    CacheLayout,
    cache_element_bytes,
    kv_cache_bytes,
)
from builder.spec import EXPERTS_ON_CPU_RULE

# VRAM kept free for compute buffers and the CUDA context (llama.cpp's are ~0.5-2 GB for these models).
DEFAULT_GPU_RESERVE = 2 * 1024**3
GIB = 1024**3
# VRAM left unplanned on each GPU beside everything the plan counts: both engines' own fitting keeps
# 1 GiB by default (mainline's --fit-target, ik_llama.cpp's --fit-margin 1024 MiB), and a plan that fills
# the card to the last MiB fails on the first allocation it did not foresee.
DEFAULT_VRAM_MARGIN = GIB


class VramShortfall(SpecError):
    """What a GPU must hold before any expert (attention, shared weights, KV cache, compute reserve) is
    more than its VRAM less the margin: `need` says so, `missing` by how many bytes."""

    def __init__(self, need: str, missing: int, advice: str) -> None:
        super().__init__(f"{need}; {advice}")
        self.need, self.missing = need, missing


@dataclass(frozen=True)
class DevicePlan:
    """One GPU's part: the layers llama.cpp's layer split gives it, and what it holds."""

    index: int  # CUDA<index>, as the engine numbers the GPUs it is given
    vram_bytes: int
    layers: range  # layers whose attention and KV cache it holds
    used_bytes: int
    expert_layers: tuple[int, ...]  # of those, the layers whose routed experts it holds too


@dataclass(frozen=True)
class Plan:
    facts: ModelFacts
    kv_bytes: int
    gpu_bytes: int
    cpu_bytes: int
    gpu_expert_layers: int  # layers whose routed experts are on a GPU
    # The same VRAM given to N experts of every layer instead (KTransformers' --kt-num-gpu-experts).
    gpu_experts_per_layer: int = 0
    override_rules: tuple[str, ...] = field(default=())
    devices: tuple[DevicePlan, ...] = ()
    tensor_split: tuple[
        int, ...
    ] = ()  # -ts for several GPUs: each one's VRAM in GiB (llama.cpp's layer split)
    margin_bytes: int = DEFAULT_VRAM_MARGIN  # left free on each GPU

    @property
    def rule_bytes(self) -> tuple[tuple[str, int], ...]:
        """Each -ot rule with the expert bytes it moves: a GPU's layers, then the CPU's rest."""
        on_gpus = [sum(self.facts.expert_bytes[i] for i in d.expert_layers) for d in self.devices]
        moved = [share for share in on_gpus if share]
        moved.append(sum(self.facts.expert_bytes) - sum(moved))
        return tuple(zip(self.override_rules, moved, strict=False))

    def experts_where(self) -> str:
        """Where the routed experts are, by the layers each GPU holds and their bytes."""
        held = [d for d in self.devices if d.expert_layers]
        if not held:
            return "CPU"
        if self.gpu_expert_layers == self.facts.expert_layers:
            return "GPU (every layer that has experts)"
        parts = [
            f"layers {layer_list(d.expert_layers)} on GPU {d.index} "
            f"({size(sum(self.facts.expert_bytes[i] for i in d.expert_layers))})"
            for d in held
        ]
        return f"CPU, {'; '.join(parts)}"


def plan(
    facts: ModelFacts,
    vram_bytes: int | Sequence[int],
    ram_bytes: int,
    ctx: int,
    cache_type: str = "f16",
    layout: CacheLayout = PER_HEAD,
    gpu_reserve: int = DEFAULT_GPU_RESERVE,
    cache_type_v: str | None = None,
    margin: int = DEFAULT_VRAM_MARGIN,
    ubatch: int = DEFAULT_UBATCH,
    sequences: int = 1,
) -> Plan:
    """Experts on the CPU, the rest on the GPUs, each GPU's leftover VRAM (less `margin`) filled with the
    experts of its own first layers that have any (`vram_bytes`: one GPU's, or each GPU's in CUDA order)."""
    vrams = _checked_vrams(vram_bytes, margin)
    kv = kv_cache_bytes(facts, ctx, cache_type, layout, sequences, cache_type_v, ubatch)
    cpu = sum(facts.expert_bytes)
    devices = []
    for index, (vram, layers) in enumerate(zip(vrams, layer_split(facts.layers, vrams), strict=True)):
        # Its layers' share of attention, shared weights and KV cache (the output head counted as spread
        # too, a small error for these models; the token embeddings stay in RAM), and its compute reserve.
        used = int((facts.gpu_weight_bytes + kv) * len(layers) / facts.layers) + gpu_reserve
        usable = vram - margin
        if used > usable:
            where = f" on GPU {index} ({len(layers)} of {facts.layers} layers)" if len(vrams) > 1 else ""
            raise VramShortfall(
                f"attention, shared weights, a {ctx}-token {cache_type} KV cache and the compute reserve "
                f"need {size(used)} of VRAM{where}, {size(used - usable)} more than the {size(vram)} given "
                f"less its {size(margin)} margin",
                used - usable,
                "lower --ctx-size"
                f"{', use --cache-type q8_0' if cache_element_bytes(cache_type) >= 2 else ''}"
                " or use a larger GPU",
            )
        used, experts = _take_experts(facts, layers, used, usable)
        devices.append(
            DevicePlan(index=index, vram_bytes=vram, layers=layers, used_bytes=used, expert_layers=experts)
        )
    _check_ram(cpu, ram_bytes)
    cpu -= sum(facts.expert_bytes[layer] for device in devices for layer in device.expert_layers)
    cpu += facts.embedding_bytes
    fixed = facts.gpu_weight_bytes + kv + gpu_reserve
    per_layer = _experts_per_layer(facts, vrams[0] - margin - fixed) if len(vrams) == 1 else 0
    return Plan(
        facts=facts,
        kv_bytes=kv,
        gpu_bytes=sum(d.used_bytes for d in devices),
        cpu_bytes=cpu,
        gpu_expert_layers=sum(len(d.expert_layers) for d in devices),
        gpu_experts_per_layer=per_layer,
        override_rules=device_rules(devices, facts.expert_layers),
        devices=tuple(devices),
        tensor_split=tuple(max(1, round(v / GIB)) for v in vrams) if len(vrams) > 1 else (),
        margin_bytes=margin,
    )


def _checked_vrams(vram_bytes: int | Sequence[int], margin: int) -> tuple[int, ...]:
    """Each GPU's VRAM, every one larger than the margin kept free."""
    vrams = (vram_bytes,) if isinstance(vram_bytes, int) else tuple(vram_bytes)
    if not vrams:
        raise SpecError("no GPU memory given: name each GPU's VRAM, e.g. --vram-gb 24 or 24,24")
    if margin < 0 or any(margin >= vram for vram in vrams):
        raise SpecError(
            f"a VRAM margin of {size(margin)} leaves nothing of a {size(min(vrams))} GPU: give a margin "
            "of 0 or more and smaller than the GPU (the default is 1 GiB)"
        )
    return vrams


def _take_experts(facts: ModelFacts, layers: range, used: int, usable: int) -> tuple[int, tuple[int, ...]]:
    """A GPU's own first layers whose experts fit beside what it holds (`used` of `usable`), in order:
    the bytes it then holds and those layers."""
    experts: list[int] = []
    for layer in layers:
        if not facts.expert_bytes[layer]:  # a dense layer (DeepSeek's first three): no experts to move
            continue
        if used + facts.expert_bytes[layer] > usable:
            break
        used += facts.expert_bytes[layer]
        experts.append(layer)
    return used, tuple(experts)


def _check_ram(expert_bytes: int, ram_bytes: int) -> None:
    if expert_bytes > ram_bytes:
        raise SpecError(
            f"the routed experts need {size(expert_bytes)} of RAM, {size(expert_bytes - ram_bytes)} more "
            f"than the {size(ram_bytes)} given; use a smaller quant of the model"
        )


def _experts_per_layer(facts: ModelFacts, spare: int) -> int:
    """KTransformers' form of the fill: how many experts of every layer the spare VRAM holds."""
    one_expert_everywhere = sum(facts.expert_bytes) // facts.expert_count if facts.expert_count else 0
    return min(facts.expert_count, spare // one_expert_everywhere) if one_expert_everywhere else 0


def layer_split(layers: int, vrams: Sequence[int]) -> list[range]:
    """llama.cpp's layer split with every layer offloaded (-ngl ≥ layers, -ts the VRAM sizes): layer il
    goes to the first GPU whose cumulative share exceeds il / (layers + 1), the output counting as one
    more layer (llama-model.cpp, `upper_bound(splits, ...)`)."""
    total = sum(vrams)
    bounds = list(accumulate(v / total for v in vrams))
    owner = [min(bisect_right(bounds, il / (layers + 1)), len(vrams) - 1) for il in range(layers)]
    return [
        range(owner.index(d), len(owner) - owner[::-1].index(d)) if d in owner else range(0)
        for d in range(len(vrams))
    ]


def device_rules(devices: Sequence[DevicePlan], expert_layers: int) -> tuple[str, ...]:
    """`-ot` rules, first match wins: each GPU's expert layers on it (CUDA<n>), the rest on the CPU (none
    when the GPUs hold all `expert_layers`, the layers that have routed experts)."""
    placed = [d for d in devices if d.expert_layers]
    if sum(len(d.expert_layers) for d in placed) >= expert_layers:
        return ()
    return (
        *(
            rf"blk\.({'|'.join(map(str, d.expert_layers))})\.ffn_.*_exps\.weight=CUDA{d.index}"
            for d in placed
        ),
        EXPERTS_ON_CPU_RULE,
    )


def layer_list(layers: Sequence[int]) -> str:
    """`3-5, 9`: runs of consecutive layers as ranges."""
    runs: list[list[int]] = []
    for layer in layers:
        if runs and layer == runs[-1][-1] + 1:
            runs[-1].append(layer)
        else:
            runs.append([layer])
    return ", ".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs)


def size(n_bytes: int) -> str:
    return f"{n_bytes / GIB:.1f} GiB" if n_bytes >= GIB // 10 else f"{n_bytes / 1024**2:.1f} MiB"
