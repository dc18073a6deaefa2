"""Write small (or real-shaped) random-weight MoE GGUFs for tests and benchmarks.

Architecture qwen3moe, as llama.cpp and ik_llama.cpp load it: per layer attention (q/k/v/output with
q/k norms), a router (ffn_gate_inp) and routed experts (ffn_gate/up/down_exps), so `-ot ...exps=CPU`
and fused-MoE code paths run for real. Weights are random Q8_0/Q4_0 blocks written as bytes and
streamed tensor by tensor (large shapes never sit in memory). The vocabulary is a SentencePiece-style
one with all 256 byte tokens, so any text tokenizes; the output head never prefers a token that is
not text on its own, so greedy completions are valid UTF-8 (ik_llama.cpp's server answers 500 otherwise).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

ARCH = "qwen3moe"
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_WORDS = ["the", "a", "an", "and", "of", "to", "in", "is", "it", "that", "for", "on", "with", "as", "was", "be", "by", "this", "are", "or", "from", "at", "not", "have", "but", "what", "all", "were", "when", "we", "there", "can", "more", "if", "no", "out", "so", "said", "up", "one", "about", "into", "than", "them", "expert", "model", "token", "layer", "memory", "cache", "server", "hello", "world"]
_QUANTS = {"Q8_0": gguf.GGMLQuantizationType.Q8_0, "Q4_0": gguf.GGMLQuantizationType.Q4_0}


@dataclass(frozen=True)
class MoeShape:
    layers: int = 4
    hidden: int = 256
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    expert_ffn: int = 128
    experts: int = 8
    experts_used: int = 2
    context: int = 4096
    quant: str = "Q8_0"

    def __post_init__(self) -> None:
        if self.quant not in _QUANTS:
            raise ValueError(f"quant must be one of {', '.join(_QUANTS)}")
        for name in ("hidden", "expert_ffn"):
            if getattr(self, name) % 32:
                raise ValueError(f"{name} must be a multiple of 32 (the quant block size)")
        if self.heads * self.head_dim % 32 or self.experts_used > self.experts:
            raise ValueError("heads*head_dim must be a multiple of 32 and experts_used <= experts")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and types: specials, the 256 byte tokens, then a few whole words."""
    tt = gguf.TokenType
    tokens = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    types = [tt.UNKNOWN, tt.CONTROL, tt.CONTROL, tt.CONTROL, tt.CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [tt.BYTE] * 256
    pieces = ["▁"] + [f"▁{w}" for w in _WORDS] + list("abcdefghijklmnopqrstuvwxyz")
    tokens += pieces
    types += [tt.NORMAL] * len(pieces)
    scores = [0.0] * (len(tokens) - len(pieces)) + [-float(i) for i in range(len(pieces))]
    return tokens, scores, [int(t) for t in types]


def _tensors(shape: MoeShape, n_vocab: int) -> Iterator[tuple[str, tuple[int, ...], str]]:
    """(name, ne as ggml orders it, kind) per tensor: 'norm' (F32 ones), 'router' (F32), 'quant', 'head'."""
    h, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    yield "token_embd.weight", (h, n_vocab), "quant"
    for i in range(shape.layers):
        p = f"blk.{i}"
        yield f"{p}.attn_norm.weight", (h,), "norm"
        yield f"{p}.attn_q.weight", (h, q), "quant"
        yield f"{p}.attn_k.weight", (h, kv), "quant"
        yield f"{p}.attn_v.weight", (h, kv), "quant"
        yield f"{p}.attn_output.weight", (q, h), "quant"
        yield f"{p}.attn_q_norm.weight", (shape.head_dim,), "norm"
        yield f"{p}.attn_k_norm.weight", (shape.head_dim,), "norm"
        yield f"{p}.ffn_norm.weight", (h,), "norm"
        yield f"{p}.ffn_gate_inp.weight", (h, shape.experts), "router"
        yield f"{p}.ffn_gate_exps.weight", (h, shape.expert_ffn, shape.experts), "quant"
        yield f"{p}.ffn_up_exps.weight", (h, shape.expert_ffn, shape.experts), "quant"
        yield f"{p}.ffn_down_exps.weight", (shape.expert_ffn, h, shape.experts), "quant"
    yield "output_norm.weight", (h,), "norm"
    yield "output.weight", (h, n_vocab), "head"


def unprintable_token_ids() -> list[int]:
    """Control tokens and the bytes 0x80-0xFF: alone they are not valid UTF-8 text."""
    tokens, _, types = vocabulary()
    control = [i for i, kind in enumerate(types) if kind == int(gguf.TokenType.CONTROL)]
    return control + [tokens.index(f"<0x{b:02X}>") for b in range(0x80, 0x100)]


def _quant_blocks(rng: np.random.Generator, ne: tuple[int, ...], quant: str, zero_rows: list[int]) -> np.ndarray:
    """Random blocks of `quant` for a tensor of `ne`, as the uint8 array gguf expects (std ≈ 0.02).

    `zero_rows` (of the first matrix) get scale 0: an output row of zeros gives that token logit 0,
    below the best of the random logits, so greedy decoding never emits it.
    """
    rows = int(np.prod(ne[1:], dtype=np.int64))
    per_row = ne[0] // 32
    blocks = rows * per_row
    if quant == "Q8_0":  # f16 scale + 32 int8
        scale, payload = np.float16(0.02 * 3**0.5 / 127), rng.integers(-127, 128, (blocks, 32), dtype=np.int8)
    else:  # Q4_0: f16 scale + 16 bytes of nibbles, value = (q - 8) * scale
        scale, payload = np.float16(0.02 / 4.6), rng.integers(0, 256, (blocks, 16), dtype=np.uint8)
    scales = np.full((rows, per_row), scale, dtype=np.float16)
    scales[zero_rows] = 0
    head = scales.reshape(blocks, 1).view(np.uint8)
    data = np.concatenate([head, payload.view(np.uint8)], axis=1)
    return data.reshape(*reversed(ne[1:]), -1)


def _array(rng: np.random.Generator, ne: tuple[int, ...], kind: str, quant: str) -> np.ndarray:
    if kind == "norm":
        return np.ones(tuple(reversed(ne)), dtype=np.float32)
    if kind == "router":
        return rng.normal(0.0, 0.02, tuple(reversed(ne))).astype(np.float32)
    return _quant_blocks(rng, ne, quant, unprintable_token_ids() if kind == "head" else [])


def write_moe_gguf(path: Path, shape: MoeShape = MoeShape(), seed: int = 0) -> Path:
    """Write the model to `path` (via a temp file and a rename); returns the path."""
    path = path.resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial")
    tokens, scores, types = vocabulary()
    writer = gguf.GGUFWriter(str(tmp), ARCH)
    writer.add_name("moe-stack synthetic qwen3moe")
    writer.add_block_count(shape.layers)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.expert_ffn)
    writer.add_expert_feed_forward_length(shape.expert_ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_expert_count(shape.experts)
    writer.add_expert_used_count(shape.experts_used)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if shape.quant == "Q8_0" else gguf.LlamaFileType.MOSTLY_Q4_0)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_eot_token_id(tokens.index("<|im_end|>"))
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHATML)

    rng = np.random.default_rng(seed)
    qtype = _QUANTS[shape.quant]
    specs = list(_tensors(shape, len(tokens)))
    for name, ne, kind in specs:  # header first: shapes and types only
        if kind in ("quant", "head"):
            row_bytes = ne[0] // 32 * gguf.GGML_QUANT_SIZES[qtype][1]
            byte_shape = (*reversed(ne[1:]), row_bytes)
            nbytes = int(np.prod(byte_shape, dtype=np.int64))
            writer.add_tensor_info(name, byte_shape, np.dtype(np.uint8), nbytes, raw_dtype=qtype)
        else:
            f32_shape = tuple(reversed(ne))
            writer.add_tensor_info(name, f32_shape, np.dtype(np.float32), 4 * int(np.prod(f32_shape)))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _name, ne, kind in specs:  # then the data, one tensor at a time
        writer.write_tensor_data(_array(rng, ne, kind, shape.quant))
    writer.close()
    tmp.replace(path)
    return path
