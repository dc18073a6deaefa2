"""The KV cache an engine keeps for a model: its bytes from the model's attention and the engine's layout.

Engines cache the same model differently (read at their pins): mainline llama.cpp keeps a sliding-window
layer's cells to its window and caches a sparse-attention indexer's keys in the cache's type; ik_llama.cpp
keeps every layer at the full context and the indexer's keys in f16. Each adapter says which in its
`cache_layout`; this module counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from builder.errors import SpecError
from builder.spec import CacheType

if TYPE_CHECKING:
    from builder.models.facts import ModelFacts

# Bytes per cached element by KV cache type (block size, block bytes of the ggml type).
CACHE_BYTES: dict[CacheType, float] = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q5_1": 24 / 32,
    "q5_0": 22 / 32,
    "q4_1": 20 / 32,
    "q4_0": 18 / 32,
    "iq4_nl": 18 / 32,
    "q6_0": 26 / 32,  # ik_llama.cpp's: 16 + 8 bytes of 4 + 2 bits and an f16 scale per 32
    "q8_KV": 1.0,  # ik_llama.cpp's: a byte an element, and ROW_META_BYTES a row (one head's K or V)
}
# ik_llama.cpp's row-wise types carry metadata per row (ggml.c's row_meta_size): q8_KV 8 bytes. Its CPU
# build logged `K (q8_KV): 2.25 MiB` for 2 Mi elements in rows of 64: (64 + 8) / 64 bytes an element.
ROW_META_BYTES = {"q8_KV": 8}
DEFAULT_UBATCH = 512  # both engines' -ub when a stack doesn't set one
# Mainline pads a cache's cells to this (llama-context.cpp and llama-kv-cache-iswa.cpp at 0c1e57098).
CELL_PAD = 256


@dataclass(frozen=True)
class CacheLayout:
    """What an engine's cache holds for a model with its stack's settings."""

    latent: bool = False  # MLA: the compressed latent and rope part a token, not each head's K and V
    indexer: bool = True  # a sparse-attention indexer's keys beside the latent (glm-dsa)
    # The type of those keys where the engine fixes it (ik_llama.cpp's -ictk default, f16), else the cache's.
    indexer_type: str | None = None
    windowed: bool = False  # sliding-window layers hold their window and a micro-batch, not the context


PER_HEAD = CacheLayout()  # each head's K and V, every layer at the full context


def kv_cache_bytes(
    facts: ModelFacts,
    ctx: int,
    cache_type: str,
    layout: CacheLayout,
    sequences: int = 1,
    cache_type_v: str | None = None,
    ubatch: int = DEFAULT_UBATCH,
) -> int:
    """KV cache bytes for `ctx` tokens over `sequences` (the server's slots): per cached layer K rows of
    `cache_type` and V rows of `cache_type_v` (default: the same), or, with the latent, the latent and rope
    part of K's type and the indexer's keys where the layout keeps them; plus the recurrent layers' state
    for each sequence."""
    if facts.compress_ratios:
        return compressed_cache_bytes(facts, ctx, cache_type, layout, sequences, ubatch)
    v_type = cache_type_v or cache_type
    if layout.latent and facts.mla_dim:
        per_token = row_bytes(cache_type, facts.mla_dim)
        if layout.indexer and facts.indexer_dim:
            per_token += row_bytes(layout.indexer_type or cache_type, facts.indexer_dim)
    else:
        per_token = facts.kv_heads * (
            row_bytes(cache_type, facts.key_dim) + row_bytes(v_type, facts.value_dim)
        )
    windowed = facts.window_layers if layout.windowed and facts.sliding_window else 0
    cells = ctx * (facts.cached_layers - windowed)
    cells += window_cells(facts.sliding_window, ctx, sequences, ubatch) * windowed
    return (
        int(per_token * cells)
        + indexer_cache_bytes(facts, ctx, cache_type, v_type, layout)
        + (facts.recurrent_state_bytes * sequences)
    )


def indexer_cache_bytes(facts: ModelFacts, ctx: int, k_type: str, v_type: str, layout: CacheLayout) -> int:
    """MiniMax Sparse Attention's second cache beside heads' K and V (not the latent's): on each layer with
    the indexer, its key a token and a value of the head's width that is allocated and never read
    (llama_kv_cache_msa at 0c1e57098: its tiny file logged `K (f16): 2.00 MiB, V (f16): 1.00 MiB`)."""
    if facts.mla_dim or not (layout.indexer and facts.indexer_dim and facts.indexer_layers):
        return 0
    return int(
        ctx
        * facts.indexer_layers
        * (row_bytes(k_type, facts.indexer_dim) + row_bytes(v_type, facts.value_dim))
    )


def compressed_cache_bytes(
    facts: ModelFacts, ctx: int, cache_type: str, layout: CacheLayout, sequences: int, ubatch: int
) -> int:
    """DeepSeek-V4's caches on mainline (llama-kv-cache-dsv4.cpp at 0c1e57098), each slot's apart
    (unified or not): every layer's raw window of K rows (K and V are one head); on each compressed
    layer a row per `ratio` tokens, and on the 4-token layers the indexer's key per 4 tokens too, in the
    cache's type; and each compressed layer's compressor state in F32."""
    key = row_bytes(cache_type, facts.key_dim)
    indexer = row_bytes(layout.indexer_type or cache_type, facts.indexer_dim)
    stream = _stream(ctx, sequences)
    raw = (
        window_cells(facts.sliding_window, ctx, sequences, ubatch) if layout.windowed else stream * sequences
    )
    total = raw * key * facts.layers
    for layer, ratio in enumerate(facts.compress_ratios):
        if not ratio:
            continue
        rows = sequences * _pad(-(-stream // ratio))
        total += rows * (key + indexer if ratio == 4 else key)
        if layer < facts.layers - facts.nextn_layers:  # the state of the layers that run
            # kv and score planes: 8 rows of twice the widths (cache and indexer) on a 4-token layer,
            # 128 rows of the key's on a 128-token one
            width, rows_in_flight = (
                (2 * (facts.key_dim + facts.indexer_dim), 8) if ratio == 4 else (facts.key_dim, 128)
            )
            total += sequences * 2 * width * rows_in_flight * 4
    return int(total)


def window_cells(window: int, ctx: int, sequences: int, ubatch: int) -> int:
    """Cells a sliding-window layer keeps on mainline: each sequence's stream (the server's slots, not
    unified) holds its window and a micro-batch, padded, at most its share of the context
    (llama-kv-cache-iswa.cpp at 0c1e57098)."""
    return sequences * _pad(min(_stream(ctx, sequences), window + ubatch))


def _stream(ctx: int, sequences: int) -> int:
    """Each slot's share of the context, as mainline pads it (llama-context.cpp at 0c1e57098)."""
    return _pad(_pad(ctx) // sequences)


def _pad(cells: int) -> int:
    return -(-cells // CELL_PAD) * CELL_PAD


def row_bytes(cache_type: str, elements: int) -> float:
    """Bytes of one cached row of `elements` (a head's K or V for one token, or the MLA latent)."""
    return elements * cache_element_bytes(cache_type) + ROW_META_BYTES.get(cache_type, 0)


def cache_element_bytes(cache_type: str) -> float:
    """Bytes per cached element of a KV cache type; SpecError naming the types for an unknown one."""
    for known, size in CACHE_BYTES.items():
        if known == cache_type:
            return size
    raise SpecError(f"unknown cache type {cache_type}: choose one of {', '.join(CACHE_BYTES)}")
