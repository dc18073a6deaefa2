"""Plain-PyTorch stand-ins for the compiled `sgl_kernel` ops a bf16/f16 forward pass of the seed's three
architectures calls (Qwen3-MoE; DeepSeek-V3/R1's MLA prefill, fused A projection and grouped routing;
Qwen3-Next's causal convolution),
registered under the same `torch.ops.sgl_kernel.*` names: for running KTransformers' SGLang server
(sglang-kt 0.7.2) under a torch its compiled `common_ops` library was not built for.

Not part of any image. The images install sglang-kt's own CUDA library for the torch it was built
against (2.9.1, CUDA 12.8); the GPU machine has no Docker and its torch is 2.11, whose C++ ABI the
library does not hold (../shared/KT-ON-THE-GPU.md). sgl_kernel's loader imports a top-level module
named `common_ops` when no architecture library is installed (sgl_kernel/load_utils.py, last
attempt): this file, on PYTHONPATH, is that module. Each op is written from its Python wrapper's
documented semantics in sgl_kernel 0.3.21 (elementwise.py, moe.py, sampling.py); the schemas are
this file's own. An op not here fails by name (`torch.ops.sgl_kernel has no attribute ...`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

_LIB = torch.library.Library("sgl_kernel", "DEF")  # kept alive for the process: it owns the ops
STANDS_IN_FOR: list[str] = []


def _op(schema: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Define `schema` and register the decorated function for CUDA and CPU. No Meta kernel: SGLang
    registers fake (tracing) kernels for some sgl_kernel ops itself, which fails where one exists."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        name = schema.split("(", 1)[0]
        _LIB.define(schema)
        _LIB.impl(name, fn, "CUDA")
        _LIB.impl(name, fn, "CPU")
        STANDS_IN_FOR.append(name)
        return fn

    return register


def _absent(name: str) -> Callable[..., None]:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            f"sgl_kernel::{name} has no PyTorch stand-in (bench/device/sgl_kernel_torch)"
        )

    return refuse


# Ops SGLang registers fake kernels for when its modules load (`torch.library.register_fake(
# "sgl_kernel::NAME")`, sglang-kt 0.7.2: quantized GEMMs, CPU-backend kernels), which needs the op
# to exist: defined without arguments, each refuses by name if anything calls it.
FAKED_BY_SGLANG = (
    "biased_grouped_topk_cpu",
    "fp8_blockwise_scaled_mm",
    "fp8_scaled_mm",
    "fp8_scaled_mm_cpu",
    "grouped_topk_cpu",
    "int8_scaled_mm_cpu",
    "int8_scaled_mm_with_quant",
    "per_token_quant_int8_cpu",
    "qkv_proj_with_rope",
    "qkv_proj_with_rope_fused_weight",
    "rotary_embedding_cpu",
    "sgl_per_token_group_quant_8bit",
    "sgl_per_token_group_quant_fp8",
    "sgl_per_token_quant_fp8",
    "shm_allgather",
    "silu_and_mul_cpu",
    "topk_sigmoid_cpu",
    "topk_softmax_cpu",
    "weight_packed_linear",
)
for _name in FAKED_BY_SGLANG:
    _LIB.define(f"{_name}() -> ()")
    _LIB.impl(_name, _absent(_name), "CompositeExplicitAutograd")


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0) -> torch.Tensor:
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (normed * (weight.float() + offset)).to(x.dtype)


@_op("rmsnorm(Tensor(a!) output, Tensor input, Tensor weight, float eps, bool enable_pdl) -> ()")
def rmsnorm(output: Any, input: Any, weight: Any, eps: Any, enable_pdl: Any) -> None:
    output.copy_(_rms(input, weight, eps))


@_op(
    "fused_add_rmsnorm(Tensor(a!) input, Tensor(b!) residual, Tensor weight, float eps, "
    "bool enable_pdl) -> ()"
)
def fused_add_rmsnorm(input: Any, residual: Any, weight: Any, eps: Any, enable_pdl: Any) -> None:
    residual.add_(input)
    input.copy_(_rms(residual, weight, eps))


@_op("gemma_rmsnorm(Tensor(a!) output, Tensor input, Tensor weight, float eps, bool enable_pdl) -> ()")
def gemma_rmsnorm(output: Any, input: Any, weight: Any, eps: Any, enable_pdl: Any) -> None:
    output.copy_(_rms(input, weight, eps, offset=1.0))


@_op(
    "gemma_fused_add_rmsnorm(Tensor(a!) input, Tensor(b!) residual, Tensor weight, float eps, "
    "bool enable_pdl) -> ()"
)
def gemma_fused_add_rmsnorm(input: Any, residual: Any, weight: Any, eps: Any, enable_pdl: Any) -> None:
    residual.add_(input)
    input.copy_(_rms(residual, weight, eps, offset=1.0))


def _gated(out: torch.Tensor, input: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor]) -> None:
    gate, up = input.chunk(2, dim=-1)
    out.copy_((act(gate.float()) * up.float()).to(out.dtype))


@_op("silu_and_mul(Tensor(a!) out, Tensor input) -> ()")
def silu_and_mul(out: Any, input: Any) -> None:
    _gated(out, input, F.silu)


@_op("gelu_and_mul(Tensor(a!) out, Tensor input) -> ()")
def gelu_and_mul(out: Any, input: Any) -> None:
    _gated(out, input, F.gelu)


@_op("gelu_tanh_and_mul(Tensor(a!) out, Tensor input) -> ()")
def gelu_tanh_and_mul(out: Any, input: Any) -> None:
    _gated(out, input, lambda x: F.gelu(x, approximate="tanh"))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool) -> torch.Tensor:
    """x: (tokens, heads, head_size); cos/sin: (tokens, rotary_dim / 2). The first rotary_dim
    dimensions turn (halves, NeoX style, or even/odd pairs when interleaved); the rest pass."""
    rotary_dim = cos.shape[-1] * 2
    turned, kept = x[..., :rotary_dim].float(), x[..., rotary_dim:]
    cos, sin = cos[:, None, :], sin[:, None, :]
    if interleave:
        even, odd = turned[..., 0::2], turned[..., 1::2]
        out = torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).flatten(-2)
    else:
        first, second = turned.chunk(2, dim=-1)
        out = torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)
    return torch.cat((out.to(x.dtype), kept), dim=-1)


@_op(
    "apply_rope_pos_ids_cos_sin_cache(Tensor q, Tensor k, Tensor(a!) q_rope, Tensor(b!) k_rope, "
    "Tensor cos_sin_cache, Tensor pos_ids, bool interleave, bool enable_pdl, Tensor? v, "
    "Tensor(c!)? k_buffer, Tensor(d!)? v_buffer, Tensor? kv_cache_loc) -> ()"
)
def apply_rope_pos_ids_cos_sin_cache(
    q: Any,
    k: Any,
    q_rope: Any,
    k_rope: Any,
    cos_sin_cache: Any,
    pos_ids: Any,
    interleave: Any,
    enable_pdl: Any,
    v: Any,
    k_buffer: Any,
    v_buffer: Any,
    kv_cache_loc: Any,
) -> None:
    cos, sin = cos_sin_cache[pos_ids].chunk(2, dim=-1)  # the cache is float32 [cos | sin] per position
    q_rope.copy_(_rotate(q, cos, sin, interleave))
    k_rope.copy_(_rotate(k, cos, sin, interleave))
    if k_buffer is not None and v_buffer is not None and kv_cache_loc is not None and v is not None:
        k_buffer[kv_cache_loc] = k_rope.to(k_buffer.dtype)
        v_buffer[kv_cache_loc] = v.to(v_buffer.dtype)


@_op(
    "rotary_embedding(Tensor positions, Tensor(a!) query, Tensor(b!) key, int head_size, "
    "Tensor cos_sin_cache, bool is_neox) -> ()"
)
def rotary_embedding(
    positions: Any, query: Any, key: Any, head_size: Any, cos_sin_cache: Any, is_neox: Any
) -> None:
    cos, sin = cos_sin_cache[positions.flatten().long()].float().chunk(2, dim=-1)
    for x in (query, key):
        heads = x.view(x.shape[0], -1, head_size)
        heads.copy_(_rotate(heads, cos, sin, interleave=not is_neox))


@_op(
    "topk_softmax(Tensor(a!) topk_weights, Tensor(b!) topk_ids, Tensor gating_output, "
    "bool renormalize, float moe_softcapping, Tensor? correction_bias) -> ()"
)
def topk_softmax(
    topk_weights: Any,
    topk_ids: Any,
    gating_output: Any,
    renormalize: Any,
    moe_softcapping: Any,
    correction_bias: Any,
) -> None:
    logits = gating_output.float()
    if moe_softcapping > 0:
        logits = torch.tanh(logits / moe_softcapping) * moe_softcapping
    scores = torch.softmax(logits, dim=-1)
    chooser = scores + correction_bias.float() if correction_bias is not None else scores
    ids = chooser.topk(topk_ids.shape[-1], dim=-1).indices
    weights = scores.gather(-1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    topk_weights.copy_(weights.to(topk_weights.dtype))
    topk_ids.copy_(ids.to(topk_ids.dtype))


@_op(
    "moe_align_block_size(Tensor topk_ids, int num_experts, int block_size, "
    "Tensor(a!) sorted_token_ids, Tensor(b!) experts_ids, Tensor(c!) num_tokens_post_pad, "
    "Tensor(d!) cumsum_buffer, bool pad_sorted_token_ids) -> ()"
)
def moe_align_block_size(
    topk_ids: Any,
    num_experts: Any,
    block_size: Any,
    sorted_token_ids: Any,
    experts_ids: Any,
    num_tokens_post_pad: Any,
    cumsum_buffer: Any,
    pad_sorted_token_ids: Any,
) -> None:
    """Group the (token, slot) pairs by expert, each group padded to whole blocks: the padding holds
    topk_ids.numel() (no token), and each block's expert in experts_ids. SGLang passes its expert
    count + 1: ids outside [0, num_experts - 1) (-1 or that sentinel: experts this GPU doesn't hold)
    are grouped into blocks of expert -1, which its Triton MoE kernel writes as zeros."""
    flat = topk_ids.flatten().long()
    real = num_experts - 1
    bucket = torch.where((flat >= 0) & (flat < real), flat, torch.full_like(flat, real))
    counts = torch.bincount(bucket, minlength=num_experts)
    padded = (counts + block_size - 1) // block_size * block_size
    starts = torch.cumsum(padded, 0) - padded
    order = torch.argsort(bucket, stable=True)
    rank = torch.arange(flat.numel(), device=flat.device) - (torch.cumsum(counts, 0) - counts)[bucket[order]]
    total = int(padded.sum())
    sorted_token_ids.fill_(flat.numel())
    sorted_token_ids[starts[bucket[order]] + rank] = order.to(sorted_token_ids.dtype)
    block_expert = torch.repeat_interleave(
        torch.arange(num_experts, device=flat.device), padded // block_size
    )
    block_expert[block_expert == real] = -1
    experts_ids.fill_(-1)
    experts_ids[: block_expert.numel()] = block_expert.to(experts_ids.dtype)
    num_tokens_post_pad.fill_(total)
    cumsum_buffer.zero_()
    cumsum_buffer[1 : num_experts + 1] = torch.cumsum(padded, 0)[: cumsum_buffer.numel() - 1].to(
        cumsum_buffer.dtype
    )


@_op("moe_sum(Tensor input, Tensor(a!) output) -> ()")
def moe_sum(input: Any, output: Any) -> None:
    output.copy_(input.float().sum(dim=1).to(output.dtype))


@_op("moe_sum_reduce(Tensor input, Tensor(a!) output, float routed_scaling_factor) -> ()")
def moe_sum_reduce(input: Any, output: Any, routed_scaling_factor: Any) -> None:
    scale = routed_scaling_factor or 1.0  # the wrapper's default 0 means unscaled
    output.copy_((input.float().sum(dim=1) * scale).to(output.dtype))


def _per_row(values: torch.Tensor | None, scalar: float, rows: int, device: torch.device) -> torch.Tensor:
    return values if values is not None else torch.full((rows,), scalar, device=device)


@_op("top_k_renorm_probs(Tensor probs, Tensor(a!) renorm_probs, Tensor? top_k_arr, int top_k_val) -> ()")
def top_k_renorm_probs(probs: Any, renorm_probs: Any, top_k_arr: Any, top_k_val: Any) -> None:
    k = _per_row(top_k_arr, top_k_val, probs.shape[0], probs.device).long().clamp(1, probs.shape[-1])
    kth = probs.sort(dim=-1, descending=True).values.gather(-1, (k - 1)[:, None])
    kept = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    renorm_probs.copy_(kept / kept.sum(dim=-1, keepdim=True))


@_op("top_p_renorm_probs(Tensor probs, Tensor(a!) renorm_probs, Tensor? top_p_arr, float top_p_val) -> ()")
def top_p_renorm_probs(probs: Any, renorm_probs: Any, top_p_arr: Any, top_p_val: Any) -> None:
    p = _per_row(top_p_arr, top_p_val, probs.shape[0], probs.device).float()[:, None]
    ordered, index = probs.sort(dim=-1, descending=True)
    before = ordered.cumsum(dim=-1) - ordered  # mass of the larger ones: keep while it is under p
    kept_sorted = torch.where(before < p, ordered, torch.zeros_like(ordered))
    kept = torch.zeros_like(probs).scatter(-1, index, kept_sorted)
    renorm_probs.copy_(kept / kept.sum(dim=-1, keepdim=True))


@_op("top_k_mask_logits(Tensor logits, Tensor(a!) mask_logits, Tensor? top_k_arr, int top_k_val) -> ()")
def top_k_mask_logits(logits: Any, mask_logits: Any, top_k_arr: Any, top_k_val: Any) -> None:
    k = _per_row(top_k_arr, top_k_val, logits.shape[0], logits.device).long().clamp(1, logits.shape[-1])
    kth = logits.sort(dim=-1, descending=True).values.gather(-1, (k - 1)[:, None])
    mask_logits.copy_(torch.where(logits >= kth, logits, torch.full_like(logits, float("-inf"))))


# -- DeepSeek-V3/R1 (sglang-kt 0.7.2's deepseek_v2.py and topk.py on sm90) ------------------------------


@_op(
    "moe_fused_gate(Tensor input_tensor, Tensor bias, int num_expert_group, int topk_group, int topk, "
    "int num_fused_shared_experts, float routed_scaling_factor, bool apply_routed_scaling_factor_on_output) "
    "-> Tensor[]"
)
def moe_fused_gate(
    input_tensor: Any,
    bias: Any,
    num_expert_group: Any,
    topk_group: Any,
    topk: Any,
    num_fused_shared_experts: Any,
    routed_scaling_factor: Any,
    apply_routed_scaling_factor_on_output: Any,
) -> list[torch.Tensor]:
    """DeepSeek's grouped routing: sigmoid scores, each group ranked by the sum of its two best biased
    scores, the best `topk_group` groups kept, the `topk` best biased scores among them chosen, weighted
    by their unbiased scores renormalized (times the scaling factor when asked)."""
    if num_fused_shared_experts:
        raise NotImplementedError("moe_fused_gate's stand-in routes without fused shared experts")
    scores = input_tensor.float().sigmoid()
    tokens, experts = scores.shape
    biased = scores + bias.float()
    groups = biased.view(tokens, num_expert_group, -1)
    kept_groups = groups.topk(2, dim=-1).values.sum(-1).topk(topk_group, dim=-1).indices
    group_mask = torch.zeros(tokens, num_expert_group, dtype=torch.bool, device=scores.device)
    group_mask.scatter_(1, kept_groups, True)
    allowed = group_mask.repeat_interleave(experts // num_expert_group, dim=1)
    ids = biased.masked_fill(~allowed, float("-inf")).topk(topk, dim=-1).indices
    weights = scores.gather(1, ids)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    if apply_routed_scaling_factor_on_output:
        weights = weights * routed_scaling_factor
    return [weights.float(), ids.to(torch.int32)]


@_op("dsv3_fused_a_gemm(Tensor(a!) output, Tensor mat_a, Tensor mat_b) -> ()")
def dsv3_fused_a_gemm(output: Any, mat_a: Any, mat_b: Any) -> None:
    """R1's fused q_a/kv_a projection for up to 16 tokens: mat_a (tokens x 7168) @ mat_b (7168 x 2112)."""
    output.copy_(torch.mm(mat_a, mat_b))


@_op("dsv3_router_gemm(Tensor(a!) output, Tensor mat_a, Tensor mat_b) -> ()")
def dsv3_router_gemm(output: Any, mat_a: Any, mat_b: Any) -> None:
    """R1's router logits for up to 16 tokens: hidden (tokens x 7168) times the router (experts x 7168)."""
    output.copy_(torch.mm(mat_a.float(), mat_b.float().t()).to(output.dtype))


@_op("concat_mla_k(Tensor(a!) k, Tensor k_nope, Tensor k_rope) -> ()")
def concat_mla_k(k: Any, k_nope: Any, k_rope: Any) -> None:
    """MLA prefill's key: each head's no-rope part, then the rope part every head shares."""
    nope = k_nope.shape[-1]
    k[..., :nope] = k_nope
    k[..., nope:] = k_rope.expand(*k.shape[:-1], k_rope.shape[-1])


@_op("concat_mla_absorb_q(Tensor a, Tensor b, Tensor(a!) out) -> ()")
def concat_mla_absorb_q(a: Any, b: Any, out: Any) -> None:
    out.copy_(torch.cat((a, b), dim=-1))


# -- Qwen3-Next's gated delta nets (sglang-kt 0.7.2's mamba/causal_conv1d.py; decode uses Triton) -------


def _conv_sequence(
    seq: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    initial: torch.Tensor | None,
    silu: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence (dim x tokens) through the depthwise causal convolution: each output the taps times
    the last `width` inputs (the `width - 1` before the sequence come from `initial`, else zeros).
    Returns the output and the new state (the last `width - 1` inputs)."""
    dim, width = weight.shape
    before = initial.float() if initial is not None else seq.new_zeros(dim, width - 1, dtype=torch.float32)
    padded = torch.cat((before, seq.float()), dim=1)
    out = F.conv1d(
        padded[None], weight.float()[:, None, :], None if bias is None else bias.float(), groups=dim
    )[0]
    return (F.silu(out) if silu else out), padded[:, -(width - 1) :]


@_op(
    "causal_conv1d_fwd(Tensor(a!) x, Tensor weight, Tensor? bias_, Tensor(b!)? conv_states, "
    "Tensor? query_start_loc, Tensor? cache_indices, Tensor? has_initial_state, bool silu_activation, "
    "int pad_slot_id) -> ()"
)
def causal_conv1d_fwd(
    x: Any,
    weight: Any,
    bias_: Any,
    conv_states: Any,
    query_start_loc: Any,
    cache_indices: Any,
    has_initial_state: Any,
    silu_activation: Any,
    pad_slot_id: Any,
) -> None:
    """In place: x (dim x all tokens, sequences from query_start_loc; or batch x dim x tokens); each
    sequence starts from its conv_states slot where has_initial_state says so and leaves its last inputs
    there; a slot of pad_slot_id is a padding entry, left untouched."""
    if query_start_loc is None:
        bounds = [(b, None, None) for b in range(x.shape[0])]
    else:
        starts = query_start_loc.tolist()
        bounds = [(b, starts[b], starts[b + 1]) for b in range(len(starts) - 1)]
    for b, start, end in bounds:
        slot = int(cache_indices[b]) if cache_indices is not None else b
        if slot == pad_slot_id:
            continue
        seq = x[b] if start is None else x[:, start:end]
        resume = conv_states is not None and has_initial_state is not None and bool(has_initial_state[b])
        out, state = _conv_sequence(
            seq, weight, bias_, conv_states[slot] if resume else None, silu_activation
        )
        if conv_states is not None:
            conv_states[slot] = state.to(conv_states.dtype)
        seq.copy_(out.to(x.dtype))


@_op(
    "causal_conv1d_update(Tensor(a!) x, Tensor(b!) conv_state, Tensor weight, Tensor? bias_, "
    "bool silu_activation, Tensor? cache_seqlens, Tensor? conv_state_indices, int pad_slot_id) -> ()"
)
def causal_conv1d_update(
    x: Any,
    conv_state: Any,
    weight: Any,
    bias_: Any,
    silu_activation: Any,
    cache_seqlens: Any,
    conv_state_indices: Any,
    pad_slot_id: Any,
) -> None:
    """Decoding: x (batch x dim x new tokens) continues each row's state (conv_state, or its slot in it),
    which moves on by those tokens. The circular-buffer form (cache_seqlens) is not stood in for."""
    if cache_seqlens is not None:
        raise NotImplementedError("causal_conv1d_update's stand-in keeps no circular buffer (cache_seqlens)")
    width = weight.shape[1]
    for b in range(x.shape[0]):
        slot = int(conv_state_indices[b]) if conv_state_indices is not None else b
        if slot == pad_slot_id:
            continue
        state = conv_state[slot]  # dim x state length (at least width - 1): the last inputs seen
        out, _ = _conv_sequence(x[b], weight, bias_, state[:, -(width - 1) :], silu_activation)
        state.copy_(torch.cat((state, x[b].to(state.dtype)), dim=1)[:, -state.shape[1] :])
        x[b].copy_(out.to(x.dtype))


@_op(
    "transfer_kv_direct(Tensor[] src_layers, Tensor(a!)[] dst_layers, Tensor src_indices, "
    "Tensor dst_indices, int page_size) -> ()"
)
def transfer_kv_direct(
    src_layers: Any, dst_layers: Any, src_indices: Any, dst_indices: Any, page_size: Any
) -> None:
    """The hierarchical cache's copies between the GPU's KV pool and host memory (layer-first layout,
    sgl_kernel's kvcacheio.py): each source layer's tokens at src_indices to the same layer's at
    dst_indices, whichever side each is on. Whole pages in the kernel; any token list here."""
    for src, dst in zip(src_layers, dst_layers, strict=True):
        dst[dst_indices.to(dst.device)] = src[src_indices.to(src.device)].to(dst.device)
