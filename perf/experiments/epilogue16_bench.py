"""Experiment: the launch shapes of f16proj16's two memory-bound launches at W075 "high" sizes:
``scale_rows`` (x and Wq/Wk/Wv to scaled fp16) and the norm/RoPE launch on the fp16 GEMM
outputs (``qk_norm_rope_(in16=True)``, with Wo's copy). CUDA-graph replay, median of 5; every
variant's outputs are compared bitwise with the default's.

    PYTHONPATH=$PWD python perf/experiments/epilogue16_bench.py [--cases 512x16,4096x1] [--out F]
        [--tokens] [--no-wo]

``--tokens``: the head-row default against the token-major programs (``tokens=``, each of
qk_epilogue.TOKEN_CONFIGS) only, no scale_rows; ``--no-wo``: without Wo's copy, as the launch
runs while a CUDA graph is captured (fp16_plans.wo16_mode 2).
Prediction for ``--tokens`` (second round, main after ae04131): the head-row form loads per
head row the feature scales, cos and sin (three to five L1/L2 loads per element moved) and runs
12,288 two-warp programs at 512x16; T tokens x all heads per program load the scales once per
program and cos/sin once per token. Expected 3.2-3.8 TB/s against 2.1-2.4 now: 512x16 ~23 ->
14-16 us, 449x16 ~20 -> 12-14, 4096x1 ~11.5 -> 7-8, bitwise the same copies.

Prediction (profile of db4f1dd, runs/30fbe73/db4f1dd/profile_f16proj16.txt): at 512x16 the
norm/RoPE launch takes ~25 us for ~60 MB (2.4 TB/s) and scale_rows 17.5 us for ~60 MB
(3.4 TB/s). With fp16 inputs a 16-row program loads 8 bytes per thread per half-row, half of
what the float32 form (tuned at 16 rows) loaded, so fewer bytes are in flight per SM: 32 or 64
rows should bring the norm/RoPE launch to 3.2-3.6 TB/s, -6 to -8 us at 512x16 and 449x16, -3 at
4096x1. scale_rows is nearer its bound: at most -2 us at 512x16.
"""
import argparse
import ast
import json
import os
import statistics

import torch

from inductor_gqa.kernels import fp16_rows, qk_epilogue, tuning
from inductor_gqa.kernels.rope_table import rope_tables
from inductor_gqa.lower.fp16_plans import _mm16_out16

DEV = os.environ.get("BENCH_DEVICE", "cuda")     # "cpu" with TRITON_INTERPRET=1: a smoke run
CASES = [(512, 16), (449, 16), (4096, 1), (2048, 1), (1024, 2), (512, 8), (131, 1)]
H, HK, D, E = 16, 4, 64, 1024
WITH_WO = True
EPILOGUE = [dict(rows=r, num_warps=w) for r in (16, 32, 64) for w in (2, 4, 8)]
SCALE = [dict(rows=r, num_warps=w) for r in (2, 4, 8) for w in (4, 8)] + [dict(rows=1,
                                                                                num_warps=4)]


def t_us(fn):
    return statistics.median(tuning.time_ms(fn, reps=10) for _ in range(5)) * 1e3


def setup(s, b, g):
    m = b * s
    x = torch.randn(m, E, device=DEV, generator=g)
    ws = [torch.randn(n, E, device=DEV, generator=g) * 0.02 for n in (H * D, HK * D, HK * D)]
    wo = torch.randn(E, H * D, device=DEV, generator=g) * 0.02
    target = fp16_rows.out16_target(E)
    n = [w.shape[0] for w in ws]
    w16 = torch.empty((sum(n), E), device=DEV, dtype=torch.float16)
    w_inv = torch.empty((sum(n),), device=DEV, dtype=torch.float32)
    cuts = [(0, n[0]), (n[0], n[0] + n[1]), (n[0] + n[1], sum(n))]
    x16 = torch.empty((m, E), device=DEV, dtype=torch.float16)
    x_inv = torch.empty((m,), device=DEV, dtype=torch.float32)
    outs = [(x16, x_inv)] + [(w16[a:z], w_inv[a:z]) for a, z in cuts]
    flag = torch.zeros(1, device=DEV, dtype=torch.int32)

    def scale(**kw):
        return fp16_rows.scale_rows([x] + ws, outs, zero=flag, target=target, **kw)

    scale()
    qkv = _mm16_out16(x16, w16.t())
    q, k, v = (qkv[:, a:z] for a, z in cuts)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, D, 2, device=DEV).float() / D))
    pos = torch.arange(s, device=DEV)[None].expand(b, s)
    cos, sin = rope_tables(inv_freq, pos, D, False, torch.float32, interpret=DEV != "cuda")
    copies = tuple(torch.empty(a.shape, device=DEV, dtype=torch.float16) for a in (q, k, v))
    wo16 = torch.empty_like(wo, dtype=torch.float16)
    scales = (x_inv, *(w_inv[a:z] for a, z in cuts))

    def epilogue(**kw):
        qk_epilogue.qk_norm_rope_(q, k, None, None, cos, sin, b, s, H, HK, D, "none", 1e-6,
                                  "half", D, v=v, copies=copies, flag=flag, scales=scales,
                                  store32=False, wo=(wo, wo16) if WITH_WO else None,
                                  in16=True, **kw)

    moved_epi = qkv.numel() * 4 + wo.numel() * 6 * WITH_WO + cos.numel() * 8
    moved_scale = (x.numel() + w16.numel()) * 6
    return dict(scale=scale, epilogue=epilogue, x16=x16, w16=w16, copies=copies, wo16=wo16,
                flag=flag, moved_epi=moved_epi, moved_scale=moved_scale)


def sweep(label, fn, variants, outputs, moved):
    ref, rows = None, []
    for kw in variants:
        for o in outputs:
            o.fill_(float("nan"))
        fn(**kw)
        got = torch.cat([o.float().flatten() for o in outputs])
        if ref is None:
            ref = got
        same = bool(torch.equal(got.nan_to_num(7.0), ref.nan_to_num(7.0)))
        us = t_us(lambda: fn(**kw)) if DEV == "cuda" else 1.0
        rows.append(dict(kernel=label, **kw, us=us, tb_s=moved / us / 1e6, same=same))
    return rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default=",".join(f"{s}x{b}" for s, b in CASES))
    p.add_argument("--out", default="")
    p.add_argument("--tokens", action="store_true")
    p.add_argument("--no-wo", action="store_true")
    p.add_argument("--token-configs", default="", help="e.g. '(4, 2), (8, 4)' instead of "
                   "qk_epilogue.TOKEN_CONFIGS")
    args = p.parse_args()
    global WITH_WO
    WITH_WO = not args.no_wo
    configs = (ast.literal_eval(f"[{args.token_configs}]") if args.token_configs
               else qk_epilogue.TOKEN_CONFIGS)
    g = torch.Generator(device=DEV).manual_seed(0)
    report = []
    for case in args.cases.split(","):
        s, b = (int(v) for v in case.split("x"))
        a = setup(s, b, g)
        # the default launch first: the reference every variant must match bitwise
        variants = ([dict(tokens=tuple(t)) for t in configs] if args.tokens
                    else EPILOGUE)
        epi = sweep("epilogue", a["epilogue"], [{}] + variants,
                    list(a["copies"]) + ([a["wo16"]] if WITH_WO else []), a["moved_epi"])
        sc = [] if args.tokens else sweep("scale_rows", a["scale"], [{}] + SCALE,
                                          [a["x16"], a["w16"]], a["moved_scale"])
        assert a["flag"].item() == 0
        for r in epi + sc:
            r["case"] = case
            print(f"{case} {r['kernel']} tokens={r.get('tokens', '-')} "
                  f"rows={r.get('rows', 'default')} "
                  f"warps={r.get('num_warps', 'default')}: {r['us']:.1f} us "
                  f"({r['tb_s']:.2f} TB/s){'' if r['same'] else ' DIFFERS'}", flush=True)
        report += epi + sc
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
