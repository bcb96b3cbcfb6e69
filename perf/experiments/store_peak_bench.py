"""Calibration: how fast can the H200 only write? The probabilities pass is judged against a store
floor (bytes / bandwidth); this times pure writes of the probabilities' sizes (torch's fill_,
and a Triton kernel of 16-byte stores with evict-first, the pass's store form) next to a copy.

    PYTHONPATH=$PWD python perf/experiments/store_peak_bench.py [--out F]
"""
import argparse
import json

import torch
import triton
import triton.language as tl

import gqa_pack_bench    # timing (this folder is sys.path[0])


@triton.jit
def _fill(p, n, BLOCK: tl.constexpr, EF: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    v = tl.full([BLOCK], 0.5, tl.float32)
    if EF:
        tl.store(p + offs, v, mask=offs < n, eviction_policy="evict_first")
    else:
        tl.store(p + offs, v, mask=offs < n)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    rep = {}
    for name, (s, b) in {"4096x1": (4096, 1), "512x16": (512, 16), "449x16": (449, 16),
                         "512x8": (512, 8)}.items():
        n = b * 16 * s * s
        t = torch.empty(n, device="cuda")
        src = torch.empty(n, device="cuda")
        row = {}
        row["fill_"] = gqa_pack_bench.t_us(lambda: t.fill_(0.5))
        row["copy_ (read+write)"] = gqa_pack_bench.t_us(lambda: t.copy_(src))
        for blk in (1024, 4096):
            for ef in (False, True):
                g = (triton.cdiv(n, blk),)
                row[f"triton {blk} ef={ef}"] = gqa_pack_bench.t_us(
                    lambda: _fill[g](t, n, BLOCK=blk, EF=ef, num_warps=4))
        rep[name] = write_rates(name, row, n)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rep, f, indent=1)


def write_rates(case, row, n):
    """{variant: {us, write_gbs}} for variants that each write n float32 values; printed."""
    rates = {k: dict(us=v, write_gbs=n * 4 / v / 1e3) for k, v in row.items()}
    for k, v in rates.items():
        print(case, k, f"{v['us']:.1f} us, {v['write_gbs']:.0f} GB/s written", flush=True)
    return rates


if __name__ == "__main__":
    main()
