"""The Q/K/V projection on fp16 operand copies with the norm/RoPE epilogue in the same launch.

The fp16-copies plan (``plan/plans.py``) computes q, k, v = x @ W^T on fp16 copies of x and of
the three weights (exact power-of-two row scales, ``fp16_rows``). Here the GEMM's float32
accumulator is unscaled, normed and rotated in registers and only the fp16 copies the attention
kernels read are written, with the range flag: the products never reach memory.

The GEMM reads both operands through the copy engine (tensor descriptors, several stages deep),
optionally as persistent programs that walk the output tiles; or, with TMA off (Inductor's C++
wrapper and AOTInductor, which do not launch host-built descriptors on every torch this package
supports), as masked pointer loads that Triton pipelines itself. A tile of BN columns holds whole
heads of one of q, k or v (BN a multiple of the head size dividing each part's width), so the
epilogue splits each head's row into its two halves, rotates, and stores the tile as
[tokens, BN] fp16 into one [B*S, Nq + Nk + Nv] buffer, whose column slices are the copies.

Numerics: each output is the float32 product times its token's and its feature's reciprocal
scale (exact), then the norm (float32, as the other epilogue does for float32 products) and RoPE
in the eager order, rounded once to fp16. The range rule is ``qk_epilogue.bad_rows16``'s per head
row (an overflow, a non-finite value, or a nonzero row whose largest value is below fp16's
normal range raises the flag and the float32 fallback redoes the block).

Scope (``covers``): head size a power of two (16-256), no RoPE or rotate-half RoPE over the
whole head, fp16 operand copies, 16-byte aligned rows (the copy engine). On the CPU the Triton
interpreter runs it (16-bit dots upcast there, as elsewhere).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import cdiv, interpreting, launch as _launch
from .qk_epilogue import NORM_CODES, ROPE_CODES, bad_rows16, norm_rope_halves

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:     # an older Triton: the fused plan is not offered
    TensorDescriptor = None

try:
    from triton.language.extra.cuda import libdevice
except ImportError:     # pragma: no cover
    libdevice = None



@triton.jit
def _tile_of(t, num_m, num_n, GROUP_M: tl.constexpr):
    """Output tile ``t`` in grouped order (a band of x rows stays in L2 while W streams)."""
    per_group = GROUP_M * num_n
    first_m = (t // per_group) * GROUP_M
    group_m = min(num_m - first_m, GROUP_M)
    return first_m + (t % per_group) % group_m, (t % per_group) // group_m


@triton.jit
def _part(x, rows, m_ok, w_ptr, eps, cos_ptr, sin_ptr, cs_b, cs_s, cs_d, S, flag_ptr, c, s,
          D: tl.constexpr, HB: tl.constexpr, NORM: tl.constexpr, ROPE: tl.constexpr,
          ANGLES: tl.constexpr):
    """Norm and RoPE of a [BM, HB * D] tile of unscaled products (HB heads of one part), the
    range rule per head row; returns the fp16 tile. ``ANGLES``: cos/sin are ``c``/``s``
    ([BM, 1, D/2], computed in registers by ``_cos_sin``) instead of table loads."""
    BM: tl.constexpr = x.shape[0]
    HALF: tl.constexpr = D // 2
    x4 = tl.permute(tl.reshape(x, [BM, HB, 2, HALF]), [0, 1, 3, 2])
    x1, x2 = tl.split(x4)                                   # [BM, HB, HALF] each
    if ANGLES:
        x1, x2 = norm_rope_halves(x1, x2, rows, m_ok, w_ptr, eps, cos_ptr, sin_ptr, cs_b, cs_s,
                                  cs_d, S, D, tl.float32, NORM, 0)
        if ROPE != 0:   # cat((f, f)) tables: both halves rotate by the same angle
            y1 = x1 * c + (-x2) * s
            x2 = x2 * c + x1 * s
            x1 = y1
    else:
        x1, x2 = norm_rope_halves(x1, x2, rows, m_ok, w_ptr, eps, cos_ptr, sin_ptr, cs_b, cs_s,
                                  cs_d, S, D, tl.float32, NORM, ROPE)
    h1 = x1.to(tl.float16)
    h2 = x2.to(tl.float16)
    # the range rule per (token, head) row; rows past M (zeros, or NaN after a norm with eps 0)
    # are left out once per row, not per element
    bad = bad_rows16(x1, x2, h1, h2, tl.full(x1.shape, 1, tl.int1)) & m_ok[:, None]
    tl.atomic_max(flag_ptr + tl.full(bad.shape, 0, tl.int32), 1, mask=bad)
    y = tl.reshape(tl.permute(tl.join(h1, h2), [0, 1, 3, 2]), [BM, HB * D])
    return y


@triton.jit
def _cos_sin(rows, m_ok, pos_ptr, pos_b, pos_s, inv_ptr, S, HALF: tl.constexpr,
             FAST: tl.constexpr):
    """cos/sin [BM, 1, HALF] of the angles position * inv_freq (the exact float32 products
    the eager model takes cos/sin of), for rotate-half RoPE over tables cat((f, f)). ``FAST``:
    reduced by 2*pi in two FMA steps (the product k * 2pi is exact inside the FMA), then the
    hardware's sin/cos approximation (absolute error ~2^-21 on [-pi, pi]): ~1e-6 from eager's
    values, 1/500 of an fp16 copy's rounding; without it (the interpreter), tl.cos / tl.sin."""
    bi = rows // S
    pos = tl.load(pos_ptr + bi.to(tl.int64) * pos_b + (rows - bi * S).to(tl.int64) * pos_s,
                  mask=m_ok, other=0).to(tl.float32)
    f = tl.load(inv_ptr + tl.arange(0, HALF))
    ang = pos[:, None, None] * f[None, None, :]
    if FAST:
        k = libdevice.rint(ang * 0.15915494309189535)
        r = tl.fma(k, -6.2831854820251465, ang)     # float32(2 pi)
        r = tl.fma(k, 1.7484556000744883e-07, r)    # 2 pi - float32(2 pi)
        return libdevice.fast_cosf(r), libdevice.fast_sinf(r)
    return tl.cos(ang), tl.sin(ang)


@triton.jit
def _rows_tile(src, off, k0, n_rows, K, R: tl.constexpr, BK: tl.constexpr, TMA: tl.constexpr):
    """[R, BK] of a row-major [n_rows, K] operand: through the copy engine (a descriptor) or
    as masked pointer loads."""
    if TMA:
        t = src.load([off, k0])
    else:
        r = off + tl.arange(0, R)
        k = k0 + tl.arange(0, BK)
        t = tl.load(src + r[:, None].to(tl.int64) * K + k[None, :],
                    mask=(r < n_rows)[:, None] & (k < K)[None, :], other=0.0)
    return t


@triton.jit
def _tile(a_desc, b_desc, out_desc, pid_m, pid_n, M, N, K, tok_inv_ptr, feat_inv_ptr,
          qw_ptr, kw_ptr, eps, eps_k, cos_ptr, sin_ptr, cs_b, cs_s, cs_d, S, flag_ptr,
          NQ, NK, pos_ptr, pos_b, pos_s, inv_ptr, D: tl.constexpr, BM: tl.constexpr,
          BN: tl.constexpr, BK: tl.constexpr, NORM: tl.constexpr, ROPE: tl.constexpr,
          ANGLES: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr):
    off_m = pid_m * BM
    off_n = pid_n * BN
    acc = tl.zeros((BM, BN), tl.float32)
    for ki in range(tl.cdiv(K, BK)):
        a = _rows_tile(a_desc, off_m, ki * BK, M, K, BM, BK, TMA)
        b = _rows_tile(b_desc, off_n, ki * BK, N, K, BN, BK, TMA)
        if UPCAST:      # the interpreter's 16-bit dot is not exact
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b.T, acc)
    rows = off_m + tl.arange(0, BM)
    m_ok = rows < M
    feat_inv = tl.load(feat_inv_ptr + off_n + tl.arange(0, BN))
    tok_inv = tl.load(tok_inv_ptr + rows, mask=m_ok, other=1.0)
    x = acc * tok_inv[:, None] * feat_inv[None, :]
    HB: tl.constexpr = BN // D
    HALF: tl.constexpr = D // 2
    if ANGLES:
        if off_n < NQ + NK:
            c, s = _cos_sin(rows, m_ok, pos_ptr, pos_b, pos_s, inv_ptr, S, HALF, not UPCAST)
        else:
            c = tl.zeros((BM, 1, HALF), tl.float32)
            s = c
    else:
        c = 0.0
        s = 0.0
    if off_n < NQ:
        y = _part(x, rows, m_ok, qw_ptr, eps, cos_ptr, sin_ptr, cs_b, cs_s, cs_d, S, flag_ptr,
                  c, s, D, HB, NORM, ROPE, ANGLES)
    elif off_n < NQ + NK:
        y = _part(x, rows, m_ok, kw_ptr, eps_k, cos_ptr, sin_ptr, cs_b, cs_s, cs_d, S,
                  flag_ptr, c, s, D, HB, NORM, ROPE, ANGLES)
    else:
        y = _part(x, rows, m_ok, kw_ptr, eps_k, cos_ptr, sin_ptr, cs_b, cs_s, cs_d, S,
                  flag_ptr, c, s, D, HB, 0, 0, ANGLES)
    if TMA:
        out_desc.store([off_m, off_n], y)
    else:
        cols = off_n + tl.arange(0, BN)
        tl.store(out_desc + rows[:, None].to(tl.int64) * N + cols[None, :], y,
                 mask=m_ok[:, None])


@triton.jit
def proj_rope_kernel(a_desc, b_desc, out_desc, M, N, K, tok_inv_ptr, feat_inv_ptr,
                     qw_ptr, kw_ptr, eps, eps_k, cos_ptr, sin_ptr, cs_b, cs_s, cs_d, S,
                     flag_ptr, NQ, NK, pos_ptr, pos_b, pos_s, inv_ptr,
                     D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                     NORM: tl.constexpr, ROPE: tl.constexpr, PERSISTENT: tl.constexpr,
                     NUM_SMS: tl.constexpr, ANGLES: tl.constexpr = False,
                     UPCAST: tl.constexpr = False, TMA: tl.constexpr = True, RT=None,
                     RT_EPS: tl.constexpr = False):
    eps = tl.cast(eps, tl.float32)        # fp64 from Inductor's launcher, fp32 from Triton's
    eps_k = tl.cast(eps_k, tl.float32)
    if RT_EPS:      # runtime eps values (dynamic=True keeps floats as values): RT[1], RT[2]
        eps = tl.load(RT + 1).to(tl.float32)
        eps_k = tl.load(RT + 2).to(tl.float32)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    if PERSISTENT:
        for t in tl.range(tl.program_id(0), num_m * num_n, NUM_SMS, flatten=True):
            pid_m, pid_n = _tile_of(t, num_m, num_n, 8)
            _tile(a_desc, b_desc, out_desc, pid_m, pid_n, M, N, K, tok_inv_ptr, feat_inv_ptr,
                  qw_ptr, kw_ptr, eps, eps_k, cos_ptr, sin_ptr, cs_b, cs_s, cs_d, S, flag_ptr,
                  NQ, NK, pos_ptr, pos_b, pos_s, inv_ptr, D, BM, BN, BK, NORM, ROPE, ANGLES,
                  UPCAST, TMA)
    else:
        pid_m, pid_n = _tile_of(tl.program_id(0), num_m, num_n, 8)
        _tile(a_desc, b_desc, out_desc, pid_m, pid_n, M, N, K, tok_inv_ptr, feat_inv_ptr,
              qw_ptr, kw_ptr, eps, eps_k, cos_ptr, sin_ptr, cs_b, cs_s, cs_d, S, flag_ptr,
              NQ, NK, pos_ptr, pos_b, pos_s, inv_ptr, D, BM, BN, BK, NORM, ROPE, ANGLES,
              UPCAST, TMA)


def covers(head_dim, rope, rotary_dim) -> bool:
    """Heads this launch covers: a power of two in [16, 256], no RoPE or rotate-half RoPE over
    the whole head (the halves split in registers)."""
    return (TensorDescriptor is not None and 16 <= head_dim <= 256
            and head_dim & (head_dim - 1) == 0 and rope in ("none", "half")
            and (rope == "none" or rotary_dim == head_dim))


def config_fits(cfg, parts, head_dim) -> bool:
    """A config's BN holds whole heads of one part: it is a multiple of the head size and
    divides each part's width."""
    return cfg.block_n % head_dim == 0 and all(n % cfg.block_n == 0 for n in parts)


def launch(x16, w16, tok_inv, feat_inv, flag, parts, *, q_norm_weight, k_norm_weight, cos,
           sin, seq, head_dim, norm, eps, eps_k, rope, cfg, num_sms, angles=None, runtime=None):
    """(qkv16, flag): qkv16 [M, Nq + Nk + Nv] fp16 = the copies of q, k, v: x16 [M, K] @
    w16 [N, K]^T (fp16, contiguous, 16-byte aligned rows: fresh buffers of ``fp16_rows``) times
    tok_inv [M] and feat_inv [N], then per-head norm and RoPE on the q and k columns
    (``parts`` = (Nq, Nk, Nv)); ``flag`` raised by the range rule. cos/sin: [B, S, D]-broadcast
    views (None without RoPE). ``angles`` = (inv_freq [D/2] float32, position_ids [B, S]
    integer): cos/sin of rotate-half RoPE over tables cat((f, f)) are computed in the launch
    from them (``_cos_sin``) instead of loaded. ``cfg``: a ``ProjectionConfig``."""
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    m, k = x16.shape
    n = w16.shape[0]
    nq, nk, _ = parts
    if not (config_fits(cfg, parts, head_dim) and covers(head_dim, rope, head_dim
                                                        if rope != "none" else 0)):
        raise ValueError(f"proj_rope.launch: config {cfg} does not cover this block")
    out16 = torch.empty((m, n), device=x16.device, dtype=torch.float16)
    if angles is not None:
        inv_freq, pos = angles
        pos_args = dict(pos_ptr=pos, pos_b=pos.stride(0), pos_s=pos.stride(1),
                        inv_ptr=inv_freq)
    else:
        pos_args = dict(pos_ptr=tok_inv, pos_b=0, pos_s=0, inv_ptr=tok_inv)
    if rope != "none":
        cs = (cos.stride(0), cos.stride(1), cos.stride(2))
    else:
        cos = sin = tok_inv
        cs = (0, 0, 0)
    tiles = cdiv(m, bm) * cdiv(n, bn)
    if cfg.persistent and not isinstance(tiles, int):
        raise ValueError("proj_rope.launch: persistent programs need a static row count")
    grid = (min(tiles, num_sms),) if cfg.persistent else (tiles,)
    tma = {"a_desc": [bm, bk], "b_desc": [bn, bk], "out_desc": [bm, bn]} if cfg.tma else None
    return _launch(
        proj_rope_kernel, grid, ("out_desc", "flag_ptr"), num_warps=cfg.warps,
        num_stages=cfg.stages, tma=tma,
        a_desc=x16, b_desc=w16, out_desc=out16, M=m, N=n, K=k, tok_inv_ptr=tok_inv,
        feat_inv_ptr=feat_inv, qw_ptr=q_norm_weight if norm != "none" else tok_inv,
        kw_ptr=k_norm_weight if norm != "none" else tok_inv, eps=float(eps), eps_k=float(eps_k),
        cos_ptr=cos, sin_ptr=sin, cs_b=cs[0], cs_s=cs[1], cs_d=cs[2], S=seq, flag_ptr=flag,
        NQ=nq, NK=nk, **pos_args, D=head_dim, BM=bm, BN=bn, BK=bk, NORM=NORM_CODES[norm],
        ROPE=ROPE_CODES[rope], PERSISTENT=bool(cfg.persistent), NUM_SMS=int(num_sms),
        ANGLES=angles is not None, UPCAST=interpreting(), TMA=bool(cfg.tma),
        RT=runtime if runtime is not None else tok_inv, RT_EPS=runtime is not None)
