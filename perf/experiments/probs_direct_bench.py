"""Experiment: kernels/probs_direct.py (the probabilities pass with P stored from the MMA's
registers and fed to P @ V as a register operand, Gluon) against flash.py's MODE 2, W075 "high"
fp16 copies, on the same statistics (flash.py's MODE 1).

    PYTHONPATH=$PWD python perf/experiments/probs_direct_bench.py [--cases 4096x1,...] [--out F]

Every config writes into NaN-poisoned probabilities and o; the probabilities must match
flash.py's tuned config's to 1e-6 (the same products, statistics and exponent FMA; exp2's
rounding may differ by an ulp) and o to fp16 rounding (other summation order). Causal is checked
(not timed) at the first case against flash.py's causal MODE 2.

Prediction (written before the first GPU run): flash.py's tuned pass moves ~96 KB per 128 x 64
tile through shared memory for P (accumulator -> store rows, and the fp16 A operand through
LDSM), ~12 bytes per probability beside the stores' 4; the direct kernel has no STS/LDS at all
(sm_90 SASS: 16 HGMMA, 32 STG.E.EF.64, 100-125 registers). If that traffic is part of what holds
the pass ~50 us above its store pattern at 4096x1 (297-308 vs 254 us), the direct kernel should
take 4096x1 to 260-280 us, 2048x1 ~77 -> 66-72, 1024x2 ~40 -> 35, 512x16 (the pair's pass,
~93) -> 80-85. 8-byte stores touch four times as many 128-byte lines per instruction as the
16-byte ones; if the L1's store path cannot take that, the direct kernel loses, and the
stores' width, not shared memory, is what to work on.
"""
import argparse
import ast

import torch

import gqa_pack_bench as gp      # inputs, flash.py launches, timing (this folder is sys.path[0])
from inductor_gqa.kernels import probs_direct as pdk

FLASH = [(128, 64, 8, 3, "gp4"), (128, 64, 8, 4, "gp4"), (64, 64, 4, 3, "gp4")]
# the first GPU run (8-byte stores from the MMA layout) lost everywhere; its best config stays
# as a reference beside the 16-byte ("cv") ones
DIRECT = list(pdk.PACKED_CONFIGS) + [(128, 64, 8, 2, "ov", "gp4")]


def direct(c, cfg, causal):
    pdk.launch(c.q, c.k, c.v, c.ml, c.o, c.probs, c.flag, c.b, c.s, gp.H, gp.H // gp.HK, gp.D,
               1.0, causal, cfg, guard=1)


def flash2(c, cfg, causal):
    s, b = c.s, c.b
    bm, bn, nw, ns = cfg[:4]
    gp.flash.launch((c.q, (s * gp.H * gp.D, gp.D, gp.H * gp.D)),
                    (c.k, (s * gp.HK * gp.D, gp.D, gp.HK * gp.D)),
                    (c.v, (s * gp.HK * gp.D, gp.D, gp.HK * gp.D, 1)), c.o, c.probs, None, c.ml,
                    b, s, gp.H, gp.H // gp.HK, gp.D, 1.0, 0.0, causal, 0, 2, "tf32", False, bm,
                    bn, nw, ns, flag=c.flag, guard=1,
                    gp=gp.lower_attention.heads_per_program(cfg))


def stats(c, causal):
    s, b = c.s, c.b
    bm, bn, nw, ns = gp.STATS_CFG
    gp.flash.launch((c.q, (s * gp.H * gp.D, gp.D, gp.H * gp.D)),
                    (c.k, (s * gp.HK * gp.D, gp.D, gp.HK * gp.D)),
                    (c.v, (s * gp.HK * gp.D, gp.D, gp.HK * gp.D, 1)), c.o, None, None, c.ml, b,
                    s, gp.H, gp.H // gp.HK, gp.D, 1.0, 0.0, causal, 0, 1, "tf32", False, bm, bn,
                    nw, ns, flag=c.flag, guard=1)


def compare(c, ref):
    p, o = c.probs, c.o.float()
    return dict(p_max_err=float((p - ref[0]).abs().max()),
                o_max_err=float((o - ref[1]).abs().max()),
                nan=int(torch.isnan(p).sum() + torch.isnan(o).sum()))


def bench(case_name, check_causal=False):
    s, b = (int(t) for t in case_name.split("x"))
    c = gp.Case(s, b)
    rep = {}
    for causal in ((False, True) if check_causal else (False,)):
        tag = "causal " if causal else ""
        stats(c, causal)
        c.probs.fill_(float("nan"))
        c.o.fill_(float("nan"))
        flash2(c, FLASH[0], causal)
        torch.cuda.synchronize()
        ref = (c.probs.clone(), c.o.float())
        runs = [("flash", cfg, flash2) for cfg in FLASH] + [("direct", cfg, direct)
                                                             for cfg in DIRECT]
        for kind, cfg, fn in runs:
            name = f"{tag}{kind} {cfg}"
            try:
                if kind == "direct" and not pdk.supported(c.q, c.k, c.v, s, gp.D, 0, 1.0,
                                                          causal, cfg):
                    continue
                c.probs.fill_(float("nan"))
                c.o.fill_(float("nan"))
                fn(c, cfg, causal)
                torch.cuda.synchronize()
                row = compare(c, ref)
                if not causal:
                    row["us"] = round(gp.t_us(lambda: fn(c, cfg, causal)), 2)
                rep[name] = row
            except Exception as e:  # noqa: BLE001
                rep[name] = dict(error=f"{type(e).__name__}: {str(e)[:300]}")
            print(case_name, name, rep[name], flush=True)
    timed = [(v["us"], k) for k, v in rep.items() if "us" in v]
    best = {kind: min((t for t in timed if t[1].startswith(kind)), default=None)
            for kind in ("flash", "direct")}
    print(case_name, "best:", best, flush=True)
    rep["best"] = best
    return rep


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="1024x2,4096x1,2048x1,512x16,512x8,256x8")
    ap.add_argument("--out", default="")
    ap.add_argument("--configs", default="", help="direct configs, a Python list of tuples")
    a = ap.parse_args()
    if a.configs:
        DIRECT[:] = [tuple(c) for c in ast.literal_eval(a.configs)]
    first = a.cases.split(",")[0]
    gp.run_cases(lambda case: bench(case, check_causal=case == first), a.cases, a.out)


if __name__ == "__main__":
    main()
