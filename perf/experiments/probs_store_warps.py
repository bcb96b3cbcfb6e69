"""Experiment (not a candidate): the probabilities pass (flash.py's MODE 2) in Gluon with its
stores on warps of their own.

Why: at 4096x1 flash.py's pass takes 297.5 us where its own store pattern alone takes 253.8
(runs/30fbe73, `store_pattern_bench.py`): the warps that compute are the warps that store, so the
compute it carries (q @ k^T, the exponentials, P @ V, ~44 us) does not hide under the stores. The
copy engine did not help (note 22: its K/V loads queued behind the stores). Here a compute
warpgroup writes each fp32 P tile to one of PBUF shared buffers and goes on; a worker partition
of STORE_WARPS warps reads the tile back and writes it with 16-byte evict-first stores, the K/V
loads staying on the copy engine. Buffers pass between the two through mbarriers (full: tile
written; empty: tile read).

Scope of the experiment: fp16 q/k/V copies of W075 (head_dim a power of two), no mask (causal
allowed), S a multiple of BLOCK_M and BLOCK_N (whole tiles), one query head per program. Same inputs and outputs as flash.py's MODE 2 with GUARD 1: ML holds
(max, sum of exp2) per row from the stats pass.

Compiled for sm_90 on the CPU by ``python perf/experiments/probs_store_warps_bench.py --compile``;
timed and checked against flash.py's pass on the GPU by the same script.
"""

from __future__ import annotations

import torch

from inductor_gqa.kernels import pdl
from inductor_gqa.kernels.probs_staged import HAVE_GLUON, LOG2E
from inductor_gqa.kernels.qk_epilogue import FP16_MIN_NORMAL

if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, tma, warpgroup_mma,
                                                                   warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from inductor_gqa.kernels.probs_staged import _block_barrier, _wait_for_predecessor

# (BLOCK_M, BLOCK_N, K/V stages, P buffers, store warps, store warps' registers, maxnreg):
# BLOCK_M // 16 compute warps; maxnreg 128 lets two 64-row programs share an SM (sm_90 build:
# no spills), None leaves the compiler's 255 (one program per SM)
CONFIGS = [(64, 64, 3, 2, 4, 48, 128), (64, 64, 3, 3, 4, 48, 128), (64, 64, 2, 2, 4, 48, 128),
           (64, 32, 4, 3, 4, 48, 128), (64, 64, 3, 2, 4, 80, None),
           (128, 64, 3, 2, 4, 80, None), (128, 64, 2, 3, 4, 80, None),
           (128, 32, 4, 4, 4, 80, None)]


if HAVE_GLUON:
    @gluon.jit
    def _compute(q_desc, k_desc, v_desc, O, ML, FLAG, q_smem, k_smem, v_smem, p_smem, q_bar,
                 kv_bar, full, empty, so_b, so_s, H, G, S, qscale,
                 D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                 STAGES: gl.constexpr, PBUF: gl.constexpr, CAUSAL: gl.constexpr,
                 GUARD: gl.constexpr, NW: gl.constexpr):
        """The default partition (NW warps, 16 rows each): q @ k^T, p = exp2(s * qscale -
        lse), the P tile into a shared buffer for the store warps, P @ V; then o."""
        start_m = gl.program_id(0)
        bh = gl.program_id(1)
        b = bh // H
        h = bh - b * H
        kvh = h // G
        m0 = start_m * BLOCK_M
        kv_row = b * S
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, D, 16])
        p_op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout,
                                                        k_width=2)
        row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
        if CAUSAL:
            hi = m0 + BLOCK_M       # key tiles past the row tile's diagonal: zeros (store warps)
        else:
            hi = S
        n_tiles = hi // BLOCK_N
        kv_bytes: gl.constexpr = 2 * BLOCK_N * D * 2

        mbarrier.expect(q_bar, BLOCK_M * D * 2)
        tma.async_copy_global_to_shared(q_desc, [kv_row + m0, h * D], q_bar, q_smem)
        for i in gl.static_range(STAGES - 1):
            if i < n_tiles:
                mbarrier.expect(kv_bar.index(i), kv_bytes)
                tma.async_copy_global_to_shared(k_desc, [kv_row + i * BLOCK_N, kvh * D],
                                                kv_bar.index(i), k_smem.index(i))
                tma.async_copy_global_to_shared(v_desc, [kv_row + i * BLOCK_N, kvh * D],
                                                kv_bar.index(i), v_smem.index(i))
        offs_r = m0 + gl.arange(0, BLOCK_M, layout=row_layout)
        ml_off = (bh * S + offs_r).to(gl.int64) * 2
        m_i = gl.load(ML + ml_off)
        l_i = gl.load(ML + ml_off + 1)
        lse2 = gl.expand_dims(gl.where(m_i == float("-inf"), 0.0, m_i) + gl.log2(l_i), 1)
        rows2 = gl.expand_dims(offs_r, 1)
        cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        acc = gl.zeros([BLOCK_M, D], gl.float32, o_layout)
        mbarrier.wait(q_bar, 0)
        for j in range(n_tiles):
            slot = j % STAGES
            mbarrier.wait(kv_bar.index(slot), (j // STAGES) & 1)
            k_t = k_smem.index(slot).permute((1, 0))
            s_tok = warpgroup_mma(q_smem, k_t, s_zero, use_acc=False, is_async=True)
            s = warpgroup_mma_wait(0, deps=(s_tok, q_smem, k_t))[0]
            z = gl.fma(s, qscale, -lse2)
            if CAUSAL:
                n0 = j * BLOCK_N
                if n0 + BLOCK_N - 1 > m0:
                    z = gl.where(rows2 >= gl.expand_dims(n0 + cols, 0), z, float("-inf"))
            p = gl.exp2(z)
            # the buffer's previous tile (PBUF tiles ago) has been read by the store warps
            pb = j % PBUF
            mbarrier.wait(empty.index(pb), ((j // PBUF) & 1) ^ 1)
            p_smem.index(pb).store(p)
            _block_barrier()        # every compute thread's part of the tile is in the buffer
            mbarrier.arrive(full.index(pb))
            # refill the slot tile j - 1 used: past the barrier, every compute warp has waited
            # for that tile's MMAs
            nj = j + STAGES - 1
            if nj < n_tiles:
                ns = nj % STAGES
                mbarrier.expect(kv_bar.index(ns), kv_bytes)
                tma.async_copy_global_to_shared(k_desc, [kv_row + nj * BLOCK_N, kvh * D],
                                                kv_bar.index(ns), k_smem.index(ns))
                tma.async_copy_global_to_shared(v_desc, [kv_row + nj * BLOCK_N, kvh * D],
                                                kv_bar.index(ns), v_smem.index(ns))
            p16 = gl.convert_layout(p.to(gl.float16), p_op_layout)
            v_s = v_smem.index(slot)
            acc = warpgroup_mma(p16, v_s, acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=(acc, p16, v_s))[0]

        offs_om = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
        offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
        o_ptrs = (O + b.to(gl.int64) * so_b + gl.expand_dims(offs_om.to(gl.int64) * so_s, 1)
                  + h * D + gl.expand_dims(offs_d, 0))
        gl.store(o_ptrs, acc.to(O.dtype.element_ty))
        if GUARD == 1:
            if O.dtype.element_ty == gl.float16:
                rmax = gl.max(gl.abs(acc), 1)
                bad = ((rmax > 0.0) & (rmax < FP16_MIN_NORMAL)) | (rmax >= 65504.0)
                zero_i = gl.zeros_like(offs_om)
                gl.atomic_max(FLAG + zero_i, zero_i + 1, mask=bad)

    @gluon.jit
    def _stores(P, p_smem, full, empty, sp_bh, S,
                BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, PBUF: gl.constexpr,
                CAUSAL: gl.constexpr, SW: gl.constexpr):
        """The worker partition: each P tile from its buffer to global memory (16-byte
        evict-first stores, whole rows per warp), then the buffer back to the compute
        warpgroup; under causal also the zero tiles past the diagonal."""
        start_m = gl.program_id(0)
        bh = gl.program_id(1)
        m0 = start_m * BLOCK_M
        TPR: gl.constexpr = BLOCK_N // 4 if BLOCK_N // 4 < 32 else 32
        st_layout: gl.constexpr = gl.BlockedLayout(
            size_per_thread=[1, 4], threads_per_warp=[32 // TPR, TPR], warps_per_cta=[SW, 1],
            order=[1, 0])
        rows = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, st_layout))
        cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, st_layout))
        p_rows = P + bh.to(gl.int64) * sp_bh + gl.expand_dims(rows.to(gl.int64) * S, 1)
        if CAUSAL:
            hi = m0 + BLOCK_M
        else:
            hi = S
        n_tiles = hi // BLOCK_N
        for j in range(n_tiles):
            pb = j % PBUF
            mbarrier.wait(full.index(pb), (j // PBUF) & 1)
            prob = p_smem.index(pb).load(st_layout)
            gl.store(p_rows + gl.expand_dims(j * BLOCK_N + cols, 0), prob,
                     eviction_policy="evict_first")
            _block_barrier()        # every store warp has read the buffer
            mbarrier.arrive(empty.index(pb))
        if CAUSAL:
            zeros = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, st_layout)
            for j in range(n_tiles, S // BLOCK_N):
                gl.store(p_rows + gl.expand_dims(j * BLOCK_N + cols, 0), zeros,
                         eviction_policy="evict_first")

    @gluon.jit
    def probs_store_warps_kernel(q_desc, k_desc, v_desc, O, P, ML, FLAG, so_b, so_s, sp_bh,
                                 H, G, S, qscale,
                                 D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                                 STAGES: gl.constexpr, PBUF: gl.constexpr,
                                 CAUSAL: gl.constexpr, GUARD: gl.constexpr,
                                 STORE_WARPS: gl.constexpr, STORE_REGS: gl.constexpr,
                                 num_warps: gl.constexpr, PDL: gl.constexpr = 0):
        """Grid (S // BLOCK_M, B * H); num_warps compute warps (16 rows each) plus
        STORE_WARPS."""
        gl.static_assert(num_warps * 16 == BLOCK_M)
        _wait_for_predecessor(PDL)
        if GUARD == 1:
            if gl.load(FLAG) != 0:
                return
        p_shared: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N],
                                                                      gl.float32)
        q_smem = gl.allocate_shared_memory(q_desc.dtype, [BLOCK_M, D], q_desc.layout)
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, D], k_desc.layout)
        v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, D], v_desc.layout)
        p_smem = gl.allocate_shared_memory(gl.float32, [PBUF, BLOCK_M, BLOCK_N], p_shared)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        kv_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        full = gl.allocate_shared_memory(gl.int64, [PBUF, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [PBUF, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(kv_bar.index(i), count=1)
        for i in gl.static_range(PBUF):
            mbarrier.init(full.index(i), count=1)
            mbarrier.init(empty.index(i), count=1)
        gl.warp_specialize([
            (_compute, (q_desc, k_desc, v_desc, O, ML, FLAG, q_smem, k_smem, v_smem, p_smem,
                        q_bar, kv_bar, full, empty, so_b, so_s, H, G, S, qscale,
                        D, BLOCK_M, BLOCK_N, STAGES, PBUF, CAUSAL, GUARD, num_warps)),
            (_stores, (P, p_smem, full, empty, sp_bh, S, BLOCK_M, BLOCK_N, PBUF, CAUSAL,
                       STORE_WARPS)),
        ], [STORE_WARPS], [STORE_REGS])


def smem_bytes(head_dim, cfg) -> int:
    block_m, block_n, stages, pbuf = cfg[:4]
    return (2 * block_m * head_dim + 2 * 2 * stages * block_n * head_dim
            + 4 * pbuf * block_m * block_n + 8 * (1 + stages + 2 * pbuf))


def _desc(t2d, block):
    layout = gl.NVMMASharedLayout.get_default_for(block, gl.float16)
    return TensorDescriptor(t2d, list(t2d.shape), list(t2d.stride()), block, layout)


def launch(q16, k16, v16, out, probs, ml, flag, batch, seq, num_heads, groups, head_dim, scale,
           causal, cfg, guard=1):
    """As probs_staged.launch, with ``ml`` the stats pass's [B*H*S*2]; ``cfg``: a CONFIGS
    entry."""
    block_m, block_n, stages, pbuf, store_warps, store_regs, maxnreg = cfg
    if seq % block_n or seq % block_m or head_dim not in (16, 32, 64, 128):
        raise ValueError(f"probs_store_warps.launch: S={seq}, head_dim={head_dim} not covered "
                         f"by {cfg}")
    if causal and block_m % block_n:
        raise ValueError(f"probs_store_warps.launch: causal needs BLOCK_N to divide BLOCK_M ({cfg})")
    if probs.dtype != torch.float32 or not probs.is_contiguous():
        raise ValueError("probs_store_warps.launch: probabilities must be contiguous float32")
    rows = batch * seq
    kd = (num_heads // groups) * head_dim
    q2 = q16.as_strided((rows, num_heads * head_dim), (q16.stride(0), 1))
    k2 = k16.as_strided((rows, kd), (k16.stride(0), 1))
    v2 = v16.as_strided((rows, kd), (v16.stride(0), 1))
    grid = (seq // block_m, batch * num_heads)
    extra = {"maxnreg": maxnreg} if maxnreg else {}
    probs_store_warps_kernel[grid](
        _desc(q2, [block_m, head_dim]), _desc(k2, [block_n, head_dim]),
        _desc(v2, [block_n, head_dim]), out, probs, ml, flag if guard else out,
        out.stride(0), out.stride(1), probs.stride(1), num_heads, groups, seq,
        float(scale) * LOG2E, D=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages,
        PBUF=pbuf, CAUSAL=bool(causal), GUARD=int(guard), STORE_WARPS=store_warps,
        STORE_REGS=store_regs, num_warps=block_m // 16, **extra,
        **pdl.launch_options(out.device))
