"""Flash-attention backward for grouped-query attention: the gradients of flash.py's forward.

What the forward must keep (per block, besides its inputs q, k, v, mask):
  * o, the attention output ([B, S, H*D], as written for o_proj), for D = rowsum(dO * o);
  * the row statistics: either flash.py's ``ml`` (MODE 1's per-row max and sum of exp2, base 2,
    [B*H*S*2] float32; the probabilities path writes it already) or the base-2 log-sum-exp
    ``lse`` [B*H*S] float32 (max + log2(sum), of the scaled scores in log2 units). MODE 0 (the
    online path, no probabilities) writes ``ml`` with its STORE_ML switch. ``ml`` is the exact form: with a mask tensor a
    row's max can be a huge finite fill (-1e9, finfo.min) beside which log2(sum) vanishes in
    m + log2(sum), and the kernels then take exp2((t - m) - log2(sum)) (TWO_STATS); ``lse``
    is exact only without such rows;
  * with returned probabilities and a gradient flowing into them, the probabilities themselves
    (the op returns them anyway).
  Memory per block: o (B*S*H*D, kept for o_proj's weight gradient regardless) plus 8*B*H*S
  bytes of statistics (``ml``; 4 with ``lse``), against eager autograd's B*H*S*S probabilities
  (twice in 16-bit models: the float32 softmax output and its cast for P @ V) plus the repeated
  K and V (B*H*S*D each). At S = 4096, H = 96, float32: 6.4 GB of probabilities per batch row
  against 3 MB of statistics. The backward itself adds 8 (12 with a mask tensor) bytes per row
  (its LSE, D and row max) and its gradients.

Kernels (three launches, the FlashAttention-2 structure):
  1. ``bwd_preprocess_kernel``, programs (row tile, b*H + h): D = rowsum(dO * o) in float32 and
     the log-sum-exp from ``ml`` (or a copy of ``lse``; TWO_STATS: log2(sum) and the max apart),
     with a wholly masked row's -inf mapped to +inf under EMPTY_ZERO so that its recomputed
     probabilities are zeros. DPROBS (a gradient
     dP_extra into the returned probabilities): D += rowsum(P * dP_extra) over the stored P.
  2. ``bwd_dkdv_kernel``, programs (key tile, b*Hkv + kv head): K and V tiles stay in registers
     while the program loops over the query tiles of all G query heads of its KV head, so dK and
     dV are summed over the group in float32 without atomics and repeat_kv never exists. Computed
     transposed (S^T = K Q^T, P^T, dP^T = V dO^T), so every product's left operand is already in
     registers: dV += P^T dO, dK += dS^T Q. Where key tiles x B x Hkv gives few programs (W092:
     8 KV heads of 12 query heads each), the group is split over ``split`` programs whose
     float32 partial sums are added afterwards (``group_split``).
  3. ``bwd_dq_kernel``, programs (query tile, b*H + h): loops over the key tiles, dQ += dS K.
  With P = exp2(t - lse) recomputed from q, k (t: the forward's scores in log2 units, same
  masks in the same order) and dP = dO V^T (+ dP_extra): dS = P * (dP - D), times the softcap
  derivative 1 - tanh^2, times the scale. A key tile wholly above the diagonal, or wholly outside
  the window, is skipped (not with bool_fill, whose finite fill overrides the -inf).

Wholly masked rows: EMPTY_ZERO (SDPA) gives zero gradients. Otherwise (the explicit core) the
gradients are eager autograd's: NaN probabilities, so dV is NaN for every key of the row's KV
head (NAN_ROWS: dV gets a NaN added where the query tiles a program skips hold such a row), while
dS is zeroed wherever eager's masked_fill backward zeroes it (causal, window, bool masks) and stays
NaN where only an additive mask removed the score.

Numerics: float32 accumulation everywhere; 16-bit operands go to the dots in their dtype (P and dS
cast to V's and Q's dtype first, as eager's P @ V takes P cast to V's dtype); float32 operands at
PREC ("tf32", "tf32x3", "ieee"), with q prescaled by scale * log2(e) as the forward does (its
products are then the forward's). The additive mask gets no gradient.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import triton
import triton.language as tl

from .flash import LOG2E, to_log2_units, log2_units
from .launch import cdiv, interpreting, launch as _launch, next_pow2, static_int

LN2 = 0.6931471805599453


@dataclasses.dataclass(frozen=True)
class BackwardConfig:
    """Tiles of the three launches. dK/dV: ``kv_n`` keys per program, looping ``kv_m`` query
    rows at a time; dQ: ``q_m`` query rows per program, looping ``q_n`` keys at a time; warps
    and pipeline stages of those two; the preprocess takes ``pre_m`` rows per program."""
    kv_m: int
    kv_n: int
    q_m: int
    q_n: int
    warps: int
    stages: int
    pre_m: int = 64


# bf16: timed on an H100 over W092's training shapes (2048x1, 512x4; 7 configs x 3 splits):
# (64, 64, 64, 64) x 4 warps was fastest at both (1.10 ms and 0.43 ms for the three launches,
# the earlier (32, 64, 64, 32) x 8 warps 2.26 and 0.76 ms) though ptxas gives its dK/dV 0.9 KB
# of spills; (64, 128, 128, 64) x 8 warps came within 2-7% with almost none. float32 (W075's
# TF32 and 3xTF32): chosen so that ptxas reports no spills, not timed yet
# (tests/kernels/sm90_compile.py compiles the defaults and fails on spills over 1 KB)
B = BackwardConfig
B16_CONFIGS = [B(64, 64, 64, 64, 4, 2), B(64, 128, 128, 64, 8, 2), B(32, 64, 64, 32, 8, 2)]
F32_CONFIGS = [B(32, 64, 64, 32, 8, 2), B(32, 32, 32, 32, 4, 2), B(16, 32, 32, 16, 4, 1)]
# 3xTF32 and full float32 products need more registers per tile
F32X3_CONFIGS = [B(16, 32, 32, 16, 4, 1)]
INTERPRET_CONFIG = B(32, 32, 32, 32, 4, 1)
_SMEM_BUDGET = 200 * 1024


def smem_estimate(c: BackwardConfig, head_dim: int, elem: int) -> int:
    """A rough footprint of the larger of the two main kernels: the looped operand tiles (two per
    stage) and the resident tiles, operands in ``elem`` bytes."""
    d = next_pow2(head_dim)
    dkdv = (2 * c.kv_n * d + 2 * max(1, c.stages) * c.kv_m * d) * elem
    dq = (2 * c.q_m * d + 2 * max(1, c.stages) * c.q_n * d) * elem
    return max(dkdv, dq)


def choose_config(head_dim: int, dtype: torch.dtype, prec: str = "tf32") -> BackwardConfig:
    """The default config for a head size, operand dtype and float32 product precision (the
    first candidate that fits)."""
    if interpreting():
        return INTERPRET_CONFIG
    elem = 4 if dtype == torch.float32 else 2
    if elem == 4:
        cands = F32_CONFIGS if prec == "tf32" else F32X3_CONFIGS
    else:
        cands = B16_CONFIGS
    for c in cands:
        if smem_estimate(c, head_dim, elem) <= _SMEM_BUDGET:
            return c
    return B(16, 32, 32, 16, 4, 1)


# ----------------------------------------------------------------------------------- kernels
@triton.jit
def _logits(s, qi, kj, m0, m_last, n0, n_last, S, qscale, mask_ptr, mask_off, sm_q, sm_k,
            mask_fill, window, softcap, CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr,
            PRESCALED: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
            KEY_BOUND: tl.constexpr, GRAD_KEEP: tl.constexpr):
    """The forward's scores (flash._scores) in log2 units for a tile of raw products ``s`` whose
    query index is ``qi`` and key index ``kj`` (2-d, broadcast to s: [M, 1] x [1, N], or
    transposed), with the tile's bounds m0..m_last (queries) and n0..n_last (keys). Returns
    (t, keep, dfac): keep, under GRAD_KEEP, is where the score's gradient flows (not replaced by
    a masked_fill: causal, window, bool masks, the key bound); dfac is softcapping's derivative
    1 - tanh^2 (1.0 without it)."""
    if not PRESCALED:
        s = s * qscale
    if SOFTCAP:
        u = 2.0 * tl.sigmoid(s * (2.0 / softcap)) - 1.0        # tanh(s / softcap)
        s = softcap * u
        dfac = 1.0 - u * u
    else:
        dfac = 1.0
    keep = tl.full(s.shape, 1, tl.int1)
    if CAUSAL:
        if n_last > m0:
            vis = qi >= kj
            s = tl.where(vis, s, float("-inf"))
            if GRAD_KEEP:
                keep = keep & vis
    if WINDOW:
        if m_last - n0 >= window:
            vis = qi - kj < window
            s = tl.where(vis, s, float("-inf"))
            if GRAD_KEEP:
                keep = keep & vis
    if MASK_KIND != 0:
        mm = (qi < S) & (kj < S)
        mv = tl.load(mask_ptr + mask_off + qi.to(tl.int64) * sm_q + kj.to(tl.int64) * sm_k,
                     mask=mm, other=0)
        if MASK_KIND == 1:
            s = tl.where(mv != 0, s, float("-inf"))
            if GRAD_KEEP:
                keep = keep & (mv != 0)
        elif MASK_KIND == 2:
            s = tl.where(mv != 0, mask_fill, s)
            if GRAD_KEEP:
                keep = keep & (mv == 0)
        else:
            s = s + to_log2_units(mv.to(tl.float32))
    if KEY_BOUND:
        if n_last >= S:
            s = tl.where(kj < S, s, float("-inf"))
            if GRAD_KEEP:
                keep = keep & (kj < S)
    return s, keep, dfac


@triton.jit
def bwd_preprocess_kernel(
        O, DO, ML, P, DP, LSE, MROW, DELTA,
        so_b, so_h, so_s, sdo_b, sdo_h, sdo_s, sp_b, sp_h, sp_s, sdp_b, sdp_h, sdp_s,
        H, S, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, STATS: tl.constexpr, EMPTY_ZERO: tl.constexpr,
        DPROBS: tl.constexpr, TWO_STATS: tl.constexpr):
    """DELTA = rowsum(dO * o) (+ rowsum(P * dP_extra)) and LSE per row (b*H + h)*S + i.
    STATS 0: ML holds flash.py's (max, sum) pairs; 1: ML holds the log-sum-exp. TWO_STATS: LSE
    gets log2(sum) and MROW the max instead (rows whose max is a huge finite fill: m + log2(l)
    would round to m)."""
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh - b * H
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < S
    md = m_ok[:, None] & (offs_d < D)[None, :]
    b64 = b.to(tl.int64)
    o = tl.load(O + b64 * so_b + h * so_h + offs_m[:, None].to(tl.int64) * so_s
                + offs_d[None, :], mask=md, other=0.0).to(tl.float32)
    do = tl.load(DO + b64 * sdo_b + h * sdo_h + offs_m[:, None].to(tl.int64) * sdo_s
                 + offs_d[None, :], mask=md, other=0.0).to(tl.float32)
    delta = tl.sum(o * do, 1)
    if DPROBS:
        p_row = P + b64 * sp_b + h.to(tl.int64) * sp_h + offs_m[:, None].to(tl.int64) * sp_s
        dp_row = DP + b64 * sdp_b + h.to(tl.int64) * sdp_h + offs_m[:, None].to(tl.int64) * sdp_s
        for start_n in range(0, S, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            mn = m_ok[:, None] & (offs_n < S)[None, :]
            p = tl.load(p_row + offs_n[None, :], mask=mn, other=0.0).to(tl.float32)
            dpx = tl.load(dp_row + offs_n[None, :], mask=mn, other=0.0).to(tl.float32)
            delta += tl.sum(p * dpx, 1)
    row = bh.to(tl.int64) * S + offs_m
    if STATS == 0:
        m_i = tl.load(ML + row * 2, mask=m_ok, other=0.0)
        l_i = tl.load(ML + row * 2 + 1, mask=m_ok, other=1.0)
        m_u = tl.where(m_i == float("-inf"), 0.0, m_i)
        l2 = tl.log2(l_i)
    else:
        lse_in = tl.load(ML + row, mask=m_ok, other=0.0)
        m_u = tl.where(lse_in == float("-inf"), 0.0, lse_in)
        l2 = tl.where(lse_in == float("-inf"), float("-inf"), 0.0)
    if TWO_STATS:       # the kernels take exp2((t - m) - log2(l))
        tl.store(MROW + row, m_u, mask=m_ok)
        lse = l2
    else:               # exp2(t - lse)
        lse = m_u + l2
    if EMPTY_ZERO:      # a wholly masked row: probabilities exp2(t - inf) = 0, zero gradients
        lse = tl.where(l2 == float("-inf"), float("inf"), lse)
    tl.store(LSE + row, lse, mask=m_ok)
    tl.store(DELTA + row, delta, mask=m_ok)


@triton.jit
def bwd_dkdv_kernel(
        Q, K, V, DO, LSE, MROW, DELTA, MASK, DP, DK, DV,
        sq_b, sq_h, sq_s, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, sv_d, sdo_b, sdo_h, sdo_s,
        sm_b, sm_h, sm_q, sm_k, sdp_b, sdp_h, sdp_s, sdk_b, sdk_h, sdk_s, dk_col, dv_col,
        H, G, S, qscale, mask_fill, window, softcap, kscale, split, sdk_part,
        D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, PREC: tl.constexpr,
        UPCAST: tl.constexpr, NAN_ROWS: tl.constexpr, WINDOW: tl.constexpr,
        SOFTCAP: tl.constexpr, DPROBS: tl.constexpr, KV_SHARED: tl.constexpr,
        TWO_STATS: tl.constexpr, FILL_INF: tl.constexpr = 0):
    """dK, dV of one key tile of one KV head, summed over the G query heads of its group, or
    over one of ``split`` equal parts of the group (program (key tile, (b*Hkv + kv head) *
    split + part)), written as that part's partial sums sdk_part elements apart (the host adds
    the parts: more programs where B * Hkv * key tiles is small next to the GPU).
    KV_SHARED: dK and dV are column slices of one buffer DK (at dk_col and dv_col)."""
    qscale = tl.cast(qscale, tl.float32)
    mask_fill = tl.cast(mask_fill, tl.float32)
    softcap = tl.cast(softcap, tl.float32)
    kscale = tl.cast(kscale, tl.float32)
    if FILL_INF != 0:
        mask_fill = FILL_INF * float("inf")
    start_n = tl.program_id(0)
    bkv = tl.program_id(1) // split
    part = tl.program_id(1) - bkv * split
    gps = G // split
    HKV = H // G
    b = bkv // HKV
    kvh = bkv - b * HKV
    b64 = b.to(tl.int64)
    n0 = start_n * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_mb = tl.arange(0, BLOCK_M)
    n_ok = offs_n < S
    d_ok = offs_d < D
    nd = n_ok[:, None] & d_ok[None, :]
    k = tl.load(K + b64 * sk_b + kvh * sk_h + offs_n[:, None].to(tl.int64) * sk_s
                + offs_d[None, :], mask=nd, other=0.0)
    v = tl.load(V + b64 * sv_b + kvh.to(tl.int64) * sv_h + offs_n[:, None].to(tl.int64) * sv_s
                + offs_d[None, :].to(tl.int64) * sv_d, mask=nd, other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    PRESCALED: tl.constexpr = Q.dtype.element_ty == tl.float32
    GRAD_KEEP: tl.constexpr = (MASK_KIND == 2) or NAN_ROWS
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    # the query rows that can see this key tile (every row with bool_fill)
    if CAUSAL and MASK_KIND != 2:
        lo = (n0 // BLOCK_M) * BLOCK_M
    else:
        lo = 0
    if WINDOW and MASK_KIND != 2:
        hi = tl.minimum(S, n0 + BLOCK_N - 1 + window)
    else:
        hi = S
    kj = offs_n[:, None]
    for g in range(part * gps, part * gps + gps):
        h = kvh * G + g
        bh = b * H + h
        q_base = Q + b64 * sq_b + h * sq_h + offs_d[None, :]
        do_base = DO + b64 * sdo_b + h * sdo_h + offs_d[None, :]
        mask_off = b64 * sm_b + h.to(tl.int64) * sm_h
        dp_base = DP + b64 * sdp_b + h.to(tl.int64) * sdp_h
        for start_m in range(lo, hi, BLOCK_M):
            offs_m = start_m + offs_mb
            m_ok = offs_m < S
            md = m_ok[:, None] & d_ok[None, :]
            q = tl.load(q_base + offs_m[:, None].to(tl.int64) * sq_s, mask=md, other=0.0)
            do = tl.load(do_base + offs_m[:, None].to(tl.int64) * sdo_s, mask=md, other=0.0)
            if UPCAST:
                q = q.to(tl.float32)
                do = do.to(tl.float32)
            if PRESCALED:
                q = q * qscale
            # rows past S: lse +inf, probabilities 0
            lse = tl.load(LSE + bh.to(tl.int64) * S + offs_m, mask=m_ok, other=float("inf"))
            delta = tl.load(DELTA + bh.to(tl.int64) * S + offs_m, mask=m_ok, other=0.0)
            st = tl.dot(k, tl.trans(q), input_precision=PREC)              # [N, M]
            t, keep, dfac = _logits(st, offs_m[None, :], kj, start_m, start_m + BLOCK_M - 1,
                                    n0, n0 + BLOCK_N - 1, S, qscale, MASK, mask_off, sm_q, sm_k,
                                    mask_fill, window, softcap, CAUSAL, MASK_KIND, PRESCALED,
                                    WINDOW, SOFTCAP, False, GRAD_KEEP)
            if TWO_STATS:
                mrow = tl.load(MROW + bh.to(tl.int64) * S + offs_m, mask=m_ok, other=0.0)
                pt = tl.exp2((t - mrow[None, :]) - lse[None, :])
            else:
                pt = tl.exp2(t - lse[None, :])
            if UPCAST:
                p16 = pt.to(V.dtype.element_ty).to(tl.float32)
            else:
                p16 = pt.to(DO.dtype.element_ty)
            dv += tl.dot(p16, do, input_precision=PREC)
            dpt = tl.dot(v, tl.trans(do), input_precision=PREC)
            if DPROBS:
                dpt += tl.load(dp_base + offs_m[None, :].to(tl.int64) * sdp_s + kj,
                               mask=m_ok[None, :] & n_ok[:, None], other=0.0).to(tl.float32)
            dst = pt * (dpt - delta[None, :]) * dfac
            if GRAD_KEEP:
                dst = tl.where(keep, dst, 0.0)
            if UPCAST:
                dk += tl.dot(dst.to(Q.dtype.element_ty).to(tl.float32), q,
                             input_precision=PREC)
            else:
                dk += tl.dot(dst.to(Q.dtype.element_ty), q, input_precision=PREC)
    if NAN_ROWS and (CAUSAL or WINDOW) and MASK_KIND != 2:
        # eager's probabilities of a wholly masked row are NaN for every key, and so is dV of
        # its KV head: look for such rows among the query tiles skipped above
        empty = tl.zeros([BLOCK_M], tl.int32)
        for g in range(part * gps, part * gps + gps):
            row0 = (b * H + kvh * G + g).to(tl.int64) * S
            for start_m in range(0, lo, BLOCK_M):
                offs_m = start_m + offs_mb
                lse = tl.load(LSE + row0 + offs_m, mask=offs_m < S, other=0.0)
                empty = empty | (lse == float("-inf")).to(tl.int32)
            for start_m in range(hi, S, BLOCK_M):
                offs_m = start_m + offs_mb
                lse = tl.load(LSE + row0 + offs_m, mask=offs_m < S, other=0.0)
                empty = empty | (lse == float("-inf")).to(tl.int32)
        if tl.max(empty, 0) != 0:
            dv = dv + float("nan")
    dk = dk * kscale
    if KV_SHARED:
        dv_base = DK
    else:
        dv_base = DV
    row_off = (part.to(tl.int64) * sdk_part + b64 * sdk_b + kvh * sdk_h
               + offs_n[:, None].to(tl.int64) * sdk_s + offs_d[None, :])
    tl.store(DK + dk_col + row_off, dk.to(DK.dtype.element_ty), mask=nd)
    tl.store(dv_base + dv_col + row_off, dv.to(DK.dtype.element_ty), mask=nd)


@triton.jit
def bwd_dq_kernel(
        Q, K, V, DO, LSE, MROW, DELTA, MASK, DP, DQ,
        sq_b, sq_h, sq_s, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, sv_d, sdo_b, sdo_h, sdo_s,
        sm_b, sm_h, sm_q, sm_k, sdp_b, sdp_h, sdp_s, sdq_b, sdq_h, sdq_s,
        H, G, S, qscale, mask_fill, window, softcap, dscale,
        D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, PREC: tl.constexpr,
        UPCAST: tl.constexpr, NAN_ROWS: tl.constexpr, WINDOW: tl.constexpr,
        SOFTCAP: tl.constexpr, DPROBS: tl.constexpr, EVEN_N: tl.constexpr,
        TWO_STATS: tl.constexpr, FILL_INF: tl.constexpr = 0):
    """dQ of one query tile of one head."""
    qscale = tl.cast(qscale, tl.float32)
    mask_fill = tl.cast(mask_fill, tl.float32)
    softcap = tl.cast(softcap, tl.float32)
    dscale = tl.cast(dscale, tl.float32)
    if FILL_INF != 0:
        mask_fill = FILL_INF * float("inf")
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh - b * H
    kvh = h // G
    b64 = b.to(tl.int64)
    m0 = start_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_nb = tl.arange(0, BLOCK_N)
    m_ok = offs_m < S
    d_ok = offs_d < D
    md = m_ok[:, None] & d_ok[None, :]
    q = tl.load(Q + b64 * sq_b + h * sq_h + offs_m[:, None].to(tl.int64) * sq_s
                + offs_d[None, :], mask=md, other=0.0)
    do = tl.load(DO + b64 * sdo_b + h * sdo_h + offs_m[:, None].to(tl.int64) * sdo_s
                 + offs_d[None, :], mask=md, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    PRESCALED: tl.constexpr = Q.dtype.element_ty == tl.float32
    GRAD_KEEP: tl.constexpr = (MASK_KIND == 2) or NAN_ROWS
    if PRESCALED:
        q = q * qscale
    lse = tl.load(LSE + bh.to(tl.int64) * S + offs_m, mask=m_ok, other=float("inf"))
    delta = tl.load(DELTA + bh.to(tl.int64) * S + offs_m, mask=m_ok, other=0.0)
    if TWO_STATS:
        mrow = tl.load(MROW + bh.to(tl.int64) * S + offs_m, mask=m_ok, other=0.0)
    k_base = K + b64 * sk_b + kvh * sk_h + offs_d[None, :]
    v_base = V + b64 * sv_b + kvh.to(tl.int64) * sv_h + offs_d[None, :].to(tl.int64) * sv_d
    mask_off = b64 * sm_b + h.to(tl.int64) * sm_h
    dp_row = (DP + b64 * sdp_b + h.to(tl.int64) * sdp_h + offs_m[:, None].to(tl.int64) * sdp_s)
    if CAUSAL and MASK_KIND != 2:
        hi = tl.minimum(S, m0 + BLOCK_M)
    else:
        hi = S
    if WINDOW and MASK_KIND != 2:
        lo = (tl.maximum(0, m0 - window + 1) // BLOCK_N) * BLOCK_N
    else:
        lo = 0
    qi = offs_m[:, None]
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + offs_nb
        n_ok = offs_n < S
        nd = n_ok[:, None] & d_ok[None, :]
        k = tl.load(k_base + offs_n[:, None].to(tl.int64) * sk_s, mask=nd, other=0.0)
        v = tl.load(v_base + offs_n[:, None].to(tl.int64) * sv_s, mask=nd, other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=PREC)                   # [M, N]
        t, keep, dfac = _logits(s, qi, offs_n[None, :], m0, m0 + BLOCK_M - 1, start_n,
                                start_n + BLOCK_N - 1, S, qscale, MASK, mask_off, sm_q, sm_k,
                                mask_fill, window, softcap, CAUSAL, MASK_KIND, PRESCALED, WINDOW,
                                SOFTCAP, not EVEN_N, GRAD_KEEP)
        if TWO_STATS:
            p = tl.exp2((t - mrow[:, None]) - lse[:, None])
        else:
            p = tl.exp2(t - lse[:, None])
        dp = tl.dot(do, tl.trans(v), input_precision=PREC)
        if DPROBS:
            dp += tl.load(dp_row + offs_n[None, :], mask=m_ok[:, None] & n_ok[None, :],
                          other=0.0).to(tl.float32)
        ds = p * (dp - delta[:, None]) * dfac
        if GRAD_KEEP:
            ds = tl.where(keep, ds, 0.0)
        if UPCAST:
            dq += tl.dot(ds.to(K.dtype.element_ty).to(tl.float32), k, input_precision=PREC)
        else:
            dq += tl.dot(ds.to(K.dtype.element_ty), k, input_precision=PREC)
    dq = dq * dscale
    tl.store(DQ + b64 * sdq_b + h * sdq_h + offs_m[:, None].to(tl.int64) * sdq_s
             + offs_d[None, :], dq.to(DQ.dtype.element_ty), mask=md)


# ------------------------------------------------------------------------------------- host
MIN_DKDV_PROGRAMS = 512     # about four per multiprocessor of an H100/H200


def group_split(groups: int, programs: int) -> int:
    """The smallest divisor of the group that gives the dK/dV launch MIN_DKDV_PROGRAMS
    programs (its grid is key tiles x B x Hkv: W092 at 2048x1 is 16 x 8 = 128 programs, each
    looping over 12 query heads); 1 where the size is symbolic."""
    programs = static_int(programs)
    if programs is None or programs >= MIN_DKDV_PROGRAMS:
        return 1
    for d in range(1, groups + 1):
        if groups % d == 0 and programs * d >= MIN_DKDV_PROGRAMS:
            return d
    return groups


def _strides3(x, what):
    t, s = x[0], x[1]
    if len(s) != 3:
        raise ValueError(f"flash_bwd.launch: {what} needs (tensor, (stride b, h, s))")
    return t, s


def launch(q, k, v, o, do, *, batch, seq, num_heads, groups, head_dim, scale, causal, prec, cfg,
           ml=None, lse=None, mask=None, mask_kind=0, mask_fill=float("-inf"), window=0,
           softcap=0.0, empty_zero=False, upcast=False, probs=None, dprobs=None, dqkv=None,
           grad_dtype=None, split=None):
    """The attention backward: three launches; returns (dq, dk, dv), or (dqkv,) when ``dqkv``
    is given.

    q, k, o, do: (tensor, (stride b, h, s)) of [B, S, heads, D]-strided views with unit d stride
    (flash.launch's form; o and do as flash.launch's o [B, S, H*D] gives (S*H*D, D, H*D)); v:
    (tensor, (stride b, h, s, d)). The forward's statistics: ``ml`` (flash MODE 1's [B*H*S*2]
    float32 (max, sum) pairs, base 2) or ``lse`` ([B*H*S] float32, base-2 log-sum-exp of the
    scaled scores); exactly one. ``scale``, ``causal``, ``mask``/``mask_kind``/``mask_fill``,
    ``window``, ``softcap``, ``empty_zero``: the forward's own arguments (scale the effective
    multiplier). ``dprobs``: the gradient flowing into the returned probabilities [B, H, S, S]
    (unit last stride), with ``probs`` the forward's probabilities. ``cfg``: a BackwardConfig.
    Gradients are written new: dq [B*S, H*D], dk and dv [B*S, Hkv*D] contiguous, in
    ``grad_dtype`` (default q's dtype); or, with ``dqkv``, a whole [B*S, ld] buffer (unit column
    stride) taking dq, dk, dv as its column blocks [0, H*D), [H*D, H*D + Hkv*D), and the next
    Hkv*D columns (the fused QKV projection's layout). ``split``: how many parts of each KV
    group the dK/dV kernel spreads over programs (their float32 partial sums are then added;
    default ``group_split``; 1 with ``dqkv``)."""
    if (ml is None) == (lse is None):
        raise ValueError("flash_bwd.launch: pass exactly one of ml (max, sum) and lse")
    if (dprobs is None) != (probs is None):
        raise ValueError("flash_bwd.launch: a gradient into the probabilities needs them "
                         "(probs and dprobs together)")
    if num_heads % groups:
        raise ValueError("flash_bwd.launch: num_heads must be a multiple of groups")
    (qt, sq), (kt, sk), (ot, so), (dot, sdo) = (_strides3(q, "q"), _strides3(k, "k"),
                                                _strides3(o, "o"), _strides3(do, "do"))
    vt, sv = v
    if len(sv) != 4:
        raise ValueError("flash_bwd.launch: v needs (tensor, (stride b, h, s, d))")
    if not (qt.dtype == kt.dtype == vt.dtype == dot.dtype):
        raise ValueError("flash_bwd.launch: q, k, v and do must share a dtype (o may differ)")
    h, d = num_heads, head_dim
    hk = h // groups
    dev = qt.device
    block_d = max(16, next_pow2(d))
    rows = batch * h * seq
    dprobs_on = dprobs is not None
    sp = (probs.stride(0), probs.stride(1), probs.stride(2)) if dprobs_on else (0, 0, 0)
    sdp = (dprobs.stride(0), dprobs.stride(1), dprobs.stride(2)) if dprobs_on else (0, 0, 0)
    if dprobs_on and (probs.stride(3) != 1 or dprobs.stride(3) != 1):
        raise ValueError("flash_bwd.launch: probs and dprobs need a unit last stride")
    # 1. D and the log-sum-exp
    # finite fills and additive masks can make a row's max a huge finite number, beside which
    # log2(sum) vanishes in m + log2(sum): the max is then kept apart
    two = mask_kind in (2, 3)
    lse_out = torch.empty((rows,), device=dev, dtype=torch.float32)
    mrow = torch.empty((rows,), device=dev, dtype=torch.float32) if two else None
    delta = torch.empty((rows,), device=dev, dtype=torch.float32)
    stats = ml if ml is not None else lse
    res = _launch(
        bwd_preprocess_kernel, (cdiv(seq, cfg.pre_m), batch * h),
        ["LSE", "DELTA"] + (["MROW"] if two else []),
        num_warps=4, num_stages=1, O=ot, DO=dot, ML=stats,
        P=probs if dprobs_on else ot, DP=dprobs if dprobs_on else ot, LSE=lse_out,
        MROW=mrow if two else ot, DELTA=delta,
        so_b=so[0], so_h=so[1], so_s=so[2], sdo_b=sdo[0], sdo_h=sdo[1], sdo_s=sdo[2],
        sp_b=sp[0], sp_h=sp[1], sp_s=sp[2], sdp_b=sdp[0], sdp_h=sdp[1], sdp_s=sdp[2],
        H=h, S=seq, D=d, BLOCK_D=block_d, BLOCK_M=cfg.pre_m, BLOCK_N=64,
        STATS=0 if ml is not None else 1, EMPTY_ZERO=bool(empty_zero), DPROBS=dprobs_on,
        TWO_STATS=two)
    lse_out, delta = res[0], res[1]
    mrow = res[2] if two else lse_out
    # 2. dK, dV
    fill = log2_units(float(mask_fill)) if mask_kind == 2 else 0.0
    can_empty = mask_kind in (1, 3) or (mask_kind == 2 and fill == float("-inf"))
    common = dict(
        Q=qt, K=kt, V=vt, DO=dot, LSE=lse_out, MROW=mrow, DELTA=delta,
        MASK=mask if mask is not None else qt, DP=dprobs if dprobs_on else qt,
        sq_b=sq[0], sq_h=sq[1], sq_s=sq[2], sk_b=sk[0], sk_h=sk[1], sk_s=sk[2],
        sv_b=sv[0], sv_h=sv[1], sv_s=sv[2], sv_d=sv[3], sdo_b=sdo[0], sdo_h=sdo[1],
        sdo_s=sdo[2], **dict(zip(("sm_b", "sm_h", "sm_q", "sm_k"),
                                 mask.stride() if mask is not None else (0, 0, 0, 0))),
        sdp_b=sdp[0], sdp_h=sdp[1], sdp_s=sdp[2],
        H=h, G=groups, S=seq, qscale=float(scale) * LOG2E,
        mask_fill=fill if math.isfinite(fill) else 0.0, window=int(window),
        softcap=float(softcap) * LOG2E,
        D=d, BLOCK_D=block_d, CAUSAL=bool(causal), MASK_KIND=int(mask_kind), PREC=prec,
        UPCAST=bool(upcast), NAN_ROWS=bool(can_empty and not empty_zero), WINDOW=window > 0,
        SOFTCAP=softcap > 0, DPROBS=dprobs_on, TWO_STATS=two,
        FILL_INF=0 if math.isfinite(fill) else (1 if fill > 0 else -1))
    gdt = grad_dtype or qt.dtype
    prescaled = qt.dtype == torch.float32
    kscale = LN2 if prescaled else float(scale)
    if dqkv is not None:
        if dqkv.stride(-1) != 1 or dqkv.shape[-1] < (h + 2 * hk) * d:
            raise ValueError("flash_bwd.launch: dqkv must be [B*S, >= (H + 2*Hkv)*D] with unit "
                             "column stride")
        ld = dqkv.stride(0)
        (dqkv,) = _launch(
            bwd_dkdv_kernel, (cdiv(seq, cfg.kv_n), batch * hk), ["DK"], num_warps=cfg.warps,
            num_stages=cfg.stages, DK=dqkv, DV=dqkv, sdk_b=seq * ld, sdk_h=d, sdk_s=ld,
            dk_col=h * d, dv_col=(h + hk) * d, kscale=kscale, BLOCK_M=cfg.kv_m,
            BLOCK_N=cfg.kv_n, KV_SHARED=True, split=1, sdk_part=0, **common)
        dq_t, sdq = dqkv, (seq * ld, d, ld)
    else:
        split = group_split(groups, cdiv(seq, cfg.kv_n) * batch * hk) if split is None else split
        if groups % split:
            raise ValueError(f"flash_bwd.launch: split {split} must divide the group {groups}")
        # split parts: float32 partial sums, added below
        pdt = gdt if split == 1 else torch.float32
        rows_kv = batch * seq
        dk = torch.empty((split, rows_kv, hk * d), device=dev, dtype=pdt)
        dv = torch.empty((split, rows_kv, hk * d), device=dev, dtype=pdt)
        dk, dv = _launch(
            bwd_dkdv_kernel, (cdiv(seq, cfg.kv_n), batch * hk * split), ["DK", "DV"],
            num_warps=cfg.warps, num_stages=cfg.stages, DK=dk, DV=dv, sdk_b=seq * hk * d,
            sdk_h=d, sdk_s=hk * d, dk_col=0, dv_col=0, kscale=kscale, BLOCK_M=cfg.kv_m,
            BLOCK_N=cfg.kv_n, KV_SHARED=False, split=split, sdk_part=rows_kv * hk * d,
            **common)
        if split == 1:
            dk, dv = dk[0], dv[0]
        else:
            dk, dv = dk.sum(0).to(gdt), dv.sum(0).to(gdt)
        dq_t = torch.empty((batch * seq, h * d), device=dev, dtype=gdt)
        sdq = (seq * h * d, d, h * d)
    # 3. dQ
    s_static = static_int(seq)
    (dq_t,) = _launch(
        bwd_dq_kernel, (cdiv(seq, cfg.q_m), batch * h), ["DQ"], num_warps=cfg.warps,
        num_stages=cfg.stages, DQ=dq_t, sdq_b=sdq[0], sdq_h=sdq[1], sdq_s=sdq[2],
        dscale=float(scale), BLOCK_M=cfg.q_m, BLOCK_N=cfg.q_n,
        EVEN_N=s_static is not None and s_static % cfg.q_n == 0, **common)
    if dqkv is not None:
        return (dq_t,)
    return dq_t, dk, dv
