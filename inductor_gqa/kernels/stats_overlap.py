"""The stats pass (flash.py's MODE 1) with each key tile's product under the previous tile's
exponentials (Gluon, Hopper).

Why: the stats pass computes, per row, the max and the sum of exponentials of q @ k^T. At
head_dim 64 a score costs 64 MMA MACs and one MUFU exponential, and on sm_90 the two take about
the same time, so the pass is fastest when they overlap. flash.py's Triton loop waits for each
warpgroup MMA right after issuing it (``WARPGROUP.DEPBAR`` after the ``HGMMA``s, with or without
its PIPELINE switch), so a warpgroup alternates between MMA and exponentials and only other
programs on the SM can fill the gaps (measured: the MUFU pipe ~58% busy at 4096x1).

Here, as in FlashAttention-3's intra-warpgroup pipelining, iteration j issues tile j + 1's MMA
asynchronously, computes tile j's exponentials while it runs, and waits for it at the end of the
iteration (no MMA in flight across the loop's back edge, which ptxas would serialize).

Outputs exactly what flash.py's MODE 1 writes, so its probabilities pass (MODE 2) reads them:
per row of (batch, head), ML[2 * r] = the row's max of scale * s in log2 units and ML[2 * r + 1]
= the sum of 2^(scale * s - max), r = (b * H + h) * S + row.

Scope: probs_staged's operands (``probs_staged.operands_ok``: fp16 rows 16-byte aligned, no mask
tensor, scale > 0, head_dim a power of two in [16, 128]), causal or not, Hopper, Gluon
importable. The Triton CPU interpreter does not run Gluon: checked on the GPU
(perf/experiments/stats_overlap_bench.py) and compiled for sm_90 on the CPU.
"""

from __future__ import annotations

import torch

from . import pdl, probs_staged
from .host import cdiv

HAVE_GLUON = probs_staged.HAVE_GLUON
LOG2E = probs_staged.LOG2E

# (BLOCK_M, BLOCK_N, warps, K stages): the tuner's candidates beside flash.py's MODE 1 configs
CONFIGS = [(64, 128, 4, 2), (64, 128, 4, 3), (64, 64, 4, 3), (64, 64, 4, 4)]

if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, tma, warpgroup_mma,
                                                                  warpgroup_mma_wait)

    _block_barrier = probs_staged._block_barrier

    @gluon.jit
    def _load_k(t, n, k_desc, k_smem, k_bar, kv_row, kvh, D: gl.constexpr,
                BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
        """K tile t of the row (if any) into ring slot t % STAGES."""
        if t < n:
            slot = t % STAGES
            mbarrier.expect(k_bar.index(slot), BLOCK_N * D * 2)
            tma.async_copy_global_to_shared(k_desc, [kv_row + t * BLOCK_N, kvh * D],
                                            k_bar.index(slot), k_smem.index(slot))

    @gluon.jit
    def _online(s, j, m_i, l_i, m0, S, qscale, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                LAST: gl.constexpr, CAUSAL: gl.constexpr, NW: gl.constexpr):
        """Tile j's scores into the rows' running (max, sum), log2 units. Only the row's last
        tile (``LAST``) can cross the sequence end or, with BLOCK_N a multiple of BLOCK_M, the
        diagonal: the others take no masks, and no branch sits between an MMA's issue and its
        wait (ptxas waits at once across one)."""
        if LAST:
            s_layout: gl.constexpr = probs_staged._s_layout(BLOCK_N, NW)
            cols = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
            s = gl.where(gl.expand_dims(cols < S, 0), s, float("-inf"))
            if CAUSAL:
                rows = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
                s = gl.where(gl.expand_dims(rows, 1) >= gl.expand_dims(cols, 0), s,
                             float("-inf"))
        # qscale > 0 commutes with the max (one FMA per score below)
        m_new = gl.maximum(m_i, gl.max(s, 1) * qscale)
        m_u = gl.where(m_new == float("-inf"), 0.0, m_new)
        p = gl.exp2(gl.fma(s, qscale, -gl.expand_dims(m_u, 1)))
        l_i = l_i * gl.exp2(m_i - m_u) + gl.sum(p, 1)
        return m_new, l_i

    @gluon.jit
    def stats_overlap_kernel(q_desc, k_desc, ML, FLAG, H, G, S, qscale,
                             D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                             STAGES: gl.constexpr, CAUSAL: gl.constexpr, GUARD: gl.constexpr,
                             num_warps: gl.constexpr, PDL: gl.constexpr = 0):
        """One row tile (BLOCK_M rows of one head) per program; grid (row tiles, B * H)."""
        probs_staged._wait_for_predecessor(PDL)
        if GUARD == 1:
            if gl.load(FLAG) != 0:
                return
        n_m = gl.num_programs(0)
        tile = gl.program_id(1) * n_m + gl.program_id(0)
        bh, b, h, kvh, m0 = probs_staged._tile_coords(tile, n_m, H, G, BLOCK_M)
        kv_row = b * S
        s_layout: gl.constexpr = probs_staged._s_layout(BLOCK_N, num_warps)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)

        q_smem = gl.allocate_shared_memory(q_desc.dtype, [BLOCK_M, D], q_desc.layout)
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, D], k_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_bar.index(i), count=1)

        if CAUSAL:
            hi = gl.minimum(S, m0 + BLOCK_M)    # key tiles past the diagonal add nothing
        else:
            hi = S
        n = (hi + BLOCK_N - 1) // BLOCK_N

        mbarrier.expect(q_bar, BLOCK_M * D * 2)
        tma.async_copy_global_to_shared(q_desc, [kv_row + m0, h * D], q_bar, q_smem)
        for i in gl.static_range(STAGES):
            _load_k(i, n, k_desc, k_smem, k_bar, kv_row, kvh, D, BLOCK_N, STAGES)

        s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_s)
        l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
        mbarrier.wait(q_bar, 0)
        mbarrier.wait(k_bar.index(0), 0)
        k_t = k_smem.index(0).permute((1, 0))
        tok = warpgroup_mma(q_smem, k_t, s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(0, deps=(tok, q_smem, k_t))[0]
        for j in range(n - 1):
            # tile j's slot is free once every warp holds its scores: refill it
            _block_barrier()
            _load_k(j + STAGES, n, k_desc, k_smem, k_bar, kv_row, kvh, D, BLOCK_N, STAGES)
            nxt = (j + 1) % STAGES
            mbarrier.wait(k_bar.index(nxt), ((j + 1) // STAGES) & 1)
            k_t = k_smem.index(nxt).permute((1, 0))
            # tile j + 1's product runs while tile j's exponentials are computed
            tok = warpgroup_mma(q_smem, k_t, s_zero, use_acc=False, is_async=True)
            m_i, l_i = _online(s, j, m_i, l_i, m0, S, qscale, BLOCK_M, BLOCK_N, False, CAUSAL,
                               num_warps)
            s = warpgroup_mma_wait(0, deps=(tok, q_smem, k_t))[0]
        m_i, l_i = _online(s, n - 1, m_i, l_i, m0, S, qscale, BLOCK_M, BLOCK_N, True, CAUSAL,
                           num_warps)

        rows = m0 + gl.arange(0, BLOCK_M, layout=row_s)
        ml = ML + (bh.to(gl.int64) * S + rows) * 2
        gl.store(ml, m_i, mask=rows < S)
        gl.store(ml + 1, l_i, mask=rows < S)
        mbarrier.invalidate(q_bar)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(k_bar.index(i))


def smem_bytes(head_dim, cfg) -> int:
    block_m, block_n, _, stages = cfg[:4]
    return 2 * block_m * head_dim + 2 * stages * block_n * head_dim + 8 * (stages + 1)


def supported(q16, k16, v16, head_dim, mask_kind, scale, cfg) -> bool:
    """Where this kernel may replace flash.py's stats pass (module docstring)."""
    return (probs_staged.operands_ok(q16, k16, v16, head_dim, mask_kind, scale)
            and _shape_ok(head_dim, cfg))


def _shape_ok(head_dim, cfg) -> bool:
    return (cfg[0] == 16 * cfg[2] and cfg[1] % cfg[0] == 0
            and smem_bytes(head_dim, cfg) <= probs_staged.SMEM_PER_BLOCK)


def candidates(q16, k16, v16, head_dim, mask_kind, scale):
    """The configs of ``CONFIGS`` this block may run, tagged for the tuner."""
    if not (HAVE_GLUON and probs_staged.available(q16.device)
            and probs_staged.operands_ok(q16, k16, v16, head_dim, mask_kind, scale)):
        return []
    return [("overlap",) + c for c in CONFIGS if _shape_ok(head_dim, c)]


def launch(q16, k16, ml, flag, batch, seq, num_heads, groups, head_dim, scale, causal, cfg,
           guard=0):
    """q16 [B*S, >= H*D], k16 [B*S, >= Hkv*D] fp16 row-major views (row stride ``.stride(0)``,
    unit column stride); ml float32 [B*H*S*2] (flash.py's ML); ``guard`` 1 exits at once if
    ``flag`` is set. ``cfg``: (BLOCK_M, BLOCK_N, warps, stages), optionally after the "overlap"
    tag."""
    if cfg and cfg[0] == "overlap":
        cfg = cfg[1:]
    block_m, block_n, num_warps, stages = cfg[:4]
    if not supported(q16, k16, k16, head_dim, 0, scale, cfg):
        raise ValueError(f"stats_overlap.launch: head_dim={head_dim}, {q16.dtype} not covered "
                         f"by config {cfg}")
    if ml.dtype != torch.float32 or not ml.is_contiguous() or \
            ml.numel() < batch * num_heads * seq * 2:
        raise ValueError("stats_overlap.launch: ml must be contiguous float32 [B*H*S*2]")
    q_desc, k_desc, _ = probs_staged.descriptors(q16, k16, None, batch * seq, num_heads, groups,
                                                 head_dim, block_m, block_n)
    grid = (cdiv(seq, block_m), batch * num_heads)
    stats_overlap_kernel[grid](q_desc, k_desc, ml, flag if guard else ml, num_heads, groups, seq,
                               float(scale) * LOG2E, D=head_dim, BLOCK_M=block_m,
                               BLOCK_N=block_n, STAGES=stages, CAUSAL=bool(causal),
                               GUARD=int(guard), num_warps=num_warps,
                               **pdl.launch_options(q16.device))
