"""The preset a model without one gets (`compose` with no --preset): the engine options and placement the
packaged presets give their models, derived from the model's own facts (its architecture, experts, dense
layers, attention kind), and a line saying so in the stack's x-moe-stack.derived. A dense model gets none:
the presets' rules are for MoE models."""

from __future__ import annotations

from dataclasses import dataclass

from builder.engines import Engine
from builder.models.facts import ModelFacts
from builder.spec import EXPERTS_ON_CPU_RULE, EngineOptions

# The presets' context where the model was trained for at least as much (R1, GLM-4.6 and Qwen3-Next's).
CONTEXT = 32768
# -ub and -b on a GPU stack, as every preset but Qwen3-Next's (its recurrent layers split a batch
# themselves): hybrid prefill 1871 → 4928 t/s from 512 to 2048 on the device (presets.yaml).
GPU_BATCH = 2048
# MiniMax Sparse Attention scores each micro-batch token against the context for each KV head in prefill
# (compute_buffers.py: 2.4 GiB at 32k and -ub 2048 on MiniMax-M3): its preset's -ub 512 keeps that a quarter.
SPARSE_UBATCH = 512
# ik_llama.cpp moves a batch's CPU-expert matmuls to the GPU once batch × used ≥ N × all experts: the
# presets pick N so that a batch of about 32 tokens does (R1: 32 × 8 / 256 = 1; Qwen3-235B: 2).
OFFLOAD_TOKENS = 32


@dataclass(frozen=True)
class Derived:
    options: EngineOptions  # those the engine honours
    override_rules: tuple[str, ...]  # the -ot rules (routed experts on the CPU, where the engine takes rules)
    source: str  # what was read: `deepseek2, 256 experts (8 used) in 58 of 61 layers, MLA attention`

    def said(self, given: EngineOptions) -> str:
        """x-moe-stack.derived: what was read, and what it set that the user's `given` options left."""
        kept = {
            k: v
            for k, v in self.options.model_dump(exclude_unset=True).items()
            if k not in given.model_fields_set
        }
        settings = (["routed experts on the CPU"] if self.override_rules else []) + [
            f"{name}={value}" for name, value in kept.items()
        ]
        return (
            f"no preset: from the model's {self.source}: {', '.join(settings) or 'nothing the options left'}"
        )


def derived_preset(facts: ModelFacts, engine: Engine, gpu: bool) -> Derived | None:
    """The presets' rules for an MoE model of `facts` served by `engine` (None: a dense model)."""
    if not facts.expert_count:
        return None
    context = min(CONTEXT, facts.context_length) if facts.context_length else CONTEXT
    wanted: dict[str, object] = {"ctx_size": context, "cache_type": "q8_0", "flash_attention": "on"}
    if gpu and not facts.recurrent_state_bytes:
        ubatch = SPARSE_UBATCH if block_sparse(facts) else GPU_BATCH
        wanted |= {"batch_size": GPU_BATCH, "ubatch_size": ubatch}
    wanted["fused_moe"] = True
    if facts.mla_dim:
        wanted["mla"] = 3
    if gpu:
        wanted["moe_offload_batch"] = max(1, OFFLOAD_TOKENS * facts.experts_used // facts.expert_count)
    options = EngineOptions.model_validate({k: v for k, v in wanted.items() if k in engine.honours})
    rules = (EXPERTS_ON_CPU_RULE,) if gpu and engine.takes_override_rules else ()  # no GPU: all on the CPU
    return Derived(options, rules, _described(facts))


def block_sparse(facts: ModelFacts) -> bool:
    """MiniMax Sparse Attention: an indexer beside each head's K and V (not the MLA latent's, as GLM-5's)."""
    return facts.indexer_layers > 0 and not facts.mla_dim


def _described(facts: ModelFacts) -> str:
    """`deepseek2, 256 experts (8 used) in 58 of 61 layers, MLA attention`."""
    if facts.mla_dim:
        attention = "MLA attention"
    elif facts.compress_ratios:
        attention = f"a {facts.sliding_window}-token window and compressed attention"
    elif facts.recurrent_state_bytes:
        attention = f"attention in {facts.cached_layers} of {facts.layers} layers, recurrent in the rest"
    elif facts.sliding_window:
        attention = f"sliding-window attention ({facts.sliding_window} tokens) in some layers"
    elif block_sparse(facts):
        attention = f"grouped-query attention, sparse (an indexer's blocks) in {facts.indexer_layers} layers"
    else:
        attention = "grouped-query attention" if facts.kv_heads < facts.heads else "attention"
    return (
        f"{facts.arch}, {facts.expert_count} experts ({facts.experts_used} used) in {facts.expert_layers} "
        f"of {facts.layers} layers, {attention}"
    )
