"""The probabilities pass (flash.py's MODE 2) with one K/V stream feeding several warpgroups
(Gluon, Hopper, warp-specialized).

Why: at 4096x1 the pass runs at L2 throughput (ncu: 81% of the L2's peak, 88% for its stores
alone): the stores are 50.7M sectors, the K/V tile reads another 14.4M, one full K and V per
128-row program. A program of NC warpgroups (64 rows each, 16 positions x 4 query heads of one
KV head) reads each K/V tile once for all of them, NC / 2 times fewer reads than flash.py's
128-row programs, while keeping 16 warps per SM: a one-warp producer partition streams the K/V
tiles into a ring (``full`` barriers), and each consumer warpgroup releases a slot
(``empty``, one arrival per warpgroup) when its MMAs on it are done, so no warp waits at a
block-wide barrier for the others (what sank the 256-row programs with a barrier per tile,
docs note 50).

Per consumer and key tile: s = q @ k^T (warpgroup MMA), p = exp2(s * scale - lse) with the
row's log-sum-exp from the stats pass (flash.py's ML), p stored as 16-byte rows (through shared
memory), o += fp16(p) @ V with P as a register operand.

Scope (``supported``): fp16 q/k/V as probs_staged's operands, no mask, not causal, S a
multiple of BLOCK_N, query heads sharing a KV head in fours, Hopper, Gluon importable.
"""

from __future__ import annotations

import torch

from . import pdl, probs_staged
from .host import cdiv

HAVE_GLUON = probs_staged.HAVE_GLUON
LOG2E = probs_staged.LOG2E
GP = 4                      # query heads per consumer row tile (positions x heads, head-major)
ROWS = 64                   # rows per consumer warpgroup

# (consumer warpgroups, BLOCK_N, K/V stages, consumer registers)
CONFIGS = [(2, 64, 3, 168), (2, 64, 3, 168, "pp"), (2, 64, 4, 168, "pp"), (2, 64, 2, 168, "pp")]

if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, tma, warpgroup_mma,
                                                                  warpgroup_mma_wait)

    @gluon.jit
    def _producer(k_desc, v_desc, k_smem, v_smem, full, empty, kv_row, kvh, n,
                  D: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
        """K and V tile t into slot t % STAGES once every consumer released it."""
        for t in range(n):
            slot = t % STAGES
            if t >= STAGES:
                mbarrier.wait(empty.index(slot), ((t // STAGES) - 1) & 1)
            mbarrier.expect(full.index(slot), 2 * BLOCK_N * D * 2)
            tma.async_copy_global_to_shared(k_desc, [kv_row + t * BLOCK_N, kvh * D],
                                            full.index(slot), k_smem.index(slot))
            tma.async_copy_global_to_shared(v_desc, [kv_row + t * BLOCK_N, kvh * D],
                                            full.index(slot), v_smem.index(slot))

    @gluon.jit
    def _consumer(c_off, q_desc, ML, O, P, FLAG, so_b, so_s, sp_bh, sp_s, H, S, qscale,
                  b, h, m0, bh, kv_row, n, q_smem, q_bar, k_smem, v_smem, full, empty,
                  tok_wait, tok_arrive, tok_off,
                  D: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                  GUARD: gl.constexpr, GP: gl.constexpr, PP: gl.constexpr):
        """A consumer warpgroup: rows of positions m0 + c_off .. (+ MR) of the GP heads."""
        MR: gl.constexpr = 16       # 64 rows = 16 positions x GP (4) heads
        mc = m0 + c_off
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, D, 16])
        st_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 4],
                                                   threads_per_warp=[2, 16],
                                                   warps_per_cta=[4, 1], order=[1, 0])
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout,
                                                     k_width=2)
        mbarrier.expect(q_bar, 64 * D * 2)
        for i in gl.static_range(GP):
            tma.async_copy_global_to_shared(q_desc, [kv_row + mc, (h + i) * D], q_bar,
                                            q_smem.slice(i * MR, MR))
        r = gl.arange(0, 64, layout=gl.SliceLayout(1, s_layout))
        rows = mc + r % MR
        ml = ML + ((bh + r // MR).to(gl.int64) * S + rows) * 2
        row_in = rows < S
        m_i = gl.load(ml, mask=row_in, other=0.0)
        l_i = gl.load(ml + 1, mask=row_in, other=1.0)
        lse = gl.expand_dims(gl.where(m_i == float("-inf"), 0.0, m_i) + gl.log2(l_i), 1)
        r_st = gl.arange(0, 64, layout=gl.SliceLayout(1, st_layout))
        rows_st = mc + r_st % MR
        row_ok = gl.expand_dims(rows_st < S, 1)
        p_rows = P + gl.expand_dims((bh + r_st // MR).to(gl.int64) * sp_bh
                                    + rows_st.to(gl.int64) * sp_s, 1)
        cols0 = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, st_layout))
        s_zero = gl.zeros([64, BLOCK_N], gl.float32, s_layout)
        acc = gl.zeros([64, D], gl.float32, o_layout)
        mbarrier.wait(q_bar, 0)
        for t in range(n):
            slot = t % STAGES
            mbarrier.wait(full.index(slot), (t // STAGES) & 1)
            k_t = k_smem.index(slot).permute((1, 0))
            v_t = v_smem.index(slot)
            if PP:
                # the two consumers' q @ k^T alternate (A_t after B_(t-1), B_t after A_t), so
                # one's exponentials and stores run while the other's product does
                mbarrier.wait(tok_wait, (t + tok_off) & 1, pred=t + tok_off >= 0)
            tok = warpgroup_mma(q_smem, k_t, s_zero, use_acc=False, is_async=True)
            s = warpgroup_mma_wait(0, deps=(tok, q_smem, k_t))[0]
            if PP:
                mbarrier.arrive(tok_arrive)
            p = gl.exp2(gl.fma(s, qscale, -lse))
            gl.store(p_rows + gl.expand_dims(t * BLOCK_N + cols0, 0),
                     gl.convert_layout(p, st_layout), mask=row_ok,
                     eviction_policy="evict_first")
            p16 = gl.convert_layout(p.to(gl.float16), a_layout)
            pv = warpgroup_mma(p16, v_t, acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=(pv, p16, v_t))[0]
            mbarrier.arrive(empty.index(slot))
        probs_staged._store_o(acc, O, FLAG, b, h, mc, so_b, so_s, S, D, 64, BLOCK_N, GUARD, 4,
                              GP)

    @gluon.jit
    def _consumer_c(c, c_off, q_desc, ML, O, P, FLAG, so_b, so_s, sp_bh, sp_s, H, S, qscale, b, h,
                    m0, bh, kv_row, n, q_smem, q_bar, k_smem, v_smem, full, empty, tok_wait,
                    tok_arrive, tok_off, D: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                    GUARD: gl.constexpr, GP: gl.constexpr, PP: gl.constexpr):
        _consumer(c_off, q_desc, ML, O, P, FLAG, so_b, so_s, sp_bh, sp_s, H, S, qscale, b, h, m0,
                  bh, kv_row, n, q_smem.index(c), q_bar.index(c), k_smem, v_smem, full, empty,
                  tok_wait, tok_arrive, tok_off,
                  D, BLOCK_N, STAGES, GUARD, GP, PP)

    @gluon.jit
    def probs_ws_kernel(q_desc, k_desc, v_desc, ML, O, P, FLAG, so_b, so_s, sp_bh, sp_s,
                        H, G, S, qscale,
                        D: gl.constexpr, BLOCK_N: gl.constexpr, NC: gl.constexpr,
                        STAGES: gl.constexpr, GUARD: gl.constexpr, REGS: gl.constexpr,
                        num_warps: gl.constexpr, PDL: gl.constexpr = 0, GP: gl.constexpr = 4,
                        PP: gl.constexpr = 0):
        """Grid: (blocks of NC * 64 // GP positions, B * H / GP); num_warps 4 (consumer 0)."""
        probs_staged._wait_for_predecessor(PDL)
        if GUARD == 1:
            if gl.load(FLAG) != 0:
                return
        n_m = gl.num_programs(0)
        tile = gl.program_id(1) * n_m + gl.program_id(0)
        bh, b, h, kvh, m0 = probs_staged._tile_coords(tile, n_m, H, G, NC * 64, GP)
        kv_row = b * S
        n = S // BLOCK_N
        q_smem = gl.allocate_shared_memory(q_desc.dtype, [NC, 64, D], q_desc.layout)
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, D], k_desc.layout)
        v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, D], v_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [NC, 1], mbarrier.MBarrierLayout())
        full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        # PP (two consumers): consumer 0 waits on tok 0 for consumer 1's q @ k^T of the previous
        # tile (none before tile 0, offset -1), consumer 1 on tok 1 for consumer 0's of this one
        tok = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(tok.index(0), count=1)
        mbarrier.init(tok.index(1), count=1)
        for i in gl.static_range(NC):
            mbarrier.init(q_bar.index(i), count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(full.index(i), count=1)
            mbarrier.init(empty.index(i), count=NC)
        # (tuples written out: a tuple built once and concatenated loses its constexprs)
        if NC == 4:
            gl.warp_specialize([(_consumer_c, (0, 0, q_desc, ML, O, P, FLAG, so_b, so_s, sp_bh, sp_s, H, S, qscale, b, h, m0, bh, kv_row, n, q_smem, q_bar, k_smem, v_smem, full, empty, tok.index(0), tok.index(1), -1, D, BLOCK_N, STAGES, GUARD, GP, PP)), (_consumer_c, (1, 16, q_desc, ML, O, P, FLAG, so_b, so_s, sp_bh, sp_s, H, S, qscale, b, h, m0, bh, kv_row, n, q_smem, q_bar, k_smem, v_smem, full, empty, tok.index(1), tok.index(0), 0, D, BLOCK_N, STAGES, GUARD, GP, PP)), (_consumer_c, (2, 32, q_desc, ML, O, P, FLAG, so_b, so_s, sp_bh, sp_s, H, S, qscale, b, h, m0, bh, kv_row, n, q_smem, q_bar, k_smem, v_smem, full, empty, tok.index(0), tok.index(1), -1, D, BLOCK_N, STAGES, GUARD, GP, PP)), (_consumer_c, (3, 48, q_desc, ML, O, P, FLAG, so_b, so_s, sp_bh, sp_s, H, S, qscale, b, h, m0, bh, kv_row, n, q_smem, q_bar, k_smem, v_smem, full, empty, tok.index(0), tok.index(1), -1, D, BLOCK_N, STAGES, GUARD, GP, PP)), (_producer, (k_desc, v_desc, k_smem, v_smem, full, empty, kv_row, kvh, n, D, BLOCK_N, STAGES))], [4, 4, 4, 1], [REGS, REGS, REGS, 24])
        elif NC == 3:
            gl.warp_specialize([(_consumer_c, (0, 0, q_desc, ML, O, P, FLAG, so_b, so_s, sp_bh, sp_s, H, S, qscale, b, h, m0, bh, kv_row, n, q_smem, q_bar, k_smem, v_smem, full, empty, tok.index(0), tok.index(1), -1, D, BLOCK_N, STAGES, GUARD, GP, PP)), (_consumer_c, (1, 16, q_desc, ML, O, P, FLAG, so_b, so_s, sp_bh, sp_s, H, S, qscale, b, h, m0, bh, kv_row, n, q_smem, q_bar, k_smem, v_smem, full, empty, tok.index(1), tok.index(0), 0, D, BLOCK_N, STAGES, GUARD, GP, PP)), (_consumer_c, (2, 32, q_desc, ML, O, P, FLAG, so_b, so_s, sp_bh, sp_s, H, S, qscale, b, h, m0, bh, kv_row, n, q_smem, q_bar, k_smem, v_smem, full, empty, tok.index(0), tok.index(1), -1, D, BLOCK_N, STAGES, GUARD, GP, PP)), (_producer, (k_desc, v_desc, k_smem, v_smem, full, empty, kv_row, kvh, n, D, BLOCK_N, STAGES))], [4, 4, 1], [REGS, REGS, 24])
        else:
            gl.warp_specialize([(_consumer_c, (0, 0, q_desc, ML, O, P, FLAG, so_b, so_s, sp_bh, sp_s, H, S, qscale, b, h, m0, bh, kv_row, n, q_smem, q_bar, k_smem, v_smem, full, empty, tok.index(0), tok.index(1), -1, D, BLOCK_N, STAGES, GUARD, GP, PP)), (_consumer_c, (1, 16, q_desc, ML, O, P, FLAG, so_b, so_s, sp_bh, sp_s, H, S, qscale, b, h, m0, bh, kv_row, n, q_smem, q_bar, k_smem, v_smem, full, empty, tok.index(1), tok.index(0), 0, D, BLOCK_N, STAGES, GUARD, GP, PP)), (_producer, (k_desc, v_desc, k_smem, v_smem, full, empty, kv_row, kvh, n, D, BLOCK_N, STAGES))], [4, 1], [REGS, 24])


def supported(q16, k16, v16, seq, head_dim, mask_kind, scale, causal, groups, cfg) -> bool:
    """Where this kernel may replace flash.py's probabilities pass (module docstring)."""
    nc, block_n, stages = cfg[:3]
    smem = 2 * nc * 64 * head_dim + 4 * stages * block_n * head_dim + 8 * (nc + 2 * stages)
    return (probs_staged.operands_ok(q16, k16, v16, head_dim, mask_kind, scale)
            and not causal and seq % block_n == 0 and groups % GP == 0
            and smem <= probs_staged.SMEM_PER_BLOCK)


def candidates(q16, k16, v16, seq, head_dim, mask_kind, scale, causal, groups):
    """The configs of ``CONFIGS`` this block may run, tagged for the tuner."""
    if not (HAVE_GLUON and probs_staged.available(q16.device)):
        return []
    return [("ws",) + c for c in CONFIGS
            if supported(q16, k16, v16, seq, head_dim, mask_kind, scale, causal, groups, c)]


def launch(q16, k16, v16, ml, out, probs, flag, batch, seq, num_heads, groups, head_dim, scale,
           cfg, guard=0):
    """q16 [B*S, >= H*D], k16/v16 [B*S, >= Hkv*D] fp16 row-major views (row stride
    ``.stride(0)``, unit column stride); ml float32 [B*H*S*2] (flash.py's ML, from the stats
    pass); out [B, S, H*D]-strided; probs [B, H, S, S] float32 with unit last stride; ``guard``
    1 exits at once if ``flag`` is set. Outputs as flash.py's MODE 2. ``cfg``: (consumer
    warpgroups, BLOCK_N, stages, consumer registers), optionally after the "ws" tag."""
    if cfg and cfg[0] == "ws":
        cfg = cfg[1:]
    nc, block_n, stages, regs = cfg[:4]
    if not supported(q16, k16, v16, seq, head_dim, 0, scale, False, groups, cfg):
        raise ValueError(f"probs_ws.launch: S={seq}, head_dim={head_dim}, groups={groups} not "
                         f"covered by config {cfg}")
    if probs.dtype != torch.float32 or probs.stride(-1) != 1 or probs.stride(1) != seq * seq:
        raise ValueError("probs_ws.launch: probabilities must be float32 [B, H, S, S] with "
                         "contiguous heads")
    if ml.dtype != torch.float32 or not ml.is_contiguous() or \
            ml.numel() < batch * num_heads * seq * 2:
        raise ValueError("probs_ws.launch: ml must be contiguous float32 [B*H*S*2]")
    descs = probs_staged.descriptors(q16, k16, v16, batch * seq, num_heads, groups, head_dim,
                                     64 // GP, block_n)
    grid = (cdiv(seq, nc * 64 // GP), batch * (num_heads // GP))
    probs_ws_kernel[grid](
        *descs, ml, out, probs, flag if guard else out, out.stride(0), out.stride(1),
        probs.stride(1), probs.stride(2), num_heads, groups, seq, float(scale) * LOG2E,
        D=head_dim, BLOCK_N=block_n, NC=nc, STAGES=stages, GUARD=int(guard), REGS=regs,
        num_warps=4, **pdl.launch_options(out.device), GP=GP, PP=int("pp" in cfg))
