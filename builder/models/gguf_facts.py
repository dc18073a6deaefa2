"""A GGUF's facts (ModelFacts) read from its header and tensor table alone: gguf.GGUFReader memory-maps
the file and no weights are read; every count is checked against the file first (gguf_bounds), and a
split model is read part by part."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf

from builder.errors import ModelError
from builder.models.facts import ModelFacts
from builder.models.gguf_bounds import check_header

ROUTED_EXPERT = re.compile(r"^blk\.(\d+)\.ffn_(?:gate|up|down|gate_up)_exps\.")
LAYER_TENSOR = re.compile(r"^blk\.(\d+)\.")
# A layer with a KV cache has a key projection (deepseek2: the latent's; deepseek4: its one K=V head's);
# qwen3next's recurrent layers have none.
CACHED_ATTENTION = re.compile(r"^blk\.(\d+)\.attn_(?:k|kv|kv_a_mqa)\.weight$")
# A layer with a sparse-attention indexer has its key projection (glm-dsa's attn_k, minimax-m3's k_proj).
INDEXER_KEY = re.compile(r"^blk\.(\d+)\.indexer\.(?:attn_k|k_proj)\.weight$")
# MLA's up-projections: split per head (attn_k_b, attn_v_b: mainline's converter) or fused (attn_kv_b).
MLA_UP_PROJECTION = re.compile(r"^blk\.(\d+)\.attn_(k_b|v_b|kv_b)\.weight$")
Q8_0_BLOCK = (32, 34)  # weights a Q8_0 block holds, its bytes
FLOAT_WIDTHS = {
    gguf.GGMLQuantizationType.F16: 2,
    gguf.GGMLQuantizationType.BF16: 2,
    gguf.GGMLQuantizationType.F32: 4,
}
# Sliding-window patterns of the architectures moe-stack serves whose GGUF may not say one (mainline's
# load_swa_pattern defaults, src/models/{openai-moe,gemma3,gemma2,deepseek4}.cpp at 0c1e57098).
WINDOW_PATTERN = {"gpt-oss": 2, "gemma3": 6, "gemma2": 2, "deepseek4": 0}
# Far beyond any real model (DeepSeek-R1: 61 layers, 256 experts); past these a header is hostile.
MAX_LAYERS = 4096
MAX_EXPERTS = 1 << 16


_SPLIT = re.compile(r"^(?P<stem>.*)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")


def open_gguf(path: Path) -> gguf.GGUFReader:
    """A reader of a complete GGUF: a cut header, or tensor data that runs past the file's end (an
    interrupted download), is a ModelError; so is a header whose counts don't fit the file."""
    check_header(path)
    try:
        reader = gguf.GGUFReader(str(path))
    except (
        ValueError,
        OSError,
        IndexError,
        KeyError,
    ) as err:  # KeyError: a key given twice  # gguf's reader on a cut or corrupt header
        raise ModelError(
            f"{path} is not a readable GGUF ({type(err).__name__}: {err}); is the file complete?"
        ) from None
    needed = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    have = path.stat().st_size
    if have < needed:
        raise ModelError(
            f"{path} is truncated: its tensors need {needed} bytes and the file has {have}; download it again"
        )
    return reader


def split_parts(path: Path) -> list[Path]:
    """All files of a split GGUF (`NAME-00001-of-00009.gguf`), or just `path`."""
    match = _SPLIT.fullmatch(path.name)
    if not match:
        return [path]
    count = int(match.group("count"))
    parts = [
        path.with_name(f"{match.group('stem')}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)
    ]
    missing = [p.name for p in parts if not p.is_file()]
    if missing:
        raise ModelError(
            f"split model {path.name} is missing {', '.join(missing)}; put all parts in one directory"
        )
    return parts


def model_bytes(path: Path) -> int:
    """Size on disk of a model, all parts of a split one included."""
    return sum(part.stat().st_size for part in split_parts(path))


def read_facts(path: Path) -> ModelFacts:
    """ModelFacts from a GGUF's header (every part of a split one); ModelError when unreadable."""
    parts = split_parts(path)
    reader = open_gguf(parts[0])
    arch = header_text(reader, "general.architecture")
    layers = header_number(reader, f"{arch}.block_count")
    if not 1 <= layers <= MAX_LAYERS:
        raise ModelError(
            f"{path} says it has {layers} layers ({arch}.block_count); a model has 1 to {MAX_LAYERS}"
        )
    readers = [reader, *(open_gguf(p) for p in parts[1:])]
    table = ((t.name, tuple(map(int, t.shape)), int(t.n_bytes), FLOAT_WIDTHS.get(t.tensor_type, 0))
             for part in readers for t in part.tensors)  # fmt: skip
    try:
        totals = tensor_totals(table, layers)
    except ValueError as err:
        raise ModelError(f"{path}: {err}; the file is corrupt") from None
    heads = header_number(reader, f"{arch}.attention.head_count")
    embd = header_number(reader, f"{arch}.embedding_length")
    if heads < 1 or embd < 1:
        raise ModelError(
            f"{path} says it has {heads} attention heads and embedding length {embd}; the file is corrupt"
        )
    experts = header_number(reader, f"{arch}.expert_count", default=0)
    if not 0 <= experts <= MAX_EXPERTS:
        raise ModelError(f"{path} says it has {experts} experts per layer; a model has at most {MAX_EXPERTS}")
    kv_heads, key_dim, value_dim, mla_dim = _cached_dims(reader, arch, heads, embd)
    used = header_number(reader, f"{arch}.expert_used_count", default=0)
    if not 0 <= used <= experts:
        raise ModelError(f"{path} says each token uses {used} of its {experts} experts")
    nextn = header_number(reader, f"{arch}.nextn_predict_layers", default=0)
    if not 0 <= nextn < layers:
        raise ModelError(
            f"{path} says {nextn} of its {layers} layers predict further tokens; the file is corrupt"
        )
    if nextn and not any(totals.expert[: layers - nextn]) and not any(totals.in_layer[: layers - nextn]):
        raise ModelError(
            f"{path.name} holds a multi-token-prediction head alone (convert_hf_to_gguf.py --mtp writes "
            "mtp-<name>.gguf), no model: give the model's file, and --mtp where that file carries the head"
        )
    cached = kv_layers(_numbers(reader, f"{arch}.attention.head_count_kv"), layers, totals.cached_layers)
    window = max(0, header_number(reader, f"{arch}.attention.sliding_window", default=0))
    return totals.facts(
        nextn,
        cached,
        arch=arch,
        kv_heads=kv_heads,
        key_dim=key_dim,
        value_dim=value_dim,
        mla_dim=mla_dim,
        expert_count=experts,
        experts_used=used,
        expert_groups=max(0, header_number(reader, f"{arch}.expert_group_count", default=0)),
        recurrent_state_bytes=_recurrent_state(reader, arch, layers - cached if cached else 0),
        heads=heads,
        hidden=embd,
        expert_ffn=max(0, header_number(reader, f"{arch}.expert_feed_forward_length", default=0)),
        sliding_window=window,
        window_layers=_window_layers(reader, arch, layers - nextn) if window else 0,
        context_length=max(0, header_number(reader, f"{arch}.context_length", default=0)),
        indexer_dim=max(0, header_number(reader, f"{arch}.attention.indexer.key_length", default=0)),
        compress_ratios=tuple(_numbers(reader, f"{arch}.attention.compress_ratios")[:layers]),
    )


# A tensor as the totals read it: its name, ne (row length first), bytes, and the bytes an element takes in
# a float type (0: quantized).
TableRow = tuple[str, tuple[int, ...], int, int]


@dataclass(frozen=True)
class TensorTotals:
    """What a model's tensor table says: the routed experts' bytes in each of its layers, every other
    tensor's and of those each layer's, the embeddings' (and the vocabulary, their rows), the layers with a
    key projection and with an indexer's, and the MLA up-projection ik_llama.cpp builds at load."""

    expert: tuple[int, ...]
    other: int
    in_layer: tuple[int, ...]
    embedding: int
    vocab: int
    cached_layers: int
    indexer_layers: int
    built_mla: int

    def facts(self, nextn_layers: int, attention_layers: int, **header: Any) -> ModelFacts:
        """The model's facts: these totals, its last `nextn_layers` layers' weights (its NextN head) and its
        layers with a KV cache (0: none it knows, every layer), with the rest from its `header`."""
        layers = len(self.expert)
        return ModelFacts(
            layers=layers, expert_bytes=self.expert, other_bytes=self.other, embedding_bytes=self.embedding,
            vocab=self.vocab, indexer_layers=self.indexer_layers, built_mla_bytes=self.built_mla,
            nextn_layers=nextn_layers, nextn_other_bytes=sum(self.in_layer[layers - nextn_layers :]),
            attention_layers=attention_layers or None, **header,
        )  # fmt: skip


def tensor_totals(table: Iterable[TableRow], layers: int) -> TensorTotals:
    """The totals of `table` for a model of `layers` blocks; ValueError for an expert beyond them."""
    expert, in_layer = [0] * layers, [0] * layers
    other = embedding = vocab = 0
    cached: set[str] = set()
    indexed: set[str] = set()
    elements = []
    for name, ne, n_bytes, width in table:
        if match := ROUTED_EXPERT.match(name):
            if (layer := int(match.group(1))) >= layers:
                raise ValueError(f"tensor {name} is in layer {layer}, but the model has {layers} layers")
            expert[layer] += n_bytes
            continue
        other += n_bytes
        if (block := LAYER_TENSOR.match(name)) and int(block.group(1)) < layers:
            in_layer[int(block.group(1))] += n_bytes
        if name == "token_embd.weight":
            embedding, vocab = embedding + n_bytes, ne[1] if len(ne) > 1 else 0
        if match := CACHED_ATTENTION.match(name):
            cached.add(match.group(1))
        if match := INDEXER_KEY.match(name):
            indexed.add(match.group(1))
        elements.append((name, math.prod(ne), width))
    return TensorTotals(tuple(expert), other, tuple(in_layer), embedding, vocab, len(cached), len(indexed),
                        built_mla_bytes(elements))  # fmt: skip


def kv_layers(per_layer_heads: list[int], layers: int, with_key_projection: int) -> int:
    """Layers with a KV cache: where the model gives head_count_kv per layer, those whose count isn't 0 (the
    KDA hybrids' recurrent layers have 0, and key projections too); else those with a key projection."""
    if len(per_layer_heads) > 1:
        return sum(1 for heads in per_layer_heads[:layers] if heads)
    return with_key_projection


def built_mla_bytes(tensors: Iterable[tuple[str, int, int]]) -> int:
    """The MLA up-projection's form a file lacks, as ik_llama.cpp builds it at load from the form it has
    (llm_prepare_mla at 55d3c05) and keeps beside it where that is (the H200 logged `Computed
    blk.N.attn_kv_b.weight ... stored in buffer CUDA0`, bench/results/family-buffers-2026-12-05):
    attn_kv_b from attn_k_b and attn_v_b (mainline's converter writes only those; at every -mla but 1),
    Q8_0 unless both are 16-bit; attn_k_b and attn_v_b from attn_kv_b (at -mla 2 and 3), Q8_0 where it is
    quantized. `tensors`: name, elements, and the bytes an element takes in a float type (0: quantized)."""
    layers: dict[str, dict[str, tuple[int, int]]] = {}
    for name, elements, width in tensors:
        if match := MLA_UP_PROJECTION.match(name):
            layers.setdefault(match.group(1), {})[match.group(2)] = (elements, width)
    total = 0
    for parts in layers.values():
        if "kv_b" in parts and "k_b" not in parts:
            elements, width = parts["kv_b"]
            total += elements * width if width else _q8_0_bytes(elements)
        elif "kv_b" not in parts and {"k_b", "v_b"} <= parts.keys():
            (k_elements, k_width), (v_elements, v_width) = parts["k_b"], parts["v_b"]
            elements = k_elements + v_elements
            total += 2 * elements if k_width == v_width == 2 else _q8_0_bytes(elements)
    return total


def _q8_0_bytes(elements: int) -> int:
    return elements * Q8_0_BLOCK[1] // Q8_0_BLOCK[0]


def _cached_dims(
    reader: gguf.GGUFReader, arch: str, heads: int, embd: int
) -> tuple[int, int, int, int | None]:
    """What a token's KV cache holds per layer: KV heads, key and value widths, and with MLA the
    latent's width (kv_lora_rank + rope dims)."""
    kv_heads = max(_numbers(reader, f"{arch}.attention.head_count_kv") or [heads])  # the most a layer has
    key_dim = header_number(reader, f"{arch}.attention.key_length", default=embd // heads)
    value_dim = header_number(reader, f"{arch}.attention.value_length", default=embd // heads)
    if f"{arch}.attention.kv_lora_rank" not in reader.fields:
        return kv_heads, key_dim, value_dim, None
    mla_dim = header_number(reader, f"{arch}.attention.kv_lora_rank") + header_number(
        reader, f"{arch}.rope.dimension_count"
    )
    if f"{arch}.attention.key_length_mla" in reader.fields:
        # Mainline's form: one "KV head" of the latent (576/512); without MLA every head caches
        # its full key and value (ik_llama.cpp converts to that: head_count_kv = head_count).
        kv_heads = heads
        key_dim = header_number(reader, f"{arch}.attention.key_length_mla")
        value_dim = header_number(reader, f"{arch}.attention.value_length_mla")
    return kv_heads, key_dim, value_dim, mla_dim


def _window_layers(reader: gguf.GGUFReader, arch: str, layers: int) -> int:
    """How many of `layers` keep a sliding window, as mainline reads it: the GGUF's per-layer flags or
    pattern (`{arch}.attention.sliding_window_pattern`), else the architecture's pattern; an architecture
    without one counts none (every layer at the full context: an upper bound)."""
    said = _numbers(reader, f"{arch}.attention.sliding_window_pattern")
    if len(said) > 1:
        return sum(1 for flag in said[:layers] if flag)
    pattern = said[0] if said else WINDOW_PATTERN.get(arch)
    return 0 if pattern is None else windowed_layers(pattern, layers)


def _numbers(reader: gguf.GGUFReader, key: str) -> list[int]:
    """A key's numbers, one or an array of them; [] when the GGUF lacks it."""
    field_ = reader.fields.get(key)
    return [_count(field_.parts[index][0], key) for index in field_.data] if field_ else []


def windowed_layers(pattern: int, layers: int) -> int:
    """Of each `pattern` layers the last attends to the whole context, the others to the window (0: every
    layer keeps a window), as mainline's set_swa_pattern lays them out."""
    return sum(1 for layer in range(layers) if pattern == 0 or layer % pattern < pattern - 1)


def _recurrent_state(reader: gguf.GGUFReader, arch: str, recurrent_layers: int) -> int:
    """f32 state one sequence keeps per recurrent layer: a gated delta net's (the convolution's last
    d_conv - 1 inputs of the q/k/v channels and each value head's d_state x head_v matrix:
    llama_memory_recurrent's R and S, matched the CPU log of a qwen3next to the byte), or Kimi Delta
    Attention's (kda_state_bytes)."""
    if not recurrent_layers:
        return 0
    if f"{arch}.kda.head_dim" in reader.fields:
        return kda_state_bytes(
            header_number(reader, f"{arch}.attention.head_count"),
            header_number(reader, f"{arch}.kda.head_dim"),
            header_number(reader, f"{arch}.ssm.conv_kernel"),
            recurrent_layers,
        )
    if f"{arch}.ssm.state_size" not in reader.fields:
        return 0
    return recurrent_state_bytes(
        header_number(reader, f"{arch}.ssm.state_size"),
        header_number(reader, f"{arch}.ssm.inner_size"),
        header_number(reader, f"{arch}.ssm.group_count"),
        header_number(reader, f"{arch}.ssm.conv_kernel"),
        recurrent_layers,
    )


def recurrent_state_bytes(state: int, inner: int, groups: int, conv: int, layers: int) -> int:
    """The conv inputs ((conv - 1) x the q/k/v channels) and SSM state (state x inner) of `layers`, f32."""
    return 4 * layers * ((conv - 1) * (2 * state * groups + inner) + state * inner)


def kda_state_bytes(heads: int, head_dim: int, conv: int, layers: int) -> int:
    """f32 state one sequence keeps over `layers` Kimi Delta Attention layers: the q/k/v convolutions' last
    conv - 1 inputs and each head's head_dim x head_dim delta-rule state (llama-hparams.cpp's n_embd_r and
    n_embd_s; matched to the byte on mainline's CPU logs of Ling-3's and Kimi-K3's tiny files)."""
    inner = heads * head_dim
    return 4 * layers * (3 * (conv - 1) * inner + head_dim * inner)


def _value(reader: gguf.GGUFReader, key: str) -> Any:
    """The raw value array of metadata `key`, None when the GGUF lacks it."""
    field_ = reader.fields.get(key)
    if field_ is None:
        return None
    value = field_.parts[field_.data[0]] if field_.data else None
    if value is None or len(value) == 0:
        raise ModelError(f"the GGUF's {key} is empty; the file is corrupt")
    return value


def header_text(reader: gguf.GGUFReader, key: str) -> str:
    value = _value(reader, key)
    if value is None:
        raise ModelError(f"the GGUF has no {key}; it is not a model moe-stack can plan for")
    try:
        return bytes(value).decode()
    except UnicodeDecodeError:
        raise ModelError(f"the GGUF's {key} is not UTF-8 text; the file is corrupt") from None


def header_number(reader: gguf.GGUFReader, key: str, default: int | None = None) -> int:
    value = _value(reader, key)
    if value is None:
        if default is not None:
            return default
        raise ModelError(f"the GGUF has no {key}; it is not a model moe-stack can plan for")
    return _count(value[0], key)


def _count(number: Any, key: str) -> int:
    """A header number that must be whole: a float key holding NaN, infinity or a fraction is corrupt."""
    if not float(number).is_integer():
        raise ModelError(f"the GGUF's {key} is {float(number)}, not a whole number; the file is corrupt")
    return int(number)
