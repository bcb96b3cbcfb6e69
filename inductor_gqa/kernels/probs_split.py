"""The probabilities path in one launch for rows too long to stage in one program's shared memory
(S > ~512), each row tile's keys split over SPLIT programs (Gluon, Hopper). Opt-in
(``INDUCTOR_GQA_SPLIT_ROWS=1``) until measured on the H200.

Why: above ~512 keys flash.py runs two passes (MODE 1 for each row's max and sum, MODE 2
recomputing q @ k^T and the exponentials to store the probabilities); at 4096x1 the stats pass
alone takes 117 us of the pair's ~415. kernels/probs_staged.py avoids the second computation by
staging a row tile's fp16 exponentials in shared memory until the row's sum is known, which fits
one program only up to ~512 keys. Here a row tile's keys are cut into chunks of CHUNK keys, one
program per chunk; each program runs probs_staged's loop 1 on its chunk, publishes its rows'
partial (max, sum), waits until every program of its row tile has, combines them into the rows'
log-sum-exp and runs loop 2 (probabilities out, P @ V on the staged tiles). The partial P @ V
products are summed in a fixed order by the row tile's last program to finish (deterministic).

Forward progress: a program's place (row tile, chunk) is a ticket taken from a counter when it
starts, not its program id, so the tickets of one row tile go to programs that are running at the
same time: groups of SPLIT consecutive tickets are complete except the newest one, and a program
waits only for its own group. Any grid therefore finishes as long as SPLIT programs fit on the
device at once (here up to 8 of 264). With GUARD 1, a program waiting for its group gives up
when the range flag is raised (then the float32 fallback rewrites everything).

Counters and workspace: ``cnt`` int32 [1 + 2 * groups] zeroed before each launch; ``ws_ml``
float32 [groups * SPLIT * 2 * BLOCK_M] (partial max and sum), ``ws_o`` float32
[groups * SPLIT * BLOCK_M * D] (partial P @ V).

Scope (``supported``): fp16 q/k/V copies, float32 probabilities, non-causal, no mask tensor,
scale > 0, head_dim a power of two in [16, 128], rows 16-byte aligned, 2 to 8 programs per row
tile, Hopper. Built on probs_staged.py's loops. Compiled for sm_90 on the CPU by
tests/kernels/sm90_compile.py; timed and checked on the GPU by
perf/experiments/probs_split_bench.py.
"""

from __future__ import annotations

import torch

import os

from . import pdl
from . import probs_staged as ps
from .host import cdiv

# (BLOCK_M, BLOCK_N, warps, K/V stages, key tiles per program)
CONFIGS = [(64, 128, 4, 2, 4), (64, 64, 4, 3, 8), (64, 128, 4, 2, 2), (64, 64, 4, 3, 4),
           (64, 128, 4, 3, 4)]

if ps.HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, tma)

    @gluon.jit
    def probs_split_kernel(q_desc, k_desc, v_desc, O, P, FLAG, WS_ML, WS_O, CNT,
                           so_b, so_s, sp_bh, sp_s, H, G, S, qscale, n_m, n_groups,
                           D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                           N_TILES: gl.constexpr, SPLIT: gl.constexpr, STAGES: gl.constexpr,
                           GUARD: gl.constexpr, num_warps: gl.constexpr,
                           PDL: gl.constexpr = 0):
        ps._wait_for_predecessor(PDL)
        # scalar atomics run in one thread and are broadcast to the others: every decision
        # below that another program can change while this one runs is the same in all threads
        if GUARD == 1:
            if gl.atomic_add(FLAG, 0, sem="relaxed", scope="gpu") != 0:
                return
        # this program's place, in the order programs start (see the module docstring)
        ticket = gl.atomic_add(CNT, 1, sem="relaxed", scope="gpu")
        g = ticket // SPLIT
        part = ticket - g * SPLIT
        bh, b, h, kvh, m0 = ps._tile_coords(g, n_m, H, G, BLOCK_M)
        key0 = part * (N_TILES * BLOCK_N)
        kv_row = b * S + key0       # the chunk's first key row of the [B*S, heads*D] views
        n_comp = gl.minimum(gl.maximum((S - key0 + BLOCK_N - 1) // BLOCK_N, 0), N_TILES)

        q_smem, kv_smem, p_smem, m_smem, q_bar, kv_bar = ps._smem(q_desc, k_desc, BLOCK_M,
                                                                  BLOCK_N, D, N_TILES, STAGES)
        mbarrier.expect(q_bar, BLOCK_M * D * 2)
        tma.async_copy_global_to_shared(q_desc, [b * S + m0, h * D], q_bar, q_smem)
        for i in gl.static_range(STAGES - 1):
            ps._issue(0, i, n_comp, k_desc, v_desc, kv_smem, kv_bar, kv_row, kvh, D, BLOCK_N,
                      STAGES)
        m_i, l_i = ps._stage_loop(0, n_comp, key0, m0, S, qscale, k_desc, v_desc, q_smem,
                                  kv_smem, p_smem, m_smem, kv_bar, kv_row, kvh, q_bar, 0, q_bar,
                                  0, False, D, BLOCK_M, BLOCK_N, STAGES, False, False, num_warps)

        # publish the rows' partial (max, sum); release them with the group's counter
        row_s: gl.constexpr = gl.SliceLayout(1, ps._s_layout(BLOCK_N, num_warps))
        r_s = gl.arange(0, BLOCK_M, layout=row_s)
        mine = WS_ML + ticket.to(gl.int64) * (2 * BLOCK_M)
        gl.store(mine + r_s, m_i)
        gl.store(mine + BLOCK_M + r_s, l_i)
        ps._block_barrier()
        gl.atomic_add(CNT + 1 + g, 1, sem="release", scope="gpu")
        seen = gl.atomic_add(CNT + 1 + g, 0, sem="acquire", scope="gpu")
        gave_up = seen * 0
        while (seen < SPLIT) & (gave_up == 0):
            seen = gl.atomic_add(CNT + 1 + g, 0, sem="acquire", scope="gpu")
            if GUARD == 1:
                gave_up = gl.atomic_add(FLAG, 0, sem="relaxed", scope="gpu")
        ps._block_barrier()
        if gave_up != 0:
            # the ring's loads loop 1 issued ahead for loop 2 land before the program ends
            for t in range(n_comp, gl.minimum(n_comp + STAGES - 1, 2 * n_comp)):
                mbarrier.wait(kv_bar.index(t % STAGES), (t // STAGES) & 1)
        else:
            # the rows' log-sum-exp (base 2) from the group's partials, in chunk order
            group = WS_ML + (g * SPLIT).to(gl.int64) * (2 * BLOCK_M)
            m_all = gl.full([BLOCK_M], float("-inf"), gl.float32, row_s)
            for p in gl.static_range(SPLIT):
                m_all = gl.maximum(m_all, gl.load(group + p * 2 * BLOCK_M + r_s,
                                                  cache_modifier=".cg"))
            m_u = gl.where(m_all == float("-inf"), 0.0, m_all)
            l_all = gl.zeros([BLOCK_M], gl.float32, row_s)
            for p in gl.static_range(SPLIT):
                m_p = gl.load(group + p * 2 * BLOCK_M + r_s, cache_modifier=".cg")
                l_p = gl.load(group + p * 2 * BLOCK_M + BLOCK_M + r_s, cache_modifier=".cg")
                l_all = l_all + l_p * gl.exp2(m_p - m_u)
            lse = m_u + gl.log2(l_all)
            st_layout: gl.constexpr = ps._st_layout(BLOCK_N, num_warps)
            o_layout: gl.constexpr = ps._o_layout(D, num_warps)
            row_st: gl.constexpr = gl.SliceLayout(1, st_layout)
            row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
            lse_st = gl.convert_layout(lse, row_st)
            lse_o = gl.convert_layout(lse, row_o)
            # the staged tiles are read by other threads and by the MMA's async proxy
            fence_async_shared()
            ps._block_barrier()
            rows_st = m0 + gl.arange(0, BLOCK_M, layout=row_st)
            row_ok = gl.expand_dims(rows_st < S, 1)
            p_rows = (P + bh.to(gl.int64) * sp_bh
                      + gl.expand_dims(rows_st.to(gl.int64) * sp_s, 1))
            acc = ps._store_loop(0, n_comp, key0, lse_st, lse_o, p_rows, row_ok, S, k_desc,
                                 v_desc, kv_smem, p_smem, m_smem, kv_bar, kv_row, kvh, D,
                                 BLOCK_M, BLOCK_N, STAGES, num_warps)

            # partial P @ V out; the group's last program sums the partials in chunk order
            r_o = gl.arange(0, BLOCK_M, layout=row_o)
            d_o = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
            tile_o = gl.expand_dims(r_o * D, 1) + gl.expand_dims(d_o, 0)
            gl.store(WS_O + ticket.to(gl.int64) * (BLOCK_M * D) + tile_o, acc)
            ps._block_barrier()
            done = gl.atomic_add(CNT + 1 + n_groups + g, 1, sem="acq_rel", scope="gpu")
            if done == SPLIT - 1:
                ps._block_barrier()
                group_o = WS_O + (g * SPLIT).to(gl.int64) * (BLOCK_M * D)
                total = gl.zeros([BLOCK_M, D], gl.float32, o_layout)
                for p in gl.static_range(SPLIT):
                    total = total + gl.load(group_o + p * BLOCK_M * D + tile_o,
                                            cache_modifier=".cg")
                ps._store_o(total, O, FLAG, b, h, m0, so_b, so_s, S, D, BLOCK_M, BLOCK_N,
                            GUARD, num_warps)
        mbarrier.invalidate(q_bar)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(kv_bar.index(i))


def smem_bytes(head_dim, cfg) -> int:
    """Shared memory of one program: q tile, K/V ring, staged fp16 tiles and their maxima."""
    block_m, block_n, _, stages, n_tiles = cfg
    return (2 * block_m * head_dim + 2 * stages * block_n * head_dim
            + n_tiles * block_m * (2 * block_n + 4) + 8 * (stages + 1))


def split_of(seq, cfg) -> int:
    """Programs per row tile: key chunks of BLOCK_N * tiles-per-program keys."""
    return cdiv(seq, cfg[1] * cfg[4])


MAX_SPLIT = 8       # programs per row tile; the grid needs that many resident at once


def enabled() -> bool:
    """INDUCTOR_GQA_SPLIT_ROWS=1 offers the kernel to the tuner (not measured on a GPU yet)."""
    return os.environ.get("INDUCTOR_GQA_SPLIT_ROWS", "0") == "1"


def supported(q16, k16, v16, seq, head_dim, mask_kind, scale, causal, cfg) -> bool:
    """Where this kernel may replace flash.py's probabilities pair (the module's scope)."""
    return (ps.operands_ok(q16, k16, v16, head_dim, mask_kind, scale) and not causal
            and 2 <= split_of(seq, cfg) <= MAX_SPLIT and cfg[0] == 16 * cfg[2]
            and smem_bytes(head_dim, cfg) <= ps.SMEM_PER_BLOCK)


def candidates(q16, k16, v16, seq, head_dim, mask_kind, scale, causal):
    """The configs of ``CONFIGS`` this block may run, tagged for the tuner (none unless
    ``enabled``)."""
    if not (enabled() and ps.HAVE_GLUON and ps.available(q16.device)):
        return []
    return [("split",) + c for c in CONFIGS
            if supported(q16, k16, v16, seq, head_dim, mask_kind, scale, causal, c)]


def workspace(batch, seq, num_heads, head_dim, cfg, device):
    """(cnt, ws_ml, ws_o) for one launch; cnt must be zero when it starts."""
    if cfg and cfg[0] == "split":
        cfg = cfg[1:]
    groups = batch * num_heads * cdiv(seq, cfg[0])
    split = split_of(seq, cfg)
    return (torch.zeros(1 + 2 * groups, device=device, dtype=torch.int32),
            torch.empty(groups * split * 2 * cfg[0], device=device, dtype=torch.float32),
            torch.empty(groups * split * cfg[0] * head_dim, device=device, dtype=torch.float32))


def launch(q16, k16, v16, out, probs, flag, ws, batch, seq, num_heads, groups, head_dim, scale,
           cfg, guard=0):
    """As probs_staged.launch (non-causal), with ``ws`` from ``workspace`` (its counters
    zeroed); ``cfg`` optionally after the "split" tag."""
    if cfg and cfg[0] == "split":
        cfg = cfg[1:]
    block_m, block_n, num_warps, stages, n_tiles = cfg
    split = split_of(seq, cfg)
    if not supported(q16, k16, v16, seq, head_dim, 0, scale, False, cfg):
        raise ValueError(f"probs_split.launch: S={seq}, head_dim={head_dim}, {q16.dtype} not "
                         f"covered by config {cfg} ({split} programs per row tile)")
    if probs.dtype != torch.float32 or probs.stride(-1) != 1 or probs.stride(1) != seq * seq:
        raise ValueError("probs_split.launch: probabilities must be float32 [B, H, S, S] with "
                         "contiguous heads")
    cnt, ws_ml, ws_o = ws
    descs = ps.descriptors(q16, k16, v16, batch * seq, num_heads, groups, head_dim, block_m,
                           block_n)
    n_m = cdiv(seq, block_m)
    n_groups = n_m * batch * num_heads
    probs_split_kernel[(n_groups * split,)](
        *descs, out, probs, flag if guard else out, ws_ml, ws_o, cnt, out.stride(0),
        out.stride(1), probs.stride(1), probs.stride(2), num_heads, groups, seq,
        float(scale) * ps.LOG2E, n_m, n_groups,
        D=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, N_TILES=n_tiles, SPLIT=split,
        STAGES=stages, GUARD=int(guard), num_warps=num_warps, **pdl.launch_options(out.device))
