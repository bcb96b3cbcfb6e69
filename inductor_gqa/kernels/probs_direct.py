"""The probabilities pass (flash.py's MODE 2) with no trip through shared memory for P (Gluon,
Hopper).

Why: flash.py's Triton pass moves every score tile through shared memory twice (sm_90 SASS of
its tuned (128, 64, 8, 3) gp4 config: 16 STS.64 + LDS per tile to turn the MMA accumulator into
16-byte store rows, and the fp16 P written again and read by LDSM as the A operand of P @ V).
That is 96 KB of shared-memory traffic per 128 x 64 tile beside the K/V ring's 32 KB, about
12 bytes per probability, against the ~20 bytes per clock an SM must store for the pass to run at
the H200's write rate. Here each probability is stored from the registers the MMA left it in
(8-byte stores: two adjacent columns per thread, four threads filling one 32-byte sector of a
row), and P @ V takes P as a register operand (the accumulator's layout is the A operand's,
FlashAttention-3's trick), so shared memory carries only q and the K/V ring.

Per key tile j: s = q @ k_j^T (warpgroup MMA), p = exp2(s * scale - lse) with the row's
log-sum-exp from the stats pass (flash.py's MODE 1 or stats_overlap.py: ML[2r] = max, ML[2r+1]
= sum, log2 units), p stored, o += fp16(p) @ V_j. With ``OVERLAP`` tile j + 1's q @ k^T is issued
before tile j's exponentials (as stats_overlap.py does), both MMAs waited for at the end of the
iteration.

Scope (``supported``): probs_staged's operands (fp16 rows 16-byte aligned, no mask tensor,
scale > 0, head_dim a power of two in [16, 128]), float32 probabilities [B, H, S, S] with S
even (8-byte stores), causal only where a row tile's diagonal lies in one key tile
(BLOCK_N a multiple of its positions), Hopper, Gluon importable. Ragged S as in probs_staged
(finite operands needed: the range rule guarantees them on the fp16 path). Outputs as flash.py's
MODE 2 with GUARD 0 or 1: probabilities, o [B, S, H*D] strided, an fp16 o raising FLAG by
flash.py's range rule.

The Triton CPU interpreter does not run Gluon: checked on the GPU
(perf/experiments/probs_direct_bench.py, the perf job's checks) and compiled for sm_90 on the CPU.
"""

from __future__ import annotations

import torch

from . import pdl, probs_staged
from .host import cdiv, heads_per_program

HAVE_GLUON = probs_staged.HAVE_GLUON
LOG2E = probs_staged.LOG2E

# (BLOCK_M, BLOCK_N, warps, K/V stages[, "ov"][, "cv"][, "r128"][, "gp4"]): candidates beside
# flash.py's MODE 2; "ov": OVERLAP, "cv": CONVERT, "r128": at most 128 registers per thread (two
# 8-warp programs per SM)
CONFIGS = [(128, 64, 8, 3, "cv"), (128, 64, 8, 3, "cv", "r128"), (128, 64, 8, 4, "cv", "r128"),
           (128, 64, 8, 2, "cv", "r128"), (64, 64, 4, 3, "cv"), (64, 64, 4, 3, "ov", "cv")]
PACKED_CONFIGS = [c + ("gp4",) for c in CONFIGS]

if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, tma, warpgroup_mma,
                                                                  warpgroup_mma_wait)

    _block_barrier = probs_staged._block_barrier

    @gluon.jit
    def _load_kv(t, n, k_desc, v_desc, k_smem, v_smem, kv_bar, kv_row, kvh, D: gl.constexpr,
                 BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
        """K and V tile t of the row (if any) into ring slot t % STAGES, one barrier."""
        if t < n:
            slot = t % STAGES
            mbarrier.expect(kv_bar.index(slot), 2 * BLOCK_N * D * 2)
            tma.async_copy_global_to_shared(k_desc, [kv_row + t * BLOCK_N, kvh * D],
                                            kv_bar.index(slot), k_smem.index(slot))
            tma.async_copy_global_to_shared(v_desc, [kv_row + t * BLOCK_N, kvh * D],
                                            kv_bar.index(slot), v_smem.index(slot))

    @gluon.jit
    def _tile_out(s, j, acc, v_t, lse, p_rows, row_ok, m_rows, S, qscale,
                  BLOCK_N: gl.constexpr, LAST: gl.constexpr, CAUSAL: gl.constexpr,
                  D: gl.constexpr, NW: gl.constexpr, CONVERT: gl.constexpr):
        """Tile j's probabilities out, straight from the scores' registers (or, with
        ``CONVERT``, moved into 16-byte store rows through shared memory, as flash.py's pass
        does), and P @ V_j issued (async; the caller waits). Only the row's last tile can cross
        the sequence end or the diagonal, so only it takes masks."""
        s_layout: gl.constexpr = probs_staged._s_layout(BLOCK_N, NW)
        o_layout: gl.constexpr = probs_staged._o_layout(D, NW)
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout,
                                                     k_width=2)
        st_layout: gl.constexpr = _store_layout(BLOCK_N, NW, CONVERT)
        p = gl.exp2(gl.fma(s, qscale, -gl.expand_dims(lse, 1)))
        if LAST:
            cols_s = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
            keep = gl.expand_dims(cols_s < S, 0)
            if CAUSAL:
                keep = keep & (gl.expand_dims(m_rows, 1) >= gl.expand_dims(cols_s, 0))
            p = gl.where(keep, p, 0.0)
        cols = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, st_layout))
        if LAST:
            ok = row_ok & gl.expand_dims(cols < S, 0)
        else:
            ok = row_ok
        gl.store(p_rows + gl.expand_dims(cols, 0), gl.convert_layout(p, st_layout), mask=ok,
                 eviction_policy="evict_first")
        p16 = gl.convert_layout(p.to(gl.float16), a_layout)
        return warpgroup_mma(p16, v_t, acc, is_async=True), p16

    @gluon.constexpr_function
    def _store_layout(BLOCK_N, NW, CONVERT):
        """The probabilities' store layout: the scores' own (8-byte stores), or 16-byte rows."""
        if CONVERT:
            return probs_staged._st_layout(BLOCK_N, NW)
        return probs_staged._s_layout(BLOCK_N, NW)

    @gluon.jit
    def probs_direct_kernel(q_desc, k_desc, v_desc, ML, O, P, FLAG, so_b, so_s, sp_bh, sp_s,
                            H, G, S, qscale,
                            D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                            N_TILES: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                            GUARD: gl.constexpr, OVERLAP: gl.constexpr,
                            CONVERT: gl.constexpr, num_warps: gl.constexpr,
                            PDL: gl.constexpr = 0, GP: gl.constexpr = 1):
        """One row tile per program (grid: row tiles x B*H/GP); with GP > 1 a tile holds
        BLOCK_M // GP positions of GP query heads of one KV head (probs_staged's GP)."""
        probs_staged._wait_for_predecessor(PDL)
        if GUARD == 1:
            if gl.load(FLAG) != 0:
                return
        n_m = gl.num_programs(0)
        tile = gl.program_id(1) * n_m + gl.program_id(0)
        bh, b, h, kvh, m0 = probs_staged._tile_coords(tile, n_m, H, G, BLOCK_M, GP)
        MR: gl.constexpr = BLOCK_M // GP
        kv_row = b * S
        s_layout: gl.constexpr = probs_staged._s_layout(BLOCK_N, num_warps)
        o_layout: gl.constexpr = probs_staged._o_layout(D, num_warps)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)

        q_smem = gl.allocate_shared_memory(q_desc.dtype, [BLOCK_M, D], q_desc.layout)
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, D], k_desc.layout)
        v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, D], v_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        kv_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(kv_bar.index(i), count=1)

        if CAUSAL:
            hi = gl.minimum(S, m0 + MR)         # key tiles past the diagonal are zeros
        else:
            hi = S
        n = (hi + BLOCK_N - 1) // BLOCK_N

        mbarrier.expect(q_bar, BLOCK_M * D * 2)
        for i in gl.static_range(GP):           # one box of MR positions per head
            tma.async_copy_global_to_shared(q_desc, [kv_row + m0, (h + i) * D], q_bar,
                                            q_smem.slice(i * MR, MR))
        for i in gl.static_range(STAGES):
            _load_kv(i, n, k_desc, v_desc, k_smem, v_smem, kv_bar, kv_row, kvh, D, BLOCK_N,
                     STAGES)

        # the rows' log-sum-exp (base 2) from the stats pass; a wholly masked row (l == 0)
        # gives NaN, as eager
        r = gl.arange(0, BLOCK_M, layout=row_s)
        m_rows = m0 + r % MR
        row_in = m_rows < S
        ml = ML + ((bh + r // MR).to(gl.int64) * S + m_rows) * 2
        m_i = gl.load(ml, mask=row_in, other=0.0)
        l_i = gl.load(ml + 1, mask=row_in, other=1.0)
        lse = gl.where(m_i == float("-inf"), 0.0, m_i) + gl.log2(l_i)
        st_layout: gl.constexpr = _store_layout(BLOCK_N, num_warps, CONVERT)
        r_st = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, st_layout))
        rows_st = m0 + r_st % MR
        row_ok = gl.expand_dims(rows_st < S, 1)
        p_rows = P + gl.expand_dims((bh + r_st // MR).to(gl.int64) * sp_bh
                                    + rows_st.to(gl.int64) * sp_s, 1)

        s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        acc = gl.zeros([BLOCK_M, D], gl.float32, o_layout)
        mbarrier.wait(q_bar, 0)
        if OVERLAP:
            mbarrier.wait(kv_bar.index(0), 0)
            k_t = k_smem.index(0).permute((1, 0))
            tok = warpgroup_mma(q_smem, k_t, s_zero, use_acc=False, is_async=True)
            s = warpgroup_mma_wait(0, deps=(tok, q_smem, k_t))[0]
            for j in range(n - 1):
                slot = j % STAGES
                nxt = (j + 1) % STAGES
                mbarrier.wait(kv_bar.index(nxt), ((j + 1) // STAGES) & 1)
                k_t = k_smem.index(nxt).permute((1, 0))
                # tile j + 1's product runs under tile j's exponentials and stores
                tok = warpgroup_mma(q_smem, k_t, s_zero, use_acc=False, is_async=True)
                v_t = v_smem.index(slot)
                pv, p16 = _tile_out(s, j, acc, v_t, lse, p_rows, row_ok, m_rows, S, qscale,
                                    BLOCK_N, False, CAUSAL, D, num_warps, CONVERT)
                done = warpgroup_mma_wait(0, deps=(tok, pv, q_smem, k_t, p16, v_t))
                s = done[0]
                acc = done[1]
                # every warp is past both MMAs that read slot j: refill it
                _block_barrier()
                _load_kv(j + STAGES, n, k_desc, v_desc, k_smem, v_smem, kv_bar, kv_row, kvh,
                         D, BLOCK_N, STAGES)
            v_t = v_smem.index((n - 1) % STAGES)
            pv, p16 = _tile_out(s, n - 1, acc, v_t, lse, p_rows, row_ok, m_rows, S, qscale,
                                BLOCK_N, True, CAUSAL, D, num_warps, CONVERT)
            acc = warpgroup_mma_wait(0, deps=(pv, p16, v_t))[0]
        else:
            for j in range(n - 1):
                slot = j % STAGES
                mbarrier.wait(kv_bar.index(slot), (j // STAGES) & 1)
                k_t = k_smem.index(slot).permute((1, 0))
                v_t = v_smem.index(slot)
                tok = warpgroup_mma(q_smem, k_t, s_zero, use_acc=False, is_async=True)
                s = warpgroup_mma_wait(0, deps=(tok, q_smem, k_t))[0]
                pv, p16 = _tile_out(s, j, acc, v_t, lse, p_rows, row_ok, m_rows, S, qscale,
                                    BLOCK_N, False, CAUSAL, D, num_warps, CONVERT)
                acc = warpgroup_mma_wait(0, deps=(pv, p16, v_t))[0]
                _block_barrier()
                _load_kv(j + STAGES, n, k_desc, v_desc, k_smem, v_smem, kv_bar, kv_row, kvh,
                         D, BLOCK_N, STAGES)
            slot = (n - 1) % STAGES
            mbarrier.wait(kv_bar.index(slot), ((n - 1) // STAGES) & 1)
            k_t = k_smem.index(slot).permute((1, 0))
            v_t = v_smem.index(slot)
            tok = warpgroup_mma(q_smem, k_t, s_zero, use_acc=False, is_async=True)
            s = warpgroup_mma_wait(0, deps=(tok, q_smem, k_t))[0]
            pv, p16 = _tile_out(s, n - 1, acc, v_t, lse, p_rows, row_ok, m_rows, S, qscale,
                                BLOCK_N, True, CAUSAL, D, num_warps, CONVERT)
            acc = warpgroup_mma_wait(0, deps=(pv, p16, v_t))[0]

        if CAUSAL:
            zeros = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, st_layout)
            for j in range(n, N_TILES):
                cols = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, st_layout))
                gl.store(p_rows + gl.expand_dims(cols, 0), zeros,
                         mask=row_ok & gl.expand_dims(cols < S, 0),
                         eviction_policy="evict_first")
        probs_staged._store_o(acc, O, FLAG, b, h, m0, so_b, so_s, S, D, BLOCK_M, BLOCK_N, GUARD,
                              num_warps, GP)
        mbarrier.invalidate(q_bar)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(kv_bar.index(i))


def smem_bytes(head_dim, cfg) -> int:
    block_m, block_n, _, stages = cfg[:4]
    return 2 * block_m * head_dim + 4 * stages * block_n * head_dim + 8 * (stages + 1)


def supported(q16, k16, v16, seq, head_dim, mask_kind, scale, causal, cfg) -> bool:
    """Where this kernel may replace flash.py's probabilities pass (module docstring)."""
    block_m, block_n, num_warps = cfg[:3]
    rows = block_m // heads_per_program(cfg)
    return (probs_staged.operands_ok(q16, k16, v16, head_dim, mask_kind, scale)
            and seq % 2 == 0 and block_m == 16 * num_warps
            and (not causal or block_n % rows == 0)
            and smem_bytes(head_dim, cfg) <= probs_staged.SMEM_PER_BLOCK)


def candidates(q16, k16, v16, seq, head_dim, mask_kind, scale, causal, groups=1):
    """The configs of ``CONFIGS`` this block may run (and ``PACKED_CONFIGS`` where ``groups``
    query heads share a KV head in fours), tagged for the tuner."""
    if not (HAVE_GLUON and probs_staged.available(q16.device)):
        return []
    packed = PACKED_CONFIGS if groups % 4 == 0 else []
    return [("direct",) + c for c in CONFIGS + packed
            if supported(q16, k16, v16, seq, head_dim, mask_kind, scale, causal, c)]


def launch(q16, k16, v16, ml, out, probs, flag, batch, seq, num_heads, groups, head_dim, scale,
           causal, cfg, guard=0):
    """q16 [B*S, >= H*D], k16/v16 [B*S, >= Hkv*D] fp16 row-major views (row stride
    ``.stride(0)``, unit column stride); ml float32 [B*H*S*2] (flash.py's ML, from the stats
    pass); out [B, S, H*D]-strided (row stride out.stride(1)); probs [B, H, S, S] float32 with
    unit last stride; ``guard`` 1 exits at once if ``flag`` is set (flash.py's GUARD 1).
    ``cfg``: (BLOCK_M, BLOCK_N, warps, stages[, flags]), optionally after the "direct" tag."""
    if cfg and cfg[0] == "direct":
        cfg = cfg[1:]
    block_m, block_n, num_warps, stages = cfg[:4]
    gp = heads_per_program(cfg)
    if not supported(q16, k16, v16, seq, head_dim, 0, scale, causal, cfg):
        raise ValueError(f"probs_direct.launch: S={seq}, head_dim={head_dim}, causal={causal}, "
                         f"{q16.dtype} not covered by config {cfg}")
    if probs.dtype != torch.float32 or probs.stride(-1) != 1 or probs.stride(1) != seq * seq:
        raise ValueError("probs_direct.launch: probabilities must be float32 [B, H, S, S] with "
                         "contiguous heads")
    if ml.dtype != torch.float32 or not ml.is_contiguous() or \
            ml.numel() < batch * num_heads * seq * 2:
        raise ValueError("probs_direct.launch: ml must be contiguous float32 [B*H*S*2]")
    if groups % gp or block_m % (8 * gp):
        raise ValueError(f"probs_direct.launch: {gp} heads per row tile need {gp} | groups "
                         f"({groups}) and 8 * {gp} | BLOCK_M ({cfg})")
    descs = probs_staged.descriptors(q16, k16, v16, batch * seq, num_heads, groups, head_dim,
                                     block_m // gp, block_n)
    grid = (cdiv(seq, block_m // gp), batch * (num_heads // gp))
    probs_direct_kernel[grid](
        *descs, ml, out, probs, flag if guard else out, out.stride(0), out.stride(1),
        probs.stride(1), probs.stride(2), num_heads, groups, seq, float(scale) * LOG2E,
        D=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, N_TILES=cdiv(seq, block_n),
        STAGES=stages, CAUSAL=bool(causal), GUARD=int(guard), OVERLAP="ov" in cfg,
        CONVERT="cv" in cfg, **({"maxnreg": 128} if "r128" in cfg else {}),
        num_warps=num_warps, **pdl.launch_options(out.device),
        **({"GP": gp} if gp > 1 else {}))
