"""Plain-PyTorch stand-ins for the compiled `sgl_kernel` ops a bf16/f16 Qwen3-MoE forward pass calls,
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


def _op(schema: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Define `schema` and register the decorated function for CUDA and CPU. No Meta kernel: SGLang
    registers fake (tracing) kernels for some sgl_kernel ops itself, which fails where one exists."""

    def register(fn: Callable[..., None]) -> Callable[..., None]:
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
    "moe_fused_gate",
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
