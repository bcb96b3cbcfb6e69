"""Experiment: flash.py's LAZY stats pass against the online one (W075 "high", fp16 copies).

LAZY subtracts a fixed offset (the first key tile's row maximum) from every later score, so a
tile's exponentials do not wait for that tile's row maximum; the sum is rescaled to the true
maximum once at the end. Prediction: if the stats pass is held back by the maximum -> exponential
dependency (the exponential unit runs at ~60% of its rate at 4096x1), LAZY takes it from ~117 to
~85-95 us at 4096x1; if it is bound by issue slots, nothing changes.

    cd perf/experiments && PYTHONPATH=../.. python stats_lazy_bench.py [--cases 4096x1,...] [--out F]

Same inputs and timing as gqa_pack_bench (CUDA-graph replay, median of 3); row maxima must be
bitwise equal and sums within 1e-5 relative.
"""
import argparse

import torch

import gqa_pack_bench
from inductor_gqa.kernels import flash

H, HK, D = gqa_pack_bench.H, gqa_pack_bench.HK, gqa_pack_bench.D
CFGS = [(64, 128, 4, 2), (64, 128, 4, 3), (128, 64, 8, 3), (128, 128, 8, 2), (64, 64, 4, 2)]


def launch(c, cfg, lazy, causal):
    s, b = c.s, c.b
    bm, bn, nw, ns = cfg
    flash.launch((c.q, (s * H * D, D, H * D)), (c.k, (s * HK * D, D, HK * D)),
                 (c.v, (s * HK * D, D, HK * D, 1)), c.o, None, None, c.ml, b, s, H, H // HK, D,
                 1.0, 0.0, causal, 0, 1, "tf32", False, bm, bn, nw, ns, flag=c.flag, guard=1,
                 lazy=lazy)


def bench(name):
    causal = name.endswith("c")
    s, b = (int(t) for t in name.rstrip("c").split("x"))
    c = gqa_pack_bench.Case(s, b)
    rep = {}
    for cfg in CFGS:
        got = {}
        for lazy in (0, 1, 2):
            c.ml.fill_(float("nan"))
            launch(c, cfg, lazy, causal)
            torch.cuda.synchronize()
            got[lazy] = c.ml.view(-1, 2).clone()
            rep[f"{cfg} lazy={lazy}"] = gqa_pack_bench.t_us(lambda: launch(c, cfg, lazy, causal))
        same_m = bool(torch.equal(got[0][:, 0], got[1][:, 0]))
        rel = ((got[1][:, 1] - got[0][:, 1]).abs() / got[0][:, 1]).max().item()
        lse = {z: got[z][:, 0] + torch.log2(got[z][:, 1]) for z in (0, 2)}
        lse_err = (lse[2] - lse[0]).abs().max().item()
        rep[f"{cfg} max equal"] = same_m
        rep[f"{cfg} sum rel err"] = rel
        rep[f"{cfg} lazy2 lse abs err"] = lse_err
        print(name, cfg, f"online {rep[f'{cfg} lazy=0']:.1f} us, lazy "
              f"{rep[f'{cfg} lazy=1']:.1f} us, lazy2 {rep[f'{cfg} lazy=2']:.1f} us, max equal "
              f"{same_m}, sum rel err {rel:.2e}, lazy2 lse err {lse_err:.2e}", flush=True)
    assert c.flag.item() == 0
    return rep


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="4096x1,2048x1,1024x2,512x16,449x16,1024x2c")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    gqa_pack_bench.run_cases(bench, a.cases, a.out)


if __name__ == "__main__":
    main()
