"""Decode attention for grouped-query attention: a few query tokens against a KV cache,
split over the context (flash-decoding), then a log-sum-exp merge of the splits.

* Packing: a program takes every query head of one KV group and every query token of the step
  (G * Sq rows, head-major: row = g * Sq + t), padded with masked rows to at least 16 so that
  ``tl.dot`` runs on tensor cores; each K/V element of the context is then read once per group
  (per ``max_m`` rows: a larger group x tokens product is cut into row blocks).
* Which keys a query token sees: its position p (``positions`` [B, Sq], or derived from the
  rows' cache lengths): keys 0..p (causal alignment), and with WINDOW only those with
  p - j < window; keys past the cache (Smax) never. A row block reads only the key range
  [lo, hi) its tokens can see: keys past a row's length (or before its window) are never read.
* Split-KV: programs over (batch, KV head, row block) x splits. A row's key range is cut into
  ``tl.num_programs(1)`` chunks of at least ``min_chunk`` keys (a multiple of BLOCK_N), so short
  rows use fewer splits; a split with nothing left writes the neutral partial (max -inf, sum 0,
  output 0). Each split writes its unnormalized output with its row max and sum of exp (base 2);
  a max and a sum kept apart (not their log-sum-exp) keep huge finite masks exact
  (finfo.min fills: the row max rounds m + log2(l) back to m).
* Masks as in flash.py, applied in the order scale, softcap (``tanh(s / c) * c``), mask tensor
  (bool_keep, bool_fill, additive), then the position rule: keys a token cannot see stay
  invisible even under a finite bool fill (they are unwritten cache slots).
* The combine launch merges the splits of each output row: weights 2^(m_s - max m), divides
  by the merged sum, and writes o [B, Sq, Hq * D] (the rows o_proj reads, as flash.py writes).
  A row that sees no key gives zeros (EMPTY_ZERO, SDPA's rule) or NaN (an explicit softmax's).
"""

from __future__ import annotations

import dataclasses
import math

import torch
import triton
import triton.language as tl

from .flash import LOG2E, MASK_CODES, log2_units, masked_scores
from .launch import cdiv, interpreting, launch as _launch, next_pow2, static_int


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """The split launch's tile: ``block_n`` keys per loop step, warps, pipeline stages; at most
    ``max_m`` packed query rows per program; a split takes at least ``min_chunk`` keys."""
    block_n: int
    warps: int
    stages: int
    max_m: int = 64
    min_chunk: int = 256


# Not timed yet (no GPU run of this kernel so far): first guesses sized so that the K and V
# tiles of every stage fit shared memory (``smem_estimate``); the first that fits is the default.
# float32: with IEEE products (FMA, no tensor cores) 4 warps at 32 keys spill (ptxas, sm_90,
# head_dim 128: 175 stores to local memory per program); 8 warps at 32 rows do not
C = DecodeConfig
B16_CONFIGS = [C(64, 4, 3), C(128, 4, 3), C(64, 4, 4), C(64, 8, 3), C(32, 4, 4), C(32, 4, 3)]
F32_CONFIGS = [C(32, 8, 2, max_m=32), C(16, 4, 4, max_m=32), C(32, 4, 3), C(64, 4, 2)]
INTERPRET_CONFIG = C(16, 4, 1, max_m=16, min_chunk=16)
SMEM_BUDGET = 160 * 1024
MAX_SPLITS = 128
PROGRAMS_PER_SM = 2     # splits are added until the split launch has about this many per SM
COMBINE_WARPS = 2
COMBINE_SPLITS = 16     # splits the combine merges per step


def smem_estimate(c: DecodeConfig, head_dim: int, elem: int) -> int:
    """A rough footprint: K and V tiles of every stage and the packed q tile."""
    d = next_pow2(head_dim)
    return (2 * max(1, c.stages) * c.block_n + c.max_m) * d * elem


def choose_config(head_dim: int, dtype: torch.dtype) -> DecodeConfig:
    """The default config of a head size and cache dtype (the first candidate that fits)."""
    if interpreting():
        return INTERPRET_CONFIG
    elem = dtype.itemsize
    for c in (F32_CONFIGS if elem == 4 else B16_CONFIGS):
        if smem_estimate(c, head_dim, elem) <= SMEM_BUDGET:
            return c
    return C(16, 4, 2, max_m=16)


# ----------------------------------------------------------------------------------- kernels
@triton.jit
def _dot(a, b, PREC: tl.constexpr, UPCAST: tl.constexpr):
    """a @ b with fp32 accumulation (16-bit operands upcast in the interpreter, whose 16-bit
    products are inexact)."""
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, input_precision=PREC)


@triton.jit
def _key_range(pos, row_ok, window, SMAX, WINDOW: tl.constexpr):
    """[lo, hi): the keys some row of the block can see (rows with a negative position see
    none); empty when lo >= hi."""
    live = row_ok & (pos >= 0)
    hi = tl.minimum(tl.max(tl.where(live, pos, -1), 0) + 1, SMAX)
    if WINDOW:
        lo = tl.maximum(tl.min(tl.where(live, pos, SMAX), 0) - window + 1, 0)
    else:
        lo = hi * 0
    return lo, hi


@triton.jit
def _logits(s, pos, offs_n, n_ok, row_ok, mask_rows, sm_k, qscale, softcap, mask_fill, window,
            MASK_KIND: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr):
    """Scores of one key tile in log2 units: scale, softcap, the mask tensor, then the
    position rule (and keys outside this split, ``n_ok``) as -inf."""
    s = s * qscale
    if SOFTCAP:
        s = softcap * (2.0 * tl.sigmoid(s * (2.0 / softcap)) - 1.0)     # softcap * tanh(s/cap)
    if MASK_KIND != 0:
        mv = tl.load(mask_rows[:, None] + offs_n[None, :].to(tl.int64) * sm_k,
                     mask=row_ok[:, None] & n_ok[None, :], other=0)
        s = masked_scores(s, mv, mask_fill, MASK_KIND)
    ok = n_ok[None, :] & (offs_n[None, :] <= pos[:, None])
    if WINDOW:
        ok = ok & (pos[:, None] - offs_n[None, :] < window)
    return tl.where(ok, s, float("-inf"))


@triton.jit
def decode_split_kernel(
        Q, K, V, POS, MASK, PO, PML,
        sq_b, sq_s, sq_h, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, sp_b, sp_s,
        sm_b, sm_h, sm_q, sm_k,
        HKV, G, SQ, SMAX, min_chunk, qscale, softcap, mask_fill, window,
        D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        MASK_KIND: tl.constexpr, FILL_INF: tl.constexpr, WINDOW: tl.constexpr,
        SOFTCAP: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr):
    # float arguments arrive as fp64 from Inductor's launcher, as fp32 from Triton's
    qscale = tl.cast(qscale, tl.float32)
    softcap = tl.cast(softcap, tl.float32)
    mask_fill = tl.cast(mask_fill, tl.float32)
    if FILL_INF != 0:   # an infinite fill travels as a switch: generated code has no inf literal
        mask_fill = FILL_INF * float("inf")
    # program (b * HKV + kv head, row block) x split
    n_rows = G * SQ
    m_blocks = tl.cdiv(n_rows, BLOCK_M)
    pid = tl.program_id(0)
    split = tl.program_id(1)
    n_split = tl.num_programs(1)
    bk = pid // m_blocks
    b = bk // HKV
    kvh = bk - b * HKV
    rows = (pid - bk * m_blocks) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n_rows
    g = rows // SQ
    t = rows - g * SQ
    h = kvh * G + g
    b64 = b.to(tl.int64)
    pos = tl.load(POS + b64 * sp_b + t * sp_s, mask=row_ok, other=-1).to(tl.int32)

    # this split's share of the keys the block sees: equal chunks of whole key tiles, at
    # least min_chunk keys each (short rows leave the last splits empty)
    lo, hi = _key_range(pos, row_ok, window, SMAX, WINDOW)
    chunk = tl.maximum(tl.cdiv(tl.maximum(hi - lo, 0), n_split), min_chunk)
    chunk = tl.cdiv(chunk, BLOCK_N) * BLOCK_N
    start = lo + split * chunk
    end = tl.minimum(start + chunk, hi)

    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    q = tl.load(Q + b64 * sq_b + t[:, None] * sq_s + h[:, None] * sq_h + offs_d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    k_base = K + b64 * sk_b + kvh.to(tl.int64) * sk_h + offs_d[None, :]
    v_base = V + b64 * sv_b + kvh.to(tl.int64) * sv_h + offs_d[None, :]
    mask_rows = MASK + b64 * sm_b + h.to(tl.int64) * sm_h + t.to(tl.int64) * sm_q
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < end
        kv_ok = n_ok[:, None] & d_ok[None, :]
        k = tl.load(k_base + offs_n[:, None].to(tl.int64) * sk_s, mask=kv_ok, other=0.0)
        s = _dot(q, tl.trans(k), PREC, UPCAST)
        s = _logits(s, pos, offs_n, n_ok, row_ok, mask_rows, sm_k, qscale, softcap, mask_fill,
                    window, MASK_KIND, WINDOW, SOFTCAP)
        # online softmax in base 2; a row with nothing visible yet keeps max -inf, sum 0
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_use[:, None])
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + offs_n[:, None].to(tl.int64) * sv_s, mask=kv_ok, other=0.0)
        acc = acc * alpha[:, None] + _dot(p.to(V.dtype.element_ty), v, PREC, UPCAST)
        m_i = m_new

    # the partial: [B, HKV, splits, G * SQ] rows of D outputs and (max, sum)
    part = (bk * n_split + split).to(tl.int64) * n_rows + rows
    tl.store(PML + part * 2, m_i, mask=row_ok)
    tl.store(PML + part * 2 + 1, l_i, mask=row_ok)
    tl.store(PO + part[:, None] * D + offs_d[None, :], acc, mask=row_ok[:, None] & d_ok[None, :])


@triton.jit
def decode_combine_kernel(
        PO, PML, O, so_b, so_s, HKV, G, SQ, n_split,
        D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
        EMPTY_ZERO: tl.constexpr):
    # program: one output row (b, query head, token), in the partials' row order
    n_rows = G * SQ
    pid = tl.program_id(0)
    bk = pid // n_rows
    r = pid - bk * n_rows
    b = bk // HKV
    g = r // SQ
    t = r - g * SQ
    h = (bk - b * HKV) * G + g
    first = (bk * n_split).to(tl.int64) * n_rows + r       # split 0's partial row
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    # the largest split max, then the splits weighted by 2^(m_s - max)
    m_top = tl.full([BLOCK_S], float("-inf"), tl.float32)
    for s0 in range(0, n_split, BLOCK_S):
        part = first + (s0 + offs_s).to(tl.int64) * n_rows
        m = tl.load(PML + part * 2, mask=s0 + offs_s < n_split, other=float("-inf"))
        m_top = tl.maximum(m_top, m)
    m_all = tl.max(m_top, 0)
    m_use = tl.where(m_all == float("-inf"), 0.0, m_all)
    l_sum = tl.zeros([BLOCK_S], tl.float32)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for s0 in range(0, n_split, BLOCK_S):
        s_ok = s0 + offs_s < n_split
        part = first + (s0 + offs_s).to(tl.int64) * n_rows
        m = tl.load(PML + part * 2, mask=s_ok, other=float("-inf"))
        w = tl.exp2(m - m_use)
        l_sum += w * tl.load(PML + part * 2 + 1, mask=s_ok, other=0.0)
        po = tl.load(PO + part[:, None] * D + offs_d[None, :], mask=s_ok[:, None] & d_ok[None, :],
                     other=0.0)
        acc += tl.sum(w[:, None] * po, 0)
    l_all = tl.sum(l_sum, 0)
    if EMPTY_ZERO:      # SDPA's rule: a row that sees no key attends to nothing (zeros)
        o = tl.where(l_all > 0.0, acc / l_all, 0.0)
    else:               # softmax's: 0 / 0, NaN, as eager gives
        o = acc / l_all
    o_ptrs = O + b.to(tl.int64) * so_b + t * so_s + h * D + offs_d
    tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=d_ok)


# ----------------------------------------------------------------------------------- host
def split_count(programs, context, num_sms: int, cfg: DecodeConfig) -> int:
    """Splits per row block: enough for about PROGRAMS_PER_SM programs per SM (``programs``:
    the launch's programs without splitting, counted at batch 1 when the batch is symbolic),
    no more than the context (``context``: Smax, None when symbolic) has chunks of
    ``min_chunk`` keys, at most MAX_SPLITS. Rows shorter than the cache use fewer on device."""
    n = cdiv(PROGRAMS_PER_SM * num_sms, programs)
    if context is not None:
        n = min(n, cdiv(max(1, context), cfg.min_chunk))
    return max(1, min(n, MAX_SPLITS))


def positions_of(seqlens: torch.Tensor, num_tokens) -> torch.Tensor:
    """Positions [B, Sq] (int32) of the last ``num_tokens`` tokens of rows whose cache holds
    ``seqlens`` [B] tokens (the new ones included)."""
    steps = torch.arange(num_tokens, device=seqlens.device, dtype=torch.int32)
    return seqlens.to(torch.int32)[:, None] - num_tokens + steps[None, :]


def _check(q, k_cache, v_cache, positions, mask, mask_kind):
    b, sq, hq, d = q.shape
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError("decode.launch: k_cache and v_cache must both be [B, Hkv, Smax, D]")
    hkv = k_cache.shape[1]
    if k_cache.shape[0] != b or k_cache.shape[3] != d or hq % hkv:
        raise ValueError(f"decode.launch: q {tuple(q.shape)} does not match the cache "
                         f"{tuple(k_cache.shape)}")
    if any(t.stride(-1) != 1 for t in (q, k_cache, v_cache)):
        raise ValueError("decode.launch: q and the caches need a unit stride over D")
    if positions.dim() != 2 or positions.shape[1] != sq or positions.is_floating_point():
        raise ValueError("decode.launch: positions must be an int [B, Sq] tensor")
    if mask_kind not in MASK_CODES:
        raise ValueError(f"decode.launch: mask_kind {mask_kind!r} not in {list(MASK_CODES)}")
    if (mask is None) != (mask_kind == "none"):
        raise ValueError("decode.launch: a mask needs its mask_kind, and a mask_kind its mask")


def launch(q, k_cache, v_cache, *, scale, positions=None, seqlens=None, window=0, softcap=0.0,
           mask=None, mask_kind="none", mask_fill=float("-inf"), empty_zero=True, prec="ieee",
           num_sms=132, num_splits=None, cfg=None, out_dtype=None):
    """Attention of q [B, Sq, Hq, D] over the caches [B, Hkv, Smax, D] (strided views, unit
    stride over D); returns o [B, Sq, Hq * D] (``out_dtype``, q's by default).

    ``positions`` [B, Sq] int (any strides, e.g. a broadcast cache_position): each query
    token's position, keys 0..p visible; or ``seqlens`` [B] int: each row's cache length, the
    Sq tokens being its last. ``window`` (> 0): only keys j with p - j < window; ``softcap``
    (> 0): tanh(s / c) * c after the scale. ``mask`` broadcastable to [B, Hq, Sq, Smax]
    (bool or float) with ``mask_kind`` one of flash.MASK_CODES and ``mask_fill`` for
    bool_fill. ``empty_zero``: a token that sees no key gives zeros (SDPA), else NaN.
    ``prec``: tl.dot's float32 precision ("ieee", "tf32"). ``num_splits``: the split count
    (default ``split_count`` from the batch, the context and ``num_sms``); ``cfg``: a
    DecodeConfig (default ``choose_config``)."""
    if (positions is None) == (seqlens is None):
        raise ValueError("decode.launch: pass exactly one of positions and seqlens")
    b, sq, hq, d = q.shape
    if positions is None:
        positions = positions_of(seqlens, sq)
    _check(q, k_cache, v_cache, positions, mask, mask_kind)
    hkv, smax = k_cache.shape[1], k_cache.shape[2]
    g = hq // hkv
    cfg = cfg or choose_config(d, k_cache.dtype)
    block_m = max(16, min(next_pow2(g * sq), cfg.max_m))
    m_blocks = cdiv(g * sq, block_m)
    if num_splits is None:
        programs = (static_int(b) or 1) * hkv * m_blocks
        num_splits = split_count(programs, static_int(smax), num_sms, cfg)
    code = MASK_CODES[mask_kind]
    if code:
        mask = torch.broadcast_to(mask, (b, hq, sq, smax))
        mask = mask.view(torch.uint8) if mask.dtype == torch.bool else mask
    fill = log2_units(float(mask_fill)) if code == 2 else 0.0
    n_part = b * hkv * num_splits * g * sq
    po = torch.empty(n_part, d, dtype=torch.float32, device=q.device)
    pml = torch.empty(n_part, 2, dtype=torch.float32, device=q.device)
    sm = mask.stride() if code else (0, 0, 0, 0)
    block_d = max(16, next_pow2(d))
    po, pml = _launch(
        decode_split_kernel, (b * hkv * m_blocks, num_splits), ["PO", "PML"],
        num_warps=cfg.warps, num_stages=cfg.stages,
        Q=q, K=k_cache, V=v_cache, POS=positions, MASK=mask if code else q, PO=po, PML=pml,
        sq_b=q.stride(0), sq_s=q.stride(1), sq_h=q.stride(2),
        sk_b=k_cache.stride(0), sk_h=k_cache.stride(1), sk_s=k_cache.stride(2),
        sv_b=v_cache.stride(0), sv_h=v_cache.stride(1), sv_s=v_cache.stride(2),
        sp_b=positions.stride(0), sp_s=positions.stride(1),
        sm_b=sm[0], sm_h=sm[1], sm_q=sm[2], sm_k=sm[3],
        HKV=hkv, G=g, SQ=sq, SMAX=smax, min_chunk=cfg.min_chunk,
        qscale=float(scale) * LOG2E, softcap=float(softcap) * LOG2E,
        mask_fill=fill if math.isfinite(fill) else 0.0, window=int(window),
        D=d, BLOCK_D=block_d, BLOCK_M=block_m, BLOCK_N=cfg.block_n, MASK_KIND=code,
        FILL_INF=0 if math.isfinite(fill) else (1 if fill > 0 else -1),
        WINDOW=window > 0, SOFTCAP=softcap > 0, PREC=prec,
        UPCAST=interpreting() and k_cache.dtype != torch.float32)
    o = torch.empty(b, sq, hq * d, dtype=out_dtype or q.dtype, device=q.device)
    (o,) = _launch(
        decode_combine_kernel, (b * hq * sq,), ["O"], num_warps=COMBINE_WARPS, num_stages=1,
        PO=po, PML=pml, O=o, so_b=o.stride(0), so_s=o.stride(1), HKV=hkv, G=g, SQ=sq,
        n_split=num_splits, D=d, BLOCK_D=block_d,
        BLOCK_S=min(COMBINE_SPLITS, max(2, next_pow2(num_splits))), EMPTY_ZERO=bool(empty_zero))
    return o
