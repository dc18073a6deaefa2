"""GGUF memory plan: what a hybrid run puts in VRAM and in RAM, and the `-ot` rules that say so.

Reads only the GGUF header and tensor table (gguf.GGUFReader memory-maps the file; no weights are
loaded). Routed experts (`blk.N.ffn_{gate,up,down,gate_up}_exps`) go to CPU RAM by default; all other
weights, the KV cache and a compute reserve go to the GPU; VRAM left over takes the experts of the
first layers, layer by layer.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from itertools import accumulate
from pathlib import Path
from typing import Any

import gguf

from builder.errors import ModelError, SpecError
from builder.models.gguf_bounds import check_header
from builder.models.kv_cache import (
    DEFAULT_UBATCH,
    PER_HEAD,
    CacheLayout,
    cache_element_bytes,
    kv_cache_bytes,
)
from builder.spec import EXPERTS_ON_CPU_RULE

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
# VRAM kept free for compute buffers and the CUDA context (llama.cpp's are ~0.5-2 GB for these models).
DEFAULT_GPU_RESERVE = 2 * 1024**3
GIB = 1024**3
# VRAM left unplanned on each GPU beside everything the plan counts: both engines' own fitting keeps
# 1 GiB by default (mainline's --fit-target, ik_llama.cpp's --fit-margin 1024 MiB), and a plan that fills
# the card to the last MiB fails on the first allocation it did not foresee.
DEFAULT_VRAM_MARGIN = GIB
# Far beyond any real model (DeepSeek-R1: 61 layers, 256 experts); past these a header is hostile.
MAX_LAYERS = 4096
MAX_EXPERTS = 1 << 16


class VramShortfall(SpecError):
    """What a GPU must hold before any expert (attention, shared weights, KV cache, compute reserve) is
    more than its VRAM less the margin: `need` says so, `missing` by how many bytes."""

    def __init__(self, need: str, missing: int, advice: str) -> None:
        super().__init__(f"{need}; {advice}")
        self.need, self.missing = need, missing


@dataclass(frozen=True)
class ModelFacts:
    """What the plan needs from a GGUF."""

    arch: str
    layers: int
    expert_bytes: tuple[int, ...]  # routed-expert bytes per layer
    other_bytes: int  # everything else (attention, norms, shared experts, embeddings, output)
    kv_heads: int
    key_dim: int
    value_dim: int
    mla_dim: int | None = None  # deepseek2: kv_lora_rank + rope dims per token and layer, cached with MLA
    expert_count: int = 0  # routed experts per layer (0: not an MoE model)
    experts_used: int = 0  # routed experts each token runs through, per layer
    # The groups a token's experts are chosen within ({arch}.expert_group_count; 0 or 1: none): mainline
    # applies them itself, ik_llama.cpp to Ling's bailingmoe2 on its -ger switch only.
    expert_groups: int = 0
    attention_layers: int | None = None  # layers with a KV cache (qwen3next: one in four); None: all
    recurrent_state_bytes: int = 0  # the recurrent layers' conv and SSM state, f32, per sequence
    heads: int = 0  # query heads
    embedding_bytes: int = 0  # token_embd: both engines keep it in RAM (only one row a token is read)
    vocab: int = 0  # tokens of the vocabulary (token_embd's rows): the logits a token outputs
    hidden: int = 0  # the embedding length
    expert_ffn: int = 0  # a routed expert's feed-forward width ({arch}.expert_feed_forward_length)
    # Multi-token-prediction layers (DeepSeek's, GLM's and Qwen3-Next's NextN): the last `nextn_layers` of
    # `layers`, whose weights mainline loads only for MTP drafting (`without_nextn`, the adapter's
    # `loaded_facts`) and ik_llama.cpp never (moe-stack drafts with none on it); both skip their KV cache
    # unless MTP drafting is on (ik_llama.cpp's n_layer_kv_from_start; served GLM-4.x-shaped files logged 3
    # of 4 layers' cache on both engines, tests/integration/test_families.py).
    nextn_layers: int = 0
    nextn_other_bytes: int = 0  # those layers' weights but their routed experts (attention, shared expert)
    # Tokens of its sliding-window layers' attention (Gemma 3, gpt-oss; 0: none): mainline's cache keeps
    # only the window there, and a saved slot with it (it restores such a slot only with --swa-full).
    sliding_window: int = 0
    window_layers: int = 0  # of the cached layers, those that attend over the window only
    context_length: int = 0  # the context it was trained for ({arch}.context_length; 0: not said)
    # DeepSeek Sparse Attention's indexer (GLM-5's glm-dsa): the key width a token caches per layer beside
    # the latent ({arch}.attention.indexer.key_length; 0: none), where the engine builds it (CacheLayout).
    indexer_dim: int = 0
    # Layers with an indexer (its key projection): MiniMax-M3's sparse layers, whose keys (and a value of the
    # head's width) mainline caches beside a non-latent cache (llama_kv_cache_msa).
    indexer_layers: int = 0
    # DeepSeek-V4's compressed attention: per layer, the tokens one compressed row of its cache stands for
    # (4: read sparsely, the indexer's keys beside it; 128: read densely; 0: the raw window alone).
    compress_ratios: tuple[int, ...] = ()
    # The MLA up-projection's form the file lacks, as ik_llama.cpp builds it at load (`built_mla_bytes`).
    built_mla_bytes: int = 0

    @property
    def gpu_weight_bytes(self) -> int:
        """The non-expert weights a GPU stack holds in VRAM: all but the token embeddings (both engines
        keep those in RAM: the logs' CUDA0 model buffer is the rest, to the MiB)."""
        return self.other_bytes - self.embedding_bytes

    def without_nextn(self) -> ModelFacts:
        """The model as an engine that skips its NextN layers loads it (mainline without --mtp)."""
        if not self.nextn_layers:
            return self
        kept = self.layers - self.nextn_layers
        attention = None if self.attention_layers is None else self.attention_layers - self.nextn_layers
        return replace(
            self,
            layers=kept,
            expert_bytes=self.expert_bytes[:kept],
            other_bytes=self.other_bytes - self.nextn_other_bytes,
            attention_layers=attention,
            nextn_layers=0,
            nextn_other_bytes=0,
        )

    @property
    def expert_layers(self) -> int:
        """Layers that hold routed experts (DeepSeek's first three are dense)."""
        return sum(1 for layer_bytes in self.expert_bytes if layer_bytes)

    @property
    def cached_layers(self) -> int:
        cached = self.layers if self.attention_layers is None else self.attention_layers
        return cached - self.nextn_layers

    @property
    def total_bytes(self) -> int:
        return sum(self.expert_bytes) + self.other_bytes

    def read_per_token(self, experts_only: bool) -> int:
        """Weight bytes one decoded token reads: the routed experts it runs through (`experts_only`: a
        hybrid stack, the rest on the GPU), else those and every other weight (a dense model: all)."""
        experts = sum(self.expert_bytes)
        active = experts * self.experts_used // self.expert_count if self.expert_count else experts
        return active if experts_only and self.expert_count else active + self.other_bytes


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
    expert, other, other_in_layer = _weight_bytes(path, readers, layers)
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
    if nextn and not any(expert[: layers - nextn]) and not any(other_in_layer[: layers - nextn]):
        raise ModelError(
            f"{path.name} holds a multi-token-prediction head alone (convert_hf_to_gguf.py --mtp writes "
            "mtp-<name>.gguf), no model: give the model's file, and --mtp where that file carries the head"
        )
    cached = _cached_layers(reader, arch, layers)
    window = max(0, header_number(reader, f"{arch}.attention.sliding_window", default=0))
    embeddings = [t for t in reader.tensors if t.name == "token_embd.weight"]
    embedding = sum(int(t.n_bytes) for t in embeddings)
    vocab = int(embeddings[0].shape[1]) if embeddings and len(embeddings[0].shape) > 1 else 0
    return ModelFacts(
        arch=arch,
        layers=layers,
        expert_bytes=tuple(expert),
        other_bytes=other,
        kv_heads=kv_heads,
        key_dim=key_dim,
        value_dim=value_dim,
        mla_dim=mla_dim,
        expert_count=experts,
        experts_used=used,
        expert_groups=max(0, header_number(reader, f"{arch}.expert_group_count", default=0)),
        attention_layers=cached if cached else None,
        recurrent_state_bytes=_recurrent_state(reader, arch, layers - cached if cached else 0),
        heads=heads,
        embedding_bytes=embedding,
        vocab=vocab,
        hidden=embd,
        expert_ffn=max(0, header_number(reader, f"{arch}.expert_feed_forward_length", default=0)),
        nextn_layers=nextn,
        nextn_other_bytes=sum(other_in_layer[layers - nextn :]) if nextn else 0,
        sliding_window=window,
        window_layers=_window_layers(reader, arch, layers - nextn) if window else 0,
        context_length=max(0, header_number(reader, f"{arch}.context_length", default=0)),
        indexer_dim=max(0, header_number(reader, f"{arch}.attention.indexer.key_length", default=0)),
        indexer_layers=len({match.group(1) for t in reader.tensors if (match := INDEXER_KEY.match(t.name))}),
        compress_ratios=tuple(_numbers(reader, f"{arch}.attention.compress_ratios")[:layers]),
        built_mla_bytes=built_mla_bytes(
            (t.name, int(t.n_elements), FLOAT_WIDTHS.get(t.tensor_type, 0))
            for part_reader in readers
            for t in part_reader.tensors
        ),
    )


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


def _weight_bytes(
    path: Path, readers: list[gguf.GGUFReader], layers: int
) -> tuple[list[int], int, list[int]]:
    """The routed experts' bytes in each layer, every other tensor's, and of those the bytes in each layer,
    over a split model's parts."""
    expert = [0] * layers
    other = 0
    other_in_layer = [0] * layers
    for part_reader in readers:
        for tensor in part_reader.tensors:
            match = ROUTED_EXPERT.match(tensor.name)
            if not match:
                other += int(tensor.n_bytes)
                if (block := LAYER_TENSOR.match(tensor.name)) and int(block.group(1)) < layers:
                    other_in_layer[int(block.group(1))] += int(tensor.n_bytes)
                continue
            layer = int(match.group(1))
            if layer >= layers:
                raise ModelError(
                    f"{path}: tensor {tensor.name} is in layer {layer}, but the model has {layers} "
                    "layers; the file is corrupt"
                )
            expert[layer] += int(tensor.n_bytes)
    return expert, other, other_in_layer


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


def _cached_layers(reader: gguf.GGUFReader, arch: str, layers: int) -> int:
    """Layers with a KV cache: where the GGUF gives head_count_kv per layer, those whose count isn't 0 (the
    KDA hybrids' recurrent layers have 0, and key projections too); else those with a key projection."""
    per_layer = _numbers(reader, f"{arch}.attention.head_count_kv")
    if len(per_layer) > 1:
        return sum(1 for heads in per_layer[:layers] if heads)
    return len({match.group(1) for t in reader.tensors if (match := CACHED_ATTENTION.match(t.name))})


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
