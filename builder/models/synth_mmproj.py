"""Write a tiny random-weight multimodal projector for a model, so the vision path (`--mmproj`, an image in
a chat request) runs for real in tests: a two-block InternViT-style vision tower with InternVL's projector
(2 x 2 patches shuffled into one, a LayerNorm and a two-layer GELU MLP to the model's width). InternVL3.5's
MoE models pair it with a Qwen3-MoE text model (InternVL3_5-30B-A3B, -241B-A28B), as the tests pair it
with the tiny qwen3moe; both pinned engines load it (`internvl` in llama.cpp 0c1e57098's and ik_llama.cpp
55d3c05's mtmd) and mark the image with plain text (`<img>`, `</img>`), which any vocabulary tokenizes.
Two other kinds were tried: Idefics3's markers are whole tokens of SmolVLM's vocabulary (the server
answers 400 "Invalid token" otherwise), and Gemma 3's image tokens are read non-causally, which stops
ik_llama.cpp 55d3c05 with flash attention on (iqk_fa_templates.h:1157, `GGML_ASSERT(S > 0)`, CPU image).
A 64-pixel image is 8 x 8 patches of 8, merged into 16 tokens.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from builder.models.projector import CLIP_ARCH

IMAGE_SIZE = 64
PATCH_SIZE = 8
MERGE = 2  # clip.vision.projector.scale_factor: the side of the patches merged into one token
_WIDTH, _HEADS, _FFN, _BLOCKS = 64, 4, 128, 2


def _tensors(text_width: int) -> list[tuple[str, tuple[int, ...], type]]:
    """(name, numpy shape, dtype): the shape is ggml's reversed (the first axis is ggml's last)."""
    patches = (IMAGE_SIZE // PATCH_SIZE) ** 2
    width, merged = _WIDTH, _WIDTH * MERGE * MERGE
    tensors: list[tuple[str, tuple[int, ...], type]] = [
        ("v.class_embd", (width,), np.float32),
        ("v.patch_embd.weight", (width, 3, PATCH_SIZE, PATCH_SIZE), np.float16),
        ("v.patch_embd.bias", (width,), np.float32),
        ("v.position_embd.weight", (patches + 1, width), np.float32),  # the class token's, then each patch's
    ]
    for block in range(_BLOCKS):
        prefix = f"v.blk.{block}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            tensors += [(f"{prefix}.{name}.weight", (width, width), np.float32)]
            tensors += [(f"{prefix}.{name}.bias", (width,), np.float32)]
        for norm in ("ln1", "ln2"):
            tensors += [(f"{prefix}.{norm}.weight", (width,), np.float32)]
            tensors += [(f"{prefix}.{norm}.bias", (width,), np.float32)]
        tensors += [
            (f"{prefix}.ffn_up.weight", (_FFN, width), np.float32),
            (f"{prefix}.ffn_up.bias", (_FFN,), np.float32),
            (f"{prefix}.ffn_down.weight", (width, _FFN), np.float32),
            (f"{prefix}.ffn_down.bias", (width,), np.float32),
        ]
    return [
        *tensors,
        ("mm.model.mlp.0.weight", (merged,), np.float32),
        ("mm.model.mlp.0.bias", (merged,), np.float32),
        ("mm.model.mlp.1.weight", (text_width, merged), np.float32),
        ("mm.model.mlp.1.bias", (text_width,), np.float32),
        ("mm.model.mlp.3.weight", (text_width, text_width), np.float32),
        ("mm.model.mlp.3.bias", (text_width,), np.float32),
    ]


def write_mmproj_gguf(path: Path, text_width: int, seed: int = 0) -> Path:
    """Write the projector for a model `text_width` wide to `path` (via a temp file and a rename)."""
    path = path.resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial")
    writer = gguf.GGUFWriter(str(tmp), CLIP_ARCH)
    writer.add_name("moe-stack synthetic mmproj (internvl projector)")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.use_gelu", True)
    writer.add_string("clip.projector_type", "internvl")
    for key, value in (
        ("image_size", IMAGE_SIZE),
        ("patch_size", PATCH_SIZE),
        ("embedding_length", _WIDTH),
        ("feed_forward_length", _FFN),
        ("block_count", _BLOCKS),
        ("projection_dim", text_width),
        ("attention.head_count", _HEADS),
        ("projector.scale_factor", MERGE),
    ):
        writer.add_uint32(f"clip.vision.{key}", value)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    rng = np.random.default_rng(seed)
    for name, shape, dtype in _tensors(text_width):
        norm = name in {f"v.blk.{b}.{n}.weight" for b in range(_BLOCKS) for n in ("ln1", "ln2")} | {
            "mm.model.mlp.0.weight"
        }
        values = np.ones(shape) if norm else rng.normal(0.0, 0.02, shape)
        writer.add_tensor(name, values.astype(dtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(path)
    return path
