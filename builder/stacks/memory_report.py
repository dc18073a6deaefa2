"""`moe-stack plan`'s report: a model's hybrid run planned for the VRAM and RAM given (stacks/vram_levers.py),
with what sits beside the plan (the engine's compute buffer and prefill pool, a draft model, a vision
projector, the prompt cache), as the rows of a table, the flags that place it, or JSON."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.engines.base import Engine
from builder.engines.compute_buffers import CUDA_CONTEXT_BYTES, ComputeEstimate, gpu_compute, prefill_pool
from builder.features.speculative import checked_speculative, draft_vram_bytes
from builder.features.vision import checked_projector, projector_bytes
from builder.images.recorded_contracts import check_pinned_architecture
from builder.models.facts import ModelFacts
from builder.models.opened import OpenedModel
from builder.models.planner import GIB, Plan, size
from builder.spec import EngineOptions
from builder.stacks.memory_use import beside_model_bytes, prompt_cache_bytes
from builder.stacks.vram_levers import GpuDemand, vram_plan


@dataclass(frozen=True)
class MemoryAsk:
    """What `plan` was asked: the memory to plan with (GiB) and the stack's options that size it."""

    vram_gb: tuple[float, ...]
    ram_gb: float
    vram_margin_gb: float
    ctx_size: int
    cache_type: str
    mla: bool
    ubatch_size: int
    mmap: bool | None
    options: EngineOptions  # the neutral ones given, checked by their declarations (draft, projector)


@dataclass(frozen=True)
class MemoryReport:
    """The plan of `model` and what the engine keeps beside it."""

    ask: MemoryAsk
    model: Path
    engine: Engine
    facts: ModelFacts
    plan: Plan
    latent: bool
    compute: ComputeEstimate
    pool: int  # prefill's CUDA pool growth past load
    draft: int  # the draft model's VRAM
    projector: int  # the vision projector's VRAM (weights and the vision tower's buffer)
    pinned: bool  # weights in RAM page-locked (else mapped)
    beside: int  # the prompt cache and the engine's buffers, in RAM beside the weights

    def as_json(self) -> dict[str, Any]:
        facts, result = self.facts, self.plan
        devices = [
            {
                "gpu": d.index,
                "layers": [d.layers.start, d.layers.stop],
                "bytes": d.used_bytes,
                "expert_layers": list(d.expert_layers),
            }
            for d in result.devices
        ]
        return {
            "arch": facts.arch,
            "layers": facts.layers,
            "expert_bytes": sum(facts.expert_bytes),
            "other_bytes": facts.other_bytes,
            "kv_bytes": result.kv_bytes,
            "gpu_bytes": result.gpu_bytes,
            "cpu_bytes": result.cpu_bytes,
            "gpu_expert_layers": result.gpu_expert_layers,
            "devices": devices,
            "tensor_split": list(result.tensor_split),
            "override_tensor": list(result.override_rules),
            "override_tensor_bytes": [moved for _, moved in result.rule_bytes],
            "margin_bytes": result.margin_bytes,
            "compute_bytes": self.compute.bytes,
            "prefill_pool_bytes": self.pool,
            "draft_bytes": self.draft,
            "projector_bytes": self.projector,
            "compute_measured": self.compute.measured,
            "cpu_weights": "pinned" if self.pinned else "mapped",
            "prompt_cache_bytes": prompt_cache_bytes(self.engine),
            "ram_total_bytes": result.cpu_bytes + self.beside,
            # compose --keep-prompts: the files on the stack's volume at most, and the page-locked pool
            # the engine keeps for them beside the weights (0: it keeps none)
            "kept_prompts_disk_bytes": self.kept_prompts[0],
            "kept_prompts_host_bytes": self.kept_prompts[1],
        }

    @property
    def kept_prompts(self) -> tuple[int, int]:
        """compose --keep-prompts' (disk, host memory) at this plan's KV cache ((0, 0): the engine keeps
        none)."""
        store = self.engine.prompt_store
        return store.sizes(self.plan.kv_bytes) if store is not None else (0, 0)

    def gpu_rows(self) -> list[tuple[str, str, str]]:
        """What the GPUs hold, row by row: (what, size, where or why)."""
        ask, facts, result = self.ask, self.facts, self.plan
        kind = (
            ", MLA latent"
            if self.latent and facts.mla_dim
            else ", with recurrent state"
            if facts.recurrent_state_bytes
            else ""
        )
        rows = [
            ("routed experts", size(sum(facts.expert_bytes)), result.experts_where()),
            ("other weights", size(facts.other_bytes), "GPU"),
            (f"KV cache ({ask.ctx_size} × {ask.cache_type}{kind})", size(result.kv_bytes), "GPU"),
            (
                f"compute buffer (-ub {ask.ubatch_size}) + CUDA context",
                size(self.compute.bytes + CUDA_CONTEXT_BYTES),
                self.compute.basis,
            ),
        ]
        if self.pool:
            rows.append(
                (
                    f"prefill's CUDA pool ({ask.ctx_size}-token prompt)",
                    size(self.pool),
                    "its growth past load, as measured on the H200 (grows with the prompt on R1 widths)",
                )
            )
        if self.draft:
            draft_model = ask.options.draft_model
            name = draft_model.name if draft_model else ""
            rows.append((f"draft model {name} (weights, f16 KV, buffer)", size(self.draft), "GPU (-ngld 99)"))
        if self.projector:
            mmproj = ask.options.mmproj
            rows.append(
                (
                    f"vision projector {mmproj.name if mmproj else ''} (weights, buffer)",
                    size(self.projector),
                    "GPU (--mmproj); its buffer an estimate from its widths",
                )
            )
        return rows

    def total_rows(self) -> list[tuple[str, str, str]]:
        """The totals on the GPUs (each one's where there are several) and in RAM."""
        ask, result = self.ask, self.plan
        rows = [
            ("total on GPU (with compute reserve)", size(result.gpu_bytes), f"of {sum(ask.vram_gb):g} GiB"),
            (
                "kept free (margin)",
                size(result.margin_bytes * len(ask.vram_gb)),
                "--vram-margin-gb, each GPU",
            ),
        ]
        for device in result.devices if len(result.devices) > 1 else ():
            experts = f", experts of {len(device.expert_layers)}" if device.expert_layers else ""
            rows.append(
                (
                    f"  GPU {device.index}: layers {device.layers.start}-{device.layers.stop - 1}{experts}",
                    size(device.used_bytes),
                    f"of {device.vram_bytes / GIB:g} GiB",
                )
            )
        return [
            *rows,
            (
                "weights in RAM",
                size(result.cpu_bytes),
                "pinned (page-locked CUDA_Host buffers)" if self.pinned else "mapped page cache",
            ),
            (
                "prompt cache and engine buffers",
                size(self.beside),
                f"{self.engine.name}'s default prompt cache (compose --cache-ram sizes it)",
            ),
            ("total in RAM", size(result.cpu_bytes + self.beside), f"of {ask.ram_gb:g} GiB"),
            *self._kept_prompts_rows(),
        ]

    def _kept_prompts_rows(self) -> list[tuple[str, str, str]]:
        """What compose --keep-prompts adds: the files on the stack's volume, and any pool in RAM."""
        store, (disk, host) = self.engine.prompt_store, self.kept_prompts
        if store is None:
            return []
        rows = [
            (
                "kept prompts on disk",
                size(disk),
                f"compose --keep-prompts: at most {store.disk_share:g} × the KV cache",
            )
        ]
        if host:
            rows.append(
                (
                    "kept prompts' pool in RAM",
                    size(host),
                    f"compose --keep-prompts: pinned, {store.host_share:g} × the KV cache, not in the total",
                )
            )
        return rows

    def flags(self) -> list[str]:
        """The flags that place the model: -ts across GPUs, then each -ot rule with what it moves."""
        split = [f"-ts {','.join(map(str, self.plan.tensor_split))}"] if self.plan.tensor_split else []
        return [*split, *(f"-ot '{rule}'   # {size(moved)}" for rule, moved in self.plan.rule_bytes)]


def memory_report(adapter: Engine, model: OpenedModel, ask: MemoryAsk) -> MemoryReport:
    """Plan `model` on `adapter`'s engine for `ask`."""
    facts = adapter.loaded_model(model, ask.options.mtp)
    check_pinned_architecture(adapter, facts.arch)
    layout = adapter.cache_layout(3 if ask.mla else None)
    latent = layout.latent
    ctx, ubatch = ask.ctx_size, ask.ubatch_size
    draft = draft_vram_bytes(checked_speculative(ask.options, model, adapter)[1], adapter, ctx, ubatch)
    projector = projector_bytes(checked_projector(ask.options, model, adapter))
    demand = GpuDemand(adapter, facts, ctx, ubatch, ask.cache_type, layout)
    vrams = [int(v * GIB) for v in ask.vram_gb]
    result = vram_plan(demand, vrams, int(ask.ram_gb * GIB), int(ask.vram_margin_gb * GIB), draft + projector)
    return MemoryReport(
        ask=ask,
        model=model.path,
        engine=adapter,
        facts=facts,
        plan=result,
        latent=latent,
        compute=gpu_compute(adapter.buffer_fits, facts, ctx, ubatch, latent),
        pool=prefill_pool(adapter.buffer_fits, facts, ctx, ubatch, latent),
        draft=draft,
        projector=projector,
        pinned=adapter.pins_cpu_weights(ask.mmap, gpu=True),
        # Beside the weights in RAM: the engine's host prompt cache (its default; compose --cache-ram
        # sizes it) and its own buffers, as a stack's memory sum counts them (stacks/memory_use.py).
        beside=beside_model_bytes(adapter),
    )
