"""Experiment: 256-row tiles (64 positions x 4 query heads) in the probabilities pass (MODE 2) of
W075 "high" (fp16 q/k/V copies, float32 probabilities, fp16 output).

ncu at 4096x1 (runs/profiles/ncu_*_52ebb51.txt) read the probabilities pass as L2-bound (L2 80%
busy at 3.44 TB/s of stores): with (128, 64, 8, 4, gp4) each program reads the whole K and V of
its KV head (S x 64 x 2 x 2 bytes) for 128 rows of S float32 probabilities, so L2 serves K/V
bytes worth half the stored bytes (1.5x the stores in all). 256-row tiles halve the K/V reads
(1.25x). Prediction: if L2 is the limit, the pass -8 to -15% at 4096x1 and 2048x1 (298 -> 260-275
us), less at mid sizes where per-program set-up weighs more; if no 256-row config beats the tuned
ones by 3%, the idea is dead. Probabilities must be bitwise those of the reference config (rows are
independent); o within fp16 rounding.

    PYTHONPATH=$PWD python perf/experiments/probs_rows_bench.py [--cases 4096x1,512x16] [--out F]
"""
import argparse

import torch

import gqa_pack_bench    # inputs, timing and report loop (this folder is sys.path[0])

REF = (128, 64, 8, 4, "gp4")      # the tuned probabilities-pass config at most W075 sizes
CFGS = [REF, (128, 64, 8, 3, "gp4"), (256, 64, 8, 3, "gp4"), (256, 64, 16, 3, "gp4"),
        (256, 32, 8, 3, "gp4"), (256, 64, 16, 2, "gp4"), (256, 32, 16, 3, "gp4")]
STATS = (64, 128, 4, 3)


def bench(name):
    s, b = (int(t) for t in name.split("x"))
    c = gqa_pack_bench.Case(s, b)
    c.launch(1, STATS)
    c.probs.fill_(float("nan"))
    c.launch(2, REF)
    torch.cuda.synchronize()
    ref_p, ref_o = c.probs.clone(), c.o.float().clone()
    rep = {}
    for cfg in CFGS:
        try:
            c.probs.fill_(float("nan"))
            c.o.fill_(float("nan"))
            c.launch(2, cfg)
            torch.cuda.synchronize()
            same = torch.equal(c.probs, ref_p)
            do = (c.o.float() - ref_o).abs().max().item()
            us = gqa_pack_bench.t_us(lambda: c.launch(2, cfg))
            gbs = b * 16 * s * s * 4 / us / 1e3
            rep[str(cfg)] = dict(us=us, probs_bitwise=same, out_max_abs_diff=do, store_gbs=gbs)
            print(name, cfg, f"{us:.1f} us ({gbs:.0f} GB/s of probabilities), probs bitwise "
                  f"{same}, out diff {do:.1e}", flush=True)
        except Exception as e:  # noqa: BLE001
            rep[str(cfg)] = dict(error=f"{type(e).__name__}: {str(e)[:120]}")
            print(name, cfg, rep[str(cfg)]["error"], flush=True)
    return rep


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="4096x1,2048x1,512x16,449x16,1024x2,512x8,373x8")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    gqa_pack_bench.run_cases(bench, a.cases, a.out)


if __name__ == "__main__":
    main()
