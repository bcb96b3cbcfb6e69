"""Projection GEMMs: cuBLAS, or the 3xTF32 Triton GEMM for float32 under "highest", chosen by
measurement per shape bucket (cuBLAS stays a candidate, so the choice is never slower than it)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..kernels import linear as linear_kernels
from ..kernels import tuning

_CONFIGS = [  # (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages)
    (128, 128, 32, 8, 8, 3), (128, 64, 32, 8, 4, 3), (64, 128, 32, 8, 4, 3),
    (128, 256, 32, 8, 8, 3), (64, 64, 32, 8, 4, 4), (128, 128, 16, 8, 8, 4),
]


def linear(x: torch.Tensor, w: torch.Tensor, b, prec: str) -> torch.Tensor:
    """F.linear(x, w, b) for x [..., K]; ``prec`` is the fp32 dot precision in force."""
    if x.dtype != torch.float32 or prec != "tf32x3":
        return F.linear(x, w, b)
    if not (w.is_contiguous() and (b is None or b.is_contiguous())):
        return F.linear(x, w, b)
    x2d = x.reshape(-1, x.shape[-1])
    if x2d.stride(-1) != 1:
        x2d = x2d.contiguous()
    m, k = x2d.shape
    n = w.shape[0]
    y = torch.empty((m, n), device=x.device, dtype=x.dtype)

    def run(cfg):
        if cfg == "cublas":
            return F.linear(x2d, w, b)
        bm, bn, bk, gm, nw, ns = cfg
        linear_kernels.launch(x2d, w, b, y, prec, bm, bn, bk, gm, nw, ns)
        return y

    cands = [(32, 32, 32, 8, 4, 1)] if tuning.interpreting() else _CONFIGS + ["cublas"]
    key = ("linear", tuning.bucket(m), tuning.bucket(n), k, prec, b is not None)
    out = run(tuning.pick(key, cands, run))
    return out.reshape(*x.shape[:-1], n)


def linear_t(x: torch.Tensor, w: torch.Tensor, b, prec: str) -> torch.Tensor:
    """(x @ W^T + b)^T as one [N, B*S] matrix (W @ x2d^T): the K-major V operand of the attention
    kernel. Same GEMM choice as ``linear``, with the roles of the two operands swapped."""
    x2d = x.reshape(-1, x.shape[-1])
    y = linear(w, x2d, None, prec)
    if b is not None:
        y = y + b[:, None]
    return y.contiguous()
