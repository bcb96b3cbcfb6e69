"""Experiment: four probabilities-pass programs per SM instead of three (W075 "high", fp16 copies).

Read on the CPU (sm_90 cubins, triton 3.6): the tuned pass, (64, 64, 4, 3) with GP 4, takes 128
registers and 73,728 bytes of shared memory per 128-thread program, so shared memory allows
three programs per SM (ncu at 4096x1: 12 warps per SM, issue slots 39% busy, DRAM 72%). With
two K/V stages it takes 57,344 bytes and the same 128 registers: four programs (16 warps) fit
an SM exactly. That config is not a candidate of the pass.

Prediction: if the pass is held back by too few warps keeping stores and loads in flight, two
stages and four programs per SM take 4096x1 from ~307 to ~285-295 us and 2048x1 from ~82 to
~77-80; if the third stage's prefetch matters more, they are slower. Results must be bitwise
equal to the 3-stage config's (the same tiles and arithmetic).

    PYTHONPATH=$PWD python perf/experiments/probs_occupancy_bench.py [--cases ...] [--out F]

PIPELINE with the 128-row packed configs (prediction written before the run): PIPELINE took
the 64-row packed config from 103 to 85 us at 2048x1 and 54 to 46 at 1024x2 (and lost at
4096x1); if it helps the 128-row packed configs alike, 2048x1 ~77 -> 70-74 us, 1024x2 ~41 ->
38-40, 4096x1 unchanged. Run: --configs '[(128,64,8,4,"gp4"), (128,64,8,4,"pipeline","gp4"),
(128,64,8,3,"gp4"), (128,64,8,3,"pipeline","gp4")]'
Outcome (runs/profiles/probs_pipeline_packed128_d8378c5.json, bitwise equal): PIPELINE slows
the 128-row packed configs everywhere, 2048x1 77.0 -> 85.0 us, 1024x2 41.0 -> 45.7, 4096x1
298.9 -> 327.6. Not candidates.
"""
import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from gqa_pack_bench import STATS_CFG, Case, run_cases, t_us  # noqa: E402

BASE = (64, 64, 4, 3, "gp4")
CONFIGS = [BASE, (64, 64, 4, 3, "pipeline", "gp4"), (128, 64, 8, 3, "gp4"),
           (128, 64, 8, 4, "gp4"),
           # new: two stages, four programs per SM
           (64, 64, 4, 2, "gp4"), (64, 64, 4, 2, "pipeline", "gp4"), (64, 64, 4, 2),
           (64, 32, 4, 2, "gp4")]


def bench(case_name, rounds=3):
    """Every config checked once, then timed ``rounds`` times round-robin (the first configs
    of a cold process otherwise run at a lower clock); the median of its rounds."""
    s, b = (int(t) for t in case_name.split("x"))
    c = Case(s, b)
    c.launch(1, STATS_CFG)
    ml = c.ml.clone()
    rows, ref, ok = {}, None, []
    for cfg in CONFIGS:
        try:
            c.ml.copy_(ml)
            c.probs.fill_(float("nan"))
            c.o.fill_(float("nan"))
            c.launch(2, cfg)
            torch.cuda.synchronize()
            got = (c.probs.clone(), c.o.clone())
            if ref is None:
                ref = got
            same = (all(torch.equal(x, y) for x, y in zip(got, ref))
                    if cfg[:2] == BASE[:2] else None)
            finite = bool(torch.isfinite(got[0]).all() and torch.isfinite(got[1]).all())
            rows[str(cfg)] = dict(cfg=str(cfg), us=[], bitwise_equal_to_base=same, finite=finite)
            ok.append(cfg)
        except Exception as e:  # noqa: BLE001
            rows[str(cfg)] = dict(cfg=str(cfg), error=f"{type(e).__name__}: {str(e)[:120]}")
    for cfg in ok:              # warm the clocks before the timed rounds
        t_us(lambda: c.launch(2, cfg))
    for _ in range(rounds):
        for cfg in ok:
            rows[str(cfg)]["us"].append(t_us(lambda: c.launch(2, cfg)))
    for r in rows.values():
        if r.get("us"):
            r["median_us"] = statistics.median(r["us"])
        print(case_name, r, flush=True)
    return list(rows.values())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="4096x1,2048x1,1024x2,512x16,449x16")
    ap.add_argument("--out", default="")
    ap.add_argument("--configs", default="", help="others: a Python list of tuples, the first "
                    "the base the others with its tile shape are compared to bitwise")
    a = ap.parse_args()
    if a.configs:
        global BASE
        CONFIGS[:] = [tuple(c) for c in eval(a.configs)]
        BASE = CONFIGS[0]
    run_cases(bench, a.cases, a.out)


if __name__ == "__main__":
    main()
