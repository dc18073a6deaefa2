"""Model checks and the synthetic MoE writer (read back with the gguf package)."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest

from builder.errors import ModelError
from builder.models.model_files import check_gguf
from builder.models.synth_moe import MoeShape, unprintable_token_ids, vocabulary, write_moe_gguf


def test_check_gguf(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="does not exist"):
        check_gguf(tmp_path / "none.gguf")
    with pytest.raises(ModelError, match="is not a file"):
        check_gguf(tmp_path)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"PK\x03\x04")
    with pytest.raises(ModelError, match="is not a GGUF file"):
        check_gguf(bad)


def test_synthetic_moe_has_routed_experts_and_byte_vocab(tmp_path: Path) -> None:
    shape = MoeShape(layers=2, hidden=64, heads=2, kv_heads=1, head_dim=32, expert_ffn=64, experts=4, experts_used=2)
    path = write_moe_gguf(tmp_path / "moe.gguf", shape)
    assert check_gguf(path) == path
    reader = gguf.GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}
    assert len(tensors) == 1 + 12 * 2 + 2  # embeddings, 12 per layer, output norm + head
    gate = tensors["blk.1.ffn_gate_exps.weight"]
    assert [int(n) for n in gate.shape] == [64, 64, 4] and gate.tensor_type == gguf.GGMLQuantizationType.Q8_0
    assert gate.n_bytes == 64 * 4 * (64 // 32) * 34
    assert [int(n) for n in tensors["blk.0.ffn_down_exps.weight"].shape] == [64, 64, 4]
    arch = reader.fields["general.architecture"]
    assert bytes(arch.parts[-1]).decode() == "qwen3moe"
    assert int(reader.fields["qwen3moe.expert_count"].parts[-1][0]) == 4
    tokens, _, types = vocabulary()
    assert "<0x41>" in tokens and types.count(int(gguf.TokenType.BYTE)) == 256
    assert not list(tmp_path.glob(".*partial")), "no partial file left behind"


def test_q4_0_blocks(tmp_path: Path) -> None:
    path = write_moe_gguf(tmp_path / "q4.gguf", MoeShape(layers=1, quant="Q4_0"))
    up = next(t for t in gguf.GGUFReader(str(path)).tensors if t.name == "blk.0.ffn_up_exps.weight")
    assert up.tensor_type == gguf.GGMLQuantizationType.Q4_0 and up.n_bytes == 256 * 128 * 8 // 32 * 18


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        MoeShape(hidden=100)
    with pytest.raises(ValueError, match="quant must be one of"):
        MoeShape(quant="IQ4_XS")


def test_output_head_mutes_tokens_that_are_not_text(tmp_path: Path) -> None:
    path = write_moe_gguf(tmp_path / "m.gguf", MoeShape(layers=1))
    head = next(t for t in gguf.GGUFReader(str(path)).tensors if t.name == "output.weight")
    rows = gguf.quants.dequantize(head.data, head.tensor_type)
    muted = unprintable_token_ids()
    assert len(muted) == 4 + 128  # <s>, </s>, <|im_start|>, <|im_end|> and bytes 0x80-0xFF
    assert not rows[muted].any()
    assert (abs(rows).sum(axis=1) > 0).sum() == len(rows) - len(muted)
