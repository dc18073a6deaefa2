"""Model checks and the synthetic MoE writer (read back with the gguf package)."""

from __future__ import annotations

import math
from pathlib import Path

import gguf
import pytest

from builder.errors import ModelError
from builder.models.gguf_facts import ROUTED_EXPERT, read_facts
from builder.models.model_files import check_gguf
from builder.models.synth_catalog import SHAPES, synth_shape
from builder.models.synth_moe import (
    MoeShape,
    model_file_bytes,
    shape_facts,
    token_read_bytes,
    unprintable_token_ids,
    vocabulary,
    write_moe_gguf,
)
from builder.models.synth_shapes import SEED_SHAPES, TINY_SHAPES


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
    shape = MoeShape(
        layers=2, hidden=64, heads=2, kv_heads=1, head_dim=32, expert_ffn=64, experts=4, experts_used=2
    )
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


def test_a_padded_vocabulary_has_the_real_width_and_stays_silent(tmp_path: Path) -> None:
    shape = MoeShape(layers=1, vocab=2048)
    path = write_moe_gguf(tmp_path / "v.gguf", shape)
    reader = gguf.GGUFReader(str(path))
    head = next(t for t in reader.tensors if t.name == "output.weight")
    assert [int(n) for n in head.shape] == [shape.hidden, 2048]
    assert len(reader.fields["tokenizer.ggml.tokens"].data) == 2048
    rows = gguf.quants.dequantize(head.data, head.tensor_type)
    spoken = len(vocabulary()[0]) - len(unprintable_token_ids())
    assert (abs(rows).sum(axis=1) > 0).sum() == spoken, "the padding's rows are zero: never sampled"
    assert shape_facts(shape) == read_facts(path)
    with pytest.raises(ValueError, match="vocab must be 0"):
        MoeShape(vocab=300)


def _fields(reader: gguf.GGUFReader) -> dict[str, object]:
    return {
        name: (bytes(f.parts[-1]).decode() if f.types[0] == gguf.GGUFValueType.STRING else f.parts[-1][0])
        for name, f in reader.fields.items()
        if f.types and f.types[0] != gguf.GGUFValueType.ARRAY
    }


def test_deepseek2_is_written_in_mainlines_mla_form(tmp_path: Path) -> None:
    shape = TINY_SHAPES["deepseek2"]
    reader = gguf.GGUFReader(str(write_moe_gguf(tmp_path / "ds.gguf", shape)))
    names = {t.name for t in reader.tensors}
    assert {
        "blk.0.ffn_gate.weight",
        "blk.1.attn_k_b.weight",
        "blk.1.attn_v_b.weight",
        "blk.2.exp_probs_b.bias",
        "blk.2.ffn_up_shexp.weight",
        "blk.2.attn_q_a.weight",
        "blk.2.attn_kv_a_mqa.weight",
    } <= names
    assert (
        "blk.0.ffn_gate_exps.weight" not in names and "blk.1.attn_kv_b.weight" not in names
    )  # dense lead; no kv_b
    fields = _fields(reader)
    # What ik_llama.cpp checks before it converts the mainline form (llama-hparams.cpp): 1 KV head,
    # 576/512, rope 64.
    assert (
        fields["deepseek2.attention.head_count_kv"],
        fields["deepseek2.attention.key_length"],
        fields["deepseek2.attention.value_length"],
        fields["deepseek2.rope.dimension_count"],
    ) == (1, 576, 512, 64)
    assert (fields["deepseek2.attention.key_length_mla"], fields["deepseek2.attention.value_length_mla"]) == (
        192,
        128,
    )
    assert fields["deepseek2.leading_dense_block_count"] == 1 and fields["deepseek2.expert_gating_func"] == 2
    assert fields["deepseek2.expert_group_count"] == 4 and fields["deepseek2.expert_group_used_count"] == 2
    k_b = next(t for t in reader.tensors if t.name == "blk.1.attn_k_b.weight")
    assert [int(n) for n in k_b.shape] == [128, 512, 8]  # per head: the 128 non-rope dims × the 512 latent
    facts = read_facts(tmp_path / "ds.gguf")
    assert facts.mla_dim == 576 and facts.expert_count == 8 and facts.expert_bytes[0] == 0


def test_qwen3next_alternates_recurrent_and_attention_layers(tmp_path: Path) -> None:
    reader = gguf.GGUFReader(str(write_moe_gguf(tmp_path / "qn.gguf", TINY_SHAPES["qwen3next"])))
    names = {t.name for t in reader.tensors}
    for layer in (0, 1, 2):  # gated delta nets
        assert {f"blk.{layer}.attn_qkv.weight", f"blk.{layer}.ssm_a", f"blk.{layer}.ssm_ba.weight"} <= names
        assert f"blk.{layer}.attn_q.weight" not in names
    q = next(t for t in reader.tensors if t.name == "blk.3.attn_q.weight")
    assert [int(n) for n in q.shape] == [256, 2 * 4 * 64], "query and its gate"
    assert "blk.3.ssm_a" not in names and "blk.3.ffn_gate_inp_shexp.weight" in names
    fields = _fields(reader)
    assert fields["qwen3next.ssm.inner_size"] == 128 * 4 and fields["qwen3next.full_attention_interval"] == 4
    with pytest.raises(ValueError, match="multiple of 4"):
        synth_shape("qwen3next", tiny=True, layers=6)


def test_q4_0_weights_are_unbiased(tmp_path: Path) -> None:
    """Nibbles 0..15 gave every weight a mean of -0.5 scale (a model that repeats one token at real
    widths)."""
    path = write_moe_gguf(tmp_path / "q4.gguf", MoeShape(layers=1, quant="Q4_0", experts=16))
    up = next(t for t in gguf.GGUFReader(str(path)).tensors if t.name == "blk.0.ffn_up_exps.weight")
    values = gguf.quants.dequantize(up.data, up.tensor_type)
    assert abs(float(values.mean())) < 0.02 * values.std() and 0.015 < float(values.std()) < 0.025


def test_seed_shapes_are_the_real_models() -> None:
    """Full-size files within a few % of the real quants: R1 IQ4_XS 355 GB / Q4_K_M 404 GB, Qwen3-235B
    Q4_K_M 143 GB, Qwen3-Next Q4_K_M about 48 GB (Q4_0 is 4.5 bits a weight)."""
    gb = {arch: model_file_bytes(shape) / 1e9 for arch, shape in SEED_SHAPES.items()}
    assert 355 < gb["deepseek2"] < 404 and 125 < gb["qwen3moe"] < 143 and 42 < gb["qwen3next"] < 48
    ram, vram = token_read_bytes(SEED_SHAPES["deepseek2"])
    # 58 MoE layers × 8 of 256 experts × 3 matrices of 7168 × 2048 at 18/32 bytes a weight
    assert ram == 58 * 8 * 3 * 7168 * 2048 * 18 // 32
    assert 8e9 < vram < 10e9  # attention, 3 dense layers, shared experts, the output head
    slice_ = synth_shape("deepseek2", layers=4, experts=16)
    assert (slice_.dense_layers, slice_.expert_groups, slice_.hidden) == (3, 8, 7168)
    assert synth_shape("deepseek2", layers=4, experts=4).expert_groups == 0  # too few to group
    with pytest.raises(ValueError, match="Lite model"):
        synth_shape("deepseek2", layers=27)
    with pytest.raises(ValueError, match="0 < groups_used < expert_groups"):  # mainline asserts it
        synth_shape("deepseek2", groups_used=8)
    with pytest.raises(ValueError, match="unknown architecture 'llama'"):
        synth_shape("llama")


def test_family_shapes_are_the_real_models() -> None:
    """The families at full size, their total and active parameters counted over the tensor tables
    synth-moe writes (at the real vocabularies) against their configs (../shared/MOE-FAMILIES.md §2):
    GLM-4.6 352.8B/33.6B without the NextN block, gpt-oss-120b 116.8B/5.7B with the embeddings, MiniMax-M2
    228.7B/11.0B, Qwen3.5's 397B/17B by its name (its vision tower and MTP block left out here), GLM-5's
    744B/40B without its NextN block, DeepSeek-V4-Flash's 284B/13B, DeepSeek-V3.2's 671B/37B as R1's
    671.0/37.6 and its indexer's 0.9B in every layer (without its MTP block), Ling-1T's 1T/50B (ik_llama.cpp
    printed 999.705B for the published GGUF), Ling-3.0-flash's 124B/5.1B, Kimi-K3's
    2.8T/104B, MiniMax-M3's 428B/23B (its vision tower
    counted, its embeddings and output head not)."""
    expected = {
        "glm4moe": (352.8, 33.6),
        "gpt-oss": (116.8, 5.7),
        "minimax-m2": (228.7, 11.0),
        "qwen35moe": (396.3, 17.3),
        "glm-dsa": (743.9, 41.8),
        "deepseek4": (284.3, 13.8),  # DeepSeek-V4-Flash: 284B / 13B, the embeddings' rows counted whole
        "deepseek32": (671.9, 38.4),
        # inclusionAI counts active parameters without the embeddings (1.3B and 0.4B here)
        "bailingmoe2": (999.7, 51.1),  # Ling-1T: ~1T / ~50B; ik_llama.cpp printed 999.705B for the real file
        "bailingmoe3": (124.4, 5.5),  # Ling-3.0-flash: 124B / 5.1B (127B with its MTP block)
        "kimi-k3": (2779.5, 105.4),  # Kimi-K3: 2.8T / 104B
        # MiniMax-M3: ~428B with its vision tower / 23B (23.5 without its embeddings and output head)
        "minimax-m3": (426.2, 26.0),
    }
    for arch, shape in SHAPES.items():
        if arch in SEED_SHAPES:
            continue
        total = active = 0
        for name, ne, _kind in shape.tensors(shape.vocab):
            if name.startswith(f"blk.{shape.layers}."):  # the NextN block
                continue
            count = math.prod(ne)
            total += count
            active += count * shape.experts_used // shape.experts if ROUTED_EXPERT.match(name) else count
        assert (round(total / 1e9, 1), round(active / 1e9, 1)) == expected[arch], arch
    glm = synth_shape("glm4moe", layers=2)
    assert (glm.dense_layers, glm.blocks) == (1, 3)  # one MoE layer left, and the NextN block
    with pytest.raises(ValueError, match="unknown architecture 'llama'.*glm4moe, gpt-oss, minimax-m2"):
        synth_shape("llama")
