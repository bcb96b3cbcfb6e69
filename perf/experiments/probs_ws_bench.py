"""Experiment: kernels/probs_ws.py (the probabilities pass with one K/V stream feeding NC
consumer warpgroups: a producer warp, full/empty barriers, no block-wide barrier per tile)
against flash.py's MODE 2 on the same statistics, W075 "high" fp16 copies.

    PYTHONPATH=$PWD python perf/experiments/probs_ws_bench.py [--cases 4096x1,...] [--out F]

Second round ("pp" configs, two consumers): the consumers' q @ k^T alternate through two token
barriers (FlashAttention-3's ping-pong), so one's exponentials and stores run while the other's
product does. The first round had the two-consumer form at 294.6-299.0 us at 4096x1 against
299.7-300.5 for flash.py's pass, and more consumers slower (they wait on the same tiles in
step). Prediction: if that bunching is what holds it, "pp" takes 4096x1 to 270-285 us and
2048x1 from ~76 to 70-73; if not, within +-2% of the unordered form.

Probabilities and o must equal flash.py's tuned config's bitwise (the same products, exponent
FMA and fp16 P; o's P @ V sums its key tiles in the same order).

Prediction (written before the first GPU run): ncu puts flash.py's pass at 81% of the L2's
throughput (88% for its stores alone), its K/V tile reads 22% of its L2 sectors
(runs/profiles/ncu_parts_4096x1_b92cbd2.txt). Four 64-row consumers per program read each K/V tile
once for 256 rows (half flash.py's reads) at 16 consumer warps per SM. If L2 throughput is the
limit and the producer keeps the ring full: 4096x1 ~300 -> 270-285 us, 2048x1 ~78 -> 70-74,
1024x2 ~42 -> 38-40. If it loses, one program per SM exposes each program's start and end
(q load, statistics, o store) and that outweighs the reads.
"""
import argparse
import ast

import torch

import gqa_pack_bench as gp      # inputs, flash.py launches, timing (this folder is sys.path[0])
from inductor_gqa.kernels import probs_ws as pws

FLASH = [(128, 64, 8, 3, "gp4"), (128, 64, 8, 4, "gp4")]
WS = list(pws.CONFIGS)


def ws(c, cfg, causal):
    pws.launch(c.q, c.k, c.v, c.ml, c.o, c.probs, c.flag, c.b, c.s, gp.H, gp.H // gp.HK, gp.D,
               1.0, cfg, guard=1)


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


def bench(case_name):
    s, b = (int(t) for t in case_name.split("x"))
    c = gp.Case(s, b)
    rep = {}
    for causal in (False,):
        tag = "causal " if causal else ""
        stats(c, causal)
        c.probs.fill_(float("nan"))
        c.o.fill_(float("nan"))
        flash2(c, FLASH[0], causal)
        torch.cuda.synchronize()
        ref = (c.probs.clone(), c.o.float())
        runs = [("flash", cfg, flash2) for cfg in FLASH] + [("ws", cfg, ws) for cfg in WS]
        for kind, cfg, fn in runs:
            name = f"{tag}{kind} {cfg}"
            try:
                if kind == "ws" and not pws.supported(c.q, c.k, c.v, s, gp.D, 0, 1.0, causal,
                                                      gp.H // gp.HK, cfg):
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
            for kind in ("flash", "ws")}
    print(case_name, "best:", best, flush=True)
    rep["best"] = best
    return rep


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="4096x1,2048x1,1024x2")
    ap.add_argument("--out", default="")
    ap.add_argument("--configs", default="", help="ws configs, a Python list of tuples")
    a = ap.parse_args()
    if a.configs:
        WS[:] = [tuple(c) for c in ast.literal_eval(a.configs)]
    gp.run_cases(bench, a.cases, a.out)


if __name__ == "__main__":
    main()
