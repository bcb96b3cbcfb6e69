"""Experiment: flash.py's MODE 7 (the stats and probabilities passes as items of one work queue)
against the pair of launches, on W075 "high"'s attention (fp16 q/k/V copies, fp16 output,
float32 probabilities).

Prediction being tested: the two passes are held by different things, the stats pass by its
SMs' exponential unit and issue slots (~116 us at 4096x1), the probabilities pass by L2 traffic
(stores plus K/V reads, ~300 us, issue slots 27% active). Run as separate launches they add up.
As items of one queue, programs of each kind run on the SMs at the same time (about 72% of them
on probabilities items, the rest on statistics), so the statistics' exponentials use the issue
slots the stores leave idle and the L2 stays busy throughout. If so: 4096x1 pair ~415 -> 320-360
us, 2048x1 ~107 -> 85-95, 1024x2 ~60 -> 50-55; no gain, or a loss, where the grid is small
(541x1) or the probabilities pass alone fits the SMs. If the probabilities items slow in
proportion to the SMs they lose, it ties.

Each queue config's probabilities and o must equal bitwise those of the pair run with the same
tiles (stats (BM, BN1), probabilities (BM, BN)); the work buffer must be zero after every launch;
50 repeated launches must give the same bits (no race on the statistics' hand-over).

    PYTHONPATH=$PWD python perf/experiments/queued_bench.py [--cases 4096x1,2048x1] [--out F]
"""
import argparse

import torch

from inductor_gqa.kernels import flash
from inductor_gqa.lower import attention as lower_attention
from perf.experiments.gqa_pack_bench import D, H, HK, Case, run_cases, t_us

# the pair as the tuner picks it at these sizes (profiles: stats (64, 128, 4, 3), probabilities
# (128, 64, 8, 4) gp4 at 4096x1 and 512x16)
PAIR_STATS = [(64, 128, 4, 3), (64, 128, 4, 2), (128, 64, 8, 3), (128, 128, 8, 2)]
PAIR_PROBS = [(128, 64, 8, 4, "gp4"), (128, 64, 8, 3, "gp4"), (64, 64, 4, 3, "gp4"),
              (64, 64, 4, 3)]
# (BM, BN, warps, stages, gp, stats key tile BN1, lead in SMs, register cap): one item per
# program (a first form with looping programs took 218-250 registers and lost everywhere: 4096x1
# 426.6 us at best against the pair's 417, 512x16 141 vs 126; docs/kernels.md note 51)
QUEUED = [(128, 64, 8, 4, 4, 64, 1, None), (128, 64, 8, 4, 4, 64, 2, None),
          (128, 64, 8, 3, 4, 64, 2, None), (128, 64, 8, 3, 4, 128, 2, None),
          (64, 64, 4, 3, 4, 64, 1, None), (64, 64, 4, 3, 4, 64, 3, None),
          (64, 64, 4, 3, 4, 128, 3, None), (64, 64, 4, 3, 4, 64, 6, None),
          (64, 64, 4, 3, 1, 128, 3, None), (64, 64, 4, 2, 4, 64, 3, None),
          (64, 32, 4, 3, 4, 64, 3, None)]


def launch_queued(c, cfg, work, sms):
    bm, bn, nw, ns, gp, bn1, lead, maxnreg = cfg
    s, b = c.s, c.b
    flash.launch((c.q, (s * H * D, D, H * D)), (c.k, (s * HK * D, D, HK * D)),
                 (c.v, (s * HK * D, D, HK * D, 1)), c.o, c.probs, None, c.ml, b, s, H, H // HK,
                 D, 1.0, 0.0, False, 0, 7, "tf32", False, bm, bn, nw, ns, flag=c.flag, guard=1,
                 gp=gp, work=work, lead=lead * sms, block_n1=bn1, maxnreg=maxnreg)


def bench(case_name):
    s, b = (int(t) for t in case_name.split("x"))
    c = Case(s, b)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    work = flash.work_buffer(c.q.device, 2 + s * b * H)
    rep = {"pair_stats": {}, "pair_probs": {}, "queued": {}}
    for cfg in PAIR_STATS:
        rep["pair_stats"][str(cfg)] = t_us(lambda: c.launch(1, cfg))
    c.launch(1, PAIR_STATS[0])
    for cfg in PAIR_PROBS:
        rep["pair_probs"][str(cfg)] = t_us(lambda: c.launch(2, cfg))
    best_s = min(rep["pair_stats"], key=rep["pair_stats"].get)
    best_p = min(rep["pair_probs"], key=rep["pair_probs"].get)
    cs, cp = eval(best_s), eval(best_p)     # noqa: S307 (our own tuple reprs)
    rep["pair_best"] = dict(stats=best_s, probs=best_p,
                            sum_us=rep["pair_stats"][best_s] + rep["pair_probs"][best_p],
                            back_to_back_us=t_us(lambda: (c.launch(1, cs), c.launch(2, cp))))
    print(case_name, "pair", rep["pair_best"], flush=True)
    for cfg in QUEUED:
        bm, bn, nw, ns, gp, bn1 = cfg[:6]
        gpf = (f"gp{gp}",) if gp > 1 else ()
        row = {}
        try:
            # the pair on the same tiles: the bits the queue must reproduce
            c.launch(1, (bm, bn1, nw, ns) + gpf)
            c.launch(2, (bm, bn, nw, ns) + gpf)
            torch.cuda.synchronize()
            want = (c.probs.clone(), c.o.clone())
            same, zero = True, True
            for i in range(50):
                if i % 10 == 0:
                    c.probs.fill_(float("nan"))
                    c.o.fill_(float("nan"))
                    c.ml.fill_(float("nan"))
                launch_queued(c, cfg, work, sms)
                if i % 10 == 9:
                    torch.cuda.synchronize()
                    same &= torch.equal(c.probs, want[0]) and torch.equal(c.o, want[1])
                    zero &= int(work.abs().sum()) == 0
            row.update(bitwise_equal=bool(same), work_zeroed=bool(zero),
                       us=t_us(lambda: launch_queued(c, cfg, work, sms)))
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {str(e)[:160]}"
        rep["queued"][str(cfg)] = row
        print(case_name, "queued", cfg, row, flush=True)
    return rep


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="4096x1,2048x1,1024x2,512x16,541x1")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    run_cases(bench, a.cases, a.out, configs=[str(x) for x in QUEUED])


if __name__ == "__main__":
    main()
