"""The Q/K/V projections with the norm/RoPE epilogue in one launch, on scaled fp16 operands.

For float32 blocks under "high": ``fp16_rows`` gives x and the three weights (as row blocks of
one [Nq+Nk+Nv, E] operand) fp16 copies with exact power-of-two row scales. Each program computes
one [BLOCK_M, BLOCK_N] tile of x16 @ w16^T (fp32 accumulation, exact products), undoes the scales,
and finishes its whole heads in registers (BLOCK_N is a multiple of head_dim and tiles never
straddle q, k and v): per-head RMSNorm in fp32 with the norm weight, RoPE (half or interleaved,
rotary_dim == head_dim, cos/sin from [B, S, D] tables), then stores

* ``OUT32=False``: fp16 copies q16 [M, H*D], k16, v16 [M, Hkv*D] for the attention kernels and
  raises ``FLAG`` where fp16's range would cost accuracy (the rule of qk_epilogue._store16: a
  value beyond it, or a nonzero head row whose maximum is below 2^-14);
* ``OUT32=True`` (with ``GUARD=2``: only once the flag is raised): the same values in float32,
  for the attention kernels' float32 fallback. Same products, so no second GEMM path is needed.

Against cuBLAS plus the separate norm/RoPE launch this saves writing and re-reading the float32
GEMM output ([M, Nq+Nk+Nv], 50 MB at 512x16) and one launch; whether Triton's GEMM loses more than
that is measured (the ``f16fused`` plan in lower/fp16_plans.py, opt-in until measured on a GPU).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .linear import _grouped, _mainloop
from .qk_epilogue import _store16


@triton.jit
def _finish(acc, DST, ld, c0, NW, eps, offs_m, m_ok, S, COS, SIN, cs_b, cs_s, cs_d, FLAG,
            D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
            NORM: tl.constexpr, ROPE: tl.constexpr, OUT32: tl.constexpr):
    NH: tl.constexpr = BLOCK_N // D
    HALF: tl.constexpr = D // 2
    x = tl.reshape(acc, (BLOCK_M, NH, D))
    offs_d = tl.arange(0, D)
    if NORM != 0:
        rs = 1.0 / tl.sqrt(tl.sum(x * x, 2) / D + eps)
        w = tl.load(NW + offs_d).to(tl.float32)
        if NORM == 3:
            w = 1.0 + w
        x = x * rs[:, :, None] * w[None, None, :]
    if ROPE != 0:
        tok = offs_m.to(tl.int64)
        bi = tok // S
        cs = bi * cs_b + (tok - bi * S) * cs_s
        offs_h = tl.arange(0, HALF)
        if ROPE == 1:       # rotate_half: columns d and d + D/2 pair up
            lo = cs[:, None] + offs_h[None, :] * cs_d
            hi = lo + HALF * cs_d
            x4 = tl.permute(tl.reshape(x, (BLOCK_M, NH, 2, HALF)), (0, 1, 3, 2))
        else:               # interleaved: columns 2i and 2i + 1
            lo = cs[:, None] + (2 * offs_h)[None, :] * cs_d
            hi = lo + cs_d
            x4 = tl.reshape(x, (BLOCK_M, NH, HALF, 2))
        x1, x2 = tl.split(x4)
        mm = m_ok[:, None]
        c1 = tl.load(COS + lo, mask=mm, other=1.0).to(tl.float32)[:, None, :]
        s1 = tl.load(SIN + lo, mask=mm, other=0.0).to(tl.float32)[:, None, :]
        c2 = tl.load(COS + hi, mask=mm, other=1.0).to(tl.float32)[:, None, :]
        s2 = tl.load(SIN + hi, mask=mm, other=0.0).to(tl.float32)[:, None, :]
        y = tl.join(x1 * c1 - x2 * s1, x2 * c2 + x1 * s2)
        if ROPE == 1:
            x = tl.reshape(tl.permute(y, (0, 1, 3, 2)), (BLOCK_M, NH, D))
        else:
            x = tl.reshape(y, (BLOCK_M, NH, D))
    offs_h = tl.arange(0, NH)
    offs = (offs_m[:, None, None].to(tl.int64) * ld + c0 + (offs_h * D)[None, :, None]
            + offs_d[None, None, :])
    m3 = tl.broadcast_to(m_ok[:, None, None], (BLOCK_M, NH, D))
    if OUT32:
        tl.store(DST + offs, x, mask=m3)
    else:   # the range rule per head row, as the epilogue's copies
        _store16(DST, offs, x, m3, FLAG)


@triton.jit
def qkv_fp16_kernel(X16, W16, X_INV, W_INV, Q, K_, V, FLAG, QW, KW, COS, SIN, cs_b, cs_s, cs_d,
                    M, S, E, NQ, NK, NV, eps, eps_k,
                    D: tl.constexpr, NORM: tl.constexpr, ROPE: tl.constexpr,
                    OUT32: tl.constexpr, GUARD: tl.constexpr, UPCAST: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    GROUP_M: tl.constexpr):
    if GUARD == 2:      # the float32 fallback's q, k, v: only once the flag is raised
        if tl.load(FLAG) == 0:
            return
    N = NQ + NK + NV
    pid_m, pid_n = _grouped(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = offs_m < M
    # fp16 operands: exact products, fp32 accumulation ("ieee" only matters when upcast)
    acc = _mainloop(X16, W16, offs_m, offs_n, m_ok, offs_n < N, E, E, E, "ieee", UPCAST,
                    BLOCK_M, BLOCK_N, BLOCK_K)
    x_inv = tl.load(X_INV + offs_m, mask=m_ok, other=1.0)
    acc = acc * x_inv[:, None] * tl.load(W_INV + offs_n)[None, :]
    n0 = pid_n * BLOCK_N
    if n0 < NQ:
        _finish(acc, Q, NQ, n0, QW, eps, offs_m, m_ok, S, COS, SIN, cs_b, cs_s, cs_d, FLAG,
                D, BLOCK_M, BLOCK_N, NORM, ROPE, OUT32)
    elif n0 < NQ + NK:
        _finish(acc, K_, NK, n0 - NQ, KW, eps_k, offs_m, m_ok, S, COS, SIN, cs_b, cs_s, cs_d,
                FLAG, D, BLOCK_M, BLOCK_N, NORM, ROPE, OUT32)
    else:
        _finish(acc, V, NV, n0 - NQ - NK, KW, eps_k, offs_m, m_ok, S, COS, SIN, cs_b, cs_s,
                cs_d, FLAG, D, BLOCK_M, BLOCK_N, 0, 0, OUT32)


def launch(x16, x_inv, w16, w_inv, nq, nk, nv, outs, flag, q_norm_weight, k_norm_weight, eps,
           eps_k, cos, sin, seq, head_dim, norm_code, rope_code, cfg, *, out32=False, guard=0,
           upcast=False):
    """x16 [M, E] and w16 [Nq+Nk+Nv, E] fp16 (contiguous) with reciprocal row scales x_inv [M],
    w_inv [N]; ``outs``: (q [M, Nq], k [M, Nk], v [M, Nv]) contiguous, fp16 (copies, ``flag``
    raised on range) or float32 with ``out32``. cos/sin: [B, S, D]-strided views (None without
    RoPE). cfg: (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages), BLOCK_N a multiple of
    head_dim dividing Nq, Nk and Nv."""
    m, e = x16.shape
    bm, bn, bk, gm, nw, ns = cfg
    d = head_dim
    if bn % d or nq % bn or nk % bn or nv % bn or d & (d - 1) or d < 16:
        raise ValueError("qkv_fp16: BLOCK_N must be a multiple of a power-of-two head_dim "
                         "that divides Nq, Nk and Nv")
    if w16.shape != (nq + nk + nv, e) or not (x16.is_contiguous() and w16.is_contiguous()):
        raise ValueError("qkv_fp16: x16 [M, E] and w16 [Nq+Nk+Nv, E] must be contiguous")
    q, k, v = outs
    for t, n in ((q, nq), (k, nk), (v, nv)):
        if t.shape != (m, n) or not t.is_contiguous():
            raise ValueError("qkv_fp16: outputs must be contiguous [M, N] matrices")
    if rope_code:
        cs = (cos.stride(0), cos.stride(1), cos.stride(2))
        if cos.shape[-1] != d:
            raise ValueError("qkv_fp16: RoPE needs rotary_dim == head_dim")
    else:
        cos = sin = x_inv
        cs = (0, 0, 0)
    dummy = x_inv
    grid = (triton.cdiv(m, bm) * ((nq + nk + nv) // bn),)
    qkv_fp16_kernel[grid](
        x16, w16, x_inv, w_inv, q, k, v, flag, q_norm_weight if norm_code else dummy,
        k_norm_weight if norm_code else dummy, cos, sin, *cs, m, seq, e, nq, nk, nv,
        float(eps), float(eps_k), D=d, NORM=norm_code, ROPE=rope_code, OUT32=bool(out32),
        GUARD=int(guard), UPCAST=bool(upcast), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        GROUP_M=gm, num_warps=nw, num_stages=ns)
