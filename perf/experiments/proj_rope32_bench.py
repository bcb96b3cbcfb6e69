"""Experiment: the f16tma launch (kernels/proj_rope.py) reading float32 x (A32), and the float32
weights too (B32), rounding them to fp16 tile by tile, against today's form (scale_rows makes
scaled fp16 copies of x and the weights first).

Prediction (written before the run): scale_rows takes 3.2 us at 131 rows, 8.3 at 2048, 11.6 at
4096, 17.6 at 8192 (profile of 033ea1e), most of it x's copy (x is 2/3 or more of its bytes from
~1024 rows on). A32 reads 2x the A bytes from L2 and converts each A tile once per column tile;
if the GEMM's issue slots absorb that, the pair (prep + GEMM) drops by ~60-70% of scale_rows'
time: 8192 rows ~71 -> ~60 us, 4096 ~40 -> ~32, 2048 ~22 -> ~17. B32 also drops the weights'
copy and the scale_rows launch (a flag memset instead) but converts W tiles in the main loop and
stores them to shared memory: expected slower GEMMs at >= 2048 rows, maybe a win at <= 512.

    PYTHONPATH=$PWD python perf/experiments/proj_rope32_bench.py [--rows 131,2048] [--out F]
"""
import argparse
import json
import statistics

import torch

from inductor_gqa.kernels import fp16_rows, proj_rope, tuning

E, H, HK, D = 1024, 16, 4, 64
PARTS = (H * D, HK * D, HK * D)


def t_us(fn):
    return statistics.median(tuning.time_ms(fn, reps=5) for _ in range(3)) * 1e3


class Case:
    def __init__(self, m, seed=0):
        g = torch.Generator(device="cuda").manual_seed(seed)
        self.m = m
        self.x = torch.randn(m, E, device="cuda", generator=g)
        self.ws = [torch.randn(n, E, device="cuda", generator=g) * 0.02 for n in PARTS]
        self.flag = torch.zeros(1, device="cuda", dtype=torch.int32)
        self.inv = 1.0 / (10000 ** (torch.arange(0, D, 2, device="cuda").float() / D))
        self.pos = torch.arange(m, device="cuda")[None]
        f = self.pos[0].float()[:, None] * self.inv[None]
        emb = torch.cat([f, f], -1)[None]
        self.cos, self.sin = emb.cos(), emb.sin()
        n = sum(PARTS)
        self.x16 = torch.empty(m, E, device="cuda", dtype=torch.float16)
        self.x_inv = torch.empty(m, device="cuda")
        self.w16 = torch.empty(n, E, device="cuda", dtype=torch.float16)
        self.w_inv = torch.empty(n, device="cuda")
        self.cuts = ((0, PARTS[0]), (PARTS[0], PARTS[0] + PARTS[1]), (PARTS[0] + PARTS[1], n))
        self.out = torch.empty(m, n, device="cuda", dtype=torch.float16)

    def prep(self, form):
        w_outs = [(self.w16[a:z], self.w_inv[a:z]) for a, z in self.cuts]
        if form == "base":
            fp16_rows.scale_rows([self.x] + self.ws, [(self.x16, self.x_inv)] + w_outs,
                                 zero=self.flag)
        elif form == "a32":
            fp16_rows.scale_rows(self.ws, w_outs, zero=self.flag)
        else:
            self.flag.zero_()

    def gemm(self, form, cfg):
        a, ti = (self.x16, self.x_inv) if form == "base" else (self.x, None)
        b, fi = (tuple(self.ws), None) if form == "a32b32" else (self.w16, self.w_inv)
        proj_rope.launch(a, b, ti, fi, self.out, self.flag, PARTS, None, None, self.cos,
                         self.sin, self.m, D, "none", 1e-6, None, "half", cfg,
                         angles=(self.inv, self.pos))


def bench(m):
    c = Case(m)
    rep = {}
    ref = None
    for form in ("base", "a32", "a32b32"):
        cfgs = proj_rope.CONFIGS if form == "base" else proj_rope.CONFIGS32
        rows = {}
        for cfg in cfgs:
            try:
                c.prep(form)
                c.gemm(form, cfg)
                torch.cuda.synchronize()
            except Exception as e:      # resources
                rows[str(cfg)] = dict(error=str(e)[:120])
                continue
            out = c.out.float().clone()
            if ref is None:
                ref = out
            diff = (out - ref).abs().max().item()
            g = t_us(lambda: c.gemm(form, cfg))
            pair = t_us(lambda: (c.prep(form), c.gemm(form, cfg)))
            rows[str(cfg)] = dict(gemm=g, pair=pair, diff=diff, flag=int(c.flag.item()))
        prep = t_us(lambda: c.prep(form))
        ok = {k: v for k, v in rows.items() if "pair" in v}
        best = min(ok, key=lambda k: ok[k]["pair"])
        rep[form] = dict(prep=prep, best=best, **{"best_" + k: v for k, v in ok[best].items()},
                         configs=rows)
        print(f"M={m:5d} {form:7s} prep {prep:6.1f}  best {best}: gemm {ok[best]['gemm']:6.1f}"
              f"  pair {ok[best]['pair']:6.1f}  diff {ok[best]['diff']:.2e} flag "
              f"{ok[best]['flag']}", flush=True)
    return rep


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", default="131,512,1024,2048,2984,4096,7184,8192")
    p.add_argument("--out", default="")
    a = p.parse_args()
    report = {m: bench(int(m)) for m in a.rows.split(",")}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
