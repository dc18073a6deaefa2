"""Speculative decoding in a stack: a draft model (a small GGUF of the model's vocabulary, beside the
model in its directory, so the stack's one read-only mount carries both) or the model's own
multi-token-prediction layer; checked against the model before anything is written, and the VRAM a
draft takes counted by the plan.

With a draft, each step the draft proposes up to `--draft-max` tokens and the model verifies them in one
batch. For a hybrid stack that batch is not free: its tokens route to more experts than one token does,
and those are read from RAM (bench/speculative_cost.py measures the draft path's cost with a draft that
is never accepted). What random weights accept means nothing for a real pair (mainline accepted none
of a random draft's tokens, ik_llama.cpp 46 %: both models fall into repeating a few tokens), so no
acceptance rate is claimed from them.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from builder.engines.base import Engine, StackSpec
from builder.engines.compute_buffers import gpu_compute
from builder.errors import SpecError
from builder.features import Feature, Where
from builder.files import check_beside_model, user_path
from builder.models.facts import ModelFacts
from builder.models.kv_cache import CacheLayout, kv_cache_bytes
from builder.models.opened import OpenedModel
from builder.spec import EngineOptions

# Both engines refuse a draft whose vocabulary size differs from the model's by more (common/speculative.cpp,
# SPEC_VOCAB_MAX_SIZE_DIFFERENCE, in llama.cpp 0c1e57098 and ik_llama.cpp 007d640).
VOCAB_MAX_DIFFERENCE = 128
# Architectures whose MTP head the pinned converter writes to a file of its own, never into the model's
# (DeepSeek-V4: conversion/deepseek.py at 0c1e57098, `--mtp` gives mtp-<name>.gguf). Mainline drafts with
# such a head through `-md` and `--spec-type draft-mtp`; its CPU build died of SIGFPE reserving the draft
# context for a tiny V4 (with the head apart or in the file alike), so moe-stack doesn't offer it yet.
MTP_HEAD_APART = frozenset({"deepseek4"})


class Speculative(Feature):
    refusals: ClassVar[dict[Where, str]] = {
        "router": "speculative decoding (--draft-model, --mtp) is for a stack of one model: emit that "
        "model's stack on its own",
    }

    def asked(self, stack: StackSpec) -> bool:
        return stack.draft_model is not None or bool(stack.mtp)


def checked_speculative(
    options: EngineOptions, model: OpenedModel, adapter: Engine
) -> tuple[EngineOptions, OpenedModel | None]:
    """`options` with the draft model's path resolved, and the draft opened, once it fits `model`: one line
    naming the problem otherwise (both asked for, a draft length without a draft, a draft elsewhere than
    the model's directory or of another vocabulary, MTP for a file without its layer)."""
    if options.draft_model is not None and options.mtp:
        raise SpecError("--draft-model and --mtp are two ways to draft tokens: give one")
    if options.draft_max is not None and options.draft_model is None and not options.mtp:
        raise SpecError("--draft-max sets how many tokens a draft proposes: give --draft-model or --mtp too")
    if options.draft_model is None and not options.mtp:
        return options, None
    facts = model.facts
    if options.mtp:
        _check_mtp(facts, model.path)
    if options.draft_model is None:
        return options, None
    check_beside_model(user_path(options.draft_model), model.path, "draft model")
    draft = adapter.open_model(user_path(options.draft_model))
    draft_vocab, vocab = draft.facts.vocab, facts.vocab
    if abs(draft_vocab - vocab) > VOCAB_MAX_DIFFERENCE:
        raise SpecError(
            f"the draft model {draft.name} has {draft_vocab} tokens and {model.name} {vocab}: a draft must "
            f"share the model's vocabulary (the engines refuse more than {VOCAB_MAX_DIFFERENCE} apart); "
            "use a smaller model of the same family"
        )
    return options.model_copy(update={"draft_model": draft.path}), draft


def _check_mtp(facts: ModelFacts, model: Path) -> None:
    """Drafting with the model's own MTP layer: the file must carry it, and the plan must count what
    drafting keeps (not a recurrent state's copies)."""
    if facts.nextn_layers == 0 and facts.arch in MTP_HEAD_APART:
        raise SpecError(
            f"{model.name} carries no multi-token-prediction layer: {facts.arch}'s converter writes it to a "
            "file of its own (convert_hf_to_gguf.py --mtp: mtp-<name>.gguf), which moe-stack doesn't serve "
            "yet; drop --mtp"
        )
    if facts.nextn_layers == 0:
        raise SpecError(
            f"{model.name} carries no multi-token-prediction layer (no nextn_predict_layers in its "
            "header): drop --mtp, or use a GGUF converted with it (llama.cpp's convert_hf_to_gguf.py "
            "keeps DeepSeek's and Qwen3-Next's unless --no-mtp)"
        )
    if facts.recurrent_state_bytes:
        raise SpecError(
            f"{model.name} keeps a recurrent state, and drafting with its MTP layer keeps one more copy of "
            "it for each drafted token, which moe-stack doesn't plan yet: drop --mtp"
        )


def draft_vram_bytes(draft: OpenedModel | None, adapter: Engine, ctx: int, ubatch: int) -> int:
    """VRAM a draft model takes beside the model's plan: its weights but the token embeddings (every
    layer on the GPU: -ngld 99), its f16 KV cache of the stack's context, and its own compute buffer (the
    engine's estimate for its architecture). An MTP layer is one of the model's own layers: the plan
    counts it already (0 here, as without a draft)."""
    if draft is None:
        return 0
    facts = draft.facts
    weights = facts.total_bytes - facts.embedding_bytes
    cache = kv_cache_bytes(facts, ctx, "f16", CacheLayout(), ubatch=ubatch)
    return weights + cache + gpu_compute(adapter.buffer_fits, facts, ctx, ubatch, latent=False).bytes
