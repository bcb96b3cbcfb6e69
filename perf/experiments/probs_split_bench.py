"""Experiment: the split-row one-launch probabilities kernel (kernels/probs_split.py) against
flash.py's stats/probabilities pair, W075 "high" fp16 copies (fp16 o, float32 probabilities).

    PYTHONPATH=$PWD python perf/experiments/probs_split_bench.py [--cases 4096x1,...] [--out F]

Every launch writes into NaN-poisoned outputs; both are compared with a float64 softmax of the
same fp16 copies (probs_staged_bench's errors), and each config runs twice to check that its o
is bitwise the same (the partial products are summed in a fixed order). The split kernel's time
includes zeroing its counters (a memset, which the block could fold into an earlier launch).

Prediction (written before the first GPU run): at S <= 512 the staged ping-pong kernel took
512x16 from the pair's ~125 us to ~107; per score, this kernel does the same work (plus a
partial-sum exchange of 0.5 KB and 16 KB per program), so the pair's 415 us at 4096x1 should
become ~340-370 (the stats pass's 117 us gone, loop 2 ~10% slower than flash.py's
probabilities pass), 2048x1 ~111 -> 90-100, 1024x2 ~61 -> 50-56, 541x1 ~22.6 -> 16-20; at
512x16 and 449x16 (two programs of 256 keys per row tile) about the staged ping-pong kernel's
107 and 119 us. If it is not faster than the pair at 4096x1, staging rows across programs does
not pay either.
"""
import argparse

import torch

import gqa_pack_bench as gp      # inputs, flash.py launches, timing (this folder is sys.path[0])
import probs_staged_bench as psb
from inductor_gqa.kernels import probs_split as split

STATS = [(64, 128, 4, 3), (64, 128, 4, 2)]
PROBS = [(128, 64, 8, 4, "gp4"), (128, 64, 8, 3, "gp4"), (64, 64, 4, 3, "pipeline"),
         (64, 64, 4, 3, "a4")]


def bench(case_name):
    s, b = (int(t) for t in case_name.split("x"))
    c = gp.Case(s, b)
    ref = psb.reference(c, False)
    rep = {}
    st = sorted((gp.t_us(lambda cfg=cfg: c.launch(1, cfg)), cfg) for cfg in STATS)
    c.launch(1, st[0][1])
    pr = sorted((gp.t_us(lambda cfg=cfg: c.launch(2, cfg)), cfg) for cfg in PROBS
                if "a4" not in cfg or s % 4)
    c.probs.fill_(float("nan"))
    c.o.fill_(float("nan"))
    c.launch(1, st[0][1])
    c.launch(2, pr[0][1])
    torch.cuda.synchronize()
    rep["pair"] = dict(us=st[0][0] + pr[0][0], stats=st[0], probs=pr[0], err=psb.errors(c, ref))
    print(case_name, "pair", rep["pair"], flush=True)
    # the one-program staged kernels where a row tile fits (S <= ~512)
    for cfg in split.ps.CONFIGS:
        if split.ps.supported(c.q, c.k, c.v, s, gp.D, 0, 1.0, cfg):
            rep[f"staged {cfg}"] = dict(us=gp.t_us(lambda cfg=cfg: psb.staged(c, cfg)))
            print(case_name, f"staged {cfg}", rep[f"staged {cfg}"], flush=True)
    for cfg in split.CONFIGS:
        name = f"split {cfg}"
        try:
            if not split.supported(c.q, c.k, c.v, s, gp.D, 0, 1.0, False, cfg):
                continue
            ws = split.workspace(b, s, gp.H, gp.D, cfg, c.q.device)

            def run(cfg=cfg, ws=ws):
                ws[0].zero_()
                split.launch(c.q, c.k, c.v, c.o, c.probs, c.flag, ws, b, s, gp.H,
                             gp.H // gp.HK, gp.D, 1.0, cfg, guard=1)
            outs = []
            for _ in range(2):
                c.probs.fill_(float("nan"))
                c.o.fill_(float("nan"))
                run()
                torch.cuda.synchronize()
                outs.append(c.o.clone())
            err = psb.errors(c, ref)
            err["o_repeatable"] = bool(torch.equal(outs[0], outs[1]))
            err["flag"] = int(c.flag.item())
            rep[name] = dict(us=gp.t_us(run), split=split.split_of(s, cfg), err=err)
        except Exception as e:  # noqa: BLE001
            rep[name] = dict(us=float("inf"), error=f"{type(e).__name__}: {str(e)[:300]}")
        print(case_name, name, rep[name], flush=True)
    return rep


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="4096x1,2048x1,1024x2,541x1,512x16,449x16")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    gp.run_cases(bench, a.cases, a.out)


if __name__ == "__main__":
    main()
