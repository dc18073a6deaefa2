"""Write small (or real-shaped) random-weight MoE GGUFs for tests and benchmarks.

The architectures and their tensor tables are in synth_shapes (qwen3moe, deepseek2, qwen3next), so
`-ot ...exps=CPU`, fused-MoE, MLA and recurrent-state code paths run for real. Weights are random
Q8_0/Q4_0 blocks written as bytes and streamed tensor by tensor (large shapes never sit in memory). The
vocabulary is a SentencePiece-style one with all 256 byte tokens, so any text tokenizes; the output head
never prefers a token that is not text on its own, so greedy completions are valid UTF-8 (ik_llama.cpp's
server answers 500 otherwise); a ChatML template makes chats work.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from builder.models.facts import ModelFacts
from builder.models.gguf_facts import (
    ROUTED_EXPERT,
    WINDOW_PATTERN,
    kv_layers,
    recurrent_state_bytes,
    tensor_totals,
    windowed_layers,
)
from builder.models.synth_delta import KdaHybridShape
from builder.models.synth_shapes import QUANTS, DeepSeek2Shape, MoeShape, Qwen3NextShape, Tensor

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_WORDS = [
    "the", "a", "an", "and", "of", "to", "in", "is", "it", "that", "for", "on", "with", "as", "was", "be",
    "by", "this", "are", "or", "from", "at", "not", "have", "but", "what", "all", "were", "when", "we",
    "there", "can", "more", "if", "no", "out", "so", "said", "up", "one", "about", "into", "than", "them",
    "expert", "model", "token", "layer", "memory", "cache", "server", "hello", "world"
]  # fmt: skip


def vocabulary(size: int = 0) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and types: specials, the 256 byte tokens, a few whole words, then unused tokens up
    to `size` (0: none; ValueError when `size` is smaller than the tokens before them)."""
    tt = gguf.TokenType
    tokens = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    types = [tt.UNKNOWN, tt.CONTROL, tt.CONTROL, tt.CONTROL, tt.CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [tt.BYTE] * 256
    pieces = ["▁"] + [f"▁{w}" for w in _WORDS] + list("abcdefghijklmnopqrstuvwxyz")
    tokens += pieces
    types += [tt.NORMAL] * len(pieces)
    scores = [0.0] * (len(tokens) - len(pieces)) + [-float(i) for i in range(len(pieces))]
    if size and size < len(tokens):
        raise ValueError(f"vocab must be 0 or at least {len(tokens)} (the byte-level tokens and words)")
    padding = max(0, size - len(tokens))
    tokens += [f"<|unused_{i}|>" for i in range(padding)]
    types += [tt.UNUSED] * padding
    scores += [-1e9] * padding
    return tokens, scores, [int(t) for t in types]


def vocab_size(shape: MoeShape) -> int:
    return shape.vocab or len(vocabulary()[0])


def unprintable_token_ids(size: int = 0) -> list[int]:
    """Control and unused tokens and the bytes 0x80-0xFF: alone they are not valid UTF-8 text."""
    tokens, _, types = vocabulary(size)
    silent = (int(gguf.TokenType.CONTROL), int(gguf.TokenType.UNUSED))
    control = [i for i, kind in enumerate(types) if kind in silent]
    return control + [tokens.index(f"<0x{b:02X}>") for b in range(0x80, 0x100)]


def _quant_blocks(
    rng: np.random.Generator, ne: tuple[int, ...], quant: str, zero_rows: list[int]
) -> np.ndarray:
    """Random blocks of `quant` for a tensor of `ne`, as the uint8 array gguf expects (std ≈ 0.02, mean 0).

    Q4_0 nibbles are drawn from 1..15 (value (q - 8) * scale, -7..7): 0..15 would give every weight a mean
    of -0.5 * scale, a bias that at real widths dominates and makes a model repeat one token.
    `zero_rows` (of the first matrix) get scale 0: an output row of zeros gives that token logit 0,
    below the best of the random logits, so greedy decoding never emits it.
    """
    rows = int(np.prod(ne[1:], dtype=np.int64))
    per_row = ne[0] // 32
    blocks = rows * per_row
    if quant == "Q8_0":  # f16 scale + 32 int8
        scale, payload = np.float16(0.02 * 3**0.5 / 127), rng.integers(-127, 128, (blocks, 32), dtype=np.int8)
    else:  # Q4_0: f16 scale + 16 bytes, two nibbles each; -7..7 has std sqrt(56/3)
        nibbles = rng.integers(1, 16, (blocks, 16, 2), dtype=np.uint8)
        scale, payload = np.float16(0.02 / (56 / 3) ** 0.5), nibbles[..., 0] | (nibbles[..., 1] << 4)
    scales = np.full((rows, per_row), scale, dtype=np.float16)
    scales[zero_rows] = 0
    head = scales.reshape(blocks, 1).view(np.uint8)
    data = np.concatenate([head, payload.view(np.uint8)], axis=1)
    return data.reshape(*reversed(ne[1:]), -1)


def _array(rng: np.random.Generator, ne: tuple[int, ...], kind: str, model: MoeShape) -> np.ndarray:
    shape = tuple(reversed(ne))
    if kind == "norm":
        return np.ones(shape, dtype=np.float32)
    if kind == "f32":
        return rng.normal(0.0, 0.02, shape).astype(np.float32)
    if kind == "decay":  # a recurrent layer's A = -exp(A_log): each head's state decays at its own rate
        return -rng.uniform(1.0, 16.0, shape).astype(np.float32)
    if kind == "conv":
        return rng.normal(0.0, 0.3, shape).astype(np.float32)
    if kind == "expert-ids":
        return rng.integers(0, model.experts, shape, dtype=np.int32)
    return _quant_blocks(rng, ne, model.quant, unprintable_token_ids(model.vocab) if kind == "head" else [])


def _is_quantized(kind: str) -> bool:
    return kind in ("quant", "head")


def tensor_bytes(ne: tuple[int, ...], kind: str, quant: str) -> int:
    elements = int(np.prod(ne, dtype=np.int64))
    if not _is_quantized(kind):
        return 4 * elements
    block, size = gguf.GGML_QUANT_SIZES[QUANTS[quant]]
    return elements // block * size


def token_read_bytes(shape: MoeShape) -> tuple[int, int]:
    """Weight bytes one decoded token reads in a hybrid stack: (from RAM: the routed experts it runs
    through; from VRAM: every other weight, one row of the embeddings)."""
    n_vocab = vocab_size(shape)
    ram = vram = 0
    for name, ne, kind in shape.tensors(n_vocab):
        n_bytes = tensor_bytes(ne, kind, shape.quant)
        if ROUTED_EXPERT.match(name):
            ram += n_bytes * shape.experts_used // shape.experts
        else:
            vram += n_bytes // n_vocab if name == "token_embd.weight" else n_bytes
    return ram, vram


def shape_facts(shape: MoeShape) -> ModelFacts:
    """What the planner reads from the file `write_moe_gguf` writes for `shape`, without writing it (a
    test holds the two together): plans for full-size shapes that would take hundreds of GB to write."""
    table = ((name, ne, tensor_bytes(ne, kind, shape.quant), 0 if _is_quantized(kind) else 4)
             for name, ne, kind in shape.tensors(vocab_size(shape)))  # fmt: skip
    totals = tensor_totals(table, shape.blocks)
    per_layer = shape.kv_head_counts if isinstance(shape.kv_head_counts, list) else []
    cached = kv_layers(per_layer, shape.blocks, totals.cached_layers)
    kv_heads, key, value, latent, state = shape.kv_heads, shape.head_dim, shape.head_dim, None, 0
    window: int = getattr(shape, "sliding_window", 0)  # gpt-oss's and deepseek4's
    if isinstance(shape, DeepSeek2Shape):
        kv_heads, value, latent = shape.heads, shape.v_head_dim, shape.kv_lora + shape.rope_dim
    if isinstance(shape, Qwen3NextShape):
        inner = shape.ssm_state * shape.ssm_v_heads
        state = recurrent_state_bytes(
            shape.ssm_state, inner, shape.ssm_groups, shape.ssm_conv, shape.layers - cached
        )
    if isinstance(shape, KdaHybridShape):
        state = shape.recurrent_state
    return totals.facts(
        shape.blocks - shape.layers,
        cached,  # as read_facts: 0 (no key projection it knows) is every layer
        arch=shape.arch,
        kv_heads=kv_heads,
        key_dim=key,
        value_dim=value,
        mla_dim=latent,
        expert_count=shape.experts,
        experts_used=shape.experts_used,
        expert_groups=shape.expert_groups,
        recurrent_state_bytes=state,
        heads=shape.heads,
        hidden=shape.hidden,
        expert_ffn=shape.expert_ffn,
        context_length=shape.context,
        indexer_dim=shape.indexer_key,
        compress_ratios=tuple(getattr(shape, "ratios", ())),  # deepseek4's
        sliding_window=window,
        window_layers=windowed_layers(WINDOW_PATTERN[shape.arch], shape.layers) if window else 0,
    )


def model_file_bytes(shape: MoeShape) -> int:
    """The tensor data's size (the file is this plus its header and vocabulary)."""
    return sum(tensor_bytes(ne, kind, shape.quant) for _name, ne, kind in shape.tensors(vocab_size(shape)))


DEFAULT_SHAPE = MoeShape()  # a tiny qwen3moe


def write_moe_gguf(path: Path, shape: MoeShape = DEFAULT_SHAPE, seed: int = 0) -> Path:
    """Write the model to `path` (via a temp file and a rename); returns the path."""
    path = path.resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial")
    tokens, scores, types = vocabulary(shape.vocab)
    writer = gguf.GGUFWriter(str(tmp), shape.arch)
    writer.add_name(f"moe-stack synthetic {shape.arch}")
    shape.metadata(writer)
    writer.add_file_type(
        gguf.LlamaFileType.MOSTLY_Q8_0 if shape.quant == "Q8_0" else gguf.LlamaFileType.MOSTLY_Q4_0
    )
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
    # No space before the text after a special token: with SentencePiece's default prefix the assistant
    # turn's opening tokenizes as " assistant", which the grammar a response_format becomes refuses when
    # the engine feeds it that opening (mainline's prefill): both engines answered every response_format
    # with "Failed to initialize samplers", where real models' tokenizers (Gemma's, Qwen's) add no space.
    writer.add_add_space_prefix(False)
    writer.add_chat_template(CHATML)

    rng = np.random.default_rng(seed)
    qtype = QUANTS[shape.quant]
    specs: list[Tensor] = list(shape.tensors(len(tokens)))
    for name, ne, kind in specs:  # header first: shapes and types only
        if _is_quantized(kind):
            byte_shape = (*reversed(ne[1:]), ne[0] // 32 * gguf.GGML_QUANT_SIZES[qtype][1])
            writer.add_tensor_info(
                name, byte_shape, np.dtype(np.uint8), tensor_bytes(ne, kind, shape.quant), raw_dtype=qtype
            )
        else:
            dtype = np.dtype(np.int32 if kind == "expert-ids" else np.float32)
            writer.add_tensor_info(name, tuple(reversed(ne)), dtype, tensor_bytes(ne, kind, shape.quant))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _name, ne, kind in specs:  # then the data, one tensor at a time
        writer.write_tensor_data(_array(rng, ne, kind, shape))
    writer.close()
    tmp.replace(path)
    return path
