"""Projection GEMMs: the library GEMM (cuBLAS through F.linear) or our Triton kernels, chosen by
measurement per shape bucket. The library GEMM is always a candidate, so the choice is never
slower than it on the shape it was measured on.

* float32 under "highest": the Triton 3xTF32 GEMM against cuBLAS's IEEE GEMM on the CUDA cores.
  Under "high" the library TF32 GEMM stays: Triton's TF32 products truncate the operands where
  cuBLAS rounds them, and on the H200 that pushed W075's attn_output to 98.3% of elements within
  tolerance on the small cases (the rule needs 99%), for no measurable speed gain.
  16-bit dtypes use the library GEMM.
* ``qkv``: the three projections in one launch (``qkv_kernel``), V optionally transposed, against
  three separate ``linear`` calls (each with its own choice).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..kernels import linear as linear_kernels
from ..kernels import tuning

_CONFIGS = [  # (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages)
    (128, 128, 32, 8, 8, 3), (128, 64, 32, 8, 4, 3), (64, 128, 32, 8, 4, 3),
    (128, 256, 32, 8, 8, 3), (64, 64, 32, 8, 4, 4), (128, 128, 16, 8, 8, 4),
    (64, 32, 64, 8, 4, 3), (64, 64, 64, 8, 4, 3),
]
_INTERPRETER_CONFIG = (32, 32, 32, 8, 4, 1)


def _triton_ok(x2d: torch.Tensor, ws, prec: str) -> bool:
    return (x2d.dtype == torch.float32 and prec == "tf32x3" and x2d.stride(-1) == 1
            and all(w.is_contiguous() and (b is None or b.is_contiguous()) for w, b in ws))


def _candidates(fallback):
    return [_INTERPRETER_CONFIG] if tuning.interpreting() else _CONFIGS + [fallback]


def linear_key(m: int, n: int, k: int, prec: str, bias: bool) -> tuple:
    """The choice key of ``linear`` for an [m, k] x [n, k]^T product (perf/linear_check.py reads
    the timings under it)."""
    return ("linear", tuning.gemm_rows_bucket(m), tuning.bucket(n), k, prec, bias)


def linear(x: torch.Tensor, w: torch.Tensor, b, prec: str) -> torch.Tensor:
    """F.linear(x, w, b) for x [..., K]; ``prec`` is the fp32 dot precision in force."""
    x2d = x.reshape(-1, x.shape[-1])
    if not _triton_ok(x2d, [(w, b)], prec):
        return F.linear(x, w, b)
    m, k = x2d.shape
    n = w.shape[0]
    y = torch.empty((m, n), device=x.device, dtype=x.dtype)

    def run(cfg):
        if cfg == "library":
            return F.linear(x2d, w, b)
        bm, bn, bk, gm, nw, ns = cfg
        linear_kernels.launch(x2d, w, b, y, prec, bm, bn, bk, gm, nw, ns)
        return y

    out = run(tuning.pick(linear_key(m, n, k, prec, b is not None), _candidates("library"), run))
    return out.reshape(*x.shape[:-1], n)


def linear_t(x: torch.Tensor, w: torch.Tensor, b, prec: str) -> torch.Tensor:
    """(x @ W^T + b)^T as one [N, B*S] matrix (W @ x2d^T): the K-major V operand of the attention
    kernel. Same GEMM choice as ``linear``, with the roles of the two operands swapped."""
    x2d = x.reshape(-1, x.shape[-1])
    y = linear(w, x2d, None, prec)
    if b is not None:
        y = y + b[:, None]
    return y.contiguous()


def qkv(x: torch.Tensor, q_wb, k_wb, v_wb, prec: str, v_transposed: bool):
    """(q [B*S, Nq], k [B*S, Nk], v) for x [B, S, K]; v is [B*S, Nv], or its transpose [Nv, B*S]
    when ``v_transposed``. All contiguous."""
    x2d = x.reshape(-1, x.shape[-1])
    parts = (q_wb, k_wb, v_wb)
    biases = [b is not None for _, b in parts]

    def separate():
        q = linear(x2d, *q_wb, prec).contiguous()
        k = linear(x2d, *k_wb, prec).contiguous()
        v = linear_t(x2d, *v_wb, prec) if v_transposed else linear(x2d, *v_wb, prec).contiguous()
        return q, k, v

    if not _triton_ok(x2d, parts, prec) or len(set(biases)) != 1:
        return separate()
    m, k = x2d.shape
    nq, nk, nv = (w.shape[0] for w, _ in parts)
    q = torch.empty((m, nq), device=x.device, dtype=x.dtype)
    kk = torch.empty((m, nk), device=x.device, dtype=x.dtype)
    if v_transposed:
        v = torch.empty((nv, m), device=x.device, dtype=x.dtype)
        v_view = v.t()
    else:
        v = v_view = torch.empty((m, nv), device=x.device, dtype=x.dtype)

    def run(cfg):
        if cfg == "separate":
            return separate()
        bm, bn, bk, gm, nw, ns = cfg
        linear_kernels.launch_qkv(x2d, [(*q_wb, q), (*k_wb, kk), (*v_wb, v_view)], prec,
                                  bm, bn, bk, gm, nw, ns)
        return q, kk, v

    key = ("qkv", tuning.gemm_rows_bucket(m), nq, nk, nv, k, prec, biases[0], v_transposed)
    return run(tuning.pick(key, _candidates("separate"), run))
