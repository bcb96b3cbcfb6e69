"""Experiment: the probabilities pass with its stores on warps of their own
(`probs_store_warps.py`) against flash.py's pass, W075 "high" fp16 copies, same statistics.

    PYTHONPATH=$PWD python perf/experiments/probs_store_warps_bench.py [--cases 4096x1,...] [--out F]
    PYTHONPATH=$PWD python perf/experiments/probs_store_warps_bench.py --compile   # CPU: sm_90 build

Each config writes the probabilities and o from NaN-poisoned buffers; its probabilities are
compared bitwise with flash.py's (the same fp16 MMA and exponent FMA), o within 2e-3.

Prediction (4096x1): flash.py's best pass 297.5 us, its own store pattern alone 253.8
(runs/30fbe73). If the compute stops holding the stores back, 255-270 us; 2048x1 ~77 -> 67-70,
1024x2 ~42 -> 37-39. If it is no faster than flash.py's pass (note 22's copy-engine kernel was
13% slower), the stores are not what the compute waits on, and warp specialization of the stores
is dead for this pass.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import probs_store_warps as psw  # noqa: E402

FLASH = [(128, 64, 8, 4, "gp4"), (128, 64, 8, 3, "gp4"), (64, 64, 4, 3, "pipeline"),
         (64, 64, 4, 3)]


def compile_for_sm90():
    """Every config, causal and not, built for sm_90 on this machine (no GPU needed)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path.insert(0, os.path.join(root, "tests", "kernels"))
    import sm90_compile
    from triton.experimental.gluon import language as gl
    d, bad = 64, 0
    for cfg in psw.CONFIGS:
        bm, bn, stages, pbuf, sw, regs, maxnreg = cfg
        desc = {}
        for name, rows in (("q_desc", bm), ("k_desc", bn), ("v_desc", bn)):
            layout = gl.NVMMASharedLayout.get_default_for([rows, d], gl.float16)
            desc[name] = f"tensordesc<fp16[{rows}, {d}],{layout!r}>"
        types = dict(desc, O="*fp16", P="*fp32", ML="*fp32", FLAG="*i32", qscale="fp32")
        for causal in (False, True):
            consts = dict(D=d, BLOCK_M=bm, BLOCK_N=bn, STAGES=stages, PBUF=pbuf,
                          CAUSAL=causal, GUARD=1, STORE_WARPS=sw, STORE_REGS=regs,
                          num_warps=bm // 16)
            options = dict({"num_warps": bm // 16}, **({"maxnreg": maxnreg} if maxnreg else {}))
            job = (f"{cfg} causal={causal}", "probs_store_warps", "probs_store_warps_kernel",
                   types, consts, options)
            try:
                k = sm90_compile._compile(job, divisible=True)
            except Exception as e:  # noqa: BLE001
                bad += 1
                print(job[0], "FAILED", f"{type(e).__name__}: {str(e)[-300:]}", flush=True)
                continue
            usage = [x.strip() for x in sm90_compile._sass(k, "-res-usage").splitlines()
                     if "REG:" in x]
            ins = sm90_compile._instructions(sm90_compile._sass(k))
            print(job[0], f"ok, {k.metadata.shared} B shared (model {psw.smem_bytes(d, cfg)}),",
                  usage[0].split()[0], usage[0].split()[3], "128-bit stores:",
                  sum("STG.E.EF.128" in x for x in ins), flush=True)
    return bad


def bench(case_name):
    import gqa_pack_bench as gp
    s, b = (int(t) for t in case_name.split("x"))
    c = gp.Case(s, b)
    c.launch(1, gp.STATS_CFG)
    rep = {}
    ref = None
    for cfg in FLASH:
        c.probs.fill_(float("nan"))
        c.o.fill_(float("nan"))
        c.launch(2, cfg)
        torch.cuda.synchronize()
        if ref is None:
            ref = (c.probs.clone(), c.o.clone())
        rep[f"flash {cfg}"] = dict(us=gp.t_us(lambda: c.launch(2, cfg)))
    for cfg in psw.CONFIGS:
        name = f"store_warps {cfg}"

        def run():
            psw.launch(c.q, c.k, c.v, c.o, c.probs, c.ml, c.flag, b, s, gp.H, gp.H // gp.HK,
                       gp.D, 1.0, False, cfg)
        try:
            c.probs.fill_(float("nan"))
            c.o.fill_(float("nan"))
            run()
            torch.cuda.synchronize()
            same_p = torch.equal(c.probs, ref[0])
            close_o = torch.allclose(c.o.float(), ref[1].float(), rtol=2e-3, atol=2e-3)
            rep[name] = dict(us=gp.t_us(run), probs_bitwise=same_p, o_close=close_o,
                             flag=int(c.flag.item()))
        except Exception as e:  # noqa: BLE001
            rep[name] = dict(us=float("inf"), error=f"{type(e).__name__}: {str(e)[:200]}")
    for k, v in sorted(rep.items(), key=lambda kv: kv[1]["us"]):
        print(case_name, k, v, flush=True)
    return rep


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="4096x1,2048x1,1024x2,512x16")
    ap.add_argument("--out", default="")
    ap.add_argument("--compile", action="store_true", help="only build every config for sm_90")
    a = ap.parse_args()
    if a.compile:
        sys.exit(1 if compile_for_sm90() else 0)
    import gqa_pack_bench as gp
    gp.run_cases(bench, a.cases, a.out)


if __name__ == "__main__":
    main()
