"""Experiment: the probabilities pass in Gluon with TMA stores (kernels/probs_tma.py) against
flash.py's MODE 2, on W075 "high" inputs (fp16 q/k/V copies, fp16 output, float32
probabilities), same statistics, same run.

Prediction being tested: flash.py's pass runs 300 us at 4096x1 against a 230 us store floor
(4.66 TB/s) and 93 against 60 at 512x16, because the warps that compute also wait on their
stores. With the copy engine writing each tile from shared memory while the warps go on, the
pass should approach max(compute, store): about 240-260 us at 4096x1 and 65-75 at 512x16 and
2048x1 (-15 to -25%). If the copy engine's stores from shared memory cannot keep the rate,
it will be no faster (as Triton's own descriptor store, TMA_P, was 5-10% slower).

Checks on the same inputs (NaN-poisoned outputs first): every probability finite and within
1e-6 absolute of flash.py's (both compute exp2(s * c - lse) from fp16 products with fp32
accumulation; the MMA order may differ), o within fp16 rounding of flash.py's, and for causal
cases the zeros above the diagonal exactly zero.

    PYTHONPATH=$PWD python perf/experiments/probs_tma_bench.py [--cases 4096x1,512x16] [--out F]
"""
import argparse
import json
import statistics

import torch

from inductor_gqa.kernels import flash, probs_tma, tuning
from inductor_gqa.lower import attention as lower_attention

H, HK, D = 16, 4, 64
STATS_CFG = (64, 128, 4, 3)
TRITON_CFGS = [(128, 64, 8, 4, "gp4"), (128, 64, 8, 3, "gp4"), (64, 64, 4, 3, "pipeline"),
               (64, 64, 4, 3, "gp4"), (128, 32, 8, 4)]


def inputs(s, b, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(b * s, 1024, device="cuda", generator=g)
    w = torch.randn(1024 + 2 * HK * D, 1024, device="cuda", generator=g) * 0.02
    y = x @ w.t()
    q, k, v = y[:, :H * D], y[:, H * D:H * D + HK * D], y[:, H * D + HK * D:]
    return q.half().contiguous(), k.half().contiguous(), v.half().contiguous()


class Case:
    def __init__(self, s, b, causal, seed=0):
        self.s, self.b, self.causal = s, b, causal
        self.q, self.k, self.v = inputs(s, b, seed)
        self.o = torch.empty(b, s, H * D, device="cuda", dtype=torch.float16)
        self.probs = torch.empty(b, H, s, s, device="cuda")
        self.ml = torch.empty(b * H * s * 2, device="cuda")
        self.flag = torch.zeros(1, device="cuda", dtype=torch.int32)

    def triton(self, mode, cfg):
        s, b = self.s, self.b
        bm, bn, nw, ns = cfg[:4]
        flash.launch((self.q, (s * H * D, D, H * D)), (self.k, (s * HK * D, D, HK * D)),
                     (self.v, (s * HK * D, D, HK * D, 1)), self.o,
                     self.probs if mode >= 2 else None, None, self.ml, b, s, H, H // HK, D, 1.0,
                     0.0, self.causal, 0, mode, "tf32", False, bm, bn, nw, ns,
                     pipeline="pipeline" in cfg, flag=self.flag, guard=1,
                     gp=lower_attention.heads_per_program(cfg))

    def gluon(self, cfg):
        probs_tma.launch(self.q, self.k, self.v, self.o, self.probs, self.ml, self.flag, self.b,
                         self.s, H, H // HK, D, 1.0, self.causal, cfg, guard=1)


def t_us(fn):
    return statistics.median(tuning.time_ms(fn, reps=5) for _ in range(3)) * 1e3


def run_case(name, causal):
    s, b = (int(t) for t in name.split("x"))
    c = Case(s, b, causal)
    c.triton(1, STATS_CFG)
    torch.cuda.synchronize()
    rows, ref = [], None
    for kind, cfg in [("triton", x) for x in TRITON_CFGS] + [("gluon", x) for x in
                                                             probs_tma.CONFIGS]:
        if kind == "gluon" and not probs_tma.supported(c.q, s, D, 0, 1.0, cfg):
            continue
        fn = (lambda cfg=cfg: c.triton(2, cfg)) if kind == "triton" else (
            lambda cfg=cfg: c.gluon(cfg))
        try:
            c.o.fill_(float("nan"))
            c.probs.fill_(float("nan"))
            c.flag.zero_()      # a config that raised it must not make the next ones exit
            fn()
            torch.cuda.synchronize()
            got = (c.probs.clone(), c.o.float().clone())
            check = {"finite": bool(torch.isfinite(got[0]).all() and torch.isfinite(got[1]).all()),
                     "flag": int(c.flag.item())}
            if ref is None:
                ref = got
            else:
                check["probs_max_abs"] = float((got[0] - ref[0]).abs().max())
                check["o_max_rel"] = float(((got[1] - ref[1]).abs()
                                            / (ref[1].abs() + 1e-3)).max())
            if causal:
                upper = torch.triu(torch.ones(s, s, device="cuda", dtype=torch.bool), 1)
                check["upper_zero"] = bool((got[0][:, :, upper] == 0).all())
            us = t_us(fn)
            check["flag_after_timing"] = int(c.flag.item())
            rows.append(dict(kind=kind, cfg=str(cfg), us=round(us, 2), **check))
        except Exception as e:  # noqa: BLE001
            rows.append(dict(kind=kind, cfg=str(cfg), us=None,
                             error=f"{type(e).__name__}: {str(e)[-300:]}"))
        print(name, "causal" if causal else "", rows[-1], flush=True)
    ok = [r for r in rows if r.get("us")]
    best = {k: min((r for r in ok if r["kind"] == k), key=lambda r: r["us"], default=None)
            for k in ("triton", "gluon")}
    print(name, "causal" if causal else "", "BEST", {k: (v["us"], v["cfg"]) if v else None
                                                    for k, v in best.items()}, flush=True)
    return dict(case=name, causal=causal, rows=rows, best=best)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default="4096x1,512x16,2048x1,1024x2,512x8,512x4,256x8,128x4")
    p.add_argument("--causal-cases", default="512x4,1024x2")
    p.add_argument("--out", default="")
    a = p.parse_args()
    print(torch.cuda.get_device_name(), "gluon available:",
          probs_tma.available(torch.device("cuda")), flush=True)
    res = [run_case(n, False) for n in a.cases.split(",") if n]
    res += [run_case(n, True) for n in a.causal_cases.split(",") if n]
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
