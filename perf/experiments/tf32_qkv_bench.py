"""Experiment: W075's Q/K/V projections ("high") as one Triton launch on the float32 operands with
TF32 rounded to nearest (kernels/linear.py's "tf32rn") against what the f16proj plans run today
(scale_rows' fp16 copies of x and the three weights, then one cuBLAS fp16 GEMM), per token count.

    PYTHONPATH=$PWD python perf/experiments/tf32_qkv_bench.py [--rows 131,512,...] [--out F]

Why: at the small cases the block is a chain of ~8 launches of 3-6 us; the projection part is
two of them (131x1: scale_rows 3.3 + GEMM 4.6 us) and mostly moves the 6 MB of float32 weights
(read, written as fp16, read again). One TF32 launch reads them once.

Prediction (written before the first GPU run): at 131-541 rows the one-launch TF32 GEMM takes
3-5 us against ~8 for the pair (-3 to -4 us per small case, about -1.4 us on the W075 "high"
mean if the plan then wins there), even at ~1024 rows, slower from ~2048 rows (TF32 runs at half
the fp16 rate). Errors: "tf32rn" as cuBLAS's TF32 (max abs error against float64 within ~1.2x
of cuBLAS TF32's), "tf32" (truncation) ~2x worse.
"""
import argparse
import json
import statistics

import torch

from inductor_gqa.kernels import linear as lk
from inductor_gqa.kernels import tuning
from inductor_gqa.lower import fp16_plans
from inductor_gqa.lower.linear import _CONFIGS

E, NQ, NK = 1024, 1024, 256
# smaller tiles and longer K steps than lower/linear.py's configs, for a few hundred rows
EXTRA = [(32, 64, 64, 8, 4, 3), (64, 64, 128, 8, 4, 2), (64, 32, 128, 8, 4, 2),
         (32, 32, 128, 8, 4, 3)]


def t_us(fn):
    return statistics.median(tuning.time_ms(fn, reps=5) for _ in range(3)) * 1e3


def bench(m):
    g = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, E, device="cuda", generator=g)
    ws = [torch.randn(n, E, device="cuda", generator=g) * 0.02 for n in (NQ, NK, NK)]
    ref = torch.cat([x.double() @ w.double().t() for w in ws], 1)
    flag = torch.zeros(1, device="cuda", dtype=torch.int32)
    rep = {}

    def f16proj():
        x16, x_inv, w16, w_inv, _ = fp16_plans._scaled_fp16_operands(x[None], ws, flag)
        return fp16_plans._mm16(x16, w16.t()), x_inv, w_inv

    y, x_inv, w_inv = f16proj()
    err = (y.double() * x_inv.double()[:, None] * w_inv.double()[None, :] - ref).abs().max()
    rep["f16proj"] = dict(us=t_us(f16proj), max_err=float(err))

    def cublas_tf32():
        torch.backends.cuda.matmul.allow_tf32 = True
        return torch.cat([x @ w.t() for w in ws], 1)

    rep["cublas_tf32_separate"] = dict(us=t_us(cublas_tf32),
                                       max_err=float((cublas_tf32().double() - ref).abs().max()))
    torch.backends.cuda.matmul.allow_tf32 = False
    out = torch.empty(m, NQ + 2 * NK, device="cuda")
    parts = [(ws[0], None, out[:, :NQ]), (ws[1], None, out[:, NQ:NQ + NK]),
             (ws[2], None, out[:, NQ + NK:])]
    for prec in ("tf32rn", "tf32"):
        best = None
        for cfg in _CONFIGS + EXTRA:
            try:
                out.fill_(float("nan"))
                lk.launch_qkv(x, parts, prec, *cfg)
                torch.cuda.synchronize()
                e = float((out.double() - ref).abs().max())
                us = t_us(lambda: lk.launch_qkv(x, parts, prec, *cfg))
            except Exception as ex:  # noqa: BLE001
                rep[f"{prec} {cfg}"] = dict(error=f"{type(ex).__name__}: {str(ex)[:200]}")
                continue
            rep[f"{prec} {cfg}"] = dict(us=us, max_err=e)
            if best is None or us < best[0]:
                best = (us, cfg, e)
        rep[f"{prec} best"] = best
    print(m, json.dumps({k: v for k, v in rep.items() if "best" in k or " " not in k}),
          flush=True)
    return rep


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="131,256,422,512,541,1024,2048,4096,8192")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    for m in (int(r) for r in a.rows.split(",")):
        report[m] = bench(m)
        if a.out:
            with open(a.out, "w") as f:
                json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
