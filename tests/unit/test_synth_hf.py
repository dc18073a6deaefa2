"""synth-moe --format hf: Hugging Face checkpoints of the three seed architectures that KTransformers'
SGLang server can load, read back with the libraries transformers uses (tokenizers, safetensors), in
agreement with the GGUF synth_moe writes of the same shape (kt-kernel reads the experts from that one).
transformers' own classes loaded each with no missing or unexpected key (bench/device/hf_load_check.py)."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from tokenizers import Tokenizer

from builder.models.hf_layouts import config_json, weights
from builder.models.kt_weights import ARCHITECTURES, read_checkpoint
from builder.models.synth_hf import EOS, VOCAB, checkpoint_bytes, write_hf_checkpoint
from builder.models.synth_shapes import ARCHITECTURES as SEED_ARCHITECTURES
from builder.models.synth_shapes import SEED_SHAPES, TINY_SHAPES
from tests.cli import run_cli_in_process

CLASSES = {
    "qwen3moe": "Qwen3MoeForCausalLM",
    "deepseek2": "DeepseekV3ForCausalLM",
    "qwen3next": "Qwen3NextForCausalLM",
}


@pytest.mark.parametrize("arch", SEED_ARCHITECTURES)
def test_each_checkpoint_holds_its_table_and_a_tokenizer_for_any_text(tmp_path: Path, arch: str) -> None:
    shape = TINY_SHAPES[arch]
    directory = write_hf_checkpoint(tmp_path / "hf", shape)
    config = json.loads((directory / "config.json").read_text())
    assert config["architectures"] == [CLASSES[arch]] and ARCHITECTURES[config["model_type"]] == arch
    assert (config["hidden_size"], config["num_hidden_layers"]) == (shape.hidden, shape.layers)
    written = safe_open(str(directory / "model.safetensors"), "numpy")
    assert {name: tuple(written.get_slice(name).get_shape()) for name in written.keys()} == {  # noqa: SIM118
        name: dims for name, dims, _fill in weights(shape, VOCAB)
    }
    expert = written.get_tensor(
        f"model.layers.{shape.layers - 1}.mlp.experts.{shape.experts - 1}.up_proj.weight"
    )
    assert expert.shape == (shape.expert_ffn, shape.hidden)
    assert 0.015 < float(expert.std()) < 0.025 and abs(float(expert.mean())) < 0.002
    assert (directory / "model.safetensors").stat().st_size > checkpoint_bytes(shape)
    read = read_checkpoint(directory)  # kt-convert's reading: experts, not the shared ones
    assert (read.experts, read.hidden, read.expert_ffn) == (shape.experts, shape.hidden, shape.expert_ffn)
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    text = "Grüß dich, 世界 <|im_end|>"
    ids = tokenizer.encode(text).ids
    assert (
        ids[-1] == tokenizer.token_to_id("<|im_end|>") == config["eos_token_id"] == EOS and max(ids) < VOCAB
    )
    assert tokenizer.decode(ids, skip_special_tokens=False) == text
    assert "<|im_start|>" in json.loads((directory / "tokenizer_config.json").read_text())["chat_template"]


def _per_layer(table: list[tuple[str, tuple[int, ...]]], pattern: str) -> Counter[tuple[int, str]]:
    """Elements per (layer, routed experts or the rest) of a tensor table."""
    counts: Counter[tuple[int, str]] = Counter()
    for name, dims in table:
        if match := re.match(pattern, name):
            part = "experts" if re.search(r"_exps\.|\.mlp\.experts\.", name) else "rest"
            counts[int(match.group(1)), part] += int(np.prod(dims))
    return counts


@pytest.mark.parametrize("arch", SEED_ARCHITECTURES)
@pytest.mark.parametrize("size", ["tiny", "seed"])
def test_the_checkpoint_and_the_gguf_of_a_shape_agree_layer_by_layer(arch: str, size: str) -> None:
    """SGLang reads attention, norms and routers from the checkpoint, kt-kernel a layer's experts from the
    GGUF by its index: each layer holds as many elements in both (its experts apart), whatever the two
    formats' names and splits (the GGUF's k_b/v_b for kv_b, qkv and gate for qkvz, ...)."""
    shape = (TINY_SHAPES if size == "tiny" else SEED_SHAPES)[arch]
    if size == "seed":  # the full models' widths, two layers of each kind
        shape = type(shape)(**{**shape.__dict__, "layers": 8 if arch == "qwen3next" else 4})
    gguf_table = [(name, ne) for name, ne, _kind in shape.tensors(VOCAB)]
    hf_table = [(name, dims) for name, dims, _fill in weights(shape, VOCAB)]
    assert _per_layer(gguf_table, r"blk\.(\d+)\.") == _per_layer(hf_table, r"model\.layers\.(\d+)\.")
    assert {ne for name, ne in gguf_table if name == "token_embd.weight"} == {(shape.hidden, VOCAB)}


def test_the_configs_are_the_released_models_at_full_size() -> None:
    """The seed models' own config.json values (their Hugging Face repositories), from SEED_SHAPES."""
    r1 = config_json(SEED_SHAPES["deepseek2"], 129280)
    assert {key: r1[key] for key in (
        "num_hidden_layers", "hidden_size", "num_attention_heads", "q_lora_rank", "kv_lora_rank",
        "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "intermediate_size", "moe_intermediate_size",
        "first_k_dense_replace", "n_routed_experts", "n_shared_experts", "num_experts_per_tok", "n_group",
        "topk_group", "scoring_func", "topk_method", "routed_scaling_factor", "max_position_embeddings",
    )} == {
        "num_hidden_layers": 61, "hidden_size": 7168, "num_attention_heads": 128, "q_lora_rank": 1536,
        "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "intermediate_size": 18432, "moe_intermediate_size": 2048, "first_k_dense_replace": 3,
        "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 8,
        "topk_group": 4, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "routed_scaling_factor": 2.5,
        "max_position_embeddings": 163840,
    }  # fmt: skip
    assert (
        r1["rope_scaling"]["factor"] == 40 and r1["rope_scaling"]["original_max_position_embeddings"] == 4096
    )
    nxt = config_json(SEED_SHAPES["qwen3next"], 151936)
    assert {key: nxt[key] for key in (
        "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
        "partial_rotary_factor", "moe_intermediate_size", "shared_expert_intermediate_size", "num_experts",
        "num_experts_per_tok", "full_attention_interval", "linear_conv_kernel_dim", "linear_key_head_dim",
        "linear_value_head_dim", "linear_num_key_heads", "linear_num_value_heads", "rope_theta",
    )} == {
        "num_hidden_layers": 48, "hidden_size": 2048, "num_attention_heads": 16, "num_key_value_heads": 2,
        "head_dim": 256, "partial_rotary_factor": 0.25, "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512, "num_experts": 512, "num_experts_per_tok": 10,
        "full_attention_interval": 4, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
        "linear_value_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
        "rope_theta": 10_000_000.0,
    }  # fmt: skip


def test_what_it_refuses(tmp_path: Path) -> None:
    (tmp_path / "there").mkdir()
    with pytest.raises(ValueError, match="exists: give a new directory"):
        write_hf_checkpoint(tmp_path / "there", TINY_SHAPES["qwen3moe"])
    result = run_cli_in_process(
        "synth-moe", str(tmp_path / "x"), "--tiny", "--format", "hf", "--vocab", "4096"
    )
    assert result.returncode != 0 and "drop --vocab" in result.stderr + result.stdout
    assert not (tmp_path / "x").exists() and not list(tmp_path.glob(".x.*"))
    mtp = run_cli_in_process(
        "synth-moe", str(tmp_path / "r1"), "--arch", "deepseek2", "--tiny", "--mtp", "--format", "hf"
    )
    assert mtp.returncode != 0 and "without the MTP layer: drop --mtp" in mtp.stderr + mtp.stdout
    assert not (tmp_path / "r1").exists() and not list(tmp_path.glob(".r1.*"))
    done = run_cli_in_process(
        "synth-moe", str(tmp_path / "ok"), "--arch", "qwen3next", "--tiny", "--format", "hf"
    )
    assert done.returncode == 0 and (tmp_path / "ok/model.safetensors").is_file()
