"""synth-moe --format hf: a Hugging Face checkpoint KTransformers' SGLang server can load, read back
with the libraries transformers uses (tokenizers, safetensors)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors import safe_open
from tokenizers import Tokenizer

from builder.models.synth_hf import VOCAB, checkpoint_bytes, write_hf_checkpoint
from builder.models.synth_shapes import TINY_SHAPES
from tests.cli import run_cli_in_process


def test_the_checkpoint_has_every_weight_of_its_config_and_a_tokenizer_for_any_text(tmp_path: Path) -> None:
    shape = TINY_SHAPES["qwen3moe"]
    directory = write_hf_checkpoint(tmp_path / "hf", shape)
    config = json.loads((directory / "config.json").read_text())
    assert config["architectures"] == ["Qwen3MoeForCausalLM"] and config["num_experts"] == shape.experts
    weights = safe_open(str(directory / "model.safetensors"), "numpy")
    names = set(weights.keys())
    layers, experts = config["num_hidden_layers"], config["num_experts"]
    assert len(names) == 3 + layers * (9 + 3 * experts)  # embeddings, final norm, head + per layer
    up = weights.get_tensor(f"model.layers.{layers - 1}.mlp.experts.{experts - 1}.up_proj.weight")
    assert up.shape == (config["moe_intermediate_size"], config["hidden_size"])
    assert 0.015 < float(up.std()) < 0.025 and abs(float(up.mean())) < 0.002
    assert (
        weights.get_tensor("lm_head.weight").shape
        == (config["vocab_size"], config["hidden_size"])
        == (
            VOCAB,
            shape.hidden,
        )
    )
    assert (directory / "model.safetensors").stat().st_size > checkpoint_bytes(shape)
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    text = "Grüß dich, 世界 <|im_end|>"
    ids = tokenizer.encode(text).ids
    assert ids[-1] == tokenizer.token_to_id("<|im_end|>") == config["eos_token_id"] and max(ids) < VOCAB
    assert tokenizer.decode(ids, skip_special_tokens=False) == text
    assert "<|im_start|>" in json.loads((directory / "tokenizer_config.json").read_text())["chat_template"]


def test_what_it_refuses(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="qwen3moe only, not deepseek2"):
        write_hf_checkpoint(tmp_path / "r1", TINY_SHAPES["deepseek2"])
    (tmp_path / "there").mkdir()
    with pytest.raises(ValueError, match="exists: give a new directory"):
        write_hf_checkpoint(tmp_path / "there", TINY_SHAPES["qwen3moe"])
    result = run_cli_in_process(
        "synth-moe", str(tmp_path / "x"), "--tiny", "--format", "hf", "--vocab", "4096"
    )
    assert result.returncode != 0 and "drop --vocab" in result.stderr + result.stdout
    assert not (tmp_path / "x").exists() and not list(tmp_path.glob(".x.*"))
    done = run_cli_in_process("synth-moe", str(tmp_path / "ok"), "--tiny", "--format", "hf")
    assert done.returncode == 0 and (tmp_path / "ok/model.safetensors").is_file()
