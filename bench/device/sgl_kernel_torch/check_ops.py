"""The stand-ins of common_ops.py, through sgl_kernel's own Python wrappers, against references written
out here (the formulas; sglang's moe_align_block_size docstring example): `python3 check_ops.py
[cpu|cuda]` with this folder and sgl_kernel's Python package on PYTHONPATH. Prints one line and exits
0 when all hold. bench/device/kt_gpu.sh runs it on the GPU before it starts the server."""

from __future__ import annotations

import sys

import common_ops
import torch
import torch.nn.functional as F
from sgl_kernel import (  # its loader found common_ops (no compiled library is installed)
    apply_rope_with_cos_sin_cache_inplace,
    fused_add_rmsnorm,
    moe_align_block_size,
    moe_sum_reduce,
    rmsnorm,
    silu_and_mul,
    top_k_renorm_prob,
    top_p_renorm_prob,
    topk_softmax,
)


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


def main(device: str) -> None:
    torch.set_default_device(device)
    torch.manual_seed(0)
    for check in (check_norms, check_silu_and_mul, check_rope, check_routing, check_align,
                  check_sum_and_sampling):  # fmt: skip
        check()
    print(f"{len(common_ops.STANDS_IN_FOR)} sgl_kernel stand-ins; all checks hold on {device}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "cpu")
