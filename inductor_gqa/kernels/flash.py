"""Flash-attention forward for grouped-query attention, one template with constexpr switches.

* GQA natively: program (m-tile, b*H + h) reads KV head h // groups straight from the projection
  output (strided [B, S, heads, D] views); programs of query heads that share a KV head are
  adjacent in launch order, so its K/V tiles are served from L2. repeat_kv is never formed.
* MODE 0: one pass, online softmax (no probabilities). EMPTY_ZERO: a wholly masked row gives
  zeros (SDPA's rule) instead of 0 / 0 (an explicit softmax's NaN). STORE_ML: it also stores
  its final row statistics in MODE 1's layout (training: flash_bwd.py reads them).
  MODE 1 + MODE 2: the probabilities path. Pass 1 stores per-row max and sum of exp (base 2);
  pass 2 recomputes the scores, writes the normalized probabilities exactly once and accumulates
  P @ V. No other S x S tensor exists.
  MODE 3: the probabilities path in one launch when a whole row fits one key tile (BLOCK_N >= S,
  the host's guarantee): exact row max and sum, then the same store and P @ V.
  MODE 4: MODE 1 then MODE 2 in the same program, row tile by row tile: the pair in one launch,
  for the guarded fallback (two passes in one launch are slower where speed counts).
* Masks, in the eager order: scale, logit softcapping (SOFTCAP), causal (-inf), sliding window
  (WINDOW, -inf), bool_fill (mask_fill), bool_keep (-inf), additive. Key tiles wholly above the
  diagonal, or wholly before a row tile's window, are skipped (and, for probabilities, written
  as zeros without computing) except with bool_fill, whose finite fill overrides the -inf.
* Scores are kept in log2 units: the scale times log2(e) is folded into q once per tile for
  float32 (one multiply per q element instead of two per score); additive masks and fills are
  scaled by log2(e) to match. 16-bit q is not rescaled (that would add a rounding of q).
* V may come K-major (V_KMAJOR: [B, Hkv, D, S]-strided, the layout a V^T GEMM writes): Hopper's
  TF32 MMA takes only K-major operands, so the float32 P @ V product then runs as one warpgroup
  MMA instead of a slower fallback (-20% time for the probabilities pass at S=4096 on the H200).
* PIPELINE: the key loop computes the next tile's q @ k^T before the current tile's softmax (and
  stores), a loop-carried product that Triton turns into asynchronous warpgroup MMAs overlapping
  the exps and stores; without it every MMA is followed by a wait (sm_90 SASS, docs/kernels.md).
  Costs one unused product per program (the tile after the last).
* GUARD (float32 blocks run with fp16 q/k/V copies, qk_epilogue's F16): 1 = run only if FLAG is
  zero (the fp16 copies are exact roundings), 2 = run only if it is not (a value left fp16's range:
  the float32 operands are used instead). Both launches are made; one exits at once.
* Output goes directly to [B, S, H*D] (strided), ready for o_proj; with GUARD 1 it may be fp16
  (for an fp16 o_proj), and a row outside fp16's useful range raises FLAG.
* Ragged S: every tile is masked on the sequence bounds; EVEN_N (S a multiple of BLOCK_N, from
  the host) drops the per-score key bound.
* GP: a program's BLOCK_M rows are GP query heads of one KV head (BLOCK_M // GP positions each),
  so a K/V tile is loaded once for all of them (H200, probabilities pass: 326 -> 307 us at
  4096x1, 102 -> 95 at 512x16); results are bitwise those of GP 1.
* FOLD (no mask tensor, scale > 0, from the host): 16-bit q is multiplied by the scale inside the
  exponent's argument, one FMA per score (``_shifted``), instead of a multiply and a subtract.
* ROW4 (S and the probabilities' row stride multiples of 4 but not of 16): both rewritten as
  (x // 4) * 4 in the kernel, so the compiler sees 16-byte aligned rows and stores 16 bytes at a
  time (H200, one-launch probabilities at 452x16: 109 -> 97 us).
* ALIGN4 (probabilities stored, S % 4 != 0, no causal mask, GP 1; ``align4_ok``): rows not
  16-byte aligned make every store 32-bit. A program then takes rows of one residue class mod 4,
  whose probability rows all start at the same offset mod 4 (DELTA), and shifts its key tiles
  DELTA columns left: whole 4-column groups go out as 16-byte stores, the partial groups at a
  row's ends one by one (H200, probabilities pass at 449x16: 120 -> 110 us).
* PERSIST (the guarded fallback's launches, GUARD 2): GUARDED_PROGRAMS programs loop over the
  tiles, so the launch is cheap when the flag is clear.

EVEN_N, ROW4 and ALIGN4 depend on S's value: they apply where S is static, never under dynamic
shapes (no guard on S is added for them).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .launch import cdiv, launch as _launch, next_pow2, static_int

FP16_MIN_NORMAL = tl.constexpr(2.0 ** -14)   # fp16's smallest normal (the copies' range rule)

MASK_CODES = {"none": 0, "bool_keep": 1, "bool_fill": 2, "additive": 3}
LOG2E = 1.4426950408889634
_FLT_MAX = 3.4028234663852886e38
FLT_MAX = tl.constexpr(_FLT_MAX)


def log2_units(x: float) -> float:
    """Host twin of ``to_log2_units`` for the mask fill value."""
    if math.isinf(x) or math.isnan(x):
        return x
    return max(-_FLT_MAX, min(_FLT_MAX, x * LOG2E))


@triton.jit
def _qk(q, k_base, sk_s, offs_n, S, d_ok, PREC: tl.constexpr, UPCAST: tl.constexpr,
        SHIFTED: tl.constexpr = False):
    """Raw q @ k^T for the key tile at offs_n (rows past S, or before 0 when SHIFTED, read as
    zeros)."""
    n_ok = offs_n < S
    if SHIFTED:
        n_ok = n_ok & (offs_n >= 0)
    k = tl.load(k_base + offs_n[:, None].to(tl.int64) * sk_s,
                mask=n_ok[:, None] & d_ok[None, :], other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
    return tl.dot(q, tl.trans(k), input_precision=PREC)


@triton.jit
def _scores(s, offs_m, offs_n, m0, m_last, n0, S, qscale, mask_ptr, mrow_off, sm_k, mask_fill,
            window, softcap, CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr,
            PRESCALED: tl.constexpr, EXP_SCALE: tl.constexpr, EVEN_N: tl.constexpr,
            SHIFTED: tl.constexpr = False, WINDOW: tl.constexpr = False,
            SOFTCAP: tl.constexpr = False):
    """Scores of one tile from q @ k^T, in log2 units (scale * log2(e) applied), masks in the
    eager order; with EXP_SCALE still unscaled (``_row_max`` and ``_shifted`` scale them).
    m0, m_last, n0: the tile's first and last query row, its first key column. SOFTCAP: the
    logits capped, softcap * tanh(s / softcap) (``softcap`` in log2 units, as the scores),
    before any mask. The causal, window and sequence-bound selects run only in tiles that cross
    the diagonal, the window's edge or a sequence end (a uniform branch instead of a select per
    score in every tile). WINDOW: key j visible from query i only when i - j < window."""
    if not PRESCALED and not EXP_SCALE:
        s = s * qscale
    if SOFTCAP:
        s = softcap * (2.0 * tl.sigmoid(s * (2.0 / softcap)) - 1.0)     # softcap * tanh(s/cap)
    BN: tl.constexpr = s.shape[1]
    if CAUSAL:
        if n0 + BN - 1 > m0:
            s = tl.where(offs_m[:, None] >= offs_n[None, :], s, float("-inf"))
    if WINDOW:
        if m_last - n0 >= window:
            s = tl.where(offs_m[:, None] - offs_n[None, :] < window, s, float("-inf"))
    valid_n = offs_n < S
    if SHIFTED:
        valid_n = valid_n & (offs_n >= 0)
    if MASK_KIND != 0:
        mm = (offs_m[:, None] < S) & valid_n[None, :]
        mv = tl.load(mask_ptr + mrow_off[:, None] + offs_n[None, :].to(tl.int64) * sm_k, mask=mm,
                     other=0)
        s = masked_scores(s, mv, mask_fill, MASK_KIND)
    if not EVEN_N:
        if (n0 + BN > S) | (n0 < 0):
            s = tl.where(valid_n[None, :], s, float("-inf"))
    return s


@triton.jit
def _row_max(t, qscale, EXP_SCALE: tl.constexpr):
    """Row maxima of ``_scores`` in log2 units (qscale > 0 with EXP_SCALE: the scale commutes
    with the maximum, and rounding of the product is monotonic, so this equals the maximum of
    the scaled scores)."""
    m = tl.max(t, 1)
    if EXP_SCALE:
        m = m * qscale
    return m


@triton.jit
def _shifted(t, m, qscale, EXP_SCALE: tl.constexpr):
    """t - m per row, in log2 units: with EXP_SCALE the scale is applied here in one FMA (one
    instruction per score fewer than scaling the scores first)."""
    if EXP_SCALE:
        z = tl.fma(t, qscale, -m[:, None])
    else:
        z = t - m[:, None]
    return z


@triton.jit
def to_log2_units(x):
    # x * log2(e), with finite values kept finite: a finfo.min mask must not overflow to -inf,
    # or a row it masks wholly would turn from eager's uniform row into NaN
    y = tl.minimum(tl.maximum(x * 1.4426950408889634, -FLT_MAX), FLT_MAX)
    return tl.where((x == float("inf")) | (x == float("-inf")), x, y)


@triton.jit
def masked_scores(s, mv, mask_fill, MASK_KIND: tl.constexpr):
    """Scores in log2 units after a tile ``mv`` of the mask tensor (MASK_KIND 1: bool keep,
    2: bool fill with ``mask_fill``, already in log2 units, 3: additive)."""
    if MASK_KIND == 1:
        s = tl.where(mv != 0, s, float("-inf"))
    elif MASK_KIND == 2:
        s = tl.where(mv != 0, mask_fill, s)
    else:
        s = s + to_log2_units(mv.to(tl.float32))
    return s


@triton.jit
def _load_v(v_base, offs_n, n_ok, d_ok, sv_s, V_KMAJOR: tl.constexpr):
    """V tile [BLOCK_N, BLOCK_D]; from a K-major layout it is loaded as [BLOCK_D, BLOCK_N] and
    transposed in registers, so the MMA sees a K-major operand."""
    # one return: Triton compiles the statements after a return inside a constexpr branch too
    if V_KMAJOR:
        v = tl.trans(tl.load(v_base + offs_n[None, :].to(tl.int64) * sv_s,
                             mask=d_ok[:, None] & n_ok[None, :], other=0.0))
    else:
        v = tl.load(v_base + offs_n[:, None].to(tl.int64) * sv_s,
                    mask=n_ok[:, None] & d_ok[None, :], other=0.0)
    return v


@triton.jit
def gqa_attention_kernel(
        Q, K, V, O, P, MASK, ML, FLAG,
        sq_b, sq_h, sq_s, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, sv_d, so_b, so_s, so_h,
        sp_b, sp_h, sp_s, sm_b, sm_h, sm_q, sm_k,
        H, G, S, qscale, mask_fill, window, softcap,
        D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, MODE: tl.constexpr, PREC: tl.constexpr,
        UPCAST: tl.constexpr, V_KMAJOR: tl.constexpr, PIPELINE: tl.constexpr,
        GUARD: tl.constexpr, GP: tl.constexpr = 1,
        FOLD: tl.constexpr = False, EVEN_N: tl.constexpr = False,
        ALIGN4: tl.constexpr = False, PERSIST: tl.constexpr = False, N_BH=1,
        ROW4: tl.constexpr = False, EMPTY_ZERO: tl.constexpr = False,
        FILL_INF: tl.constexpr = 0, WINDOW: tl.constexpr = False,
        SOFTCAP: tl.constexpr = False, RT=None, RT_SCALE: tl.constexpr = 0,
        STORE_ML: tl.constexpr = False):
    # float arguments arrive as fp64 from Inductor's launcher, as fp32 from Triton's
    qscale = tl.cast(qscale, tl.float32)
    if RT_SCALE != 0:   # a runtime scale (dynamic=True keeps float arguments as values): RT[0]
        qscale = tl.load(RT).to(tl.float32)
        if RT_SCALE == 2:       # the explicit chain's division
            qscale = 1.0 / qscale
        qscale = qscale * 1.4426950408889634
    mask_fill = tl.cast(mask_fill, tl.float32)
    softcap = tl.cast(softcap, tl.float32)
    if FILL_INF != 0:   # an infinite fill travels as a switch: generated code has no inf literal
        mask_fill = FILL_INF * float("inf")
    if ROW4:
        # S and the probabilities' row stride are multiples of 4 (launch: row4); written so
        # that the compiler sees it (a hint on an argument is not kept): the rows start
        # 16-byte aligned and the column masks hold over four columns, so stores are 16-byte
        sp_s = (sp_s // 4) * 4
        S = (S // 4) * 4
    if GUARD == 1:
        if tl.load(FLAG) != 0:
            return
    if GUARD == 2:
        if tl.load(FLAG) == 0:
            return
    # the row tiles this program takes: its own, or (PERSIST, the guarded float32 fallback) every
    # num_programs-th of them, so that a launch whose flag is clear costs a few programs only
    if PERSIST:
        first = tl.program_id(0)
        n_tiles = tl.cdiv(S, BLOCK_M // GP) * N_BH
        step = tl.num_programs(0)
    else:
        first = 0
        n_tiles = 1
        step = 1
    # MODE 4: MODE 1 then MODE 2 on the same row tile (a tile's probabilities need only its own
    # rows' statistics), for the guarded fallback: one launch instead of two; the barriers make
    # the statistics one thread stored visible to the thread that reads them, and keep a looping
    # program's next tile from racing these reads
    FIRST: tl.constexpr = 1 if MODE == 4 else MODE
    LAST: tl.constexpr = 2 if MODE == 4 else MODE
    for tile in range(first, n_tiles, step):
        if PERSIST:
            start_m = tile // N_BH
            bh = tile % N_BH
        else:
            start_m = tl.program_id(0)
            bh = tl.program_id(1)
        for pass_mode in tl.static_range(FIRST, LAST + 1):
            _attention_tile(start_m, bh, Q, K, V, O, P, MASK, ML, FLAG,
                            sq_b, sq_h, sq_s, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, sv_d, so_b,
                            so_s, so_h, sp_b, sp_h, sp_s, sm_b, sm_h, sm_q, sm_k, H, G, S,
                            qscale, mask_fill, window, softcap, D, BLOCK_D, BLOCK_M, BLOCK_N,
                            CAUSAL, MASK_KIND, pass_mode, PREC, UPCAST, V_KMAJOR, PIPELINE,
                            GUARD, GP, FOLD, EVEN_N, ALIGN4, EMPTY_ZERO, WINDOW, SOFTCAP,
                            STORE_ML)
            if MODE == 4:
                tl.debug_barrier()


@triton.jit
def _attention_tile(
        start_m, bh, Q, K, V, O, P, MASK, ML, FLAG,
        sq_b, sq_h, sq_s, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, sv_d, so_b, so_s, so_h,
        sp_b, sp_h, sp_s, sm_b, sm_h, sm_q, sm_k,
        H, G, S, qscale, mask_fill, window, softcap,
        D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, MODE: tl.constexpr, PREC: tl.constexpr,
        UPCAST: tl.constexpr, V_KMAJOR: tl.constexpr, PIPELINE: tl.constexpr,
        GUARD: tl.constexpr, GP: tl.constexpr, FOLD: tl.constexpr, EVEN_N: tl.constexpr,
        ALIGN4: tl.constexpr, EMPTY_ZERO: tl.constexpr, WINDOW: tl.constexpr,
        SOFTCAP: tl.constexpr, STORE_ML: tl.constexpr):
    # MR query positions per program; with GP > 1 its BLOCK_M rows are GP query heads of one KV
    # head (head-major blocks of MR rows), so each K/V tile it loads serves all of them
    MR: tl.constexpr = BLOCK_M // GP
    if GP == 1:
        b = bh // H
        h = bh - b * H
        kvh = h // G
        if ALIGN4:
            # rows of one residue class mod 4: their probability rows all start at the same
            # offset mod 4 (DELTA below), so one shift of the key tile aligns every row's stores
            offs_m = start_m % 4 + 4 * ((start_m // 4) * BLOCK_M + tl.arange(0, BLOCK_M))
        else:
            offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        hh = h              # each row's query head
        hcol = h
        row_bh = bh
    else:
        b = bh // (H // GP)
        h = (bh - b * (H // GP)) * GP
        kvh = h // G
        rows = tl.arange(0, BLOCK_M)
        offs_m = start_m * MR + rows % MR
        hh = h + rows // MR
        hcol = hh[:, None]
        row_bh = b * H + hh
    m0 = start_m * MR       # the tile's first row (causal tiles; ALIGN4 is never causal)
    offs_d = tl.arange(0, BLOCK_D)
    offs_nb = tl.arange(0, BLOCK_N)
    m_ok = offs_m < S
    d_ok = offs_d < D
    b64 = b.to(tl.int64)
    q_ptrs = Q + b64 * sq_b + hcol * sq_h + offs_m[:, None].to(tl.int64) * sq_s + offs_d[None, :]
    q = tl.load(q_ptrs, mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    PRESCALED: tl.constexpr = Q.dtype.element_ty == tl.float32
    EXP_SCALE: tl.constexpr = FOLD and not PRESCALED
    if PRESCALED:
        q = q * qscale
    k_base = K + b64 * sk_b + kvh * sk_h + offs_d[None, :]
    if V_KMAJOR:
        v_base = V + b64 * sv_b + kvh.to(tl.int64) * sv_h + offs_d[:, None].to(tl.int64) * sv_d
    else:
        v_base = V + b64 * sv_b + kvh.to(tl.int64) * sv_h + offs_d[None, :].to(tl.int64) * sv_d
    mrow_off = b64 * sm_b + hh.to(tl.int64) * sm_h + offs_m.to(tl.int64) * sm_q

    if CAUSAL and MASK_KIND != 2:
        hi = tl.minimum(S, (start_m + 1) * MR)
    else:
        hi = S
    # a window skips the key tiles wholly before the first row's window (probabilities there:
    # zeros, written once), except where a finite bool_fill can override the -inf
    if WINDOW and MASK_KIND != 2 and MODE != 3:
        lo = (tl.maximum(0, start_m * MR - window + 1) // BLOCK_N) * BLOCK_N
    else:
        lo = 0

    ml_off = row_bh.to(tl.int64) * S + offs_m
    if MODE == 2:
        m_i = tl.load(ML + ml_off * 2, mask=m_ok, other=0.0)
        l_i = tl.load(ML + ml_off * 2 + 1, mask=m_ok, other=1.0)
        # the row's log-sum-exp (base 2): dividing by l becomes part of the exponent, one
        # multiply per probability fewer (a row with l == 0, wholly masked, gives NaN as eager)
        m_use2 = tl.where(m_i == float("-inf"), 0.0, m_i)
        if MASK_KIND != 0:
            # a mask tensor can make a row's maximum a huge finite value (finfo.min fills):
            # m + log2(l) would round to m there, so subtract the two one after the other
            log_l = tl.log2(l_i)
            lse = m_use2
        else:
            log_l = 0.0
            lse = m_use2 + tl.log2(l_i)
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if ALIGN4:
        # ragged S (rows not 16-byte aligned): key tiles start DELTA columns early, so column
        # a - DELTA of a row sits at an aligned address; whole 4-column groups are stored as
        # 16-byte vectors, the partial groups at either end of a row one by one
        tl.static_assert(GP == 1 and not CAUSAL and MODE >= 2)
        row_off = b64 * sp_b + h.to(tl.int64) * sp_h + offs_m[:, None].to(tl.int64) * sp_s
        DELTA = ((b64 * sp_b + h.to(tl.int64) * sp_h + (start_m % 4).to(tl.int64) * sp_s)
                 % 4).to(tl.int32)
        p_row = P + (row_off // 4) * 4
        hi = hi + DELTA
    else:
        DELTA = 0
        if MODE >= 2:
            p_row = (P + b64 * sp_b + hcol.to(tl.int64) * sp_h
                     + offs_m[:, None].to(tl.int64) * sp_s)
    if PIPELINE:
        s_next = _qk(q, k_base, sk_s, lo + offs_nb - DELTA, S, d_ok, PREC, UPCAST, ALIGN4)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n - DELTA + offs_nb
        if EVEN_N:
            n_ok = tl.full([BLOCK_N], 1, tl.int1)
        elif ALIGN4:
            n_ok = (offs_n < S) & (offs_n >= 0)
        else:
            n_ok = offs_n < S
        if PIPELINE:
            # the next tile's product is issued before this tile's softmax and stores, and the
            # compiler then lets the two overlap (asynchronous warpgroup MMA)
            s = s_next
            s_next = _qk(q, k_base, sk_s, offs_n + BLOCK_N, S, d_ok, PREC, UPCAST, ALIGN4)
        else:
            s = _qk(q, k_base, sk_s, offs_n, S, d_ok, PREC, UPCAST, ALIGN4)
        t = _scores(s, offs_m, offs_n, m0, m0 + MR - 1, start_n - DELTA, S, qscale, MASK,
                    mrow_off, sm_k, mask_fill, window, softcap, CAUSAL, MASK_KIND, PRESCALED,
                    EXP_SCALE, EVEN_N, ALIGN4, WINDOW, SOFTCAP)
        if MODE >= 2:
            if MODE == 3:   # the only tile of the row: its exact statistics first
                m_i = _row_max(t, qscale, EXP_SCALE)
                m_use = tl.where(m_i == float("-inf"), 0.0, m_i)
                p = tl.exp2(_shifted(t, m_use, qscale, EXP_SCALE))
                l_i = tl.sum(p, 1)
                p = p * (1.0 / l_i)[:, None]
            else:
                if MASK_KIND != 0:
                    p = tl.exp2(_shifted(t, lse, qscale, EXP_SCALE) - log_l[:, None])
                else:
                    p = tl.exp2(_shifted(t, lse, qscale, EXP_SCALE))
            p_out = p.to(P.dtype.element_ty)
            if ALIGN4:
                a = start_n + offs_nb
                grp = start_n - DELTA + (offs_nb // 4) * 4       # each 4-group's first column
                whole = (grp >= 0) & (grp + 4 <= S)
                tl.store(p_row + a[None, :], p_out, mask=m_ok[:, None] & whole[None, :],
                         eviction_policy="evict_first")
                if (start_n == 0) | (start_n + BLOCK_N > S + DELTA - 4):
                    tl.store(p_row + a[None, :], p_out,
                             mask=m_ok[:, None] & (n_ok & ~whole)[None, :],
                             eviction_policy="evict_first")
            else:
                tl.store(p_row + offs_n[None, :], p_out, mask=m_ok[:, None] & n_ok[None, :],
                         eviction_policy="evict_first")
            v = _load_v(v_base, offs_n, n_ok, d_ok, sv_s, V_KMAJOR)
            if UPCAST:
                acc += tl.dot(p_out.to(tl.float32), v.to(tl.float32), input_precision=PREC)
            else:
                acc += tl.dot(p_out.to(V.dtype.element_ty), v, input_precision=PREC)
        else:
            m_new = tl.maximum(m_i, _row_max(t, qscale, EXP_SCALE))
            m_u = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp2(_shifted(t, m_u, qscale, EXP_SCALE))
            alpha = tl.exp2(m_i - m_u)
            l_i = l_i * alpha + tl.sum(p, 1)
            m_i = m_new
            if MODE == 0:
                v = _load_v(v_base, offs_n, n_ok, d_ok, sv_s, V_KMAJOR)
                acc = acc * alpha[:, None]
                if UPCAST:
                    acc += tl.dot(p.to(V.dtype.element_ty).to(tl.float32), v.to(tl.float32),
                                  input_precision=PREC)
                else:
                    acc += tl.dot(p.to(V.dtype.element_ty), v, input_precision=PREC)
    if MODE == 1 or (MODE == 0 and STORE_ML):
        # the row statistics (MODE 0: the backward's, flash_bwd.py, in MODE 1's layout)
        tl.store(ML + ml_off * 2, m_i, mask=m_ok)
        tl.store(ML + ml_off * 2 + 1, l_i, mask=m_ok)
    if MODE != 1:
        if MODE == 2:
            # causal tiles above the diagonal and tiles before the window: zeros, written once,
            # nothing computed
            zeros = tl.zeros([BLOCK_M, BLOCK_N], P.dtype.element_ty)
            for start_n in range(0, lo, BLOCK_N):
                offs_n = start_n + offs_nb
                tl.store(p_row + offs_n[None, :], zeros, mask=m_ok[:, None],
                         eviction_policy="evict_first")
            for start_n in range(hi, S, BLOCK_N):
                offs_n = start_n + offs_nb
                tl.store(p_row + offs_n[None, :], zeros, mask=m_ok[:, None] & (offs_n < S)[None, :],
                         eviction_policy="evict_first")
        elif MODE == 0:
            if EMPTY_ZERO:      # SDPA's rule: a wholly masked row attends to nothing (zeros)
                acc = tl.where(l_i[:, None] > 0.0, acc / l_i[:, None], 0.0)
            else:               # softmax's: 0 / 0, NaN, as eager gives
                acc = acc / l_i[:, None]
        o_ptrs = (O + b64 * so_b + hcol * so_h + offs_m[:, None].to(tl.int64) * so_s
                  + offs_d[None, :])
        tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])
        if GUARD == 1:
            _flag_o16(acc, m_ok, d_ok, offs_m, FLAG, O.dtype.element_ty == tl.float16)


@triton.jit
def _flag_o16(acc, m_ok, d_ok, offs_m, FLAG, O16: tl.constexpr):
    if O16:
        # an fp16 output for the fp16 o_proj: the same range rule as the q/k/V copies
        # (qk_epilogue._store16), per row of this head; a raised flag sends the block to the
        # float32 fallback launches that follow
        a = tl.where(m_ok[:, None] & d_ok[None, :], tl.abs(acc), 0.0)
        rmax = tl.max(a, 1)
        bad = ((rmax > 0.0) & (rmax < FP16_MIN_NORMAL)) | (rmax >= 65504.0)
        # one predicated atomic per bad row, no reduction across the program's warps
        tl.atomic_max(FLAG + tl.zeros_like(offs_m), 1, mask=bad)


def align4_ok(seq, mode, causal, gp, block_n):
    """Where ALIGN4 applies: probabilities stored (MODE 2 or 3) with rows not 16-byte aligned
    (S % 4 != 0), no causal mask, one query head per program; MODE 3's single key tile must
    still cover a row shifted by up to 3 columns."""
    return (mode in (2, 3) and seq % 4 != 0 and not causal and gp == 1
            and (mode == 2 or block_n >= seq + 3))




GUARDED_PROGRAMS = 128      # about one per H200 SM: a guarded launch whose flag is clear is cheap


def row4(probs_row_stride, seq) -> bool:
    """ROW4 applies: both multiples of 4 that Triton's launcher does not mark (it marks
    multiples of 16)."""
    sp, s = static_int(probs_row_stride), static_int(seq)
    return (sp is not None and s is not None and sp % 4 == 0 and s % 4 == 0
            and (sp % 16 != 0 or s % 16 != 0))


def launch(q, k, v, o=None, *, batch, seq, num_heads, groups, head_dim, scale, causal, mode, prec,
           cfg, probs=None, ml=None, mask=None, mask_kind=0, mask_fill=float("-inf"),
           flag=None, guard=0, v_kmajor=False, upcast=False, empty_zero=False, window=0,
           softcap=0.0, runtime=None, scale_div=False, store_ml=False):
    """One attention launch; returns the new values of the tensors it writes, in the order
    (o, probs, ml, flag) restricted to those this MODE writes.

    q, k: (tensor, (stride b, h, s)) of [B, S, heads, D]-strided views with unit d stride; v:
    (tensor, (stride b, h, s, d)), K-major (stride s == 1) when ``v_kmajor``; o [B, S, H*D]
    (float32, or fp16 with GUARD 1: the fp16 o_proj's operand); probs [B, H, S, S]; ml
    [B*H*S*2] float32 (the row statistics of MODE 1, read by MODE 2); mask broadcast to
    [B, H, S, S]; ``cfg``: an ``AttentionConfig`` (plan/configs.py). ``runtime``: a float32
    device tensor whose element 0 is the scale (a runtime value; ``scale`` is then unused), a
    divisor when ``scale_div``. ``store_ml`` (MODE 0): also write the row statistics into ``ml``
    as MODE 1 does, for the backward (flash_bwd.py)."""
    gp, block_m, block_n = cfg.gp, cfg.block_m, cfg.block_n
    if gp < 1 or groups % gp or block_m % gp:
        raise ValueError(f"flash.launch: {gp} query heads per program must divide the group "
                         f"({groups}) and the row tile ({block_m})")
    if guard and flag is None:
        raise ValueError("flash.launch: a guarded launch needs the flag")
    (qt, sq), (kt, sk), (vt, sv) = q, k, v
    dummy = qt      # pointers a MODE never touches
    fill = log2_units(float(mask_fill)) if mask_kind == 2 else 0.0
    s_static = static_int(seq)
    align4 = (bool(cfg.align4) and s_static is not None and not window
              and align4_ok(s_static, mode, causal, gp, block_n))
    if align4:
        grid = (4 * cdiv(cdiv(s_static, 4), block_m), batch * num_heads)
    else:
        grid = (cdiv(seq, block_m // gp), batch * num_heads // gp)
    persist = guard == 2 and not align4
    n_bh = grid[1]
    if persist:
        grid = (GUARDED_PROGRAMS, 1)
    writes_o = mode != 1
    writes_p = mode in (2, 3, 4)
    writes_ml = mode in (1, 4) or (mode == 0 and bool(store_ml))
    writes_flag = guard == 1 and writes_o and o.dtype == torch.float16
    if (writes_o and o is None) or (writes_p and probs is None) or (
            (writes_ml or mode == 2) and ml is None):
        raise ValueError(f"flash.launch: MODE {mode} needs o, probs and/or ml")
    sp = (probs.stride(0), probs.stride(1), probs.stride(2)) if probs is not None else (0, 0, 0)
    sm = mask.stride() if mask is not None else (0, 0, 0, 0)
    outputs = (["O"] if writes_o else []) + (["P"] if writes_p else []) + (
        ["ML"] if writes_ml else []) + (["FLAG"] if writes_flag else [])
    return _launch(
        gqa_attention_kernel, grid, outputs, num_warps=cfg.warps, num_stages=cfg.stages,
        Q=qt, K=kt, V=vt, O=o if o is not None else dummy,
        P=probs if probs is not None else dummy, MASK=mask if mask is not None else dummy,
        ML=ml if ml is not None else dummy, FLAG=flag if flag is not None else dummy,
        sq_b=sq[0], sq_h=sq[1], sq_s=sq[2], sk_b=sk[0], sk_h=sk[1], sk_s=sk[2],
        sv_b=sv[0], sv_h=sv[1], sv_s=sv[2], sv_d=sv[3],
        so_b=o.stride(0) if o is not None else 0, so_s=o.stride(1) if o is not None else 0,
        so_h=head_dim,
        sp_b=sp[0], sp_h=sp[1], sp_s=sp[2], sm_b=sm[0], sm_h=sm[1], sm_q=sm[2], sm_k=sm[3],
        H=num_heads, G=groups, S=seq, window=int(window),
        qscale=float(scale) * LOG2E if runtime is None else 1.0,
        softcap=float(softcap) * LOG2E,
        mask_fill=fill if math.isfinite(fill) else 0.0,
        FILL_INF=0 if math.isfinite(fill) else (1 if fill > 0 else -1),
        D=head_dim, BLOCK_D=max(16, next_pow2(head_dim)), BLOCK_M=block_m, BLOCK_N=block_n,
        CAUSAL=bool(causal), MASK_KIND=int(mask_kind), MODE=int(mode), PREC=prec,
        UPCAST=bool(upcast), V_KMAJOR=bool(v_kmajor), PIPELINE=bool(cfg.pipeline),
        GUARD=int(guard), GP=int(gp),
        FOLD=mask_kind == 0 and runtime is None and float(scale) > 0 and not softcap,
        EVEN_N=s_static is not None and s_static % block_n == 0 and not align4,
        ALIGN4=align4, PERSIST=persist, N_BH=n_bh,
        ROW4=probs is not None and mode != 1 and row4(sp[2], seq),
        EMPTY_ZERO=bool(empty_zero), WINDOW=window > 0, SOFTCAP=softcap > 0,
        RT=runtime if runtime is not None else dummy,
        RT_SCALE=0 if runtime is None else (2 if scale_div else 1),
        STORE_ML=mode == 0 and bool(store_ml))
