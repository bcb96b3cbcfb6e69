"""The probabilities pass (flash.py's MODE 2) written in Gluon, for Hopper: the probabilities leave
through the TMA copy engine, so the warps go on computing while their tiles are written.

Why a second kernel: the pass is bound by its fp32 probability stores (1.07 GB at W075's
(4096, 1)). In the Triton kernel the warps that compute are the warps that store, and Triton's
own descriptor store waits for each tile before going on (measured slower, docs note 21). Here
each tile goes to one of PBUF shared buffers and a bulk tensor copy takes it from there; a
buffer is waited for only when it comes round again, PBUF tiles later.

Scope (``supported``): fp16 q/k/V copies (the f16 plans of float32 blocks under "high") or
16-bit blocks, no mask tensor (causal allowed), scale > 0, head_dim a power of two in [16, 128],
S a multiple of BLOCK_M and BLOCK_N (whole tiles: no bound masks, and the probabilities'
rows, 4*S bytes apart, meet the copy engine's 16-byte stride rule), Hopper or newer, Gluon
importable. Elsewhere flash.py's pass runs. Same inputs and outputs as flash.py's MODE 2 with
GUARD 0 or 1, GP 1: ML holds (max, sum of exp2) per row from the stats pass; o is written to
[B, S, H*D] (strided), an fp16 o raising FLAG as flash.py does.

The Triton CPU interpreter does not run Gluon: this kernel is checked on the GPU
(tests/kernels/test_probs_tma.py) and compiled for sm_90 on the CPU (tests/kernels/sm90_compile.py).
"""

from __future__ import annotations

import functools

import torch

from .qk_epilogue import FP16_MIN_NORMAL

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_init,
        warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    # a barrier across the block's threads: thread_barrier in Triton 3.6, barrier from 3.7
    _block_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
    HAVE_GLUON = True
except ImportError:         # an older Triton: the Triton pass is the only one
    HAVE_GLUON = False

LOG2E = 1.4426950408889634

# (BLOCK_M, BLOCK_N, warps, K/V stages, probability buffers, OVERLAP): the tuner's candidates,
# next to flash.py's MODE 2 configs (lower/attention.py)
CONFIGS = [(128, 64, 8, 2, 2, 0), (64, 64, 4, 3, 2, 0), (64, 64, 4, 4, 3, 0),
           (128, 32, 8, 6, 4, 0), (128, 64, 8, 3, 3, 0),
           (128, 32, 8, 5, 4, 1), (128, 32, 8, 8, 4, 1), (64, 32, 4, 8, 4, 1),
           (128, 32, 8, 7, 6, 1), (64, 64, 4, 7, 4, 1), (128, 64, 8, 6, 3, 1),
           (64, 32, 4, 10, 6, 1)]


if HAVE_GLUON:
    @gluon.jit
    def probs_tma_kernel(q_desc, k_desc, v_desc, p_desc, zero_desc, O, ML, FLAG, so_b, so_s,
                         H, G, S, qscale,
                         D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                         STAGES: gl.constexpr, PBUF: gl.constexpr, CAUSAL: gl.constexpr,
                         GUARD: gl.constexpr, OVERLAP: gl.constexpr, num_warps: gl.constexpr):
        if GUARD == 1:
            if gl.load(FLAG) != 0:
                return
        start_m = gl.program_id(0)
        bh = gl.program_id(1)
        b = bh // H
        h = bh - b * H
        kvh = h // G
        m0 = start_m * BLOCK_M
        q_row = b * S + m0          # rows of the [B*S, heads*D] q/k/V views
        kv_row = b * S
        p_row = bh * S + m0         # rows of the [B*H*S, S] probabilities view

        # one warpgroup MMA layout per product: scores [BLOCK_M, BLOCK_N], output [BLOCK_M, D]
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, D, 16])
        p_op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout,
                                                        k_width=2)
        row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)

        q_smem = gl.allocate_shared_memory(q_desc.dtype, [BLOCK_M, D], q_desc.layout)
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, D], k_desc.layout)
        v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, D], v_desc.layout)
        p_smem = gl.allocate_shared_memory(gl.float32, [PBUF, BLOCK_M, BLOCK_N], p_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        kv_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(kv_bar.index(i), count=1)

        if CAUSAL:
            hi = m0 + BLOCK_M       # key tiles past the row tile's diagonal are zeros
        else:
            hi = S
        n_tiles = hi // BLOCK_N
        kv_bytes: gl.constexpr = 2 * BLOCK_N * D * 2

        mbarrier.expect(q_bar, BLOCK_M * D * 2)
        tma.async_copy_global_to_shared(q_desc, [q_row, h * D], q_bar, q_smem)
        # tiles loaded ahead: STAGES - 1, or STAGES - 2 when OVERLAP (a slot is refilled only
        # after the block barrier that follows its P @ V's wait)
        LEAD: gl.constexpr = STAGES - 2 if OVERLAP else STAGES - 1
        for i in gl.static_range(LEAD):
            if i < n_tiles:
                mbarrier.expect(kv_bar.index(i), kv_bytes)
                tma.async_copy_global_to_shared(k_desc, [kv_row + i * BLOCK_N, kvh * D],
                                                kv_bar.index(i), k_smem.index(i))
                tma.async_copy_global_to_shared(v_desc, [kv_row + i * BLOCK_N, kvh * D],
                                                kv_bar.index(i), v_smem.index(i))

        # the row's log-sum-exp (base 2) from the stats pass: p = exp2(s * qscale - lse)
        offs_r = m0 + gl.arange(0, BLOCK_M, layout=row_layout)
        ml_off = (bh * S + offs_r).to(gl.int64) * 2
        m_i = gl.load(ML + ml_off)
        l_i = gl.load(ML + ml_off + 1)
        lse = gl.where(m_i == float("-inf"), 0.0, m_i) + gl.log2(l_i)
        lse2 = gl.expand_dims(lse, 1)
        rows2 = gl.expand_dims(offs_r, 1)
        cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))

        s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        mbarrier.wait(q_bar, 0)
        if OVERLAP:
            acc = _overlapped_loop(q_smem, k_smem, v_smem, p_smem, kv_bar, k_desc, v_desc,
                                        p_desc, s_zero, lse2, rows2, cols, qscale, n_tiles, m0,
                                        kv_row, kvh, p_row, D, BLOCK_M, BLOCK_N, STAGES, PBUF,
                                        CAUSAL, s_layout, o_layout)
        else:
            acc = gl.zeros([BLOCK_M, D], gl.float32, o_layout)
            for j in range(n_tiles):
                slot = j % STAGES
                # refill the slot tile j - 1 used (its products were waited for at its end)
                nj = j + STAGES - 1
                if nj < n_tiles:
                    ns = nj % STAGES
                    mbarrier.expect(kv_bar.index(ns), kv_bytes)
                    tma.async_copy_global_to_shared(k_desc, [kv_row + nj * BLOCK_N, kvh * D],
                                                    kv_bar.index(ns), k_smem.index(ns))
                    tma.async_copy_global_to_shared(v_desc, [kv_row + nj * BLOCK_N, kvh * D],
                                                    kv_bar.index(ns), v_smem.index(ns))
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
                # the buffer this tile takes was last sent PBUF tiles ago: wait for that copy to
                # have read it, then for every thread to know
                pb = j % PBUF
                tma.store_wait(PBUF - 1)
                _block_barrier()
                p_smem.index(pb).store(p)
                fence_async_shared()
                _block_barrier()
                tma.async_copy_shared_to_global(p_desc, [p_row, j * BLOCK_N], p_smem.index(pb))
                p16 = gl.convert_layout(p.to(v_desc.dtype), p_op_layout)
                v_s = v_smem.index(slot)
                acc = warpgroup_mma(p16, v_s, acc, is_async=True)
                acc = warpgroup_mma_wait(0, deps=(acc, p16, v_s))[0]

        if CAUSAL:
            # tiles wholly above the diagonal: zeros, from one zero tile in global memory
            z_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_M, BLOCK_N], p_desc.layout)
            z_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
            mbarrier.init(z_bar, count=1)
            mbarrier.expect(z_bar, BLOCK_M * BLOCK_N * 4)
            tma.async_copy_global_to_shared(zero_desc, [0, 0], z_bar, z_smem)
            mbarrier.wait(z_bar, 0)
            for j in range(n_tiles, S // BLOCK_N):
                tma.async_copy_shared_to_global(p_desc, [p_row, j * BLOCK_N], z_smem)
            mbarrier.invalidate(z_bar)

        offs_om = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
        offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
        o_ptrs = (O + b.to(gl.int64) * so_b + gl.expand_dims(offs_om.to(gl.int64) * so_s, 1)
                  + h * D + gl.expand_dims(offs_d, 0))
        gl.store(o_ptrs, acc.to(O.dtype.element_ty))
        if GUARD == 1:
            if O.dtype.element_ty == gl.float16:
                # flash.py's range rule for an fp16 output: a bad row sends the block to the
                # float32 fallback
                rmax = gl.max(gl.abs(acc), 1)
                bad = ((rmax > 0.0) & (rmax < FP16_MIN_NORMAL)) | (rmax >= 65504.0)
                zero_i = gl.zeros_like(offs_om)
                gl.atomic_max(FLAG + zero_i, zero_i + 1, mask=bad)
        tma.store_wait(0)
        mbarrier.invalidate(q_bar)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(kv_bar.index(i))


    @gluon.jit
    def _overlapped_loop(q_smem, k_smem, v_smem, p_smem, kv_bar, k_desc, v_desc, p_desc, s_zero,
                         lse2, rows2, cols, qscale, n_tiles, m0, kv_row, kvh, p_row,
                         D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                         STAGES: gl.constexpr, PBUF: gl.constexpr, CAUSAL: gl.constexpr,
                         s_layout: gl.constexpr, o_layout: gl.constexpr):
        """The key loop with warpgroup MMAs in flight under the exponentials and stores:
        q @ k^T of tile j + 1 is issued before tile j's softmax, and tile j's P @ V runs into
        the next tile, waited for together with that tile's next product. Per tile: QK(j+1),
        softmax and store of j, [wait QK(j+1), PV(j-1)], PV(j). No MMA result in flight is
        carried across the loop's back edge except P @ V's accumulator, which the MMA updates
        in place (a copy of in-flight registers would make ptxas serialize every MMA). Needs
        STAGES >= 4: slot j - 2 is refilled with tile j + STAGES - 2 after tile j's block
        barrier, by which every warp has waited for PV(j - 2)."""
        p_op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout,
                                                        k_width=2)
        gl.static_assert(STAGES >= 4)
        gl.static_assert(PBUF >= 2)
        kv_bytes: gl.constexpr = 2 * BLOCK_N * D * 2
        mbarrier.wait(kv_bar.index(0), 0)
        s_tok = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False,
                              is_async=True)
        s = warpgroup_mma_wait(0, deps=(s_tok, ))
        acc = warpgroup_mma_init(gl.zeros([BLOCK_M, D], gl.float32, o_layout))
        # P of the tile before, the A operand of the P @ V in flight: carried through the wait
        # that covers that MMA, so its registers are not reused before it has read them
        p16 = gl.zeros([BLOCK_M, BLOCK_N], v_desc.dtype, p_op_layout)
        for j in range(n_tiles):
            slot = j % STAGES
            nslot = (j + 1) % STAGES
            # QK(j + 1); past the last tile it reads a stale slot and is never used
            mbarrier.wait(kv_bar.index(nslot), ((j + 1) // STAGES) & 1, pred=j + 1 < n_tiles)
            s_tok = warpgroup_mma(q_smem, k_smem.index(nslot).permute((1, 0)), s_zero,
                                  use_acc=False, is_async=True)
            z = gl.fma(s, qscale, -lse2)
            if CAUSAL:
                n0 = j * BLOCK_N
                if n0 + BLOCK_N - 1 > m0:
                    z = gl.where(rows2 >= gl.expand_dims(n0 + cols, 0), z, float("-inf"))
            p = gl.exp2(z)
            pb = j % PBUF
            p_smem.index(pb).store(p)
            fence_async_shared()
            # the copy of tile j + 1 - PBUF (whose buffer tile j + 1 takes) has read it once
            # at most PBUF - 2 copies are pending; the barrier tells every thread
            tma.store_wait(PBUF - 2)
            _block_barrier()
            tma.async_copy_shared_to_global(p_desc, [p_row, j * BLOCK_N], p_smem.index(pb))
            nj = j + STAGES - 2
            if nj < n_tiles:
                ns = nj % STAGES
                mbarrier.expect(kv_bar.index(ns), kv_bytes)
                tma.async_copy_global_to_shared(k_desc, [kv_row + nj * BLOCK_N, kvh * D],
                                                kv_bar.index(ns), k_smem.index(ns))
                tma.async_copy_global_to_shared(v_desc, [kv_row + nj * BLOCK_N, kvh * D],
                                                kv_bar.index(ns), v_smem.index(ns))
            p16_next = gl.convert_layout(p.to(v_desc.dtype), p_op_layout)
            s, acc, p16 = warpgroup_mma_wait(0, deps=(s_tok, acc, p16))
            p16 = p16_next
            acc = warpgroup_mma(p16, v_smem.index(slot), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc, p16))[0]
        return acc


def available(device: torch.device) -> bool:
    """Gluon importable and a Hopper-or-newer CUDA device."""
    if not HAVE_GLUON or device.type != "cuda":
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def supported(q16, seq, head_dim, mask_kind, scale, cfg) -> bool:
    """Where this pass may replace flash.py's MODE 2 (see the module docstring)."""
    block_m, block_n = cfg[0], cfg[1]
    return (q16.dtype in (torch.float16, torch.bfloat16) and mask_kind == 0 and scale > 0
            and head_dim in (16, 32, 64, 128) and seq % block_m == 0 and seq % block_n == 0
            and (block_m % block_n == 0 or block_n % block_m == 0))


@functools.lru_cache(maxsize=None)
def _zero_tile(device_index, block_m, block_n):
    # the causal pass copies its above-diagonal zeros from here (never written after creation)
    return torch.zeros((block_m, block_n), device=torch.device("cuda", device_index),
                       dtype=torch.float32)


def _desc(t2d, block, dtype):
    layout = gl.NVMMASharedLayout.get_default_for(block, dtype)
    return TensorDescriptor(t2d, list(t2d.shape), list(t2d.stride()), block, layout)


def launch(q16, k16, v16, out, probs, ml, flag, batch, seq, num_heads, groups, head_dim, scale,
           causal, cfg, guard=0):
    """q16 [B*S, >= H*D] (row stride q16.stride(0)), k16/v16 [B*S, >= Hkv*D], all 16-bit with
    unit column stride; out [B, S, H*D]-strided (row stride out.stride(1)); probs [B, H, S, S]
    float32 contiguous; ml the stats pass's [B*H*S*2]; ``guard`` 1 exits at once if ``flag``
    is set (flash.py's GUARD 1)."""
    block_m, block_n, num_warps, stages, pbuf, overlap = cfg[:6]
    if not supported(q16, seq, head_dim, 0, scale, cfg):
        raise ValueError(f"probs_tma.launch: S={seq}, head_dim={head_dim}, {q16.dtype} not "
                         f"covered by config {cfg}")
    if causal and block_m % block_n:
        raise ValueError(f"probs_tma.launch: causal needs BLOCK_N to divide BLOCK_M ({cfg})")
    if not probs.is_contiguous() or probs.dtype != torch.float32:
        raise ValueError("probs_tma.launch: probabilities must be contiguous float32")
    elem = gl.float16 if q16.dtype == torch.float16 else gl.bfloat16
    rows = batch * seq
    hd = num_heads * head_dim
    kd = (num_heads // groups) * head_dim
    q2 = q16.as_strided((rows, hd), (q16.stride(0), 1))
    k2 = k16.as_strided((rows, kd), (k16.stride(0), 1))
    v2 = v16.as_strided((rows, kd), (v16.stride(0), 1))
    p2 = probs.view(batch * num_heads * seq, seq)
    q_desc = _desc(q2, [block_m, head_dim], elem)
    k_desc = _desc(k2, [block_n, head_dim], elem)
    v_desc = _desc(v2, [block_n, head_dim], elem)
    p_desc = _desc(p2, [block_m, block_n], gl.float32)
    zero = _zero_tile(probs.device.index, block_m, block_n)
    zero_desc = _desc(zero, [block_m, block_n], gl.float32)
    grid = (seq // block_m, batch * num_heads)
    probs_tma_kernel[grid](
        q_desc, k_desc, v_desc, p_desc, zero_desc, out, ml, flag if guard else out,
        out.stride(0), out.stride(1), num_heads, groups, seq, float(scale) * LOG2E,
        D=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, PBUF=pbuf,
        CAUSAL=bool(causal), GUARD=int(guard), OVERLAP=bool(overlap),
        num_warps=num_warps)
