"""kt-kernel's AMX expert weights: the Hugging Face checkpoint its converter reads, the directory it
writes, and the record moe-stack keeps there.

kt-kernel 0.7.2's AMXINT4/AMXINT8 backends read experts that its converter
(kt-kernel/scripts/convert_cpu_weights.py) quantized ahead of time: one safetensors shard per MoE layer
with `blk.{L}.ffn_{gate,up,down}_exps.{E}.numa.{N}.{weight,scale}` (each expert split over the N CPU
thread pools it was converted for), a shard of the other weights renamed `blk.`/`model.`-less, the
index, and the checkpoint's config.json and tokenizer. Its loader counts the pools from the keys
(kt_kernel/utils/loader.py's SafeTensorLoader), so weights converted for 2 pools under a server of 1
load the wrong halves: the stack's `--kt-threadpool-count` must equal the conversion's.

Everything here is read from safetensors headers and JSON, never from tensor data.
"""

from __future__ import annotations

import json
import re
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.errors import ModelError
from builder.fd_files import read_capped
from builder.models.facts import ModelFacts

INDEX = "model.safetensors.index.json"
RECORD = "moe-stack-kt-weights.json"
AMX_BITS = {"AMXINT4": 4, "AMXINT8": 8}  # kt-kernel's AMX methods and their weight bits
CONVERTED_EXPERT = re.compile(r"blk\.(\d+)\.ffn_(?:gate|up|down)_exps\.(\d+)\.numa\.(\d+)\.(?:weight|scale)$")
CHECKPOINT_EXPERT = re.compile(r"(?:model\.)?(?:language_model\.)?(?:model\.)?layers\.(\d+)\.mlp\.experts\.")
# The converter's --input-type for the experts' safetensors dtype (its choices: bf16, fp16, fp8).
INPUT_TYPES = {"BF16": "bf16", "F16": "fp16", "F8_E4M3": "fp8"}
# Hugging Face model_type → the GGUF architecture name presets are keyed by.
ARCHITECTURES = {
    "qwen3_moe": "qwen3moe",
    "qwen3_next": "qwen3next",
    "qwen2_moe": "qwen2moe",
    "deepseek_v2": "deepseek2",
    "deepseek_v3": "deepseek2",
}
_MAX_HEADER = 256 * 1024**2  # a safetensors header above this is not one
# A JSON file (index, config, record) above this is not one: an index of 8 pools of DeepSeek-V3's
# 58 MoE layers is about 60 MiB. Read capped, since a converter's output is another party's.
_MAX_JSON = 256 * 1024**2


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


def read_header(path: Path) -> list[Tensor]:
    """The tensors a safetensors file declares (an 8-byte little-endian length, then its JSON header)."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(8)
            (length,) = struct.unpack("<Q", raw) if len(raw) == 8 else (0,)
            if not 2 <= length <= _MAX_HEADER:
                raise ModelError(f"{path} is not a safetensors file (header length {length})")
            header = json.loads(handle.read(length))
    except OSError as err:
        raise ModelError(f"{path} can't be read ({err.strerror}); check its permissions") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ModelError(f"{path} is not a safetensors file (its header is not JSON)") from None
    tensors = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            start, end = entry["data_offsets"]
            tensors.append(Tensor(name, str(entry["dtype"]), tuple(entry["shape"]), int(end) - int(start)))
        except (KeyError, TypeError, ValueError):
            raise ModelError(
                f"{path}: tensor {name} has no dtype, shape and offsets; the file is corrupt"
            ) from None
    return tensors


def _config(directory: Path) -> dict[str, Any]:
    """config.json's text model part (a multimodal checkpoint nests it under text_config)."""
    path = directory / "config.json"
    try:
        config = json.loads(read_capped(path, _MAX_JSON))
    except FileNotFoundError:
        raise ModelError(f"{directory} has no config.json; give the model's Hugging Face directory") from None
    except OSError as err:
        raise ModelError(
            f"{path} can't be read as JSON ({err.strerror}); fetch the checkpoint again"
        ) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ModelError(f"{path} can't be read as JSON ({err}); fetch the checkpoint again") from None
    if not isinstance(config, dict):
        raise ModelError(f"{path} is not a JSON object; fetch the checkpoint again")
    text = config.get("text_config", config)
    return {**config, **text} if isinstance(text, dict) else config


def _architecture(config: dict[str, Any]) -> str:
    """The GGUF architecture name of the config's model type (qwen3_moe → qwen3moe)."""
    model_type = str(config.get("model_type", ""))
    return ARCHITECTURES.get(model_type, model_type.replace("_", ""))


def _number(config: dict[str, Any], path: Path, *keys: str) -> int:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and value > 0:
            return value
    raise ModelError(f"{path / 'config.json'} has no {' or '.join(keys)}; it is not an MoE model's config")


def _tensors(directory: Path) -> list[Tensor]:
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelError(f"{directory} holds no .safetensors files")
    return [tensor for path in files for tensor in read_header(path)]


def check_same_model(config_dir: Path, facts: ModelFacts, model: Path) -> None:
    """ModelError when the checkpoint SGLang builds the model from (`config_dir`) is not the model whose
    experts kt-kernel reads (`facts` of `model`): the two would meet only at load, in shape errors."""
    config = _config(config_dir)
    experts = config.get("n_routed_experts", config.get("num_experts"))
    theirs = {
        "architecture": _architecture(config) if config.get("model_type") else None,
        "width": config.get("hidden_size"),
        "layers": config.get("num_hidden_layers"),
        "routed experts": experts,
    }
    ours = {
        "architecture": facts.arch,
        "width": facts.hidden,
        "layers": facts.layers - facts.nextn_layers,
        "routed experts": facts.expert_count,
    }
    differ = [  # what both sides state and differ in
        f"{key} {theirs[key]} vs {ours[key]}"
        for key in ours
        if ours[key] and theirs[key] not in (None, ours[key])
    ]
    if differ:
        raise ModelError(
            f"--config-dir {config_dir} is another model than {model.name} ({'; '.join(differ)}): give the "
            "Hugging Face checkpoint of the model whose experts --model holds"
        )


@dataclass(frozen=True)
class Checkpoint:
    """A Hugging Face MoE checkpoint as kt-kernel's converter reads it."""

    path: Path
    input_type: str  # the converter's --input-type, from the experts' dtype
    moe_layers: int
    experts: int
    hidden: int
    expert_ffn: int
    other_bytes: int = 0  # the weights besides the routed experts (the converter copies them)

    def layer_bytes(self, method: str) -> int:
        """One MoE layer's experts quantized by `method` (weights; the scales add a few per cent)."""
        return self.experts * 3 * self.hidden * self.expert_ffn * AMX_BITS[method] // 8

    def converted_bytes(self, method: str) -> int:
        """What the converter writes: every MoE layer's quantized experts (and their scales, about 1 %
        more: 0.3 % seen on the H200), and the other weights as they are."""
        return self.moe_layers * self.layer_bytes(method) * 101 // 100 + self.other_bytes


def read_checkpoint(directory: Path) -> Checkpoint:
    """The checkpoint in `directory`; ModelError when it is not one the converter can read."""
    if not directory.is_dir():
        raise ModelError(f"{directory} is not a directory; give the model's Hugging Face checkpoint")
    config = _config(directory)
    tensors = _tensors(directory)
    experts = [t for t in tensors if CHECKPOINT_EXPERT.match(t.name)]
    if not experts:
        raise ModelError(
            f"{directory}'s safetensors hold no routed experts (model.layers.N.mlp.experts.*); "
            "give an MoE model's checkpoint"
        )
    # The weights' dtype (an FP8 checkpoint's F32 weight_scale_inv beside each is not its type).
    dtype = Counter(t.dtype for t in experts if t.name.endswith(".weight")).most_common(1)[0][0]
    if dtype not in INPUT_TYPES:
        raise ModelError(
            f"{directory}'s experts are {dtype}; kt-kernel's converter reads BF16, F16 or FP8 (F8_E4M3) "
            "checkpoints: fetch the model's original release"
        )
    layers = {int(match.group(1)) for t in experts if (match := CHECKPOINT_EXPERT.match(t.name))}
    return Checkpoint(
        path=directory,
        input_type=INPUT_TYPES[dtype],
        moe_layers=len(layers),
        experts=_number(config, directory, "n_routed_experts", "num_experts"),
        hidden=_number(config, directory, "hidden_size"),
        expert_ffn=_number(config, directory, "moe_intermediate_size", "intermediate_size"),
        other_bytes=sum(t.nbytes for t in tensors) - sum(t.nbytes for t in experts),
    )


@dataclass(frozen=True)
class ConvertedWeights:
    """A directory kt-kernel's converter wrote: its NUMA pools and MoE layers, and, where moe-stack
    converted it, the method (AMXINT4/AMXINT8) and what it was made from."""

    path: Path
    numa_pools: int
    moe_layers: int
    method: str | None
    record: dict[str, Any] | None


def is_converted(path: Path) -> bool:
    """Whether `path` looks like a converter's output (a directory with its index)."""
    return path.is_dir() and (path / INDEX).is_file()


def read_converted(directory: Path) -> ConvertedWeights:
    """The converted weights in `directory`; ModelError when it holds none."""
    fix = "convert the checkpoint first (`moe-stack kt-convert --model CHECKPOINT --source KT_TREE`)"
    try:
        index = json.loads(read_capped(directory / INDEX, _MAX_JSON))
        keys = list(index["weight_map"])
    except FileNotFoundError:
        raise ModelError(
            f"{directory} has no {INDEX}: it holds no kt-kernel converted weights; {fix}"
        ) from None
    except OSError as err:
        raise ModelError(f"{directory / INDEX} can't be read as an index ({err.strerror}); {fix}") from None
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
        raise ModelError(f"{directory / INDEX} is not a safetensors index; {fix}") from None
    found = [match for key in keys if (match := CONVERTED_EXPERT.match(key))]
    if not found:
        raise ModelError(
            f"{directory} holds no kt-kernel converted experts (blk.N.ffn_up_exps.E.numa.K.weight); {fix}"
        )
    record = _read_record(directory)
    method = record.get("method") if record else None
    return ConvertedWeights(
        path=directory,
        numa_pools=1 + max(int(match.group(3)) for match in found),
        moe_layers=len({match.group(1) for match in found}),
        method=method if method in AMX_BITS else None,
        record=record,
    )


def _read_record(directory: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(read_capped(directory / RECORD, _MAX_JSON))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return record if isinstance(record, dict) else None


def converted_facts(directory: Path) -> ModelFacts:
    """What a plan needs from converted weights: the layer and attention shape from the copied
    config.json, the bytes from the shards' headers (routed experts by layer, the rest)."""
    config = _config(directory)
    layers = _number(config, directory, "num_hidden_layers")
    experts = [0] * layers
    other = embedding = vocab = 0
    for tensor in _tensors(directory):
        match = CONVERTED_EXPERT.match(tensor.name)
        if match and int(match.group(1)) < layers:
            experts[int(match.group(1))] += tensor.nbytes
        else:
            other += tensor.nbytes
        if tensor.name.endswith("embed_tokens.weight"):
            embedding, vocab = tensor.nbytes, tensor.shape[0]
    hidden = _number(config, directory, "hidden_size")
    heads = _number(config, directory, "num_attention_heads")
    head_dim = config.get("head_dim") or hidden // heads
    mla = isinstance(config.get("kv_lora_rank"), int)
    interval = config.get("full_attention_interval")  # qwen3next: one layer in `interval` has a KV cache
    rope = _number(config, directory, "qk_rope_head_dim") if mla else 0
    return ModelFacts(
        arch=_architecture(config),
        layers=layers,
        expert_bytes=tuple(experts),
        other_bytes=other,
        # MLA as llama.cpp's planner counts it: every head's key and value without the latent cache.
        kv_heads=heads if mla else int(config.get("num_key_value_heads") or heads),
        key_dim=_number(config, directory, "qk_nope_head_dim") + rope if mla else int(head_dim),
        value_dim=_number(config, directory, "v_head_dim") if mla else int(head_dim),
        mla_dim=_number(config, directory, "kv_lora_rank") + rope if mla else None,
        expert_count=_number(config, directory, "n_routed_experts", "num_experts"),
        experts_used=_number(config, directory, "num_experts_per_tok"),
        attention_layers=layers // interval if isinstance(interval, int) and interval > 0 else None,
        heads=heads,
        embedding_bytes=embedding,
        vocab=vocab,
        hidden=hidden,
    )


def converted_bytes(directory: Path) -> int:
    """Bytes of the directory's files (what the server reads)."""
    return sum(path.stat().st_size for path in directory.iterdir() if path.is_file())


def converted_files(directory: Path) -> list[Path]:
    return sorted(path for path in directory.iterdir() if path.is_file())
