"""Each seed architecture as its released Hugging Face checkpoints lay it out: the config.json keys that
transformers and SGLang read, and the weight table in those checkpoints' names and orientation (PyTorch's
out x in, one tensor per routed expert). Built from the same MoeShape synth_moe writes the GGUF from, so
the two files of a KTransformers stack (SGLang's --model-path, kt-kernel's --kt-weight-path) agree.

- qwen3moe → Qwen3MoeForCausalLM (Qwen3-235B-A22B's keys);
- deepseek2 → DeepseekV3ForCausalLM (DeepSeek-R1's: MLA projections `q_a/q_b`, `kv_a_proj_with_mqa`,
  `kv_b_proj`, dense leading layers, shared experts, sigmoid routing with a score-correction bias in
  expert groups, YaRN rope), without the multi-token-prediction layer;
- qwen3next → Qwen3NextForCausalLM (Qwen3-Next-80B-A3B's: `linear_attn` gated delta nets with one
  `self_attn` layer in four, a gated shared expert, zero-centred norms: they scale by 1 + weight, which
  is why the GGUF converter adds 1 to them and this table writes zeros where the GGUF has ones).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from builder.models.synth_shapes import DeepSeek2Shape, MoeShape, Qwen3NextShape

# name, shape in PyTorch's order (out x in), fill: "random" (small normal values), "ones" or "zeros"
Weight = tuple[str, tuple[int, ...], str]
YARN_ORIGINAL_CONTEXT = 4096  # DeepSeek-V3/R1's pre-extension context: YaRN factor = context / this


def _shared_config(shape: MoeShape, vocab: int) -> dict[str, object]:
    return {
        "hidden_size": shape.hidden,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "vocab_size": vocab,
        "max_position_embeddings": shape.context,
        "rms_norm_eps": 1e-6,
        "rope_theta": shape.rope_base,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "use_cache": True,
        "initializer_range": 0.02,
        "torch_dtype": "bfloat16",
    }


def _qwen_config(
    shape: MoeShape, architecture: str, model_type: str, shared_ffn: int | None = None
) -> dict[str, object]:
    """The keys Qwen's MoE configs share: the architecture, the attention heads and the experts (a shared
    expert's width where it has one)."""
    shared = {} if shared_ffn is None else {"shared_expert_intermediate_size": shared_ffn}
    return {
        "architectures": [architecture],
        "model_type": model_type,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "intermediate_size": shape.expert_ffn,
        "moe_intermediate_size": shape.expert_ffn,
        **shared,
        "num_experts": shape.experts,
        "num_experts_per_tok": shape.experts_used,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "output_router_logits": False,
        "router_aux_loss_coef": 0.001,
    }


def _qwen3moe_config(shape: MoeShape) -> dict[str, object]:
    return {
        **_qwen_config(shape, "Qwen3MoeForCausalLM", "qwen3_moe"),
        "rope_scaling": None,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": shape.layers,
    }


def _deepseek_v3_config(shape: DeepSeek2Shape) -> dict[str, object]:
    rope_scaling = None
    if shape.context > YARN_ORIGINAL_CONTEXT:
        rope_scaling = {
            "type": "yarn",
            "factor": shape.context / YARN_ORIGINAL_CONTEXT,
            "original_max_position_embeddings": YARN_ORIGINAL_CONTEXT,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        }
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "num_key_value_heads": shape.heads,  # MLA: every head reads the one latent
        "q_lora_rank": shape.q_lora or None,
        "kv_lora_rank": shape.kv_lora,
        "qk_nope_head_dim": shape.head_dim - shape.rope_dim,
        "qk_rope_head_dim": shape.rope_dim,
        "v_head_dim": shape.v_head_dim,
        "intermediate_size": shape.dense_ffn,
        "moe_intermediate_size": shape.expert_ffn,
        "first_k_dense_replace": shape.dense_layers,
        "moe_layer_freq": 1,
        "n_routed_experts": shape.experts,
        "n_shared_experts": shape.shared_experts,
        "num_experts_per_tok": shape.experts_used,
        "n_group": shape.expert_groups or 1,  # no groups: one group of every expert
        "topk_group": shape.groups_used or 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,  # as synth_shapes writes expert_weights_scale
        "num_nextn_predict_layers": 0,
        "ep_size": 1,
        "rope_scaling": rope_scaling,
    }


def _qwen3next_config(shape: Qwen3NextShape) -> dict[str, object]:
    return {
        **_qwen_config(shape, "Qwen3NextForCausalLM", "qwen3_next", shape.shared_ffn),
        "partial_rotary_factor": shape.rope_dim / shape.head_dim,
        "full_attention_interval": 4,
        "linear_conv_kernel_dim": shape.ssm_conv,
        "linear_key_head_dim": shape.ssm_state,
        "linear_value_head_dim": shape.ssm_state,
        "linear_num_key_heads": shape.ssm_groups,
        "linear_num_value_heads": shape.ssm_v_heads,
        "rope_scaling": None,
    }


def _routed_experts(p: str, shape: MoeShape) -> Iterator[Weight]:
    h, ffn = shape.hidden, shape.expert_ffn
    yield f"{p}.mlp.gate.weight", (shape.experts, h), "random"
    for e in range(shape.experts):
        yield from _mlp(f"{p}.mlp.experts.{e}", ffn, h)


def _mlp(p: str, width: int, h: int) -> Iterator[Weight]:
    yield f"{p}.gate_proj.weight", (width, h), "random"
    yield f"{p}.up_proj.weight", (width, h), "random"
    yield f"{p}.down_proj.weight", (h, width), "random"


def _gqa_attention(p: str, shape: MoeShape, norm: str, gated: bool = False) -> Iterator[Weight]:
    """Grouped-query attention with a q and a k norm a head (filled with `norm`); `gated`: the query
    projection twice as wide, the query and its output gate."""
    h, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    yield f"{p}.self_attn.q_proj.weight", (2 * q if gated else q, h), "random"
    yield f"{p}.self_attn.k_proj.weight", (kv, h), "random"
    yield f"{p}.self_attn.v_proj.weight", (kv, h), "random"
    yield f"{p}.self_attn.o_proj.weight", (h, q), "random"
    yield f"{p}.self_attn.q_norm.weight", (shape.head_dim,), norm
    yield f"{p}.self_attn.k_norm.weight", (shape.head_dim,), norm


def _qwen3moe_layer(i: int, shape: MoeShape) -> Iterator[Weight]:
    p, h = f"model.layers.{i}", shape.hidden
    yield f"{p}.input_layernorm.weight", (h,), "ones"
    yield f"{p}.post_attention_layernorm.weight", (h,), "ones"
    yield from _gqa_attention(p, shape, "ones")
    yield from _routed_experts(p, shape)


def _deepseek_v3_layer(i: int, shape: DeepSeek2Shape) -> Iterator[Weight]:
    p, h, heads = f"model.layers.{i}", shape.hidden, shape.heads
    nope = shape.head_dim - shape.rope_dim
    yield f"{p}.input_layernorm.weight", (h,), "ones"
    yield f"{p}.post_attention_layernorm.weight", (h,), "ones"
    if shape.q_lora:
        yield f"{p}.self_attn.q_a_proj.weight", (shape.q_lora, h), "random"
        yield f"{p}.self_attn.q_a_layernorm.weight", (shape.q_lora,), "ones"
        yield f"{p}.self_attn.q_b_proj.weight", (heads * shape.head_dim, shape.q_lora), "random"
    else:
        yield f"{p}.self_attn.q_proj.weight", (heads * shape.head_dim, h), "random"
    yield f"{p}.self_attn.kv_a_proj_with_mqa.weight", (shape.kv_lora + shape.rope_dim, h), "random"
    yield f"{p}.self_attn.kv_a_layernorm.weight", (shape.kv_lora,), "ones"
    yield f"{p}.self_attn.kv_b_proj.weight", (heads * (nope + shape.v_head_dim), shape.kv_lora), "random"
    yield f"{p}.self_attn.o_proj.weight", (h, heads * shape.v_head_dim), "random"
    if i < shape.dense_layers:
        yield from _mlp(f"{p}.mlp", shape.dense_ffn, h)
        return
    yield from _routed_experts(p, shape)
    yield f"{p}.mlp.gate.e_score_correction_bias", (shape.experts,), "zeros"
    yield from _mlp(f"{p}.mlp.shared_experts", shape.expert_ffn * shape.shared_experts, h)


def _qwen3next_layer(i: int, shape: Qwen3NextShape) -> Iterator[Weight]:
    p, h = f"model.layers.{i}", shape.hidden
    yield f"{p}.input_layernorm.weight", (h,), "zeros"
    yield f"{p}.post_attention_layernorm.weight", (h,), "zeros"
    if (i + 1) % 4 == 0:
        yield from _gqa_attention(p, shape, "zeros", gated=True)
    else:
        key, value = shape.ssm_state * shape.ssm_groups, shape.ssm_state * shape.ssm_v_heads
        yield f"{p}.linear_attn.in_proj_qkvz.weight", (2 * key + 2 * value, h), "random"
        yield f"{p}.linear_attn.in_proj_ba.weight", (2 * shape.ssm_v_heads, h), "random"
        yield f"{p}.linear_attn.conv1d.weight", (2 * key + value, 1, shape.ssm_conv), "random"
        yield f"{p}.linear_attn.dt_bias", (shape.ssm_v_heads,), "ones"
        yield f"{p}.linear_attn.A_log", (shape.ssm_v_heads,), "zeros"  # decay -exp(0) = -1 a step
        yield f"{p}.linear_attn.norm.weight", (shape.ssm_state,), "ones"  # a plain gated RMSNorm
        yield f"{p}.linear_attn.out_proj.weight", (h, value), "random"
    yield from _routed_experts(p, shape)
    yield from _mlp(f"{p}.mlp.shared_expert", shape.shared_ffn, h)
    yield f"{p}.mlp.shared_expert_gate.weight", (1, h), "random"


_CONFIGS: dict[str, Callable[..., dict[str, object]]] = {
    "qwen3moe": _qwen3moe_config,
    "deepseek2": _deepseek_v3_config,
    "qwen3next": _qwen3next_config,
}
_LAYERS: dict[str, Callable[..., Iterator[Weight]]] = {
    "qwen3moe": _qwen3moe_layer,
    "deepseek2": _deepseek_v3_layer,
    "qwen3next": _qwen3next_layer,
}
_FINAL_NORM = {"qwen3moe": "ones", "deepseek2": "ones", "qwen3next": "zeros"}


def check_writable(shape: MoeShape) -> None:
    """ValueError naming what a checkpoint of this shape can't be written with."""
    if shape.arch not in _CONFIGS:
        raise ValueError(f"no Hugging Face layout for {shape.arch}: choose one of {', '.join(_CONFIGS)}")
    if isinstance(shape, DeepSeek2Shape) and shape.mtp_layers:
        raise ValueError("the Hugging Face checkpoint is written without the MTP layer: drop --mtp")


def config_json(shape: MoeShape, vocab: int) -> dict[str, object]:
    """config.json's model keys (the tokenizer's ids are the writer's)."""
    check_writable(shape)
    return {**_CONFIGS[shape.arch](shape), **_shared_config(shape, vocab)}


def weights(shape: MoeShape, vocab: int) -> Iterator[Weight]:
    """Every weight of the checkpoint, in file order."""
    check_writable(shape)
    yield "model.embed_tokens.weight", (vocab, shape.hidden), "random"
    for i in range(shape.layers):
        yield from _LAYERS[shape.arch](i, shape)
    yield "model.norm.weight", (shape.hidden,), _FINAL_NORM[shape.arch]
    yield "lm_head.weight", (vocab, shape.hidden), "random"
