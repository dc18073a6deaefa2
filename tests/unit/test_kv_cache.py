"""The KV cache each engine keeps for a model: what a sliding-window or sparse-attention model costs
depends on the engine, and the plan counts what that engine allocates."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

import gguf

from builder.engines import get_engine
from builder.models.gguf_facts import read_facts, windowed_layers
from builder.models.kv_cache import CacheLayout, kv_cache_bytes, row_bytes, window_cells
from builder.models.synth_catalog import TINY, synth_shape
from builder.models.synth_families import GptOssShape
from builder.models.synth_moe import shape_facts, write_moe_gguf
from builder.stacks.vram_levers import GpuDemand

MAINLINE, IK = get_engine("llama.cpp"), get_engine("ik_llama.cpp")


def test_a_window_layer_keeps_its_window_and_a_micro_batch_per_slot_on_mainline() -> None:
    """llama-kv-cache-iswa.cpp at 0c1e57098: each slot's stream keeps the window and one micro-batch,
    padded to 256 cells, never more than the slot's share of the context."""
    assert window_cells(128, 4096, 1, 512) == 768
    assert window_cells(128, 32768, 4, 2048) == 4 * 2304
    assert window_cells(4096, 2048, 1, 512) == 2048  # a context shorter than the window: all of it
    # mainline's patterns: gpt-oss alternates (18 of 36), Gemma 3 keeps five of each six (15 of 18)
    assert windowed_layers(2, 36) == 18 and windowed_layers(6, 18) == 15 and windowed_layers(0, 5) == 5


def test_gpt_oss_costs_mainline_a_window_and_ik_the_whole_context() -> None:
    """gpt-oss-120b at 128k: mainline keeps half its layers to the window; ik_llama.cpp (no windowed cache
    at 55d3c05, only a mask) and mainline with --swa-full keep all 36 at the full context."""
    facts = shape_facts(synth_shape("gpt-oss"))
    assert (facts.sliding_window, facts.window_layers, facts.cached_layers) == (128, 18, 36)
    per_token = facts.kv_heads * 2 * row_bytes("f16", facts.key_dim)
    ctx, ubatch = 131072, 2048
    windowed = kv_cache_bytes(facts, ctx, "f16", MAINLINE.cache_layout(None), ubatch=ubatch)
    assert windowed == int(per_token * (18 * ctx + 18 * 2304))
    whole = int(per_token * 36 * ctx)
    assert kv_cache_bytes(facts, ctx, "f16", IK.cache_layout(None), ubatch=ubatch) == whole
    assert kv_cache_bytes(facts, ctx, "f16", MAINLINE.cache_layout(None, swa_full=True)) == whole
    assert whole - windowed > 4 * 1024**3  # what counting every layer in full over-planned a card by


def test_each_engine_caches_the_sparse_attention_indexer_in_its_own_type() -> None:
    """GLM-5 (glm-dsa): both cache the indexer's 128-wide keys beside the 576-wide latent, mainline in the
    cache's type (llama_kv_cache_dsa), ik_llama.cpp in f16 whatever the cache's (its -ictk default at
    8337e4c: the tiny model logged 7.17 MiB of q8_0 latent and `KV self indexer size = 3.00 MiB (f16)`)."""
    facts = shape_facts(TINY["glm-dsa"])
    cells = 4096 * facts.cached_layers
    latent, keys = row_bytes("q8_0", facts.mla_dim or 0) * cells, row_bytes("f16", facts.indexer_dim) * cells
    assert kv_cache_bytes(facts, 4096, "q8_0", IK.cache_layout(None)) == int(latent + keys)
    assert round((latent + keys) / 2**20, 2) == 10.17  # its `CPU KV buffer size = 10.17 MiB`
    mainline_keys = row_bytes("q8_0", facts.indexer_dim) * cells
    assert kv_cache_bytes(facts, 4096, "q8_0", MAINLINE.cache_layout(None)) == int(latent + mainline_keys)


@dataclass(frozen=True)
class _SaysItsPattern(GptOssShape):
    """gpt-oss as a converter that writes `attention.sliding_window_pattern` would: per-layer flags, or a
    period."""

    flags: tuple[bool, ...] = ()
    period: int | None = None

    def metadata(self, writer: gguf.GGUFWriter) -> None:
        super().metadata(writer)
        key = f"{self.arch}.attention.sliding_window_pattern"
        if self.flags:
            writer.add_array(key, list(self.flags))
        if self.period is not None:
            writer.add_uint32(key, self.period)


def test_the_files_own_pattern_counts_before_the_architectures(tmp_path: Path) -> None:
    tiny = TINY["gpt-oss"]
    base = asdict(tiny)
    assert read_facts(write_moe_gguf(tmp_path / "a.gguf", tiny)).window_layers == 2  # the arch's: 2 of 4
    flagged = _SaysItsPattern(**base, flags=(True, True, True, False))
    assert read_facts(write_moe_gguf(tmp_path / "b.gguf", flagged)).window_layers == 3
    every = _SaysItsPattern(**base, period=0)
    assert read_facts(write_moe_gguf(tmp_path / "c.gguf", every)).window_layers == 4


def test_a_layout_nobody_reads_counts_every_layer_in_full() -> None:
    """KTransformers' cache is not read here: every layer at the full context, indexer included."""
    assert get_engine("ktransformers").cache_layout(None) == CacheLayout(latent=True)
    assert not CacheLayout().windowed and CacheLayout().indexer


def test_a_gpu_plan_counts_the_state_of_every_slot() -> None:
    """`--parallel 4` on Qwen3-Next: four sequences' recurrent state on the GPU, not one."""
    facts = shape_facts(synth_shape("qwen3next"))
    one = GpuDemand(MAINLINE, facts, 32768, 512, "q8_0", MAINLINE.cache_layout(None))
    assert replace(one, sequences=4).bytes() - one.bytes() == 3 * facts.recurrent_state_bytes > 0


def test_deepseek_v4_caches_a_window_and_compressed_rows_per_slot() -> None:
    """DeepSeek-V4-Flash's attention (43 layers: 21 compress by 4, 20 by 128), f16, -ub 512, against the
    buffers mainline 0c1e57098's CPU build logged for a file of that attention (raw window, CSA, HCA and
    indexer caches, and the three compressor states): 473.9 MiB at 65536 tokens, 615.6 MiB over 4 slots;
    the compressed rows don't grow with the slots, the window and states do."""
    facts = shape_facts(synth_shape("deepseek4"))
    assert (facts.compress_ratios.count(4), facts.compress_ratios.count(128)) == (21, 20)
    layout = MAINLINE.cache_layout(None)
    mib = {slots: kv_cache_bytes(facts, 65536, "f16", layout, slots) / 1024**2 for slots in (1, 4)}
    assert (round(mib[1], 1), round(mib[4], 1)) == (473.9, 615.6)
    # A million tokens: 6.9 GiB, about 6880 bytes a token of compressed rows beside a constant window.
    assert round(kv_cache_bytes(facts, 1 << 20, "f16", layout) / 1024**3, 2) == 6.76
    # The tiny model the suite serves logged 0.38 + 0.12 + 0.03 + 0.12 MiB of caches and 0.01 + 0.06 +
    # 0.01 of states at 4096 tokens.
    assert kv_cache_bytes(shape_facts(TINY["deepseek4"]), 4096, "f16", layout) == 0.734375 * 1024**2


def test_deepseek_v3_2_caches_the_latent_and_the_indexer_keys_of_its_trunk() -> None:
    """DeepSeek-V3.2 (deepseek32) on mainline: llama_kv_cache_dsa, as for GLM-5, the 576-wide latent and
    the indexer's 128-wide key a layer, the MTP block's in neither. Mainline 0c1e57098's CPU build logged
    288.00 + 64.00 MiB (f16) and 153.00 + 34.00 MiB (q8_0) at 65536 tokens for a file of V3.2's attention
    in 4 layers and the MTP block, and 7.17 + 1.59 MiB (q8_0) at 4096 for the tiny model; ik_llama.cpp
    can't load it (its pin has no deepseek32)."""
    layout = MAINLINE.cache_layout(None)
    four = shape_facts(
        synth_shape("deepseek32", layers=4, dense_layers=1, dense_ffn=512, experts=8, expert_ffn=256, vocab=0)
    )
    assert (four.cached_layers, four.nextn_layers, four.mla_dim, four.indexer_dim) == (4, 1, 576, 128)
    assert kv_cache_bytes(four, 65536, "f16", layout) == (288 + 64) * 1024**2
    assert kv_cache_bytes(four, 65536, "q8_0", layout) == (153 + 34) * 1024**2
    tiny = shape_facts(TINY["deepseek32"])
    # 612 and 136 bytes a q8_0 row (576 and 128 elements), 3 layers: 7.17 and 1.59 MiB as logged
    assert kv_cache_bytes(tiny, 4096, "q8_0", layout) == 3 * 4096 * (612 + 136)
    # The real model, 61 layers: 1.39 GiB at 32k in q8_0 (the preset's), 13.1 GiB at 160k in f16.
    full = shape_facts(synth_shape("deepseek32"))
    assert round(kv_cache_bytes(full, 32768, "q8_0", layout) / 1024**3, 2) == 1.39
    assert round(kv_cache_bytes(full, 163840, "f16", layout) / 1024**3, 1) == 13.1


def test_ling_3_caches_its_mla_layers_latent_and_keeps_its_kda_layers_state() -> None:
    """Ling-3 (bailingmoe3) on mainline, a Kimi Delta Attention hybrid: the MLA layers (one a group, and
    the MTP block, which mainline caches whether it drafts or not) keep the 576-wide latent a token, the KDA
    layers an f32 state a slot. Mainline 0c1e57098's CPU build logged, for the tiny model at 4096 tokens over
    4 slots, `9.00 MiB` of K in 2 layers and 3.21 MiB of recurrent state; one slot, q8_0: 4.78 MiB."""
    layout = MAINLINE.cache_layout(None)
    tiny = MAINLINE.loaded_facts(shape_facts(TINY["bailingmoe3"]), mtp=False)
    assert (tiny.cached_layers, tiny.mla_dim, tiny.recurrent_state_bytes) == (2, 576, 841_728)
    assert kv_cache_bytes(tiny, 4096, "f16", layout, sequences=4) == 9 * 1024**2 + 4 * 841_728
    assert kv_cache_bytes(tiny, 4096, "q8_0", layout) == 2 * 4096 * 612 + 841_728
    # Ling-3.0-flash: 7 MLA layers and the MTP block, 35 KDA layers of 32 heads of 128: 362.9 MiB at 32k, f16.
    flash = MAINLINE.loaded_facts(shape_facts(synth_shape("bailingmoe3")), mtp=False)
    assert (flash.cached_layers, flash.recurrent_state_bytes) == (8, 35 * 2_244_608)
    assert round(kv_cache_bytes(flash, 32768, "f16", layout) / 1024**2, 1) == 362.9


def test_kimi_k3_caches_its_mla_layers_latent_and_keeps_its_kda_layers_state() -> None:
    """Kimi-K3 (kimi-k3) on mainline: its gated MLA layers (every 4th and the last) keep the 576-wide latent
    a token, no V; its KDA layers an f32 state a slot. Mainline 0c1e57098's CPU build logged, for the tiny
    model at 4096 tokens over 4 slots, `K (f16): 4.50 MiB` and 0.86 MiB of recurrent state; one slot at 32768,
    q8_0: 19.12 MiB."""
    layout = MAINLINE.cache_layout(None)
    tiny = MAINLINE.loaded_facts(shape_facts(TINY["kimi-k3"]), mtp=False)
    assert (tiny.cached_layers, tiny.recurrent_state_bytes) == (1, 224_256)
    assert kv_cache_bytes(tiny, 4096, "f16", layout, sequences=4) == int(4.5 * 1024**2) + 4 * 224_256
    assert kv_cache_bytes(tiny, 32768, "q8_0", layout) == 32768 * 612 + 224_256
    # The real model: 24 MLA layers, 69 KDA layers of 96 heads of 128 (443.1 MiB a slot): 2.2 GiB at 128k.
    full = shape_facts(synth_shape("kimi-k3"))
    assert (full.cached_layers, round(full.recurrent_state_bytes / 1024**2, 1)) == (24, 443.1)
    assert round(kv_cache_bytes(full, 131072, "q8_0", layout) / 1024**3, 1) == 2.2


def test_minimax_m3_caches_its_indexer_keys_beside_each_heads_k_and_v() -> None:
    """MiniMax-M3 on mainline (llama_kv_cache_msa): every layer's K and V of its KV heads, and on each sparse
    layer a second cache of the indexer's 128-wide key and a value of the head's width that is never read.
    Mainline 0c1e57098's CPU build logged, for the tiny model at 4096 tokens, 6.00 MiB (3 layers) and 3.00
    MiB (2 layers: K 2.00, V 1.00); q8_0: 3.19 and 1.59 MiB."""
    layout = MAINLINE.cache_layout(None)
    tiny = shape_facts(TINY["minimax-m3"])
    assert (tiny.cached_layers, tiny.indexer_layers, tiny.indexer_dim) == (3, 2, 128)
    assert kv_cache_bytes(tiny, 4096, "f16", layout) == (6 + 3) * 1024**2
    assert kv_cache_bytes(tiny, 4096, "q8_0", layout) == 4096 * (3 * 2 * 2 * 68 + 2 * (136 + 68))
    # The real model: 120 KiB of K and V and 28.5 KiB of the indexer's a token at f16, 4.6 GiB at 32k.
    full = shape_facts(synth_shape("minimax-m3"))
    assert kv_cache_bytes(full, 1, "f16", layout) == (120 + 28.5) * 1024
