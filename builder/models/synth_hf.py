"""Write a random-weight Hugging Face checkpoint of a seed architecture's shape (qwen3moe, deepseek2,
qwen3next): what KTransformers' SGLang server loads from `--model-path` (config, tokenizer, the
non-expert weights; BF16 experts too, for `--kt-method BF16`), beside synth_moe's GGUF of the same shape
for kt-kernel's LLAMAFILE experts.

- config.json: the model's keys as its released checkpoints have them (hf_layouts);
- model.safetensors: every weight in that model's layout (hf_layouts), F16, drawn with std 0.02
  (norms 1, or 0 where the model scales by 1 + weight), written tensor by tensor;
- tokenizer.json: a byte-level BPE of the 256 bytes and ChatML's special tokens (no merges, so any text
  tokenizes byte by byte), with tokenizer_config.json's ChatML template, so chats work.

The file is written as a temp directory renamed into place.
"""

from __future__ import annotations

import json
import shutil
import struct
import tempfile
from pathlib import Path

import numpy as np

from builder.models.hf_layouts import check_writable, config_json, weights
from builder.models.synth_moe import CHATML
from builder.models.synth_shapes import MoeShape

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
VOCAB = 256 + len(SPECIALS)
BOS, EOS = 256 + SPECIALS.index("<|endoftext|>"), 256 + SPECIALS.index("<|im_end|>")


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


def checkpoint_bytes(shape: MoeShape) -> int:
    """The weights' size in the checkpoint (F16)."""
    return sum(2 * int(np.prod(dims)) for _name, dims, _fill in weights(shape, VOCAB))


def _write_safetensors(path: Path, shape: MoeShape, seed: int) -> None:
    """safetensors: an 8-byte header length, the JSON header, then each tensor's F16 bytes in order."""
    table = list(weights(shape, VOCAB))
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
            if fill == "random":
                values = rng.normal(0.0, 0.02, dims)
            else:
                values = np.ones(dims) if fill == "ones" else np.zeros(dims)
            out.write(values.astype("<f2").tobytes())


def write_hf_checkpoint(directory: Path, shape: MoeShape, seed: int = 0) -> Path:
    """Write the checkpoint into `directory` (which must not exist); returns it."""
    check_writable(shape)
    directory = directory.resolve()
    if directory.exists():
        raise ValueError(f"{directory} exists: give a new directory for the checkpoint")
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        config = {**config_json(shape, VOCAB), "bos_token_id": BOS, "eos_token_id": EOS}
        (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        (staging / "generation_config.json").write_text(
            json.dumps({"bos_token_id": BOS, "eos_token_id": [EOS, BOS], "do_sample": False}) + "\n"
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
