"""The probabilities path in one launch, for rows that fit in shared memory (Gluon, Hopper).

Why: with the probabilities returned, flash.py runs two passes (MODE 1 for each row's max and sum
of exponentials, MODE 2 recomputing q @ k^T and the exponentials to store the normalized
probabilities), because a probability can be stored only once the row's sum is known. When a
row tile fits in shared memory (S up to ~512 keys at 64 rows, two tiles per program), it can
wait for the sum instead of recomputing:

* loop 1, per key tile j: s = q @ k_j^T (warpgroup MMA), the online max m_j and sum, and
  p_j = exp2(s - m_j) staged as fp16 in shared memory with m_j;
* loop 2, per key tile j: the probabilities p_j * exp2(m_j - lse) go out as 16-byte stores
  while the MMA p_j @ V_j runs (its A operand is the staged tile); o += exp2(m_j - lse) * that.

Each score's product and exponential are computed once (the pair computes both twice). Two
kernels share the row-tile code: ``probs_staged_kernel``, one row tile per program, and
``probs_pingpong_kernel``, persistent programs of two warpgroups with their own buffers that
take row tiles in turn, their loop 1s alternating so one's stores run while the other computes
(FlashAttention-3's ping-pong, with the stores in the place of its second GEMM).

The staged fp16 value is relative to the running max (in [0, 1]): its rounding (2^-11 relative
at most, 2^-25 absolute below fp16's normal range) is below the error of the fp16 operand
copies this runs on (the fp16-copies plans of float32 blocks under "high", where TF32 is
allowed); on the H200 the probabilities' largest error against a float64 reference of the same
copies is 1.5e-4 (the pair's 1e-6), W075's tolerance 2.2e-3.

Scope (``supported``): fp16 q/k/V, float32 probabilities, no mask tensor (causal allowed),
scale > 0, head_dim a power of two in [16, 128], rows 16-byte aligned for the copy engine (row
strides of q/k/V), the buffers within an H200 block's shared memory, Hopper (sm_90), Gluon
importable.
Ragged S: key columns past S are masked, rows past S computed and not stored. The copy engine
brings the V rows of those keys from the next batch; their p is 0, but 0 * inf or NaN is NaN.
So these kernels need finite operands: the copies' range rule (qk_epilogue._store16) raises
the flag for any non-finite value, and with it set the GUARD 1 launch exits and the float32
fallback, which loads through masks, keeps each batch's values to itself (zeroing the V rows
here instead cost 119 -> 126 us at 449x16; docs note 39). Outputs as flash.py's MODE 3 with
GUARD 0 or 1: probabilities [B, H, S, S], o [B, S, H*D] (strided), an fp16 o raising FLAG by
flash.py's range rule.

GP ("gp4" configs, docs note 43): a row tile holds BLOCK_M // GP positions of GP query heads of
one KV head (q arrives as GP copy-engine boxes), so each K/V tile serves GP heads; every row is
computed exactly as with one head per tile.

The Triton CPU interpreter does not run Gluon: these kernels are checked on the GPU
(perf/experiments/probs_staged_bench.py, the perf job's checks) and compiled for sm_90 on the
CPU (tests/kernels/test_probs_staged_compile.py).
"""

from __future__ import annotations

import torch

from . import pdl
from .host import capability, cdiv, heads_per_program, row4, sm_count
from .qk_epilogue import FP16_MIN_NORMAL

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    # a barrier across the block's threads: thread_barrier in Triton 3.6, barrier from 3.7
    _block_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
    HAVE_GLUON = True
except ImportError:         # an older Triton: flash.py's passes are the only ones
    HAVE_GLUON = False

LOG2E = 1.4426950408889634
SMEM_PER_BLOCK = 232448     # bytes of shared memory one H100/H200 block may use

# (BLOCK_M, BLOCK_N, warps, K/V stages[, "pp"]): the tuner's candidates, beside flash.py's pair
# and MODE 3; "pp": the ping-pong kernel (two warpgroups of ``warps`` each, persistent)
# (H200, perf/experiments/probs_staged_bench.py: the ping-pong kernel with 128-key tiles is the
# fastest at S in 256..512, the one-tile programs at B*H*S small)
CONFIGS = [(64, 128, 4, 2), (64, 128, 4, 2, "pp"), (64, 64, 4, 3, "pp")]
# "gp4": each row tile holds 16 positions of 4 query heads of one KV head, so a K/V tile the copy
# engine brings serves four heads (flash.py's GP). H200 (probs_staged_bench.py, results bitwise
# equal): the 128-key ping-pong 449x16 118.8 -> 109.9 us, 373x8 40.0 -> 38.6, 512x16 108.8 ->
# 106.1, 512x8 and 512x4 unchanged; the 64-key ping-pong gained nowhere
PACKED_CONFIGS = [(64, 128, 4, 2, "gp4"), (64, 128, 4, 2, "pp", "gp4")]
PINGPONG_REGS = 168         # registers per thread of the second warpgroup


if HAVE_GLUON:
    @gluon.jit
    def _issue(u, t, n_comp, k_desc, v_desc, kv_smem, kv_bar, kv_row, kvh,
               D: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
        """Load t of a row tile's sequence (K tiles 0..n_comp-1, then V tiles), the u + t-th
        load of its warps' ring."""
        if t < 2 * n_comp:
            slot = (u + t) % STAGES
            mbarrier.expect(kv_bar.index(slot), BLOCK_N * D * 2)
            if t < n_comp:
                tma.async_copy_global_to_shared(k_desc, [kv_row + t * BLOCK_N, kvh * D],
                                                kv_bar.index(slot), kv_smem.index(slot))
            else:
                tma.async_copy_global_to_shared(v_desc, [kv_row + (t - n_comp) * BLOCK_N,
                                                         kvh * D],
                                                kv_bar.index(slot), kv_smem.index(slot))

    @gluon.constexpr_function
    def _s_layout(BLOCK_N, NW):
        """The scores' warpgroup-MMA layout."""
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                         instr_shape=[16, BLOCK_N, 16])

    @gluon.constexpr_function
    def _o_layout(D, NW):
        """P @ V's warpgroup-MMA layout."""
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                         instr_shape=[16, D, 16])

    @gluon.constexpr_function
    def _st_layout(BLOCK_N, NW):
        """The stores': 4 consecutive probabilities per thread (one 16-byte store), whole rows
        per warp."""
        tpr = BLOCK_N // 4 if BLOCK_N // 4 < 32 else 32
        return gl.BlockedLayout(size_per_thread=[1, 4], threads_per_warp=[32 // tpr, tpr],
                                warps_per_cta=[NW, 1], order=[1, 0])

    @gluon.jit
    def _stage_loop(u, n_comp, m0, S, qscale, k_desc, v_desc, q_smem, kv_smem, p_smem,
                    m_smem, kv_bar, kv_row, kvh, q_bar, q_loads, tok_wait, tok_phase, tok_pred,
                    D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                    STAGES: gl.constexpr, CAUSAL: gl.constexpr, WS: gl.constexpr,
                    NW: gl.constexpr, GP: gl.constexpr):
        """Loop 1 over the key tiles j * BLOCK_N, j < n_comp (the ring's loads u + j),
        once q has landed (its ``q_loads``-th load of ``q_bar``; with WS, also the other
        warpgroup's token): scores, online max and
        sum; p relative to the running max, staged as fp16 with that max. Returns the rows'
        (max, sum) in log2 units."""
        s_layout: gl.constexpr = _s_layout(BLOCK_N, NW)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        rows_s = m0 + gl.arange(0, BLOCK_M, layout=row_s) % (BLOCK_M // GP)   # positions
        cols_s = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_s)
        l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
        if WS:
            mbarrier.wait(tok_wait, tok_phase, pred=tok_pred)
        mbarrier.wait(q_bar, q_loads & 1)
        for j in range(n_comp):
            # every warp is past its wait on the MMA that read the slot refilled here
            _block_barrier()
            _issue(u, j + STAGES - 1, n_comp, k_desc, v_desc, kv_smem, kv_bar, kv_row, kvh, D,
                   BLOCK_N, STAGES)
            slot = (u + j) % STAGES
            mbarrier.wait(kv_bar.index(slot), ((u + j) // STAGES) & 1)
            k_t = kv_smem.index(slot).permute((1, 0))
            s_tok = warpgroup_mma(q_smem, k_t, s_zero, use_acc=False, is_async=True)
            s = warpgroup_mma_wait(0, deps=(s_tok, q_smem, k_t))[0]
            n0 = j * BLOCK_N
            if n0 + BLOCK_N > S:
                s = gl.where(gl.expand_dims(n0 + cols_s < S, 0), s, float("-inf"))
            if CAUSAL:
                if n0 + BLOCK_N - 1 > m0:
                    s = gl.where(gl.expand_dims(rows_s, 1) >= gl.expand_dims(n0 + cols_s, 0),
                                 s, float("-inf"))
            # qscale > 0 commutes with the max (log2 units, one FMA per score below)
            m_new = gl.maximum(m_i, gl.max(s, 1) * qscale)
            m_u = gl.where(m_new == float("-inf"), 0.0, m_new)
            p = gl.exp2(gl.fma(s, qscale, -gl.expand_dims(m_u, 1)))
            l_i = l_i * gl.exp2(m_i - m_u) + gl.sum(p, 1)
            m_i = m_new
            p_smem.index(j).store(p.to(gl.float16))
            m_smem.index(j).store(m_u)
        return m_i, l_i

    @gluon.jit
    def _store_loop(u, n_comp, lse_st, lse_o, p_rows, row_ok, S, k_desc, v_desc,
                    kv_smem, p_smem, m_smem, kv_bar, kv_row, kvh,
                    D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                    STAGES: gl.constexpr, NW: gl.constexpr):
        """Loop 2 over the staged tiles: the probabilities p * 2^(m_j - lse) out (columns
        j * BLOCK_N on, rows at ``p_rows``, where ``row_ok``) while P @ V_j runs on the staged
        tile (the ring's loads u + n_comp + j); ``lse_st``/``lse_o``: the rows' log-sum-exp in
        the stores' and the o layout. Returns P @ V, normalized, in the o layout."""
        o_layout: gl.constexpr = _o_layout(D, NW)
        st_layout: gl.constexpr = _st_layout(BLOCK_N, NW)
        row_st: gl.constexpr = gl.SliceLayout(1, st_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
        cols_st = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, st_layout))
        o_zero = gl.zeros([BLOCK_M, D], gl.float32, o_layout)
        acc = gl.zeros([BLOCK_M, D], gl.float32, o_layout)
        for j in range(n_comp):
            _block_barrier()
            t = n_comp + j
            _issue(u, t + STAGES - 1, n_comp, k_desc, v_desc, kv_smem, kv_bar, kv_row, kvh, D,
                   BLOCK_N, STAGES)
            slot = (u + t) % STAGES
            mbarrier.wait(kv_bar.index(slot), ((u + t) // STAGES) & 1)
            p_j = p_smem.index(j)
            v_s = kv_smem.index(slot)
            pv_tok = warpgroup_mma(p_j, v_s, o_zero, use_acc=False, is_async=True)
            f = gl.exp2(m_smem.index(j).load(row_st) - lse_st)
            prob = p_j.load(st_layout).to(gl.float32) * gl.expand_dims(f, 1)
            cols = j * BLOCK_N + cols_st
            gl.store(p_rows + gl.expand_dims(cols, 0), prob,
                     mask=row_ok & gl.expand_dims(cols < S, 0), eviction_policy="evict_first")
            pv = warpgroup_mma_wait(0, deps=(pv_tok, p_j, v_s))[0]
            f_o = gl.exp2(m_smem.index(j).load(row_o) - lse_o)
            acc = acc + pv * gl.expand_dims(f_o, 1)
        return acc

    @gluon.jit
    def _store_o(acc, O, FLAG, b, h, m0, so_b, so_s, S,
                 D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                 GUARD: gl.constexpr, NW: gl.constexpr, GP: gl.constexpr):
        """o [B, S, H*D]-strided from the o-layout accumulator; an fp16 o raises FLAG by
        flash.py's range rule (a bad row sends the block to the float32 fallback)."""
        o_layout: gl.constexpr = _o_layout(D, NW)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
        r = gl.arange(0, BLOCK_M, layout=row_o)
        rows_o = m0 + r % (BLOCK_M // GP)
        heads_o = h + r // (BLOCK_M // GP)
        offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
        o_ok = gl.expand_dims(rows_o < S, 1)
        o_ptrs = (O + b.to(gl.int64) * so_b + gl.expand_dims(rows_o.to(gl.int64) * so_s
                                                             + heads_o * D, 1)
                  + gl.expand_dims(offs_d, 0))
        gl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=o_ok)
        if GUARD == 1:
            if O.dtype.element_ty == gl.float16:
                rmax = gl.max(gl.where(o_ok, gl.abs(acc), 0.0), 1)
                bad = ((rmax > 0.0) & (rmax < FP16_MIN_NORMAL)) | (rmax >= 65504.0)
                zero_i = gl.zeros_like(rows_o)
                gl.atomic_max(FLAG + zero_i, zero_i + 1, mask=bad)

    @gluon.jit
    def _tile_coords(tile, n_m, H, G, BLOCK_M: gl.constexpr, GP: gl.constexpr = 1):
        """Row tile ``tile`` (row tiles of one head, or of one group of GP heads, consecutive):
        its (batch * H + first head, batch, first head, KV head, first position). With GP > 1
        a tile's rows are BLOCK_M // GP positions of GP query heads of one KV head, head-major
        (flash.py's GP): each K/V tile loaded serves GP heads."""
        start_m = tile % n_m
        bg = tile // n_m
        b = bg // (H // GP)
        h = (bg - b * (H // GP)) * GP
        return b * H + h, b, h, h // G, start_m * (BLOCK_M // GP)

    @gluon.jit
    def _row_tile(tile, u, nth, q_desc, k_desc, v_desc, O, P, FLAG, so_b, so_s, sp_bh, sp_s,
                  H, G, S, qscale, n_m, q_smem, kv_smem, p_smem, m_smem, q_bar, kv_bar,
                  tok_wait, tok_phase, tok_pred, tok_arrive,
                  D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                  N_TILES: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                  GUARD: gl.constexpr, WS: gl.constexpr, NW: gl.constexpr,
                  GP: gl.constexpr):
        """One row tile (BLOCK_M query rows of one head, or BLOCK_M // GP positions of GP
        heads): loop 1 stages p, loop 2 stores the probabilities and accumulates P @ V. ``u``: loads its warps' K/V ring took before;
        ``nth``: row tiles its warps did before (the q barrier's phase). With WS the loop 1s of
        the two warpgroups take turns (``tok_*``), so one's stores run under the other's
        exponentials. Returns the ring's load count after this tile."""
        bh, b, h, kvh, m0 = _tile_coords(tile, n_m, H, G, BLOCK_M, GP)
        MR: gl.constexpr = BLOCK_M // GP        # positions per tile
        kv_row = b * S              # rows of the [B*S, heads*D] q/k/V views
        st_layout: gl.constexpr = _st_layout(BLOCK_N, NW)
        row_st: gl.constexpr = gl.SliceLayout(1, st_layout)
        col_st: gl.constexpr = gl.SliceLayout(0, st_layout)

        if CAUSAL:
            hi = gl.minimum(S, m0 + MR)         # key tiles past the diagonal are zeros
        else:
            hi = S
        n_comp = (hi + BLOCK_N - 1) // BLOCK_N

        # every warp is done with the previous tile's q, ring slots and staged tiles
        _block_barrier()
        mbarrier.expect(q_bar, BLOCK_M * D * 2)
        for i in gl.static_range(GP):           # one box of MR positions per head
            tma.async_copy_global_to_shared(q_desc, [kv_row + m0, (h + i) * D], q_bar,
                                            q_smem.slice(i * MR, MR))
        for i in gl.static_range(STAGES - 1):
            _issue(u, i, n_comp, k_desc, v_desc, kv_smem, kv_bar, kv_row, kvh, D, BLOCK_N,
                   STAGES)
        m_i, l_i = _stage_loop(u, n_comp, m0, S, qscale, k_desc, v_desc, q_smem, kv_smem,
                               p_smem, m_smem, kv_bar, kv_row, kvh, q_bar, nth, tok_wait,
                               tok_phase, tok_pred, D, BLOCK_M, BLOCK_N, STAGES, CAUSAL, WS, NW,
                               GP)

        # the row's log-sum-exp (base 2); a row with l == 0 (wholly masked) gives NaN, as eager
        lse = gl.where(m_i == float("-inf"), 0.0, m_i) + gl.log2(l_i)
        lse_st = gl.convert_layout(lse, row_st)
        lse_o = gl.convert_layout(lse, gl.SliceLayout(1, _o_layout(D, NW)))
        # the staged tiles are read by other threads and by the MMA's async proxy
        fence_async_shared()
        _block_barrier()
        if WS:
            mbarrier.arrive(tok_arrive)

        r_st = gl.arange(0, BLOCK_M, layout=row_st)
        rows_st = m0 + r_st % MR
        cols_st = gl.arange(0, BLOCK_N, layout=col_st)
        row_ok = gl.expand_dims(rows_st < S, 1)
        p_rows = P + gl.expand_dims((bh + r_st // MR).to(gl.int64) * sp_bh
                                    + rows_st.to(gl.int64) * sp_s, 1)
        # loop 2: the normalized probabilities out, P @ V from the staged tiles
        acc = _store_loop(u, n_comp, lse_st, lse_o, p_rows, row_ok, S, k_desc, v_desc,
                          kv_smem, p_smem, m_smem, kv_bar, kv_row, kvh, D, BLOCK_M, BLOCK_N,
                          STAGES, NW)
        if CAUSAL:
            zeros = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, st_layout)
            for j in range(n_comp, N_TILES):
                cols = j * BLOCK_N + cols_st
                gl.store(p_rows + gl.expand_dims(cols, 0), zeros,
                         mask=row_ok & gl.expand_dims(cols < S, 0),
                         eviction_policy="evict_first")
        _store_o(acc, O, FLAG, b, h, m0, so_b, so_s, S, D, BLOCK_M, BLOCK_N, GUARD, NW, GP)
        return u + 2 * n_comp

    @gluon.jit
    def _smem(q_desc, k_desc, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D: gl.constexpr,
              N_TILES: gl.constexpr, STAGES: gl.constexpr):
        """One warpgroup's buffers: q tile, K/V ring, staged fp16 tiles and their maxima, and
        the barriers of the q and ring loads."""
        p_shared: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N],
                                                                      gl.float16)
        m_shared: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
        q_smem = gl.allocate_shared_memory(q_desc.dtype, [BLOCK_M, D], q_desc.layout)
        kv_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, D], k_desc.layout)
        p_smem = gl.allocate_shared_memory(gl.float16, [N_TILES, BLOCK_M, BLOCK_N], p_shared)
        m_smem = gl.allocate_shared_memory(gl.float32, [N_TILES, BLOCK_M], m_shared)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        kv_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(kv_bar.index(i), count=1)
        return q_smem, kv_smem, p_smem, m_smem, q_bar, kv_bar

    @gluon.jit
    def _multiples_of_4(sp_s, S):
        """ROW4 (``host.row4``): the probabilities' row stride and S, which are multiples of 4,
        as (x // 4) * 4, so that the compiler sees it (16-byte stores; flash.py does the same)."""
        return (sp_s // 4) * 4, (S // 4) * 4

    @gluon.jit
    def _wait_for_predecessor(PDL: gl.constexpr):
        # pdl.wait_for_predecessor for Gluon kernels (the same two PTX instructions)
        if PDL:
            gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [],
                                      dtype=gl.int32, is_pure=False, pack=1)
        if PDL == 2:
            gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [],
                                      dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def probs_staged_kernel(q_desc, k_desc, v_desc, O, P, FLAG, so_b, so_s, sp_bh, sp_s,
                            H, G, S, qscale,
                            D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                            N_TILES: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                            GUARD: gl.constexpr, num_warps: gl.constexpr,
                            PDL: gl.constexpr = 0, GP: gl.constexpr = 1,
                            ROW4: gl.constexpr = False):
        """One row tile per program (grid: row tiles x B*H/GP). ROW4: the probabilities' row
        stride is a multiple of 4 (``row4``)."""
        _wait_for_predecessor(PDL)
        if ROW4:
            sp_s, S = _multiples_of_4(sp_s, S)
        if GUARD == 1:
            if gl.load(FLAG) != 0:
                return
        n_m = gl.num_programs(0)
        tile = gl.program_id(1) * n_m + gl.program_id(0)
        q_smem, kv_smem, p_smem, m_smem, q_bar, kv_bar = _smem(q_desc, k_desc, BLOCK_M, BLOCK_N,
                                                               D, N_TILES, STAGES)
        _row_tile(tile, 0, 0, q_desc, k_desc, v_desc, O, P, FLAG, so_b, so_s, sp_bh, sp_s,
                  H, G, S, qscale, n_m, q_smem, kv_smem, p_smem, m_smem, q_bar, kv_bar,
                  q_bar, 0, False, q_bar,
                  D, BLOCK_M, BLOCK_N, N_TILES, STAGES, CAUSAL, GUARD, False, num_warps, GP)
        mbarrier.invalidate(q_bar)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(kv_bar.index(i))

    @gluon.jit
    def _pingpong_role(role, q_desc, k_desc, v_desc, O, P, FLAG, so_b, so_s, sp_bh, sp_s,
                       H, G, S, qscale, n_m, n_tiles, q_smem, kv_smem, p_smem, m_smem, q_bar,
                       kv_bar, tok,
                       D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                       N_TILES: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                       GUARD: gl.constexpr, NW: gl.constexpr, GP: gl.constexpr,
                       ROW4: gl.constexpr):
        """One warpgroup of the ping-pong kernel: the program's row tiles of parity ``role``.
        Its loop 1 of the program's k-th tile waits for the other warpgroup's loop 1 of tile
        k - 1 (token ``tok[1 - role]``) and then passes its own token."""
        if ROW4:
            sp_s, S = _multiples_of_4(sp_s, S)
        pid = gl.program_id(0)
        nprog = gl.num_programs(0)
        u = 0
        nth = 0
        for tile in range(pid + role * nprog, n_tiles, 2 * nprog):
            # the other warpgroup's arrivals: its nth (role 1) or (nth - 1)-th (role 0)
            other = nth - 1 + role
            u = _row_tile(tile, u, nth, q_desc, k_desc, v_desc, O, P, FLAG, so_b, so_s, sp_bh,
                          sp_s, H, G, S, qscale, n_m, q_smem, kv_smem, p_smem, m_smem, q_bar,
                          kv_bar, tok.index(1 - role), other & 1, other >= 0, tok.index(role),
                          D, BLOCK_M, BLOCK_N, N_TILES, STAGES, CAUSAL, GUARD, True, NW, GP)
            nth += 1

    @gluon.jit
    def probs_pingpong_kernel(q_desc, k_desc, v_desc, O, P, FLAG, so_b, so_s, sp_bh, sp_s,
                              H, G, S, qscale, n_m, n_tiles,
                              D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                              N_TILES: gl.constexpr, STAGES: gl.constexpr,
                              CAUSAL: gl.constexpr, GUARD: gl.constexpr, REGS: gl.constexpr,
                              num_warps: gl.constexpr, PDL: gl.constexpr = 0,
                              GP: gl.constexpr = 1, ROW4: gl.constexpr = False):
        """Persistent programs of two warpgroups, each with its own buffers, taking the
        program's row tiles in turn; their loop 1s alternate, so one warpgroup's stores run
        while the other computes (FlashAttention-3's ping-pong, with the stores in the place
        of its second GEMM)."""
        _wait_for_predecessor(PDL)
        if GUARD == 1:
            if gl.load(FLAG) != 0:
                return
        q0, kv0, p0, mx0, qb0, kvb0 = _smem(q_desc, k_desc, BLOCK_M, BLOCK_N, D, N_TILES, STAGES)
        q1, kv1, p1, mx1, qb1, kvb1 = _smem(q_desc, k_desc, BLOCK_M, BLOCK_N, D, N_TILES, STAGES)
        tok = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(tok.index(0), count=1)
        mbarrier.init(tok.index(1), count=1)
        gl.warp_specialize([
            (_pingpong_role, (0, q_desc, k_desc, v_desc, O, P, FLAG, so_b, so_s, sp_bh, sp_s,
                              H, G, S, qscale, n_m, n_tiles, q0, kv0, p0, mx0, qb0, kvb0, tok,
                              D, BLOCK_M, BLOCK_N, N_TILES, STAGES, CAUSAL, GUARD, num_warps,
                              GP, ROW4)),
            (_pingpong_role, (1, q_desc, k_desc, v_desc, O, P, FLAG, so_b, so_s, sp_bh, sp_s,
                              H, G, S, qscale, n_m, n_tiles, q1, kv1, p1, mx1, qb1, kvb1, tok,
                              D, BLOCK_M, BLOCK_N, N_TILES, STAGES, CAUSAL, GUARD, num_warps,
                              GP, ROW4)),
        ], [num_warps], [REGS])


def available(device: torch.device) -> bool:
    """Gluon importable and a Hopper CUDA device (the kernels use Hopper's warpgroup MMA, which
    Blackwell's tensor cores do not run)."""
    if not HAVE_GLUON or device.type != "cuda":
        return False
    return capability(device)[0] == 9


def smem_bytes(seq, head_dim, cfg) -> int:
    """Shared memory of one program: q tile, K/V ring, staged fp16 tiles and their maxima."""
    block_m, block_n, _, stages = cfg[:4]
    n_tiles = cdiv(seq, block_n)
    one = (2 * block_m * head_dim + 2 * stages * block_n * head_dim
           + n_tiles * block_m * (2 * block_n + 4) + 8 * (stages + 1))
    return 2 * one + 16 if "pp" in cfg else one


def operands_ok(q16, k16, v16, head_dim, mask_kind, scale) -> bool:
    """The operands these Gluon kernels (and stats_overlap.py's) take: fp16 rows 16-byte aligned
    for the copy engine, no mask tensor, scale > 0, head_dim a power of two in [16, 128]."""
    return (all(t.dtype == torch.float16 and t.stride(-1) == 1 and t.stride(0) % 8 == 0
                and t.data_ptr() % 16 == 0 for t in (q16, k16, v16))
            and mask_kind == 0 and scale > 0 and head_dim in (16, 32, 64, 128))


def supported(q16, k16, v16, seq, head_dim, mask_kind, scale, cfg) -> bool:
    """Where this kernel may replace flash.py's probabilities path (see the module docstring)."""
    return operands_ok(q16, k16, v16, head_dim, mask_kind, scale) and _fits(seq, head_dim, cfg)


def _fits(seq, head_dim, cfg) -> bool:
    return smem_bytes(seq, head_dim, cfg) <= SMEM_PER_BLOCK


def candidates(q16, k16, v16, seq, head_dim, mask_kind, scale, groups=1):
    """The configs of ``CONFIGS`` this block may run (those of ``PACKED_CONFIGS`` where
    ``groups`` query heads share a KV head in fours), tagged for the tuner."""
    if not (HAVE_GLUON and available(q16.device)
            and operands_ok(q16, k16, v16, head_dim, mask_kind, scale)):
        return []
    packed = PACKED_CONFIGS if groups % 4 == 0 else []
    return [("staged",) + c for c in CONFIGS + packed if _fits(seq, head_dim, c)]


def _desc(t2d, block):
    layout = gl.NVMMASharedLayout.get_default_for(block, gl.float16)
    return TensorDescriptor(t2d, list(t2d.shape), list(t2d.stride()), block, layout)


def descriptors(q16, k16, v16, rows, num_heads, groups, head_dim, block_m, block_n):
    """The copy engine's descriptors of q [rows, H*D] (blocks of block_m rows: a row tile's
    positions of one head) and K, V [rows, Hkv*D] (blocks of block_n rows), each over its row
    stride; V's is None for v16 None (a kernel that reads no V)."""
    kd = (num_heads // groups) * head_dim
    q2 = q16.as_strided((rows, num_heads * head_dim), (q16.stride(0), 1))
    k2 = k16.as_strided((rows, kd), (k16.stride(0), 1))
    v_desc = None
    if v16 is not None:
        v_desc = _desc(v16.as_strided((rows, kd), (v16.stride(0), 1)), [block_n, head_dim])
    return _desc(q2, [block_m, head_dim]), _desc(k2, [block_n, head_dim]), v_desc


def launch(q16, k16, v16, out, probs, flag, batch, seq, num_heads, groups, head_dim, scale,
           causal, cfg, guard=0):
    """q16 [B*S, >= H*D], k16/v16 [B*S, >= Hkv*D] fp16 row-major views (row stride
    ``.stride(0)``, unit column stride); out [B, S, H*D]-strided (row stride out.stride(1));
    probs [B, H, S, S] float32 with unit last stride; ``guard`` 1 exits at once if ``flag`` is
    set (flash.py's GUARD 1). ``cfg``: (BLOCK_M, BLOCK_N, warps, stages), optionally after the
    "staged" tag."""
    if cfg and cfg[0] == "staged":
        cfg = cfg[1:]
    block_m, block_n, num_warps, stages = cfg[:4]
    pingpong = "pp" in cfg
    gp = heads_per_program(cfg)
    if not supported(q16, k16, v16, seq, head_dim, 0, scale, cfg):
        raise ValueError(f"probs_staged.launch: S={seq}, head_dim={head_dim}, {q16.dtype} not "
                         f"covered by config {cfg}")
    if probs.dtype != torch.float32 or probs.stride(-1) != 1 or probs.stride(1) != seq * seq:
        raise ValueError("probs_staged.launch: probabilities must be float32 [B, H, S, S] with "
                         "contiguous heads")
    if block_m != 16 * num_warps:
        raise ValueError(f"probs_staged.launch: BLOCK_M must be 16 rows per warp ({cfg})")
    if groups % gp or block_m % (8 * gp):
        raise ValueError(f"probs_staged.launch: {gp} heads per row tile need {gp} | groups "
                         f"({groups}) and 8 * {gp} | BLOCK_M ({cfg})")
    descs = descriptors(q16, k16, v16, batch * seq, num_heads, groups, head_dim, block_m // gp,
                        block_n)
    args = (out, probs, flag if guard else out, out.stride(0), out.stride(1), probs.stride(1),
            probs.stride(2), num_heads, groups, seq, float(scale) * LOG2E)
    n_m = cdiv(seq, block_m // gp)
    meta = dict(D=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, N_TILES=cdiv(seq, block_n),
                STAGES=stages, CAUSAL=bool(causal), GUARD=int(guard), num_warps=num_warps,
                **pdl.launch_options(out.device), **({"GP": gp} if gp > 1 else {}),
                **({"ROW4": True} if row4(probs, seq) else {}))
    if pingpong:
        n_tiles = n_m * batch * (num_heads // gp)
        grid = (min(n_tiles, sm_count(q16.device)),)
        probs_pingpong_kernel[grid](*descs, *args, n_m, n_tiles, REGS=PINGPONG_REGS, **meta)
    else:
        probs_staged_kernel[(n_m, batch * (num_heads // gp))](*descs, *args, **meta)

