"""Experiment: the split-row one-launch probabilities kernel (`probs_split.py`) against flash.py's
stats/probabilities pair, W075 "high" fp16 copies (fp16 o, float32 probabilities).

    PYTHONPATH=$PWD python perf/experiments/probs_split_bench.py [--cases 4096x1,...] [--out F]
    PYTHONPATH=$PWD python perf/experiments/probs_split_bench.py --compile   # CPU: sm_90 build

Every launch writes into NaN-poisoned outputs; both are compared with a float64 softmax of the
same fp16 copies (probs_staged_bench's errors), and each config runs twice to check that its o
is bitwise the same (the partial products are summed in a fixed order). The split kernel's time
includes zeroing its counters (a memset, which the block could fold into an earlier launch).

Prediction (written before the first GPU run): at S <= 512 the staged ping-pong kernel took
512x16 from the pair's ~125 us to ~107; per score, this kernel does the same work (plus a
partial-sum exchange of 0.5 KB and 16 KB per program), so the pair's 415 us at 4096x1 should
become ~340-370 (the stats pass's 117 us gone, loop 2 ~10% slower than flash.py's
probabilities pass), 2048x1 ~111 -> 90-100, 1024x2 ~61 -> 50-56, 541x1 ~22.6 -> 16-20. If it is
not faster than the pair at 4096x1, staging rows across programs does not pay either.
"""
import argparse
import os
import sys

import torch

import gqa_pack_bench as gp      # inputs, flash.py launches, timing (this folder is sys.path[0])
import probs_split as split
import probs_staged_bench as psb

STATS = [(64, 128, 4, 3), (64, 128, 4, 2)]
PROBS = [(128, 64, 8, 4, "gp4"), (128, 64, 8, 3, "gp4"), (64, 64, 4, 3, "pipeline"),
         (64, 64, 4, 3, "a4")]


def compile_for_sm90():
    """Every config, both guards, for sm_90 on this machine (no GPU needed)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path.insert(0, os.path.join(root, "tests", "kernels"))
    import sm90_compile
    from triton.experimental.gluon import language as gl
    d, bad = 64, 0
    for cfg in split.CONFIGS:
        bm, bn, nw, stages, n_tiles = cfg
        desc = {}
        for name, rows in (("q_desc", bm), ("k_desc", bn), ("v_desc", bn)):
            layout = gl.NVMMASharedLayout.get_default_for([rows, d], gl.float16)
            desc[name] = f"tensordesc<fp16[{rows}, {d}],{layout!r}>"
        types = dict(desc, O="*fp16", P="*fp32", FLAG="*i32", WS_ML="*fp32", WS_O="*fp32",
                     CNT="*i32", qscale="fp32")
        for seq in (4096, 541):
            for guard in (1, 0):
                consts = dict(D=d, BLOCK_M=bm, BLOCK_N=bn, N_TILES=n_tiles,
                              SPLIT=split.split_of(seq, cfg), STAGES=stages, GUARD=guard,
                              num_warps=nw)
                if consts["SPLIT"] > 8:
                    continue
                job = (f"{cfg} S{seq} guard={guard}", "probs_split", "probs_split_kernel", types,
                       consts, {"num_warps": nw})
                try:
                    k = sm90_compile._compile(job, divisible=True)
                except Exception as e:  # noqa: BLE001
                    bad += 1
                    print(job[0], "FAILED", f"{type(e).__name__}: {str(e)[-1500:]}", flush=True)
                    continue
                usage = [x.strip() for x in sm90_compile._sass(k, "-res-usage").splitlines()
                         if "REG:" in x]
                ins = sm90_compile._instructions(sm90_compile._sass(k))
                print(job[0], f"ok, {k.metadata.shared} B shared (model "
                      f"{split.smem_bytes(d, cfg)}),", usage[0].split()[0],
                      usage[0].split()[3], "128-bit P stores:",
                      sum("STG.E.EF.128" in x for x in ins), flush=True)
    return bad


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
    for cfg in split.CONFIGS:
        name = f"split {cfg}"
        try:
            if split.split_of(s, cfg) > 8 or split.smem_bytes(gp.D, cfg) > split.ps.SMEM_PER_BLOCK:
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
    ap.add_argument("--cases", default="4096x1,2048x1,1024x2,541x1")
    ap.add_argument("--out", default="")
    ap.add_argument("--compile", action="store_true", help="only build every config for sm_90")
    a = ap.parse_args()
    if a.compile:
        sys.exit(1 if compile_for_sm90() else 0)
    gp.run_cases(bench, a.cases, a.out)


if __name__ == "__main__":
    main()
