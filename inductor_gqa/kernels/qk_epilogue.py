"""Fused projection epilogue: per-head RMSNorm (fp32) + RoPE on the q and k GEMM outputs, in place.

The Q/K/V GEMMs (with their bias) run in cuBLAS (``F.linear``); their outputs are [B*S, heads*D]
row-major, i.e. already the [B, S, heads, D] layout the attention kernel reads through strides. This
kernel rewrites the q and k rows in place (one row = one token x head), so no transposed copy is
made. One launch covers q and k (grid axis 1 picks the tensor).

With ``copies`` (float32 blocks whose dots may use TF32): the kernel also writes fp16 copies of q, k
and V for the attention kernel. fp16 keeps TF32's 10-bit significand, rounds to nearest and runs
at twice the tensor-core rate; only its range is smaller, so a value that would overflow it, or a
row too small for its normal range, sets ``flag`` and the attention kernels then take the float32
path instead (flash.py's GUARD).

With ``scales`` (projections computed on fp16 copies with per-row power-of-two scales,
``fp16_rows``): the GEMM outputs are scaled, and the kernel multiplies each element by its token's
and its feature's reciprocal scale first. ``store32=False`` writes only the fp16 copies and leaves
the GEMM outputs untouched; a second launch with ``guard=2`` then finishes them in place only if
the flag was raised, for the float32 fallback. With ``in16`` the scaled GEMM outputs are fp16
(a GEMM with fp16 output, ``fp16_plans``' f16proj16): they are checked by the range rule of
``_check_scaled16`` before anything else.

Numerics follow the eager reference: norm in fp32, its result rounded to the activation dtype, the
weight applied per ``norm`` style, RoPE cos/sin loaded from [B, S, R] tables (the model's own, or
built from ``inv_freq`` and ``position_ids`` by ``rope_table``: computing them here, per head row,
measured slower on the H200).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl, tuning
from .host import cdiv, next_pow2

NORM_CODES = {"none": 0, "fp32_weight": 1, "cast_weight": 2, "fp32_one_plus_weight": 3}
FP16_MIN_NORMAL = tl.constexpr(2.0 ** -14)   # the range rule's lower bound for a row's maximum
ROPE_CODES = {"none": 0, "half": 1, "interleaved": 2}


@triton.jit
def _round(x, DT: tl.constexpr):
    # round an fp32 value to the activation dtype and back (no-op for fp32)
    return x.to(DT).to(tl.float32)


@triton.jit
def _not_fp16_finite(x16, m2):
    """Where an fp16 copy (within mask ``m2``) holds no finite value: an overflow, inf or NaN."""
    return m2 & ~(tl.abs(x16.to(tl.float32)) < float("inf"))


@triton.jit
def _store16(x16_ptr, offs, x, m2, flag_ptr):
    """fp16 copy of fp32 values. The flag is raised where fp16's range would cost accuracy: a
    value that overflows, or a nonzero row (one head of one token) whose largest value is
    below 2^-14, fp16's smallest normal. In a row whose maximum M is at least 2^-14 every value's
    error (at most 2^-25 absolute for subnormals) stays within M * 2^-11, TF32's bound for M.
    Non-finite values (inf, NaN) raise it too: the staged kernels read past a batch's last key
    into the next batch's V rows with p = 0, and 0 * NaN would carry a NaN across batches; the
    float32 fallback keeps batches apart as eager does."""
    x16 = x.to(tl.float16)
    ax = tl.where(m2, tl.abs(x), 0.0)
    over = _not_fp16_finite(x16, m2)
    rmax = tl.max(ax, axis=-1)      # rows along the last axis
    tiny = (rmax > 0.0) & (rmax < FP16_MIN_NORMAL)
    tl.store(x16_ptr + offs, x16, mask=m2)
    # one predicated atomic per bad row: the rows' own reductions stay within their warps, where
    # a scalar test over the whole tile would add a reduction across the program's warps
    bad = tiny | (tl.max(over.to(tl.int32), axis=-1) != 0)
    tl.atomic_max(flag_ptr + tl.zeros_like(rmax).to(tl.int32), 1, mask=bad)


@triton.jit
def _store16_pair(x16_ptr, offs1, offs2, x1, x2, m2, flag_ptr):
    """``_store16`` for a row held as two column halves (same rule, rows over both halves)."""
    h1 = x1.to(tl.float16)
    h2 = x2.to(tl.float16)
    bad = bad_rows16(x1, x2, h1, h2, m2)
    tl.store(x16_ptr + offs1, h1, mask=m2)
    tl.store(x16_ptr + offs2, h2, mask=m2)
    tl.atomic_max(flag_ptr + tl.zeros(bad.shape, tl.int32), 1, mask=bad)


@triton.jit
def bad_rows16(x1, x2, h1, h2, m2):
    """``_store16``'s rule for rows held as two halves along the last axis (x1, x2 float32, h1,
    h2 their fp16 copies, within mask ``m2``): where a row's copy holds a value that is not
    finite, or the row is nonzero with its largest value below fp16's smallest normal."""
    a1 = tl.where(m2, tl.abs(x1), 0.0)
    a2 = tl.where(m2, tl.abs(x2), 0.0)
    over = _not_fp16_finite(h1, m2).to(tl.int32) | _not_fp16_finite(h2, m2).to(tl.int32)
    rmax = tl.maximum(tl.max(a1, axis=-1), tl.max(a2, axis=-1))
    tiny = (rmax > 0.0) & (rmax < FP16_MIN_NORMAL)
    return tiny | (tl.max(over, axis=-1) != 0)


@triton.jit
def _check_scaled16(x_abs_max, tok_inv, feat_inv_ptr, feat0, c, m2, flag_ptr):
    """Range rule for scaled fp16 GEMM outputs (IN16). An output below fp16's normal range has an
    error of up to 2^-25 in scaled units, 2^-25 * tok_inv * feat_inv in true ones; that is within
    TF32's 2^-11 of the head row's largest true value M for every column while
    M >= 2^-14 * tok_inv * max(feat_inv). A nonzero row short of that raises the flag (its
    overflow needs no test: the operand scales of fp16_rows.out16_target bound every output
    below fp16's range)."""
    fmax = tl.max(tl.load(feat_inv_ptr + feat0[:, None] + c[None, :], mask=m2, other=0.0), 1)
    bad = (x_abs_max > 0.0) & (x_abs_max < tok_inv * fmax * FP16_MIN_NORMAL)
    tl.atomic_max(flag_ptr + tl.zeros_like(x_abs_max).to(tl.int32), 1, mask=bad)


@triton.jit
def _load_cols(base, cols, m2, feat0, tok_inv, feat_inv_ptr, SCALED: tl.constexpr):
    """Columns ``cols`` of the rows at ``base``, in fp32, with the GEMM operands' power-of-two
    scales undone when SCALED (exact)."""
    x = tl.load(base + cols[None, :], mask=m2, other=0.0).to(tl.float32)
    if SCALED:
        x = x * tok_inv[:, None] * tl.load(feat_inv_ptr + feat0[:, None] + cols[None, :],
                                           mask=m2, other=1.0)
    return x


@triton.jit
def _weighted(x, rs, w, DT: tl.constexpr, NORM: tl.constexpr):
    """The normalized row times its weight, in the eager order of each norm style."""
    return _weighted_b(x, rs[:, None], w[None, :], DT, NORM)


@triton.jit
def _weighted_b(x, rs, w, DT: tl.constexpr, NORM: tl.constexpr):
    """``_weighted`` with ``rs`` and ``w`` already broadcastable to x (any rank)."""
    x = x * rs
    if NORM == 1:
        x = _round(x * w, DT)
    elif NORM == 2:
        x = _round(_round(x, DT) * w, DT)
    else:
        x = _round(x * (1.0 + w), DT)
    return x


@triton.jit
def _rows_halves(x_ptr, w_ptr, n_rows, heads, S, pid, eps,
                 cos_ptr, sin_ptr, cs_b, cs_s, cs_d, x16_ptr, flag_ptr, tok_inv_ptr,
                 feat_inv_ptr, ld, D: tl.constexpr, ROWS: tl.constexpr, NORM: tl.constexpr,
                 F16: tl.constexpr, SCALED: tl.constexpr, STORE32: tl.constexpr,
                 STRIDED: tl.constexpr, IN16: tl.constexpr):
    """``_rows`` for rotate-half RoPE over the whole head (R == D, a power of two): the row is
    loaded as its two halves, so the rotation partner of each value is in the same thread's
    registers (a rotation of one [ROWS, D] tile moves values between threads through shared
    memory, with barriers)."""
    HALF: tl.constexpr = D // 2
    rows = pid * ROWS + tl.arange(0, ROWS)
    c = tl.arange(0, HALF)
    rmask = rows < n_rows
    m2 = rmask[:, None] & (c < HALF)[None, :]
    # the activation dtype (norm roundings, float32 stores): float32 behind fp16 GEMM outputs
    DT: tl.constexpr = tl.float32 if IN16 else x_ptr.dtype.element_ty
    if STRIDED:
        base = x_ptr + ((rows // heads).to(tl.int64) * ld + (rows % heads) * D)[:, None]
    else:
        base = x_ptr + rows[:, None].to(tl.int64) * D
    feat0 = (rows % heads) * D
    if SCALED:
        tok_inv = tl.load(tok_inv_ptr + rows // heads, mask=rmask, other=1.0)
    else:
        tok_inv = tl.zeros([ROWS], tl.float32)
    x1 = _load_cols(base, c, m2, feat0, tok_inv, feat_inv_ptr, SCALED)
    x2 = _load_cols(base, c + HALF, m2, feat0, tok_inv, feat_inv_ptr, SCALED)
    if IN16:
        amax = tl.maximum(tl.max(tl.where(m2, tl.abs(x1), 0.0), 1),
                          tl.max(tl.where(m2, tl.abs(x2), 0.0), 1))
        _check_scaled16(amax, tok_inv, feat_inv_ptr, feat0, c, m2, flag_ptr)
        _check_scaled16(amax, tok_inv, feat_inv_ptr, feat0 + HALF, c, m2, flag_ptr)
    if NORM != 0:
        ms = (tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / D
        rs = 1.0 / tl.sqrt(ms + eps)
        x1 = _weighted(x1, rs, tl.load(w_ptr + c).to(tl.float32), DT, NORM)
        x2 = _weighted(x2, rs, tl.load(w_ptr + c + HALF).to(tl.float32), DT, NORM)
    tok = rows // heads                      # b * S + s
    bi = tok // S
    si = tok - bi * S
    cso = bi[:, None].to(tl.int64) * cs_b + si[:, None] * cs_s
    c1 = tl.load(cos_ptr + cso + c[None, :] * cs_d, mask=m2, other=1.0).to(tl.float32)
    s1 = tl.load(sin_ptr + cso + c[None, :] * cs_d, mask=m2, other=0.0).to(tl.float32)
    c2 = tl.load(cos_ptr + cso + (c + HALF)[None, :] * cs_d, mask=m2, other=1.0).to(tl.float32)
    s2 = tl.load(sin_ptr + cso + (c + HALF)[None, :] * cs_d, mask=m2, other=0.0).to(tl.float32)
    y1 = x1 * c1 + (-x2) * s1
    y2 = x2 * c2 + x1 * s2
    if STORE32:
        tl.store(base + c[None, :], y1.to(DT), mask=m2)
        tl.store(base + (c + HALF)[None, :], y2.to(DT), mask=m2)
    if F16:
        offs = rows[:, None].to(tl.int64) * D + c[None, :]
        _store16_pair(x16_ptr, offs, offs + HALF, y1, y2, m2, flag_ptr)


@triton.jit
def _rotated(x, ROWS: tl.constexpr, D: tl.constexpr, ROPE: tl.constexpr):
    """The RoPE partner with its sign, from registers: rotate_half gives (-x2, x1) of the
    halves, interleaved gives (-x[2i+1], x[2i]) per pair."""
    HALF: tl.constexpr = D // 2
    if ROPE == 1:
        x1, x2 = tl.split(tl.permute(tl.reshape(x, (ROWS, 2, HALF)), (0, 2, 1)))
        r = tl.reshape(tl.permute(tl.join(-x2, x1), (0, 2, 1)), (ROWS, D))
    else:
        xe, xo = tl.split(tl.reshape(x, (ROWS, HALF, 2)))
        r = tl.reshape(tl.join(-xo, xe), (ROWS, D))
    return r


@triton.jit
def _rows(x_ptr, w_ptr, n_rows, heads, S, pid, eps,
          cos_ptr, sin_ptr, cs_b, cs_s, cs_d, x16_ptr, flag_ptr, tok_inv_ptr, feat_inv_ptr, ld,
          D: tl.constexpr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr,
          NORM: tl.constexpr, ROPE: tl.constexpr, R: tl.constexpr, F16: tl.constexpr,
          SCALED: tl.constexpr, STORE32: tl.constexpr, STRIDED: tl.constexpr,
          IN16: tl.constexpr = False):
    if (ROPE == 1) & (R == D) & (BLOCK_D == D):
        _rows_halves(x_ptr, w_ptr, n_rows, heads, S, pid, eps, cos_ptr, sin_ptr, cs_b, cs_s,
                     cs_d, x16_ptr, flag_ptr, tok_inv_ptr, feat_inv_ptr, ld, D, ROWS, NORM, F16,
                     SCALED, STORE32, STRIDED, IN16)
    else:
        _rows_tile(x_ptr, w_ptr, n_rows, heads, S, pid, eps, cos_ptr, sin_ptr, cs_b, cs_s,
                   cs_d, x16_ptr, flag_ptr, tok_inv_ptr, feat_inv_ptr, ld, D, BLOCK_D, ROWS,
                   NORM, ROPE, R, F16, SCALED, STORE32, STRIDED, IN16)


@triton.jit
def _rows_tile(x_ptr, w_ptr, n_rows, heads, S, pid, eps,
               cos_ptr, sin_ptr, cs_b, cs_s, cs_d, x16_ptr, flag_ptr, tok_inv_ptr, feat_inv_ptr,
               ld, D: tl.constexpr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr,
               NORM: tl.constexpr, ROPE: tl.constexpr, R: tl.constexpr, F16: tl.constexpr,
               SCALED: tl.constexpr, STORE32: tl.constexpr, STRIDED: tl.constexpr,
               IN16: tl.constexpr):
    """One [ROWS, BLOCK_D] tile of rows: no RoPE, interleaved RoPE, or a partial rotary dim."""
    rows = pid * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_D)
    rmask = rows < n_rows
    cmask = cols < D
    m2 = rmask[:, None] & cmask[None, :]
    DT: tl.constexpr = tl.float32 if IN16 else x_ptr.dtype.element_ty
    if STRIDED:     # token rows ``ld`` apart (column slices of one fused QKV product)
        base = x_ptr + ((rows // heads).to(tl.int64) * ld + (rows % heads) * D)[:, None]
    else:
        base = x_ptr + rows[:, None].to(tl.int64) * D
    feat0 = (rows % heads) * D
    if SCALED:      # undo the fp16 GEMM operands' power-of-two row scales (exact)
        tok_inv = tl.load(tok_inv_ptr + rows // heads, mask=rmask, other=1.0)
    else:
        tok_inv = tl.zeros([ROWS], tl.float32)
    x = _load_cols(base, cols, m2, feat0, tok_inv, feat_inv_ptr, SCALED)
    if IN16:
        _check_scaled16(tl.max(tl.where(m2, tl.abs(x), 0.0), 1), tok_inv, feat_inv_ptr, feat0,
                        cols, m2, flag_ptr)
    # the rotation partner comes from registers when every column rotates (R == D, a power of two);
    # loading it per column (a permuted gather) measured twice the launch's DRAM time on the H200
    REG_ROT: tl.constexpr = (ROPE != 0) & (R == D) & (BLOCK_D == D)
    if (ROPE != 0) & (not REG_ROT):
        HALF: tl.constexpr = R // 2
        if ROPE == 1:
            pcol = tl.where(cols < HALF, cols + HALF, cols - HALF)
            sign = tl.where(cols < HALF, -1.0, 1.0)
        else:
            pcol = cols ^ 1
            sign = tl.where((cols % 2) == 0, -1.0, 1.0)
        in_rot = cols < R
        pcol = tl.where(in_rot, pcol, cols)
        xp = _load_cols(base, pcol, m2 & in_rot[None, :], feat0, tok_inv, feat_inv_ptr, SCALED)
    if NORM != 0:
        ms = tl.sum(x * x, axis=1) / D
        rs = 1.0 / tl.sqrt(ms + eps)
        x = _weighted(x, rs, tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32), DT,
                      NORM)
        if (ROPE != 0) & (not REG_ROT):
            xp = _weighted(xp, rs, tl.load(w_ptr + pcol, mask=cmask, other=0.0).to(tl.float32),
                           DT, NORM)
    if ROPE != 0:
        tok = rows // heads                      # b * S + s
        bi = tok // S
        si = tok - bi * S
        if REG_ROT:
            rm = m2
        else:
            rm = rmask[:, None] & in_rot[None, :]
        cso = bi[:, None].to(tl.int64) * cs_b + si[:, None] * cs_s + cols[None, :] * cs_d
        c = tl.load(cos_ptr + cso, mask=rm, other=1.0).to(tl.float32)
        s_ = tl.load(sin_ptr + cso, mask=rm, other=0.0).to(tl.float32)
        if REG_ROT:
            x = x * c + _rotated(x, ROWS, D, ROPE) * s_
        else:
            y = x * c + (sign[None, :] * xp) * s_
            x = tl.where(in_rot[None, :], y, x)
    if STORE32:
        tl.store(base + cols[None, :], x.to(DT), mask=m2)
    if F16:
        _store16(x16_ptr, rows[:, None].to(tl.int64) * D + cols[None, :], x, m2, flag_ptr)


@triton.jit
def qk_norm_rope_kernel(q_ptr, k_ptr, qw_ptr, kw_ptr, q_rows, k_rows, HQ, HK, S, eps, eps_k,
                        cos_ptr, sin_ptr, cs_b, cs_s, cs_d, q16_ptr, k16_ptr, v_ptr, v16_ptr,
                        flag_ptr, tok_inv_ptr, qf_inv_ptr, kf_inv_ptr, vf_inv_ptr, ld,
                        wo_ptr, wo16_ptr, wo_rows, nq, nk, nv,
                        D: tl.constexpr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr,
                        NORM: tl.constexpr, ROPE: tl.constexpr, R: tl.constexpr,
                        F16: tl.constexpr, SCALED: tl.constexpr, STORE32: tl.constexpr,
                        STORE_V32: tl.constexpr, GUARD: tl.constexpr, STRIDED: tl.constexpr,
                        WO: tl.constexpr, LOOP: tl.constexpr = False, PDL: tl.constexpr = 0,
                        IN16: tl.constexpr = False):
    pdl.wait_for_predecessor(PDL)
    if GUARD == 2:      # the float32 fallback's epilogue: only once the flag is raised
        if tl.load(flag_ptr) == 0:
            return
    if LOOP:
        # fewer programs than row blocks loop over the work (GUARD 2: cheap to launch when the
        # flag is clear)
        n_work = nq + nk + nv + tl.cdiv(wo_rows, ROWS)
        for pid in range(tl.program_id(0), n_work, tl.num_programs(0)):
            _program(pid, q_ptr, k_ptr, qw_ptr, kw_ptr, q_rows, k_rows, HQ, HK, S, eps, eps_k,
                     cos_ptr, sin_ptr, cs_b, cs_s, cs_d, q16_ptr, k16_ptr, v_ptr, v16_ptr,
                     flag_ptr, tok_inv_ptr, qf_inv_ptr, kf_inv_ptr, vf_inv_ptr, ld,
                     wo_ptr, wo16_ptr, wo_rows, nq, nk, nv, D, BLOCK_D, ROWS, NORM, ROPE, R,
                     F16, SCALED, STORE32, STORE_V32, STRIDED, WO, IN16)
    else:
        _program(tl.program_id(0), q_ptr, k_ptr, qw_ptr, kw_ptr, q_rows, k_rows, HQ, HK, S,
                 eps, eps_k, cos_ptr, sin_ptr, cs_b, cs_s, cs_d, q16_ptr, k16_ptr, v_ptr,
                 v16_ptr, flag_ptr, tok_inv_ptr, qf_inv_ptr, kf_inv_ptr, vf_inv_ptr, ld,
                 wo_ptr, wo16_ptr, wo_rows, nq, nk, nv, D, BLOCK_D, ROWS, NORM, ROPE, R,
                 F16, SCALED, STORE32, STORE_V32, STRIDED, WO, IN16)


@triton.jit
def _program(pid, q_ptr, k_ptr, qw_ptr, kw_ptr, q_rows, k_rows, HQ, HK, S, eps, eps_k,
             cos_ptr, sin_ptr, cs_b, cs_s, cs_d, q16_ptr, k16_ptr, v_ptr, v16_ptr,
             flag_ptr, tok_inv_ptr, qf_inv_ptr, kf_inv_ptr, vf_inv_ptr, ld,
             wo_ptr, wo16_ptr, wo_rows, nq, nk, nv,
             D: tl.constexpr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr,
             NORM: tl.constexpr, ROPE: tl.constexpr, R: tl.constexpr,
             F16: tl.constexpr, SCALED: tl.constexpr, STORE32: tl.constexpr,
             STORE_V32: tl.constexpr, STRIDED: tl.constexpr, WO: tl.constexpr,
             IN16: tl.constexpr):
    # one flat grid: nq programs for q, then nk for k, nv for V, the rest for o_proj's weight
    # (a 2-D grid sized by q left most of the k, V and Wo programs with nothing to do)
    if pid < nq:
        _rows(q_ptr, qw_ptr, q_rows, HQ, S, pid, eps, cos_ptr, sin_ptr, cs_b, cs_s, cs_d,
              q16_ptr, flag_ptr, tok_inv_ptr, qf_inv_ptr, ld, D, BLOCK_D, ROWS, NORM, ROPE,
              R, F16, SCALED, STORE32, STRIDED, IN16)
    elif pid < nq + nk:
        _rows(k_ptr, kw_ptr, k_rows, HK, S, pid - nq, eps_k, cos_ptr, sin_ptr, cs_b, cs_s, cs_d,
              k16_ptr, flag_ptr, tok_inv_ptr, kf_inv_ptr, ld, D, BLOCK_D, ROWS, NORM, ROPE,
              R, F16, SCALED, STORE32, STRIDED, IN16)
    elif pid < nq + nk + nv:    # V: its fp16 copy and/or its scales undone; no norm or RoPE
        _rows(v_ptr, kw_ptr, k_rows, HK, S, pid - nq - nk, eps_k, cos_ptr, sin_ptr, cs_b, cs_s,
              cs_d, v16_ptr, flag_ptr, tok_inv_ptr, vf_inv_ptr, ld, D, BLOCK_D, ROWS, 0, 0, 0,
              F16, SCALED, STORE_V32, STRIDED, IN16)
    elif WO:    # o_proj's weight [E, H*D] as rows of D: its fp16 copy, range-checked like the rest
        # (compiled only with it: without fp16 copies the flag is a dummy of the activation type)
        _rows(wo_ptr, kw_ptr, wo_rows, 1, S, pid - nq - nk - nv, eps_k, cos_ptr, sin_ptr, cs_b,
              cs_s, cs_d, wo16_ptr, flag_ptr, tok_inv_ptr, vf_inv_ptr, D, D, BLOCK_D, ROWS,
              0, 0, 0, 1, 0, 0, 0)


@triton.jit
def _tokens(x_ptr, w_ptr, n_tok, H, S, pid, eps, cos_ptr, sin_ptr, cs_b, cs_s, cs_d, x16_ptr,
            flag_ptr, tok_inv_ptr, feat_inv_ptr, ld, D: tl.constexpr, HP: tl.constexpr,
            T: tl.constexpr, NORM: tl.constexpr, ROPE: tl.constexpr, IN16: tl.constexpr):
    """The token-major form of ``_rows_halves`` for the fp16 copies of scaled GEMM outputs: one
    program takes T tokens x all H heads as a [T, HP, D/2] tile per half, so the feature scales
    (and the norm weight) are loaded once per program and cos/sin once per token, where the
    head-row form loads them per head row. Same values, same roundings, same range rule."""
    HALF: tl.constexpr = D // 2
    t = pid * T + tl.arange(0, T)
    h = tl.arange(0, HP)
    c = tl.arange(0, HALF)
    tmask = t < n_tok
    hmask = h < H
    m3 = tmask[:, None, None] & hmask[None, :, None] & (c < HALF)[None, None, :]
    DT: tl.constexpr = tl.float32 if IN16 else x_ptr.dtype.element_ty
    base = x_ptr + (t.to(tl.int64) * ld)[:, None, None] + (h * D)[None, :, None]
    fo = (h * D)[:, None] + c[None, :]
    f1 = tl.load(feat_inv_ptr + fo, mask=hmask[:, None], other=1.0)          # [HP, HALF]
    f2 = tl.load(feat_inv_ptr + fo + HALF, mask=hmask[:, None], other=1.0)
    tok_inv = tl.load(tok_inv_ptr + t, mask=tmask, other=1.0)
    x1 = tl.load(base + c[None, None, :], mask=m3, other=0.0).to(tl.float32)
    x2 = tl.load(base + (c + HALF)[None, None, :], mask=m3, other=0.0).to(tl.float32)
    x1 = x1 * tok_inv[:, None, None] * f1[None, :, :]
    x2 = x2 * tok_inv[:, None, None] * f2[None, :, :]
    if IN16:    # _check_scaled16's rule over the whole head row
        amax = tl.maximum(tl.max(tl.abs(x1), 2), tl.max(tl.abs(x2), 2))        # [T, HP]
        fmax = tl.where(hmask, tl.maximum(tl.max(f1, 1), tl.max(f2, 1)), 0.0)
        bad = (amax > 0.0) & (amax < tok_inv[:, None] * fmax[None, :] * FP16_MIN_NORMAL)
        tl.atomic_max(flag_ptr + tl.zeros_like(amax).to(tl.int32), 1, mask=bad)
    x1, x2 = norm_rope_halves(x1, x2, t, tmask, w_ptr, eps, cos_ptr, sin_ptr, cs_b, cs_s,
                              cs_d, S, D, DT, NORM, ROPE)
    offs = ((t.to(tl.int64) * H)[:, None, None] + h[None, :, None]) * D + c[None, None, :]
    _store16_pair(x16_ptr, offs, offs + HALF, x1, x2, m3, flag_ptr)


@triton.jit
def norm_rope_halves(x1, x2, t, tmask, w_ptr, eps, cos_ptr, sin_ptr, cs_b, cs_s, cs_d, S,
                     D: tl.constexpr, DT: tl.constexpr, NORM: tl.constexpr,
                     ROPE: tl.constexpr):
    """Per-head norm and rotate-half RoPE of head rows held as [tokens, heads, D/2] halves
    (tokens ``t``, valid where ``tmask``), in the eager order; the token-major epilogue's and
    proj_rope.py's fused one's."""
    HALF: tl.constexpr = D // 2
    c = tl.arange(0, HALF)
    if NORM != 0:
        ms = (tl.sum(x1 * x1, axis=2) + tl.sum(x2 * x2, axis=2)) / D
        rs = (1.0 / tl.sqrt(ms + eps))[:, :, None]
        x1 = _weighted_b(x1, rs, tl.load(w_ptr + c).to(tl.float32)[None, None, :], DT, NORM)
        x2 = _weighted_b(x2, rs, tl.load(w_ptr + c + HALF).to(tl.float32)[None, None, :], DT,
                         NORM)
    if ROPE != 0:
        bi = t // S
        cso = (bi.to(tl.int64) * cs_b + (t - bi * S) * cs_s)[:, None]
        cm = tmask[:, None]
        c1 = tl.load(cos_ptr + cso + c[None, :] * cs_d, mask=cm, other=1.0).to(tl.float32)
        s1 = tl.load(sin_ptr + cso + c[None, :] * cs_d, mask=cm, other=0.0).to(tl.float32)
        c2 = tl.load(cos_ptr + cso + (c + HALF)[None, :] * cs_d, mask=cm, other=1.0).to(
            tl.float32)
        s2 = tl.load(sin_ptr + cso + (c + HALF)[None, :] * cs_d, mask=cm, other=0.0).to(
            tl.float32)
        y1 = x1 * c1[:, None, :] + (-x2) * s1[:, None, :]
        x2 = x2 * c2[:, None, :] + x1 * s2[:, None, :]
        x1 = y1
    return x1, x2


@triton.jit
def qk_tokens_kernel(q_ptr, k_ptr, qw_ptr, kw_ptr, n_tok, HQ, HK, S, eps, eps_k,
                     cos_ptr, sin_ptr, cs_b, cs_s, cs_d, q16_ptr, k16_ptr, v_ptr, v16_ptr,
                     flag_ptr, tok_inv_ptr, qf_inv_ptr, kf_inv_ptr, vf_inv_ptr, ld,
                     wo_ptr, wo16_ptr, wo_rows, nq, nk, nv,
                     D: tl.constexpr, HQP: tl.constexpr, HKP: tl.constexpr,
                     TQ: tl.constexpr, TK: tl.constexpr, NORM: tl.constexpr,
                     ROPE: tl.constexpr, WO: tl.constexpr, WO_ROWS: tl.constexpr,
                     PDL: tl.constexpr = 0, IN16: tl.constexpr = False):
    """``qk_norm_rope_kernel``'s fp16-copies launch in token-major programs (``_tokens``): nq
    programs of TQ tokens for q, nk and nv of TK tokens for k and V, then o_proj's weight in
    the head-row programs of the other form (WO_ROWS rows each)."""
    pdl.wait_for_predecessor(PDL)
    pid = tl.program_id(0)
    if pid < nq:
        _tokens(q_ptr, qw_ptr, n_tok, HQ, S, pid, eps, cos_ptr, sin_ptr, cs_b, cs_s, cs_d,
                q16_ptr, flag_ptr, tok_inv_ptr, qf_inv_ptr, ld, D, HQP, TQ, NORM, ROPE, IN16)
    elif pid < nq + nk:
        _tokens(k_ptr, kw_ptr, n_tok, HK, S, pid - nq, eps_k, cos_ptr, sin_ptr, cs_b, cs_s,
                cs_d, k16_ptr, flag_ptr, tok_inv_ptr, kf_inv_ptr, ld, D, HKP, TK, NORM, ROPE,
                IN16)
    elif pid < nq + nk + nv:
        _tokens(v_ptr, kw_ptr, n_tok, HK, S, pid - nq - nk, eps_k, cos_ptr, sin_ptr, cs_b,
                cs_s, cs_d, v16_ptr, flag_ptr, tok_inv_ptr, vf_inv_ptr, ld, D, HKP, TK, 0, 0,
                IN16)
    elif WO:
        _rows(wo_ptr, kw_ptr, wo_rows, 1, S, pid - nq - nk - nv, eps_k, cos_ptr, sin_ptr, cs_b,
              cs_s, cs_d, wo16_ptr, flag_ptr, tok_inv_ptr, vf_inv_ptr, D, D, D, WO_ROWS,
              0, 0, 0, 1, 0, 0, 0)


@triton.jit
def wo16_kernel(w_ptr, w16_ptr, flag_ptr, n_rows, D: tl.constexpr, BLOCK_D: tl.constexpr,
                ROWS: tl.constexpr, PDL: tl.constexpr = 0):
    """The epilogue launch's Wo programs alone (``wo16_``)."""
    pdl.wait_for_predecessor(PDL)
    _rows(w_ptr, w_ptr, n_rows, 1, 1, tl.program_id(0), 0.0, w_ptr, w_ptr, 0, 0, 0, w16_ptr,
          flag_ptr, w_ptr, w_ptr, D, D, BLOCK_D, ROWS, 0, 0, 0, 1, 0, 0, 0)


def wo16_(w32, w16, flag, head_dim):
    """o_proj's weight [E, H*D] (float32, contiguous) into its fp16 copy ``w16``, range-checked
    into ``flag`` as rows of ``head_dim``, as a launch of its own: the same code as the WO
    programs of ``qk_norm_rope_(wo=)``, for a caller that runs it beside other work (the fp16
    plans, on a side stream while a CUDA graph is captured)."""
    if (w32.dtype != torch.float32 or not w32.is_contiguous() or w16.shape != w32.shape
            or w16.dtype != torch.float16 or not w16.is_contiguous()
            or w32.shape[1] % head_dim or flag.dtype != torch.int32):
        raise ValueError("wo16_: a contiguous float32 [E, H*D] weight, its fp16 twin and an "
                         "int32 flag are needed")
    block_d = next_pow2(head_dim)
    rows = default_rows(block_d)
    n_rows = w32.numel() // head_dim
    wo16_kernel[(cdiv(n_rows, rows),)](w32, w16, flag, n_rows, D=head_dim, BLOCK_D=block_d,
                                       ROWS=rows, num_warps=default_warps(block_d, False),
                                       **pdl.launch_options(w32.device))


# (tokens per q program, warps) of the token-major form: the launch's candidates, timed against
# the head-row form per shape bucket (fp16_plans). H200, W075 "high" sizes (epilogue16_bench
# --tokens --no-wo): (4, 4) best from 256 tokens up (512x16 22.4 -> 19.7 us, 4096x1 11.1 -> 9.6),
# (2, 4) at 131; 8 warps or 8 tokens slower; (4, 2) and (8, 4) need 188-203 registers
TOKEN_CONFIGS = ((4, 4), (2, 4), (2, 2))


def token_major_covers(head_dim, rope, rotary_dim) -> bool:
    """Whether token-major programs (``qk_norm_rope_(tokens=)``) cover a head: a power of two,
    and no RoPE or rotate-half RoPE over the whole head."""
    return (head_dim >= 2 and head_dim & (head_dim - 1) == 0 and rope in ("none", "half")
            and (rope == "none" or rotary_dim == head_dim))


def default_rows(block_d):
    """Rows per program. From epilogue_bench on the H200 at W075 sizes (head_dim 64): 16 rows
    are 3-6% faster than 32 since rows are loaded as halves (runs/profiles/
    epilogue_ab_86efc75.txt), and 32 were 8% faster than 64 before; other head sizes keep 32
    (not measured)."""
    return 16 if block_d <= 64 else max(1, min(32, 4096 // block_d))


def default_warps(block_d, in16):
    """Warps per program. fp16 inputs (in16) at head_dim 64: two, so that each thread loads 16
    bytes of a half-row as the float32 form's four warps do (epilogue16_bench on the H200:
    25.3 -> 23.9 us at 512x16, 23.1 -> 20.9 at 449x16, 13.4 -> 11.9 at 4096x1, bitwise the same
    copies; runs/profiles/epilogue16_eba4acf.json)."""
    return 2 if in16 and block_d <= 64 else 4


def qk_norm_rope_(q, k, q_norm_weight, k_norm_weight, cos, sin, batch, seq, num_heads,
                  num_kv_heads, head_dim, norm, eps, rope, rotary_dim, eps_k=None, v=None,
                  copies=None, flag=None, scales=None, store32=None, guard=0, wo=None,
                  rows=None, num_warps=None, programs=None, in16=False, tokens=None):
    """In place on q [B*S, H*D] and k [B*S, Hkv*D] (contiguous). cos/sin: [B, S, R]-broadcast
    views (None without RoPE). ``copies``: (q16, k16, v16) to also write fp16 copies of the
    float32 q, k (after norm and RoPE) and ``v`` [B*S, Hkv*D]; ``flag`` (int32, zeroed by the
    caller) then becomes nonzero if fp16's range would cost accuracy (``_store16``).
    ``scales``: (token_inv [B*S], q_inv [H*D], k_inv [Hkv*D], v_inv [Hkv*D]) reciprocal row
    scales of fp16 GEMM operands to undo first (``fp16_rows``); ``store32`` (default: whenever
    there is a norm or RoPE) writes the float32 results in place, also for ``v`` when scaled;
    ``guard=2`` with ``flag``: the launch does nothing unless the flag is set (the fallback's
    epilogue). ``wo``: (o_proj weight [E, H*D] float32 contiguous, its fp16 copy) made in the
    same launch, with ``copies``. q, k (and v) are contiguous, or all three column slices of one
    [B*S, ld] matrix (a fused QKV product): rows ``ld`` apart. ``in16``: q, k, v are the scaled
    fp16 outputs of such a product (with ``scales`` and ``copies``, ``store32=False``): range-
    checked by ``_check_scaled16``, the norm rounding to float32. ``tokens``: (tokens per q
    program, warps) to run the fp16-copies launch in token-major programs (``_tokens``; only
    with ``scales``, ``store32=False``, no guard, and no or rotate-half RoPE over the whole
    power-of-two head)."""
    d = head_dim
    q_rows = batch * seq * num_heads
    k_rows = batch * seq * num_kv_heads
    block_d = next_pow2(d)
    rows = rows or default_rows(block_d)
    num_warps = num_warps or default_warps(block_d, in16)
    dummy = q
    if rope != "none":
        cs = (cos.stride(0), cos.stride(1), cos.stride(2))
    else:
        cos = sin = dummy
        cs = (0, 0, 0)
    f16 = copies is not None
    if f16:
        q16, k16, v16 = copies
        if v is None or flag is None:
            raise ValueError("qk_norm_rope_: fp16 copies need v and the flag")
        src = torch.float16 if in16 else torch.float32
        if q.dtype != k.dtype or q.dtype != v.dtype or q.dtype != src:
            raise ValueError("qk_norm_rope_: fp16 copies are made of float32 q, k, v only "
                             "(or of scaled fp16 GEMM outputs, in16)")
    else:
        q16 = k16 = v16 = dummy
    if store32 is None:
        store32 = norm != "none" or rope != "none"
    store_v32 = bool(store32 and scales is not None)
    if store_v32 and v is None:
        raise ValueError("qk_norm_rope_: v is needed")
    if guard and flag is None:
        raise ValueError("qk_norm_rope_: a guarded launch needs the flag")
    if in16 and (not f16 or scales is None or store32 or guard):
        raise ValueError("qk_norm_rope_: fp16 GEMM outputs (in16) need the copies and the "
                         "scales, and are never stored back")
    sc = scales if scales is not None else (dummy,) * 4
    ld = q.stride(0)
    strided = not (q.is_contiguous() and k.is_contiguous() and (v is None or v.is_contiguous()))
    if strided:
        for t in (q, k) + ((v,) if v is not None else ()):
            if t.dim() != 2 or t.stride() != (ld, 1):
                raise ValueError("qk_norm_rope_: q, k, v must be contiguous or share one row "
                                 "stride with unit column stride")
    wo_rows = 0
    if wo is not None:
        w32, w16 = wo
        if not f16 or w32.dtype != torch.float32 or not w32.is_contiguous() \
                or w16.shape != w32.shape or w32.shape[1] != num_heads * d:
            raise ValueError("qk_norm_rope_: wo needs the fp16 copies and a contiguous float32 "
                             "[E, H*D] weight with an fp16 twin")
        wo_rows = w32.numel() // d
    else:
        w32 = w16 = dummy
    if tokens is not None:
        if not (f16 and scales is not None and not store32 and not guard
                and token_major_covers(d, rope, rotary_dim)):
            raise ValueError("qk_norm_rope_: token-major programs make only the fp16 copies of "
                             "scaled products, with no or rotate-half RoPE over a power-of-two "
                             "head")
        tq, warps = tokens
        n_tok = batch * seq
        hqp, hkp = next_pow2(num_heads), next_pow2(num_kv_heads)
        tk = tq * max(1, hqp // hkp)        # k and V programs as large as q's
        nq, nk = cdiv(n_tok, tq), cdiv(n_tok, tk)
        grid = (nq + 2 * nk + cdiv(wo_rows, rows),)
        qk_tokens_kernel[grid](
            q, k, q_norm_weight if norm != "none" else dummy,
            k_norm_weight if norm != "none" else dummy, n_tok, num_heads, num_kv_heads, seq,
            float(eps), float(eps if eps_k is None else eps_k), cos, sin, *cs, q16, k16, v, v16,
            flag, *sc, ld, w32, w16, wo_rows, nq, nk, nk,
            D=d, HQP=hqp, HKP=hkp, TQ=tq, TK=tk, NORM=NORM_CODES[norm], ROPE=ROPE_CODES[rope],
            WO=wo is not None, WO_ROWS=rows, num_warps=warps, IN16=bool(in16),
            **pdl.launch_options(q.device))
        return
    nq = cdiv(q_rows, rows)
    nk = cdiv(k_rows, rows)
    nv = nk if f16 or store_v32 else 0
    grid = (nq + nk + nv + cdiv(wo_rows, rows),)
    if guard == 2:
        programs = tuning.GUARDED_PROGRAMS
    loop = programs is not None and programs < grid[0]
    if loop:
        grid = (programs,)
    qk_norm_rope_kernel[grid](
        q, k,
        q_norm_weight if norm != "none" else dummy, k_norm_weight if norm != "none" else dummy,
        q_rows, k_rows, num_heads, num_kv_heads, seq, float(eps),
        float(eps if eps_k is None else eps_k), cos, sin, *cs, q16, k16,
        v if v is not None else dummy, v16, flag if flag is not None else dummy, *sc, ld,
        w32, w16, wo_rows, nq, nk, nv,
        D=d, BLOCK_D=block_d, ROWS=rows, NORM=NORM_CODES[norm], ROPE=ROPE_CODES[rope],
        R=rotary_dim if rope != "none" else 0, F16=f16, SCALED=scales is not None,
        STORE32=bool(store32), STORE_V32=store_v32, GUARD=int(guard), STRIDED=strided,
        WO=wo is not None, LOOP=loop, num_warps=num_warps, IN16=bool(in16),
        **pdl.launch_options(q.device))
