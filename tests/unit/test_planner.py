"""Memory planner: sizes read from a real GGUF, KV cache arithmetic, and the -ot rules it emits.

Expected numbers are derived by hand in the comments."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import get_args

import pytest

from builder.errors import ModelError, SpecError
from builder.models.planner import (
    CACHE_BYTES,
    GIB,
    DevicePlan,
    ModelFacts,
    device_rules,
    kv_cache_bytes,
    plan,
    read_facts,
)
from builder.models.synth_moe import MoeShape, write_moe_gguf
from builder.spec import CacheType
from tests.cli import run_cli

# The default synthetic model: 4 layers, hidden 256, 8 experts of FFN 128, Q8_0 (34 bytes per 32 weights).
# Per layer: gate + up + down = 3 × 8 × 128 × 256 weights × 34/32 = 835,584 bytes.
EXPERT_LAYER_BYTES = 3 * 8 * 128 * 256 * 34 // 32

# DeepSeek-R1 shapes (config.json): 61 layers, 128 heads, qk head dim 192 (128 nope + 64 rope), v 128,
# kv_lora_rank 512. The routed-expert and other sizes are only placeholders here.
R1 = ModelFacts(arch="deepseek2", layers=61, expert_bytes=(5 * GIB,) * 61, other_bytes=14 * GIB, kv_heads=128,
                key_dim=192, value_dim=128, mla_dim=512 + 64)


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_moe_gguf(tmp_path_factory.mktemp("plan") / "moe.gguf", MoeShape())


def test_reads_expert_bytes_per_layer(moe: Path) -> None:
    facts = read_facts(moe)
    assert facts.arch == "qwen3moe" and facts.layers == 4
    assert facts.expert_bytes == (EXPERT_LAYER_BYTES,) * 4
    assert 0 < moe.stat().st_size - facts.total_bytes < 64 * 1024  # the rest is header (vocab) and padding
    assert (facts.kv_heads, facts.key_dim, facts.value_dim, facts.mla_dim) == (2, 64, 64, None)


def test_kv_cache_sizes() -> None:
    # R1 with MLA, 32768 tokens of q8_0: 576 × 32768 × 61 × 34/32 = 1,223,294,976 bytes
    assert kv_cache_bytes(R1, 32768, "q8_0", mla=True) == 1_223_294_976
    # without MLA, f16: 128 × (192 + 128) × 32768 × 61 × 2 = 163,745,628,160 bytes (152.5 GiB)
    assert kv_cache_bytes(R1, 32768, "f16", mla=False) == 163_745_628_160
    with pytest.raises(SpecError, match="unknown cache type q3_k"):
        kv_cache_bytes(R1, 1024, "q3_k", mla=False)


def test_leftover_vram_takes_the_first_layers_experts(moe: Path) -> None:
    facts = read_facts(moe)
    fixed = facts.other_bytes + kv_cache_bytes(facts, 4096, "f16", False) + 2 * GIB
    two_layers = plan(facts, fixed + 2 * EXPERT_LAYER_BYTES + 100, GIB, 4096, "f16")
    assert two_layers.gpu_expert_layers == 2
    assert two_layers.cpu_bytes == 2 * EXPERT_LAYER_BYTES
    assert two_layers.override_rules == (r"blk\.(0|1)\.ffn_.*_exps\.weight=CUDA0", r"blk\.[0-9]+\.ffn_.*_exps\.weight=CPU")
    assert plan(facts, fixed + 100, GIB, 4096, "f16").override_rules == (r"blk\.[0-9]+\.ffn_.*_exps\.weight=CPU",)


def test_rules_route_tensors_as_planned() -> None:
    rules = device_rules([DevicePlan(0, 24 * GIB, range(61), 0, (0, 1, 2))], 61)
    def where(name: str) -> str:
        return next(rule.rsplit("=", 1)[1] for rule in rules if re.search(rule.rsplit("=", 1)[0], name))
    assert where("blk.2.ffn_up_exps.weight") == "CUDA0"
    assert where("blk.12.ffn_down_exps.weight") == "CPU"  # "1" alone must not catch layer 12
    assert where("blk.3.ffn_gate_exps.weight") == "CPU"


def test_too_large_says_by_how_much() -> None:
    with pytest.raises(SpecError, match=r"routed experts need 305.0 GiB of RAM, 49.0 GiB more than the 256.0 GiB"):
        plan(R1, 24 * GIB, 256 * GIB, 32768, "q8_0", mla=True)
    with pytest.raises(SpecError, match=r"need 17.1 GiB of VRAM, 1.1 GiB more than the 16.0 GiB given"):
        plan(R1, 16 * GIB, 512 * GIB, 32768, "q8_0", mla=True)


@pytest.mark.cli
def test_plan_cli(moe: Path, tmp_path: Path) -> None:
    result = run_cli("plan", str(moe), "--vram-gb", "1", "--ram-gb", "8")
    assert result.returncode == 1 and "more than the 1.0 GiB given" in result.stderr
    two = run_cli("plan", str(moe), "--vram-gb", "2.003,2.003", "--ram-gb", "8", "-c", "512", "--json")
    assert two.returncode == 0, two.stderr
    planned = json.loads(two.stdout)
    assert planned["tensor_split"] == [2, 2] and [d["gpu"] for d in planned["devices"]] == [0, 1]
    assert planned["devices"][0]["layers"][0] == 0 and planned["devices"][1]["layers"][1] == planned["layers"]
    broken = tmp_path / "cut.gguf"
    broken.write_bytes(moe.read_bytes()[:1000])
    with pytest.raises(ModelError, match="header does not hold together: tensor count 51 does not fit"):
        read_facts(broken)


def test_split_models_are_read_whole(moe: Path, tmp_path: Path) -> None:
    first = tmp_path / "m-00001-of-00002.gguf"
    first.symlink_to(moe)
    with pytest.raises(ModelError, match="missing m-00002-of-00002.gguf"):
        read_facts(first)
    (tmp_path / "m-00002-of-00002.gguf").symlink_to(moe)  # the same tensors twice: sizes double
    assert read_facts(first).expert_bytes == (2 * EXPERT_LAYER_BYTES,) * 4


def test_every_cache_type_a_stack_takes_has_a_size() -> None:
    """The cache types have one home (spec.CacheType); the planner's sizes cover exactly those."""
    assert set(CACHE_BYTES) == set(get_args(CacheType))
