"""Write a random-weight Hugging Face checkpoint of a qwen3moe shape: what KTransformers' SGLang server
loads from `--model-path` (config, tokenizer, the non-expert weights; BF16 experts too, for
`--kt-method BF16`), beside synth_moe's GGUF of the same shape for kt-kernel's LLAMAFILE experts.

- config.json: transformers' Qwen3MoeForCausalLM keys (every layer sparse, no shared expert);
- model.safetensors: every weight in the layout Qwen3-MoE checkpoints use
  (`model.layers.{L}.mlp.experts.{E}.{gate,up,down}_proj.weight`, ...), F16, drawn with std 0.02
  (norms 1), written tensor by tensor;
- tokenizer.json: a byte-level BPE of the 256 bytes and ChatML's special tokens (no merges, so any text
  tokenizes byte by byte), with tokenizer_config.json's ChatML template, so chats work.

The file is written as a temp directory renamed into place.
"""

from __future__ import annotations

import json
import shutil
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from builder.models.synth_moe import CHATML
from builder.models.synth_shapes import MoeShape

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
VOCAB = 256 + len(SPECIALS)


def byte_symbols() -> list[str]:
    """The printable character byte-level BPE writes for each byte 0..255: printable Latin-1 bytes
    stand for themselves, the others are moved to code points from 256 up, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    symbols, shifted = {}, 0
    for byte in range(256):
        if byte in printable:
            symbols[byte] = chr(byte)
        else:
            symbols[byte] = chr(256 + shifted)
            shifted += 1
    return [symbols[byte] for byte in range(256)]


def tokenizer_json() -> dict[str, object]:
    vocab = {symbol: i for i, symbol in enumerate(byte_symbols())}
    added = [
        {
            "id": 256 + i,
            "content": token,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, token in enumerate(SPECIALS)
    ]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": None,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "vocab": vocab,
            "merges": [],
            "byte_fallback": False,
            "ignore_merges": False,
        },
    }


def config_json(shape: MoeShape) -> dict[str, object]:
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_size": shape.hidden,
        "intermediate_size": shape.expert_ffn,
        "moe_intermediate_size": shape.expert_ffn,
        "num_experts": shape.experts,
        "num_experts_per_tok": shape.experts_used,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "vocab_size": VOCAB,
        "max_position_embeddings": shape.context,
        "rms_norm_eps": 1e-6,
        "rope_theta": shape.rope_base,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "output_router_logits": False,
        "router_aux_loss_coef": 0.001,
        "tie_word_embeddings": False,
        "use_cache": True,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": shape.layers,
        "initializer_range": 0.02,
        "bos_token_id": 256,
        "eos_token_id": 258,
        "torch_dtype": "bfloat16",
    }


def tensors(shape: MoeShape) -> Iterator[tuple[str, tuple[int, ...], str]]:
    """(name, shape in PyTorch's order: out x in, fill) of every weight."""
    h, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    yield "model.embed_tokens.weight", (VOCAB, h), "random"
    for i in range(shape.layers):
        p = f"model.layers.{i}"
        yield f"{p}.input_layernorm.weight", (h,), "ones"
        yield f"{p}.post_attention_layernorm.weight", (h,), "ones"
        yield f"{p}.self_attn.q_proj.weight", (q, h), "random"
        yield f"{p}.self_attn.k_proj.weight", (kv, h), "random"
        yield f"{p}.self_attn.v_proj.weight", (kv, h), "random"
        yield f"{p}.self_attn.o_proj.weight", (h, q), "random"
        yield f"{p}.self_attn.q_norm.weight", (shape.head_dim,), "ones"
        yield f"{p}.self_attn.k_norm.weight", (shape.head_dim,), "ones"
        yield f"{p}.mlp.gate.weight", (shape.experts, h), "random"
        for e in range(shape.experts):
            yield f"{p}.mlp.experts.{e}.gate_proj.weight", (shape.expert_ffn, h), "random"
            yield f"{p}.mlp.experts.{e}.up_proj.weight", (shape.expert_ffn, h), "random"
            yield f"{p}.mlp.experts.{e}.down_proj.weight", (h, shape.expert_ffn), "random"
    yield "model.norm.weight", (h,), "ones"
    yield "lm_head.weight", (VOCAB, h), "random"


def checkpoint_bytes(shape: MoeShape) -> int:
    """The weights' size in the checkpoint (F16)."""
    return sum(2 * int(np.prod(dims)) for _name, dims, _fill in tensors(shape))


def _write_safetensors(path: Path, shape: MoeShape, seed: int) -> None:
    """safetensors: an 8-byte header length, the JSON header, then each tensor's F16 bytes in order."""
    table = list(tensors(shape))
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dims, _fill in table:
        size = 2 * int(np.prod(dims))
        header[name] = {"dtype": "F16", "shape": list(dims), "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    rng = np.random.default_rng(seed)
    with path.open("wb") as out:
        out.write(struct.pack("<Q", len(encoded)) + encoded)
        for _name, dims, fill in table:
            values = np.ones(dims) if fill == "ones" else rng.normal(0.0, 0.02, dims)
            out.write(values.astype("<f2").tobytes())


def write_hf_checkpoint(directory: Path, shape: MoeShape, seed: int = 0) -> Path:
    """Write the checkpoint into `directory` (which must not exist); returns it."""
    if shape.arch != "qwen3moe":
        raise ValueError(f"Hugging Face checkpoints are written for qwen3moe only, not {shape.arch}")
    directory = directory.resolve()
    if directory.exists():
        raise ValueError(f"{directory} exists: give a new directory for the checkpoint")
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        (staging / "config.json").write_text(json.dumps(config_json(shape), indent=2) + "\n")
        (staging / "generation_config.json").write_text(
            json.dumps({"bos_token_id": 256, "eos_token_id": [258, 256], "do_sample": False}) + "\n"
        )
        (staging / "tokenizer.json").write_text(json.dumps(tokenizer_json(), ensure_ascii=False))
        (staging / "tokenizer_config.json").write_text(
            json.dumps(
                {
                    "tokenizer_class": "PreTrainedTokenizerFast",
                    "bos_token": None,
                    "eos_token": "<|im_end|>",
                    "pad_token": "<|endoftext|>",
                    "chat_template": CHATML,
                    "model_max_length": shape.context,
                    "clean_up_tokenization_spaces": False,
                }
            )
            + "\n"
        )
        _write_safetensors(staging / "model.safetensors", shape, seed)
        staging.chmod(0o755)
        staging.rename(directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return directory
