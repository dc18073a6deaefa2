"""A directory in the layout kt-kernel's converter writes (convert_cpu_weights.py, merged shards), with
zero-filled tensors: per-layer expert shards keyed `blk.L.ffn_{gate,up,down}_exps.E.numa.N.{weight,scale}`,
a shard of the other weights renamed `blk.`, the index and the checkpoint's config.json. The H200 run
(bench/results/kt-amx-*) checks the same readers against the converter's real output."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from builder.models.kt_weights import INDEX, RECORD


def write_safetensors(path: Path, tensors: dict[str, tuple[str, tuple[int, ...], int]]) -> None:
    """`tensors`: name → (dtype, shape, bytes), zero-filled."""
    header: dict[str, object] = {}
    offset = 0
    for name, (dtype, shape, size) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + bytes(offset))


def write_converted(
    directory: Path,
    layers: int = 2,
    experts: int = 4,
    pools: int = 2,
    hidden: int = 64,
    ffn: int = 32,
    method: str | None = "AMXINT4",
    config: dict[str, object] | None = None,
) -> Path:
    directory.mkdir(parents=True)
    weight_map: dict[str, str] = {}
    bits = 4 if method in (None, "AMXINT4") else 8
    for layer in range(layers):
        shard = f"model-{layer + 1:05d}-of-{layers + 1:05d}.safetensors"
        tensors = {}
        for proj in ("gate", "up", "down"):
            for expert in range(experts):
                for pool in range(pools):
                    key = f"blk.{layer}.ffn_{proj}_exps.{expert}.numa.{pool}"
                    size = hidden * ffn * bits // 8 // pools
                    tensors[f"{key}.weight"] = ("U8", (size,), size)
                    tensors[f"{key}.scale"] = ("F32", (ffn // pools,), 4 * (ffn // pools))
        write_safetensors(directory / shard, tensors)
        weight_map.update(dict.fromkeys(tensors, shard))
    other = {
        "embed_tokens.weight": ("BF16", (259, hidden), 2 * 259 * hidden),
        "norm.weight": ("BF16", (hidden,), 2 * hidden),
    }
    for layer in range(layers):
        other[f"blk.{layer}.self_attn.q_proj.weight"] = ("BF16", (hidden, hidden), 2 * hidden * hidden)
    last = f"model-{layers + 1:05d}-of-{layers + 1:05d}.safetensors"
    write_safetensors(directory / last, other)
    weight_map.update(dict.fromkeys(other, last))
    (directory / INDEX).write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    (directory / "config.json").write_text(
        json.dumps(
            config
            or {
                "model_type": "qwen3_moe",
                "hidden_size": hidden,
                "moe_intermediate_size": ffn,
                "num_experts": experts,
                "num_experts_per_tok": 2,
                "num_hidden_layers": layers,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 16,
            }
        )
    )
    if method is not None:
        (directory / RECORD).write_text(json.dumps({"method": method, "numa_pools": pools}))
    for path in [directory, *directory.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return directory
