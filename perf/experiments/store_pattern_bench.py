"""Calibration: does the probabilities pass's write *pattern* cap its store rate?

The pass (flash.py MODE 2, fp16 copies, best config (128, 64, 8, 4, gp4) at 4096x1) writes
1.07 GB at 3.55 TB/s, against 4.66 TB/s for contiguous writes (store_peak_bench.py). Each of its
programs owns BLOCK_M rows (with gp4: 32 positions x 4 query heads) and writes them one
[BLOCK_M, BLOCK_N] tile per key step, so at any moment the ~264 resident programs write 256-byte
pieces of ~34 K rows 16 KB apart. This kernel does only those stores (no compute), in the same
order, for several tile shapes, next to the contiguous fill.

Prediction: if the pattern alone runs near 3.5-3.7 TB/s, the pass is bound by where it writes,
not by its compute, and a pattern with longer runs per row (wider tiles, fewer rows) is the
lever; if it runs near 4.6 TB/s, the pass's compute and stores interfere and the pattern is not
the limit.

    PYTHONPATH=$PWD python perf/experiments/store_pattern_bench.py [--out F]
"""
import argparse
import json

import torch
import triton
import triton.language as tl

import gqa_pack_bench    # timing (this folder is sys.path[0])
from store_peak_bench import _fill, write_rates


@triton.jit
def _tile_stores(P, S, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GP: tl.constexpr):
    # the probabilities pass's program layout: program (m-tile, b*H/GP + head group); its rows
    # are GP heads x BLOCK_M // GP positions, head-major
    MR: tl.constexpr = BLOCK_M // GP
    start_m = tl.program_id(0)
    bh = tl.program_id(1) * GP
    r = tl.arange(0, BLOCK_M)
    pos = start_m * MR + r % MR
    head = bh + r // MR
    row = head.to(tl.int64) * S * S + pos.to(tl.int64) * S
    cols = tl.arange(0, BLOCK_N)
    v = (r[:, None] + cols[None, :]).to(tl.float32)
    for n0 in range(0, S, BLOCK_N):
        # evict-first, as the pass stores
        tl.store(P + row[:, None] + (n0 + cols)[None, :], v, eviction_policy="evict_first")


# (BLOCK_M, BLOCK_N, GP, warps): the pass's tuned tiles first, then longer runs per row
PATTERNS = [(128, 64, 4, 8), (64, 64, 1, 4), (64, 64, 4, 4), (128, 32, 1, 8),
            (64, 128, 1, 4), (32, 256, 1, 4), (16, 512, 1, 4), (16, 1024, 1, 4),
            (128, 128, 4, 8), (256, 64, 4, 8)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="4096x1,512x16,2048x1")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    rep = {}
    for case in a.cases.split(","):
        s, b = (int(x) for x in case.split("x"))
        h = 16
        n = b * h * s * s
        t = torch.empty(n, device="cuda")
        row = {"fill": gqa_pack_bench.t_us(lambda: _fill[(triton.cdiv(n, 1024),)](
            t, n, BLOCK=1024, EF=True, num_warps=4))}
        for bm, bn, gp, nw in PATTERNS:
            if s % bn or s % (bm // gp):
                continue
            grid = (s // (bm // gp), b * h // gp)
            row[f"tile {bm}x{bn} gp{gp} w{nw}"] = gqa_pack_bench.t_us(
                lambda: _tile_stores[grid](t, s, BLOCK_M=bm, BLOCK_N=bn, GP=gp, num_warps=nw))
        rep[case] = write_rates(case, row, n)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rep, f, indent=1)


if __name__ == "__main__":
    main()
