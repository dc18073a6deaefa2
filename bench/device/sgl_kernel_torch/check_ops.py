"""The stand-ins of common_ops.py, through sgl_kernel's own Python wrappers, against references written
out here (the formulas; sglang's moe_align_block_size docstring example): `python3 check_ops.py
[cpu|cuda]` with this folder and sgl_kernel's Python package on PYTHONPATH. Prints one line and exits
0 when all hold. bench/device/kt.py runs it on the GPU before it starts the server."""

from __future__ import annotations

import sys

import common_ops
import torch
import torch.nn.functional as F
from sgl_kernel import (  # its loader found common_ops (no compiled library is installed)
    apply_rope_with_cos_sin_cache_inplace,
    causal_conv1d_fwd,
    causal_conv1d_update,
    concat_mla_absorb_q,
    concat_mla_k,
    dsv3_fused_a_gemm,
    dsv3_router_gemm,
    fused_add_rmsnorm,
    moe_align_block_size,
    moe_fused_gate,
    moe_sum_reduce,
    rmsnorm,
    silu_and_mul,
    top_k_renorm_prob,
    top_p_renorm_prob,
    topk_softmax,
)
from sgl_kernel.kvcacheio import transfer_kv_direct


def check_norms() -> None:
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    w = torch.randn(64, dtype=torch.bfloat16)
    ref = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).bfloat16()
    assert torch.equal(rmsnorm(x, w, 1e-6, enable_pdl=False), ref), "rmsnorm"
    residual = torch.randn_like(x)
    hidden, summed = x.clone(), residual.clone()
    fused_add_rmsnorm(hidden, summed, w, 1e-6, enable_pdl=False)
    assert torch.allclose(summed.float(), (x + residual).float(), atol=1e-2), "fused_add_rmsnorm residual"
    assert torch.equal(hidden, rmsnorm(summed, w, 1e-6, enable_pdl=False)), "fused_add_rmsnorm output"


def check_silu_and_mul() -> None:
    g = torch.randn(3, 32)
    assert torch.allclose(silu_and_mul(g), F.silu(g[:, :16]) * g[:, 16:], atol=1e-6), "silu_and_mul"


def check_rope() -> None:
    tokens, head_size = 4, 8
    q, k = torch.randn(tokens, 2 * head_size), torch.randn(tokens, head_size)
    pos = torch.tensor([0, 1, 5, 7])
    inv = 1.0 / (10000 ** (torch.arange(0, head_size, 2).float() / head_size))
    angles = torch.outer(torch.arange(16).float(), inv)
    cache = torch.cat((angles.cos(), angles.sin()), -1)

    def neox(x: torch.Tensor) -> torch.Tensor:
        heads = x.view(tokens, -1, head_size)
        cos, sin = angles[pos].cos()[:, None], angles[pos].sin()[:, None]
        a, b = heads[..., : head_size // 2], heads[..., head_size // 2 :]
        return torch.cat((a * cos - b * sin, b * cos + a * sin), -1).reshape(tokens, -1)

    want_q, want_k = neox(q), neox(k)
    apply_rope_with_cos_sin_cache_inplace(pos, q, k, head_size, cache, is_neox=True, enable_pdl=False)
    assert torch.allclose(q, want_q, atol=1e-5) and torch.allclose(k, want_k, atol=1e-5), "rope"


def check_routing() -> None:
    logits = torch.randn(6, 16)
    weights, ids = torch.empty(6, 4), torch.empty(6, 4, dtype=torch.int32)
    topk_softmax(weights, ids, logits, True)
    best, best_ids = logits.softmax(-1).topk(4)
    assert torch.equal(ids.long(), best_ids), "topk_softmax ids"
    assert torch.allclose(weights, best / best.sum(-1, keepdim=True)), "topk_softmax weights"


def _align(ids: torch.Tensor, experts: int, block: int) -> tuple[list[int], list[int]]:
    capacity = ids.numel() + (experts + 1) * (block - 1)
    sorted_ids = torch.empty(capacity, dtype=torch.int32)
    expert_of_block = torch.empty((capacity + block - 1) // block, dtype=torch.int32)
    total = torch.empty(1, dtype=torch.int32)
    moe_align_block_size(ids, experts + 1, block, sorted_ids, expert_of_block, total,
                         torch.empty(experts + 2, dtype=torch.int32), True)  # fmt: skip
    n = int(total.item())
    return sorted_ids[:n].tolist(), expert_of_block[: n // block].tolist()


def check_align() -> None:
    # sglang's moe_align_block_size docstring: experts 1-4 (of 5), block 4.
    ids = torch.tensor([[2, 3, 4], [1, 2, 4], [1, 3, 4], [1, 2, 3]], dtype=torch.int32)
    tokens, blocks = _align(ids, 5, 4)
    assert tokens == [3, 6, 9, 12, 0, 4, 10, 12, 1, 7, 11, 12, 2, 5, 8, 12], f"align tokens {tokens}"
    assert blocks == [1, 2, 3, 4], f"align blocks {blocks}"
    # Experts the GPU doesn't hold (-1, or the sentinel 5 of 5): blocks of expert -1, every slot once.
    tokens, blocks = _align(torch.tensor([[0, -1], [5, 1]], dtype=torch.int32), 5, 2)
    assert blocks == [0, 1, -1], f"align invalid blocks {blocks}"
    assert sorted(t for t in tokens if t < 4) == [0, 1, 2, 3], f"align invalid tokens {tokens}"


def check_sum_and_sampling() -> None:
    parts, out = torch.randn(3, 4, 8), torch.empty(3, 8)
    moe_sum_reduce(parts, out, 1.0)
    assert torch.allclose(out, parts.sum(1), atol=1e-5), "moe_sum_reduce"
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    want = torch.tensor([[0.625, 0.375, 0.0, 0.0]])
    assert torch.allclose(top_k_renorm_prob(probs, 2), want), "top_k_renorm_probs"
    assert torch.allclose(top_p_renorm_prob(probs, 0.7), want), "top_p_renorm_probs"


def check_grouped_routing() -> None:
    """DeepSeek's routing, token by token as its model card describes it: 8 groups of 2, 4 kept."""
    logits, bias = torch.randn(5, 16), torch.randn(16) * 0.1
    weights, ids = moe_fused_gate(logits, bias, 8, 4, 8, 0, 2.5, True)
    for t in range(5):
        scores = logits[t].sigmoid()
        chooser = scores + bias
        group_score = [sorted(chooser[2 * g : 2 * g + 2].tolist())[-2:] for g in range(8)]
        kept = sorted(range(8), key=lambda g: -sum(group_score[g]))[:4]
        allowed = [e for e in range(16) if e // 2 in kept]
        chosen = sorted(allowed, key=lambda e: -chooser[e].item())[:8]
        assert sorted(ids[t].tolist()) == sorted(chosen), f"moe_fused_gate ids {ids[t].tolist()} {chosen}"
        want = scores[ids[t].long()] / scores[ids[t].long()].sum() * 2.5
        assert torch.allclose(weights[t], want, atol=1e-5), "moe_fused_gate weights"


def check_mla_parts() -> None:
    k_nope, k_rope = torch.randn(3, 4, 128), torch.randn(3, 1, 64)
    k = torch.empty(3, 4, 192)
    concat_mla_k(k, k_nope, k_rope)
    assert torch.equal(k[:, 2, :128], k_nope[:, 2]) and torch.equal(k[:, 3, 128:], k_rope[:, 0]), (
        "concat_mla_k"
    )
    a, b = torch.randn(2, 4, 512), torch.randn(2, 4, 64)
    assert torch.equal(concat_mla_absorb_q(a, b)[..., 512:], b), "concat_mla_absorb_q"
    x, w = torch.randn(3, 64), torch.randn(48, 64)
    assert torch.allclose(dsv3_fused_a_gemm(x, w.t()), x @ w.t(), atol=1e-4), "dsv3_fused_a_gemm"
    assert torch.allclose(dsv3_router_gemm(x, w, torch.float32), x @ w.t(), atol=1e-4), "dsv3_router_gemm"


def _conv_reference(inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """out[:, t] = silu(bias + sum_k weight[:, k] * inputs[:, t - (width - 1) + k]), zeros before 0."""
    width = weight.shape[1]
    out = torch.empty_like(inputs)
    for t in range(inputs.shape[1]):
        acc = bias.clone()
        for k in range(width):
            if (src := t - (width - 1) + k) >= 0:
                acc += weight[:, k] * inputs[:, src]
        out[:, t] = F.silu(acc)
    return out


def check_causal_conv1d() -> None:
    """Two sequences of a varlen batch (one resuming from its slot's state) and a padding entry, then
    token-by-token decoding: the same as the whole sequence convolved at once."""
    dim, width = 6, 4
    weight, bias = torch.randn(dim, width), torch.randn(dim)
    first, second = torch.randn(dim, 7), torch.randn(dim, 5)
    states = torch.zeros(4, dim, width - 1)
    x = torch.cat((first[:, :4], second), dim=1)
    causal_conv1d_fwd(x, weight, bias, states, torch.tensor([0, 4, 9, 9], dtype=torch.int32),
                      torch.tensor([2, 0, -1], dtype=torch.int32), torch.tensor([False, False, False]),
                      True, -1)  # fmt: skip
    assert torch.allclose(x[:, :4], _conv_reference(first, weight, bias)[:, :4], atol=1e-5), "conv fwd"
    assert torch.allclose(x[:, 4:], _conv_reference(second, weight, bias), atol=1e-5), "conv fwd 2"
    assert torch.equal(states[2], first[:, 1:4]) and torch.equal(states[0], second[:, 2:]), "conv state"
    rest = first[:, 4:6].clone()
    causal_conv1d_fwd(rest, weight, bias, states, torch.tensor([0, 2], dtype=torch.int32),
                      torch.tensor([2], dtype=torch.int32), torch.tensor([True]), True, -1)  # fmt: skip
    assert torch.allclose(rest, _conv_reference(first, weight, bias)[:, 4:6], atol=1e-5), "conv resumed"
    last = first[:, 6:7][None].clone()
    causal_conv1d_update(last, states, weight, bias, True, None, torch.tensor([2], dtype=torch.int32), -1)
    assert torch.allclose(last[0], _conv_reference(first, weight, bias)[:, 6:], atol=1e-5), "conv update"
    assert torch.equal(states[2], first[:, 4:7]), "conv update state"


def check_kv_transfer() -> None:
    """The hierarchical cache's copy: the GPU pool's pages to the host's and back (CPU tensors on both
    sides when the device is the CPU)."""
    device_k, device_v = torch.randn(3, 256, 4, 8), torch.randn(3, 256, 4, 8)
    host_k, host_v = torch.zeros(3, 512, 4, 8, device="cpu"), torch.zeros(3, 512, 4, 8, device="cpu")
    on_device, on_host = torch.arange(64, 128), torch.arange(320, 384, device="cpu")
    transfer_kv_direct(list(device_k) + list(device_v), list(host_k) + list(host_v), on_device, on_host, 64)
    assert torch.equal(host_k[:, 320:384], device_k[:, 64:128].cpu()), "transfer_kv_direct to the host"
    assert not host_v[:, :320].any() and torch.equal(host_v[:, 320:384], device_v[:, 64:128].cpu()), "host v"
    back = torch.arange(0, 64)
    transfer_kv_direct([host_k[1], host_v[1]], [device_k[1], device_v[1]], on_host, back, 64)
    assert torch.equal(device_k[1, :64], device_k[1, 64:128]), "transfer_kv_direct back to the device"


def check_conv_against_sglang_triton() -> None:
    """On the GPU: the stand-in against SGLang's own Triton causal_conv1d_fn (the same contract)."""
    from sglang.srt.layers.attention.mamba.causal_conv1d_triton import causal_conv1d_fn

    dim, width = 256, 4
    weight, bias = torch.randn(dim, width), torch.randn(dim)
    x = torch.randn(dim, 23)
    loc, slots = torch.tensor([0, 9, 23], dtype=torch.int32), torch.tensor([1, 3], dtype=torch.int32)
    initial = torch.tensor([True, False])
    states = torch.randn(4, dim, width - 1)
    mine, ours = x.clone(), states.clone()
    causal_conv1d_fwd(mine, weight, bias, ours, loc, slots, initial, True, -1)
    theirs = causal_conv1d_fn(x.clone(), weight, bias, states, loc, [9, 14], cache_indices=slots,
                              has_initial_state=initial, activation="silu")  # fmt: skip
    assert torch.allclose(mine, theirs, atol=2e-3), "causal_conv1d_fwd vs SGLang's Triton kernel"
    assert torch.allclose(ours, states, atol=1e-5), "causal_conv1d_fwd's state vs SGLang's Triton kernel"


def main(device: str) -> None:
    torch.set_default_device(device)
    torch.manual_seed(0)
    for check in (check_norms, check_silu_and_mul, check_rope, check_routing, check_align,
                  check_sum_and_sampling, check_grouped_routing, check_mla_parts,
                  check_causal_conv1d, check_kv_transfer):  # fmt: skip
        check()
    if device == "cuda":
        check_conv_against_sglang_triton()
    print(f"{len(common_ops.STANDS_IN_FOR)} sgl_kernel stand-ins; all checks hold on {device}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "cpu")
