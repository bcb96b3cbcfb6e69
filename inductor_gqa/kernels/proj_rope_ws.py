"""The fused Q/K/V projection with its RoPE epilogue under the next tile's GEMM (Gluon, Hopper).

``proj_rope.py`` computes q, k, v = x @ W^T on fp16 operand copies and applies the scales, RoPE
and the range rule to each output tile in registers before writing the copies. Its programs
alternate between the GEMM's main loop and that epilogue, so the tensor cores idle during every
epilogue (~11 us of the launch at 8192 rows on the H200, docs/kernels.md note 53), and two
programs per SM did not hide it. Here the roles are split inside one persistent program
(warp specialization, as CUTLASS's "ping-pong" GEMM):

* a loader warp streams the K slices of x and W through a ring of shared buffers (copy engine;
  ``ready``/``empty`` barriers per slot);
* two consumer warpgroups take the program's output tiles in turn: while one runs its
  epilogue, the other's main loop has the tensor cores. A token barrier per warpgroup orders
  their main loops (tile i + 1's first slot wait after tile i's last one): a wait on a ring
  slot one round early would pass on the previous round's completion of the same parity.

The epilogue is proj_rope's, numerics included: the product times its token's and feature's
reciprocal scale (exact), rotate-half RoPE with cos/sin of the exact float32 angles
position * inv_freq (reduced by 2*pi in two FMA steps, then the hardware's approximations),
rounded once to fp16, the range rule per head row, and the tile out through the copy engine.

Scope (``covers``): no per-head norm; no RoPE, or rotate-half RoPE over the whole head with
cos/sin computed from inv_freq and the positions (W075's block); head size a power of two in
[32, 128] (the sizes run on the GPU); fp16 operands with 16-byte aligned rows; Hopper, Gluon
importable. Other blocks keep proj_rope's kernel. The CPU interpreter does not run Gluon: the
kernel is compiled for sm_90 on the CPU (tests/kernels/test_sm90_compile.py) and checked on the
GPU against proj_rope's (perf/experiments/proj_rope_ws_bench.py).
"""

from __future__ import annotations

import torch

from . import pdl
from .host import capability, cdiv, sm_count
from .proj_rope import _tile_of, checked_operands
from .qk_epilogue import FP16_MIN_NORMAL

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

    from .probs_staged import _block_barrier, _desc, _wait_for_predecessor
    HAVE_GLUON = True
except ImportError:         # an older Triton: proj_rope's kernel is the only one
    HAVE_GLUON = False

# ("ws", BM, BN, BK, STAGES): each consumer's output tile BM x BN (BN whole heads of one part),
# K slices of BK, a ring of STAGES slots. At 128 x 128 the two output buffers and a five-slot
# ring take 229,704 of an H200 block's 232,448 bytes (H200, 8192 rows: 5 slots 43.8 us,
# 4 slots 44.6, 3 slots 50.1; the 64-row form wins at 131 rows only)
CONFIGS = [("ws", 128, 128, 64, 5), ("ws", 128, 128, 64, 4), ("ws", 64, 128, 64, 4)]
CONSUMER_REGS = 232         # registers per thread of the second consumer warpgroup
LOADER_REGS = 40


if HAVE_GLUON:
    @gluon.jit
    def _asm1(x, op: gl.constexpr):
        """One PTX instruction of one float32 operand, elementwise (cvt.rni, cos/sin.approx:
        libdevice's rint and fast_cosf/fast_sinf, which Gluon does not expose)."""
        return gl.inline_asm_elementwise(op + " $0, $1;", "=r,r", [x], dtype=gl.float32,
                                         is_pure=True, pack=1)

    @gluon.jit
    def _loader(role, a_desc, b_desc, out_desc, a_ring, b_ring, o_smem, ready, empty, tok, M, N,
                K, tok_inv_ptr, feat_inv_ptr, flag_ptr, NQ, NK, S, pos_ptr, pos_b, pos_s, inv_ptr,
                D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
                STAGES: gl.constexpr, ROPE: gl.constexpr):
        """The copy-engine warp: the K slices of every tile of this program, in order."""
        num_m = gl.cdiv(M, BM)
        num_n = gl.cdiv(N, BN)
        kt = gl.cdiv(K, BK)
        p = 0
        for t in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):
            pid_m, pid_n = _tile_of(t, num_m, num_n, 8)
            for kk in range(kt):
                slot = p % STAGES
                # a slot's first use waits on the phase before its init (passes at once)
                mbarrier.wait(empty.index(slot), ((p // STAGES) & 1) ^ 1)
                mbarrier.expect(ready.index(slot),
                                a_desc.block_type.nbytes + b_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(a_desc, [pid_m * BM, kk * BK], ready.index(slot),
                                                a_ring.index(slot))
                tma.async_copy_global_to_shared(b_desc, [pid_n * BN, kk * BK], ready.index(slot),
                                                b_ring.index(slot))
                p += 1

    @gluon.jit
    def _epilogue(acc, off_m, off_n, M, tok_inv_ptr, feat_inv_ptr, flag_ptr, NQ, NK, S,
                  pos_ptr, pos_b, pos_s, inv_ptr, D: gl.constexpr, BM: gl.constexpr,
                  BN: gl.constexpr, ROPE: gl.constexpr, NW: gl.constexpr):
        """proj_rope's epilogue on one accumulator: scales undone, RoPE on q and k columns,
        fp16 with the range rule per head row. Returns the fp16 tile."""
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                      instr_shape=[16, BN, 16])
        HB: gl.constexpr = BN // D
        HALF: gl.constexpr = D // 2
        rows = off_m + gl.arange(0, BM, layout=gl.SliceLayout(1, mma))
        cols = gl.arange(0, BN, layout=gl.SliceLayout(0, mma))
        m_ok = rows < M
        # rows past M: scale 0, so their (zero) products raise no flag and are not stored
        tok_inv = gl.load(tok_inv_ptr + rows, mask=m_ok, other=0.0)
        feat_inv = gl.load(feat_inv_ptr + off_n + cols)
        x = acc * gl.expand_dims(tok_inv, 1) * gl.expand_dims(feat_inv, 0)
        # each head's row in its two halves: [BM, HB, HALF] twice (the same registers)
        x1, x2 = gl.split(gl.permute(gl.reshape(x, [BM, HB, 2, HALF]), [0, 1, 3, 2]))
        if ROPE != 0:
            if off_n < NQ + NK:
                bi = rows // S
                pos = gl.load(pos_ptr + bi.to(gl.int64) * pos_b
                              + (rows - bi * S).to(gl.int64) * pos_s,
                              mask=m_ok, other=0).to(gl.float32)
                f = gl.load(inv_ptr + cols % HALF)
                # the exact float32 angles, laid out as x1 (every head the same: one kept)
                ang = gl.expand_dims(pos, 1) * gl.expand_dims(f, 0)
                a1, _ = gl.split(gl.permute(gl.reshape(ang, [BM, HB, 2, HALF]), [0, 1, 3, 2]))
                ang = gl.max(a1, axis=1)
                k = _asm1(ang * 0.15915494309189535, "cvt.rni.f32.f32")
                r = gl.fma(k, -6.2831854820251465, ang)     # float32(2 pi)
                r = gl.fma(k, 1.7484556000744883e-07, r)    # 2 pi - float32(2 pi)
                c = gl.expand_dims(_asm1(r, "cos.approx.ftz.f32"), 1)
                s = gl.expand_dims(_asm1(r, "sin.approx.ftz.f32"), 1)
                y1 = x1 * c + (-x2) * s
                x2 = x2 * c + x1 * s
                x1 = y1
        h1 = x1.to(gl.float16)
        h2 = x2.to(gl.float16)
        # the range rule per (token, head) row (qk_epilogue.bad_rows16)
        over = gl.max((~(gl.abs(h1.to(gl.float32)) < float("inf"))
                       | ~(gl.abs(h2.to(gl.float32)) < float("inf"))).to(gl.int32), axis=2)
        rmax = gl.maximum(gl.max(gl.abs(x1), axis=2), gl.max(gl.abs(x2), axis=2))
        bad = ((rmax > 0.0) & (rmax < FP16_MIN_NORMAL)) | (over != 0)
        one = bad.to(gl.int32)
        gl.atomic_max(flag_ptr + one * 0, one, mask=bad)
        y = gl.reshape(gl.permute(gl.join(h1, h2), [0, 1, 3, 2]), [BM, BN])
        return gl.convert_layout(y, mma)

    @gluon.jit
    def _consumer(role, a_desc, b_desc, out_desc, a_ring, b_ring, o_smem, ready, empty, tok, M,
                  N, K, tok_inv_ptr, feat_inv_ptr, flag_ptr, NQ, NK, S, pos_ptr, pos_b, pos_s,
                  inv_ptr, D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                  BK: gl.constexpr, STAGES: gl.constexpr, ROPE: gl.constexpr):
        """A consumer warpgroup: the program's tiles of parity ``role``, main loop (one MMA in
        flight, each slot freed once the MMA that read it is done) then epilogue."""
        NW: gl.constexpr = 4
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                      instr_shape=[16, BN, 16])
        num_m = gl.cdiv(M, BM)
        num_n = gl.cdiv(N, BN)
        kt = gl.cdiv(K, BK)
        pid = gl.program_id(0)
        nprog = gl.num_programs(0)
        out = o_smem.index(role)
        i = role                    # the tile's place in the program's sequence
        for t in range(pid + role * nprog, num_m * num_n, 2 * nprog):
            pid_m, pid_n = _tile_of(t, num_m, num_n, 8)
            acc = gl.zeros([BM, BN], gl.float32, mma)
            p0 = i * kt
            # the other warpgroup's tile i - 1 has waited for all its slices: the ring's
            # barriers are now in the phases of tile i's (a wait on a later phase of the same
            # parity would pass early)
            other = i // 2 - 1 + role
            mbarrier.wait(tok.index(1 - role), other & 1, pred=other >= 0)
            for kk in range(kt):
                p = p0 + kk
                slot = p % STAGES
                mbarrier.wait(ready.index(slot), (p // STAGES) & 1)
                mbarrier.arrive(tok.index(role), pred=kk == kt - 1)
                a_s = a_ring.index(slot)
                b_s = b_ring.index(slot).permute((1, 0))
                acc = warpgroup_mma(a_s, b_s, acc, is_async=True)
                acc = warpgroup_mma_wait(1, deps=(acc, a_s, b_s))[0]
                # the MMA before this one is done: its slot may be refilled
                mbarrier.arrive(empty.index((p + STAGES - 1) % STAGES), pred=kk > 0)
            acc = warpgroup_mma_wait(0, deps=(acc,))
            mbarrier.arrive(empty.index((p0 + kt - 1) % STAGES))
            y = _epilogue(acc, pid_m * BM, pid_n * BN, M, tok_inv_ptr, feat_inv_ptr, flag_ptr,
                          NQ, NK, S, pos_ptr, pos_b, pos_s, inv_ptr, D, BM, BN, ROPE, NW)
            tma.store_wait(0)       # this warpgroup's previous tile has left its buffer
            _block_barrier()
            out.store(y)
            fence_async_shared()
            _block_barrier()
            tma.async_copy_shared_to_global(out_desc, [pid_m * BM, pid_n * BN], out)
            i += 2
        tma.store_wait(0)

    @gluon.jit
    def proj_rope_ws_kernel(a_desc, b_desc, out_desc, M, N, K, tok_inv_ptr, feat_inv_ptr,
                            flag_ptr, NQ, NK, S, pos_ptr, pos_b, pos_s, inv_ptr,
                            D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                            BK: gl.constexpr, STAGES: gl.constexpr, ROPE: gl.constexpr,
                            REGS: gl.constexpr, LREGS: gl.constexpr, num_warps: gl.constexpr,
                            PDL: gl.constexpr = 0):
        """Persistent programs (one per SM): a loader warp and two consumer warpgroups."""
        _wait_for_predecessor(PDL)
        a_ring = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BM, BK], a_desc.layout)
        b_ring = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BN, BK], b_desc.layout)
        o_smem = gl.allocate_shared_memory(out_desc.dtype, [2, BM, BN], out_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=1)
        tok = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(tok.index(0), count=1)
        mbarrier.init(tok.index(1), count=1)
        # (the arguments written out for each partition: a tuple built here would turn the
        # constexprs into values)
        gl.warp_specialize([
            (_consumer, (0, a_desc, b_desc, out_desc, a_ring, b_ring, o_smem, ready, empty, tok, M,
                         N, K, tok_inv_ptr, feat_inv_ptr, flag_ptr, NQ, NK, S, pos_ptr, pos_b,
                         pos_s, inv_ptr, D, BM, BN, BK, STAGES, ROPE)),
            (_consumer, (1, a_desc, b_desc, out_desc, a_ring, b_ring, o_smem, ready, empty, tok, M,
                         N, K, tok_inv_ptr, feat_inv_ptr, flag_ptr, NQ, NK, S, pos_ptr, pos_b,
                         pos_s, inv_ptr, D, BM, BN, BK, STAGES, ROPE)),
            (_loader, (2, a_desc, b_desc, out_desc, a_ring, b_ring, o_smem, ready, empty, tok, M,
                       N, K, tok_inv_ptr, feat_inv_ptr, flag_ptr, NQ, NK, S, pos_ptr, pos_b, pos_s,
                       inv_ptr, D, BM, BN, BK, STAGES, ROPE)),
        ], [num_warps, 1], [REGS, LREGS])


def available(device: torch.device) -> bool:
    """Gluon importable and a Hopper CUDA device (warpgroup MMA)."""
    if not HAVE_GLUON or device.type != "cuda":
        return False
    return capability(device)[0] == 9


def covers(head_dim, norm, rope, rotary_dim, angles) -> bool:
    """Blocks this launch covers, as checked on the GPU against proj_rope's kernel (H200, head
    sizes 32, 64 and 128; docs/kernels.md note 60): no norm, and no RoPE or rotate-half RoPE
    over the whole head with cos/sin from the angles (inv_freq and positions)."""
    if not (HAVE_GLUON and head_dim in (32, 64, 128) and norm == "none"):
        return False
    return rope == "none" or (rope == "half" and rotary_dim == head_dim and bool(angles))


def config_fits(cfg, parts, head_dim) -> bool:
    """BN whole heads of one part (a multiple of the head size dividing each part's width)."""
    bn = cfg[2]
    return bn % head_dim == 0 and all(n % bn == 0 for n in parts)


def candidates(parts, head_dim, device, norm, rope, rotary_dim, angles):
    """The configs the tuner may time beside proj_rope's (none where not covered)."""
    if not (available(device) and covers(head_dim, norm, rope, rotary_dim, angles)):
        return []
    return [c for c in CONFIGS if config_fits(c, parts, head_dim)]


def launch(x16, w16, tok_inv, feat_inv, out16, flag, parts, seq, head_dim, rope, cfg,
           angles=None):
    """proj_rope.launch's contract for the covered blocks (``covers``): out16 [M, Nq+Nk+Nv]
    fp16 = the copies of q, k, v from x16 [M, K] @ w16 [N, K]^T times tok_inv [M] and
    feat_inv [N], RoPE on the q and k columns from ``angles`` = (inv_freq [D/2] float32,
    position_ids [B, S] integer); raises ``flag`` by the range rule."""
    _, bm, bn, bk, stages = cfg
    m, k = x16.shape
    n = w16.shape[0]
    nq, nk, _ = parts
    rotary = head_dim if rope != "none" else 0
    pos_args = checked_operands(
        x16, w16, out16, tok_inv, parts, seq, head_dim, rope, angles, cfg,
        "proj_rope_ws.launch",
        config_fits(cfg, parts, head_dim)
        and covers(head_dim, "none", rope, rotary, angles is not None))
    tiles = cdiv(m, bm) * cdiv(n, bn)
    grid = (min(tiles, sm_count(x16.device)),)
    proj_rope_ws_kernel[grid](
        _desc(x16, [bm, bk]), _desc(w16, [bn, bk]), _desc(out16, [bm, bn]), m, n, k, tok_inv,
        feat_inv, flag, nq, nk, seq, *pos_args, D=head_dim, BM=bm, BN=bn, BK=bk, STAGES=stages,
        ROPE=int(rope != "none"), REGS=CONSUMER_REGS, LREGS=LOADER_REGS, num_warps=4,
        **pdl.launch_options(x16.device))
