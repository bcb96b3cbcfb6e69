"""Experiment: flash.py's GP (query heads of one KV head packed into a program's row tile) on the
W075 "high" attention passes (fp16 q/k/V copies, fp16 output, float32 probabilities).

Prediction being tested: per unit of work a program loads K/V tiles GP times less often, so if
the passes are limited by L2 -> SM traffic (4096x1: ~1 GB of K/V tile reads beside the 1.07 GB of
probabilities in the probabilities pass), GP=4 makes them faster; if not, it changes nothing.
Every config of the stats pass (MODE 1), the probabilities pass (MODE 2, with and without
PIPELINE) and, for S <= 256, the single pass (MODE 3) is timed with GP 1, 2 and 4 on the same
inputs; results must be bitwise equal to the same config's with GP 1 (rows are independent).

    PYTHONPATH=$PWD python perf/experiments/gqa_pack_bench.py [--cases 4096x1,512x16] [--out F]

It also times stats-pass variants that are not candidates yet (EXTRA_STATS, PIPELINE in MODE 1).
    ncu --profile-from-start off ... python perf/experiments/gqa_pack_bench.py --ncu 4096x1
"""
import argparse
import json
import statistics

import torch

from inductor_gqa.kernels import flash, tuning
from inductor_gqa.lower import attention as lower_attention

H, HK, D = 16, 4, 64


def inputs(s, b, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(b * s, 1024, device="cuda", generator=g)
    w = torch.randn(1024 + 2 * HK * D, 1024, device="cuda", generator=g) * 0.02
    y = (x @ w.t())
    q, k, v = y[:, :H * D], y[:, H * D:H * D + HK * D], y[:, H * D + HK * D:]
    return q.half().contiguous(), k.half().contiguous(), v.half().contiguous()


class Case:
    def __init__(self, s, b):
        self.s, self.b = s, b
        self.q, self.k, self.v = inputs(s, b)
        self.o = torch.empty(b, s, H * D, device="cuda", dtype=torch.float16)
        self.probs = torch.empty(b, H, s, s, device="cuda")
        self.ml = torch.empty(b * H * s * 2, device="cuda")
        self.flag = torch.zeros(1, device="cuda", dtype=torch.int32)

    def launch(self, mode, cfg, mod=flash):
        """One pass with config ``cfg``; ``mod``: flash.py or a copy of another revision's."""
        s, b = self.s, self.b
        bm, bn, nw, ns = cfg[:4]
        mod.launch((self.q, (s * H * D, D, H * D)), (self.k, (s * HK * D, D, HK * D)),
                     (self.v, (s * HK * D, D, HK * D, 1)), self.o,
                     self.probs if mode >= 2 else None, None, self.ml, b, s, H, H // HK, D, 1.0,
                     0.0, False, 0, mode, "tf32", False, bm, bn, nw, ns,
                     pipeline="pipeline" in cfg, flag=self.flag, guard=1,
                     gp=lower_attention.heads_per_program(cfg), align4="a4" in cfg)


STATS_CFG = (64, 128, 4, 3)
SINGLE_MAX = 256        # --single-max: time MODE 3 up to this S (one key tile per row)
EXTRA_STATS = [(128, 64, 4, 2), (128, 64, 4, 3), (128, 128, 4, 2), (256, 64, 8, 2)]


def t_us(fn):
    return statistics.median(tuning.time_ms(fn, reps=5) for _ in range(3)) * 1e3


def bench(case_name):
    s, b = (int(t) for t in case_name.split("x"))
    c = Case(s, b)
    rep = {}
    c.launch(1, STATS_CFG)      # the statistics every probabilities-pass config reads
    ml_ref = c.ml.clone()
    modes = [1, 2] + ([3] if s <= max(256, SINGLE_MAX) else [])
    for mode in modes:
        if mode == 3 and s > 256:
            # not a candidate yet: one key tile of up to SINGLE_MAX keys per row
            bn = 1 << (s - 1).bit_length()
            base = [(16, bn, 4, 1), (16, bn, 8, 1), (32, bn, 8, 1)]
        elif mode == 3:
            base = [tuple(x) for x in lower_attention._single_pass_candidates(s)]
        else:
            base = lower_attention._attention_configs(torch.float32, D, mode, f16=True)
            if mode == 1 and EXTRA_STATS:
                # not candidates yet: the stats pass with its next product issued early
                # (PIPELINE), and one warpgroup over 128 rows (more independent work per thread
                # for a pass bound by instruction latency at 16 warps per SM)
                base = base + [x + ("pipeline",) for x in base] + EXTRA_STATS
            base = base + [x + ("pipeline",) for x in base] if mode == 2 else base
        rows = []
        for cfg in base:
            mine = None         # this config's results with GP 1: GP > 1 must equal them
            a4 = mode >= 2 and s % 4 != 0 and "a4" not in cfg
            for gp in (1, 2, 4) + (("a4",) if a4 else ()):
                if gp == "a4":
                    # flash.py's ALIGN4 (aligned 16-byte stores at ragged S): the same
                    # probabilities bitwise; o sums its key tiles in other groups
                    cc = cfg + ("a4",)
                elif cfg[0] % gp:
                    continue
                else:
                    cc = cfg + ((f"gp{gp}",) if gp > 1 else ())
                try:
                    if mode == 2:
                        c.ml.copy_(ml_ref)
                    c.o.fill_(float("nan"))
                    c.probs.fill_(float("nan"))
                    c.launch(mode, cc)
                    torch.cuda.synchronize()
                    got = (c.ml.clone(),) if mode == 1 else (c.probs.clone(), c.o.clone())
                    if gp == 1:
                        mine, same = got, None
                    elif gp == "a4":
                        same = (torch.equal(got[0], mine[0])
                                and torch.allclose(got[1].float(), mine[1].float(), rtol=2e-3,
                                                   atol=1e-3))
                    else:
                        same = all(torch.equal(x, y) for x, y in zip(got, mine))
                    if mode >= 2 and not torch.isfinite(got[0]).all():
                        same = False
                    us = t_us(lambda: c.launch(mode, cc))
                    rows.append((us, str(cc), gp, same))
                except Exception as e:  # noqa: BLE001
                    rows.append((float("inf"), f"{cc} {type(e).__name__}: {str(e)[:80]}", gp,
                                 None))
        rows.sort()
        best = {gp: next((r for r in rows if r[2] == gp), None) for gp in (1, 2, 4, "a4")}
        rep[f"mode{mode}"] = dict(top=rows[:6], best_by_gp=best,
                                  all_equal=all(r[3] for r in rows if r[3] is not None))
        print(case_name, f"mode{mode}", "best by gp:",
              {gp: (round(r[0], 1), r[1]) if r else None for gp, r in best.items()},
              "all bitwise equal:", rep[f"mode{mode}"]["all_equal"], flush=True)
    return rep


def ncu(case_name, cfgs, launch=Case.launch):
    """Each (mode, cfg) launched once inside the profiler's range (compiled and warmed outside
    it), for ncu --profile-from-start off; ``launch(case, mode, cfg)``."""
    s, b = (int(t) for t in case_name.split("x"))
    c = Case(s, b)
    for mode, cfg in cfgs:          # compile and warm outside the profiled range
        launch(c, mode, cfg)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for mode, cfg in cfgs:
        launch(c, mode, cfg)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="4096x1,2048x1,512x16,449x16,1024x2,512x8,256x8,131x1")
    ap.add_argument("--out", default="")
    ap.add_argument("--ncu", default="", help="a case: profile four fixed launches")
    ap.add_argument("--single-max", type=int, default=256)
    ap.add_argument("--no-extra-stats", action="store_true")
    a = ap.parse_args()
    global SINGLE_MAX, EXTRA_STATS
    SINGLE_MAX = a.single_max
    if a.no_extra_stats:
        EXTRA_STATS = []
    if a.ncu:
        ncu(a.ncu, [(1, STATS_CFG), (1, STATS_CFG + ("gp4",)), (2, (64, 64, 4, 3)),
                    (2, (64, 64, 4, 3, "gp4"))])
        return
    run_cases(bench, a.cases, a.out)


def run_cases(bench, cases, out, **about):
    """bench(case) per comma-separated case; the report (device, versions, ``about``) is
    rewritten to ``out`` after each case, so a timeout keeps what finished."""
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, **about}
    for case in cases.split(","):
        report[case] = bench(case)
        if out:
            with open(out, "w") as f:
                json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
