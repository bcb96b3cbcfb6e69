"""GPU check (about a minute): thread-block clusters for a kernel compiled without them
(docs/kernels.md note 41). The kernel is compiled as usual (``num_ctas=1``: no cluster layouts,
which Gluon's front end cannot yet index in 2-D), and only its launch gets 8-CTA clusters, by
setting the ``num_ctas`` field of the compiled kernel's packed launch metadata (triton 3.6 and
3.7: (num_warps, num_ctas, shared)); the launcher then launches grid * 8 CTAs in clusters of 8.
Each CTA writes a slot of a global workspace, all meet at ``barrier.cluster`` (release/acquire,
by inline assembly), and each then reads its right neighbour's slot in the ring of its cluster.

    PYTHONPATH=$PWD python perf/experiments/cluster_launch_check.py

Prediction (written before the first GPU run): with the clusters every read sees its
neighbour's value and %cluster_ctarank equals program_id % 8, over 2048 clusters and 20 rounds;
without them (the control launch, the field left at 1) every rank reads 0, and the check says
so. The barrier round trip is timed too: a few microseconds at most per launch. If this holds,
the one-launch probabilities kernel for S > 512 can use clusters with Triton as it is; if the
launcher ignores the field, the route is cuLaunchKernelEx on the loaded function instead.
"""
import sys

import torch
import triton
import triton.language as tl

RANKS = 8


@triton.jit
def exchange_kernel(WS, OUT, RANK_OUT, BLOCK: tl.constexpr, RANKS: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)      # one element per thread: each thread arrives once
    rank = tl.inline_asm_elementwise("mov.u32 $0, %cluster_ctarank;", "=r,r", [offs],
                                     dtype=tl.int32, is_pure=True, pack=1)
    tl.store(WS + pid * BLOCK + offs, pid * 1000 + offs)
    tl.debug_barrier()          # the stores are issued before the arrive
    zero = tl.inline_asm_elementwise("barrier.cluster.arrive.release.aligned;\n"
                                     "barrier.cluster.wait.acquire.aligned;\n"
                                     "mov.u32 $0, 0;", "=r,r", [offs], dtype=tl.int32,
                                     is_pure=False, pack=1)
    tl.debug_barrier()
    nxt = pid - rank + (rank + 1) % RANKS
    # the address depends on the barrier's result, so the load cannot move above it
    v = tl.load(WS + nxt * BLOCK + offs + zero, cache_modifier=".cg")
    tl.store(OUT + pid * BLOCK + offs, v)
    tl.store(RANK_OUT + pid * BLOCK + offs, rank)


def run(clusters, block, clustered):
    n = clusters * RANKS
    ws = torch.full((n * block,), -1, device="cuda", dtype=torch.int32)
    out = torch.full_like(ws, -2)
    ranks = torch.full_like(ws, -3)
    k = exchange_kernel.warmup(ws, out, ranks, BLOCK=block, RANKS=RANKS, grid=(n,),
                               num_warps=block // 32)
    # the compiled kernel is the JIT cache's own object: set the field both ways
    nw, _, shared = k.packed_metadata
    k.packed_metadata = (nw, RANKS if clustered else 1, shared)
    grid = (clusters, 1, 1) if clustered else (n, 1, 1)     # the launcher multiplies x by it
    # a compiled kernel's launcher takes every parameter, the constexprs included
    args = (ws, out, ranks, block, RANKS)
    k[grid](*args)
    torch.cuda.synchronize()
    pid = torch.arange(n, device="cuda").repeat_interleave(block)
    offs = torch.arange(block, device="cuda").repeat(n)
    nxt = pid - pid % RANKS + (pid % RANKS + 1) % RANKS
    ok_vals = torch.equal(out, (nxt * 1000 + offs).int())
    ok_ranks = torch.equal(ranks, (pid % RANKS).int())
    return ok_vals, ok_ranks, k, grid, args


def main() -> int:
    bad = 0
    for clustered in (True, False):
        for r in range(20 if clustered else 1):
            ok_vals, ok_ranks, k, grid, args = run(2048, 128, clustered)
            if clustered:
                bad += not (ok_vals and ok_ranks)
            if r == 0 or not (ok_vals and ok_ranks):
                print(f"clusters={clustered} round {r}: neighbour values {ok_vals}, "
                      f"ranks {ok_ranks}", flush=True)
        if clustered:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(100):
                k[grid](*args)
            b.record()
            torch.cuda.synchronize()
            print(f"clustered launch of {grid[0] * RANKS} CTAs: "
                  f"{a.elapsed_time(b) * 10:.1f} us each", flush=True)
    print("PASS" if not bad else f"FAIL ({bad} clustered rounds wrong)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
