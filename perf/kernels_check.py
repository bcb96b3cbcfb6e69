"""GPU check and microbenchmark of the fused attention-block kernels on W075 and W092.

(a) correctness: every case, fresh random inputs per round (the workloads' distributions, drawn on
    the GPU), outputs poisoned (the allocator's free memory is filled with NaN before each run), the
    workload tolerance rule (``workloads.check``) on every output; W075 also with causal=True and
    under both fp32 matmul precisions ("highest" reference always).
(b) timing: CUDA-graph replay median of our block vs eager vs stock ``torch.compile`` of the
    workload function, per case; a short table last (mean over cases, fraction of SOL).

    PYTHONPATH=$PWD python perf/kernels_check.py --rounds 10 --out $OUT/kernels.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback

import torch

from inductor_gqa.kernels import tuning
from perf.bench import graph_time_us
from inductor_gqa.lower import block
from inductor_gqa.plan.spec import BlockSpec
from inductor_gqa.workloads import (W075, W092, atol, check, make_inputs,
                                    sol_seconds)

DEV = "cuda"


def w075_block(inp, causal):
    spec = BlockSpec(num_heads=16, num_kv_heads=4, head_dim=64, rope="half", rotary_dim=64,
                     core="explicit", scale=1.0, causal=causal, return_probs=True)
    t = _empty_tensors()
    t.update(x=inp["hidden_states"], wq=inp["q_proj_weight"], wk=inp["k_proj_weight"],
             wv=inp["v_proj_weight"], wo=inp["o_proj_weight"], inv_freq=inp["inv_freq"],
             position_ids=inp["position_ids"])
    return t, spec


def w092_block(inp):
    spec = BlockSpec(num_heads=96, num_kv_heads=8, head_dim=128, norm="fp32_weight", eps=1e-5,
                     rope="half", rotary_dim=128, core="explicit", scale=128 ** -0.5, causal=True)
    t = _empty_tensors()
    t.update(x=inp["hidden_states"], wq=inp["q_proj_weight"], bq=inp["q_proj_bias"],
             wk=inp["k_proj_weight"], bk=inp["k_proj_bias"], wv=inp["v_proj_weight"],
             bv=inp["v_proj_bias"], wo=inp["o_proj_weight"], q_norm_weight=inp["q_norm_weight"],
             k_norm_weight=inp["k_norm_weight"], cos=inp["cos"], sin=inp["sin"])
    return t, spec


def _empty_tensors():
    return dict.fromkeys(("x", "wq", "wk", "wv", "bq", "bk", "bv", "q_norm_weight",
                          "k_norm_weight", "cos", "sin", "inv_freq", "position_ids", "attn_mask",
                          "wo", "bo"))


def poison(nbytes):
    """Fill the allocator's free memory with NaN so unwritten outputs show up."""
    n = int(nbytes * 1.5) // 4 + 1024
    torch.empty(n, device=DEV, dtype=torch.float32).fill_(float("nan"))
    torch.cuda.synchronize()


def graph_median_us(fn, reps=20):
    """Median GPU time of one call over ``reps`` CUDA-graph replays (the perf job's timer)."""
    return graph_time_us(fn, replays=reps, blocks=1)[0]


def run_case(wl, s, b, rounds, causal, precision, do_time, compiled, variants):
    res = dict(S=s, B=b, causal=causal, precision=precision)
    torch.set_float32_matmul_precision("highest")
    at = atol(wl, s, b)
    fracs = {}
    ok_all = True
    for r in range(rounds):
        torch.manual_seed(1000 * r + s * 7 + b)
        inp = make_inputs(wl, s, b, device=DEV)
        torch.set_float32_matmul_precision("highest")
        with torch.no_grad():
            if wl is W075:
                ref = wl.fn(**inp, is_causal=causal)
            else:
                ref = (wl.fn(**inp),)
        torch.set_float32_matmul_precision(precision)
        t, spec = w075_block(inp, causal) if wl is W075 else w092_block(inp)
        for vname, env in variants:
            os.environ.update(env)
            poison(sum(x.numel() * x.element_size() for x in ref))
            got = block.run_block(dict(t), spec)
            assert got is not None, "kernels declined"
            outs = (got[0], got[1]) if wl is W075 else (got[0],)
            for i, (o, rf) in enumerate(zip(outs, ref)):
                ok, frac = check(o, rf, at, wl.rtol)
                key = f"{vname}:out{i}"
                fracs[key] = min(fracs.get(key, 1.0), frac)
                ok_all &= ok
    res["min_pass_frac"] = fracs
    res["ok"] = bool(ok_all)
    if do_time:
        torch.manual_seed(s * 7 + b)
        inp = make_inputs(wl, s, b, device=DEV)
        torch.set_float32_matmul_precision(precision)
        t, spec = w075_block(inp, causal) if wl is W075 else w092_block(inp)
        kw = dict(is_causal=causal) if wl is W075 else {}
        with torch.no_grad():
            for vname, env in variants:
                os.environ.update(env)
                res[f"ours_{vname}_us"] = graph_median_us(lambda: block.run_block(dict(t), spec))
            res["eager_us"] = graph_median_us(lambda: wl.fn(**inp, **kw))
            if compiled is not None:
                try:
                    res["compile_us"] = graph_median_us(lambda: compiled(**inp, **kw))
                except Exception as ex:  # noqa: BLE001
                    res["compile_err"] = repr(ex)[:200]
        res["sol_us"] = sol_seconds(wl, s, b) * 1e6
    torch.cuda.empty_cache()
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--out", default="kernels.json")
    ap.add_argument("--only", default="",
                    help="comma list of W092, W075-high, W075-highest, W075c-high, W075c-highest")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--no-time", action="store_true")
    ap.add_argument("--budget-s", type=float, default=1e9)
    ap.add_argument("--cases", default="", help="comma list of SxB (e.g. 512x1,4096x1): only these")
    ap.add_argument("--ieee", action="store_true", help="also check/time IEEE fp32 dots")
    args = ap.parse_args()
    t0 = time.time()
    runs = [("W092", W092, False, "highest"), ("W075-high", W075, False, "high"),
            ("W075-highest", W075, False, "highest"), ("W075c-high", W075, True, "high"),
            ("W075c-highest", W075, True, "highest")]
    if args.only:
        keep = args.only.split(",")
        unknown = sorted(set(keep) - {r[0] for r in runs})
        if unknown:
            ap.error(f"--only: unknown {unknown}; known: {[r[0] for r in runs]}")
        runs = [r for r in runs if r[0] in keep]
    report = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                  triton=__import__("triton").__version__, rounds=args.rounds, runs={})
    for name, wl, causal, prec in runs:
        variants = [("k", {})]
        if name in ("W075-highest", "W075c-highest"):
            variants = [("tf32x3", {"INDUCTOR_GQA_FP32_HIGHEST": "tf32x3"})]
            if args.ieee:
                variants.append(("ieee", {"INDUCTOR_GQA_FP32_HIGHEST": "ieee"}))
        compiled = None
        if not args.no_compile and not name.startswith("W075c"):
            torch._dynamo.reset()
            compiled = torch.compile(wl.fn)
        rows = []
        for s, b in wl.cases:
            if args.cases and f"{s}x{b}" not in args.cases.split(","):
                continue
            if time.time() - t0 > args.budget_s:
                rows.append(dict(S=s, B=b, skipped="budget"))
                continue
            try:
                row = run_case(wl, s, b, args.rounds, causal, prec,
                               not args.no_time and not name.startswith("W075c"), compiled,
                               variants)
            except Exception as ex:  # noqa: BLE001
                traceback.print_exc()
                row = dict(S=s, B=b, error=repr(ex)[:300])
            rows.append(row)
            print(name, json.dumps(row), flush=True)
        report["runs"][name] = rows
        report.setdefault("tuning", {})[name] = {str(k): [(str(c), ms) for c, ms in v]
                                                 for k, v in tuning.TIMINGS.items()}
    report["candidate_failures"] = tuning.failure_report()
    report["elapsed_s"] = time.time() - t0
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    # short table last
    print("\nrun            ok   ours_us(mean)  eager_us  compile_us  sol_us  sol/ours  worst_vs_stock")
    for name, rows in report["runs"].items():
        good = [r for r in rows if "S" in r and "error" not in r and "skipped" not in r]
        ok = all(r.get("ok") for r in good) and len(good) == len(rows)
        for vk in sorted({k for r in good for k in r if k.startswith("ours_")}) or ["-"]:
            def mean(k):
                v = [r[k] for r in good if k in r]
                return statistics.mean(v) if v and len(v) == len(good) else float("nan")
            worst = max((r[vk] / r["compile_us"] for r in good
                         if vk in r and "compile_us" in r), default=float("nan"))
            print(f"{name:14s} {str(ok):5s} {vk[5:-3]:>7s} {mean(vk):8.1f} {mean('eager_us'):9.1f} "
                  f"{mean('compile_us'):10.1f} {mean('sol_us'):7.1f} "
                  f"{mean('sol_us') / mean(vk) if vk != '-' else float('nan'):8.3f} {worst:8.2f}")
    for k, v in report["candidate_failures"].items():
        print(f"CANDIDATE FAILED {k}: {v}")
    print(f"elapsed {report['elapsed_s']:.0f}s")
    return 1 if report["candidate_failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
