"""Experiment: linear.py's split-K kernel against cuBLAS for the fp16 plans' short-M GEMMs at
W075 "high" sizes: the Q/K/V product (N = 1536, float32 or fp16 out) and o_proj (N = 1024,
float32 out), K = 1024, fp16 operands. CUDA-graph replay, median of 3.

    PYTHONPATH=$PWD python perf/experiments/splitk_gemm_bench.py [--rows 131,541] [--out F]

Each config's result is compared with cuBLAS's (float32 out: max relative error; fp16 out: the
largest difference in fp16 ulps) and run twice for bitwise repeatability. Timed twice: with the
counters the kernel leaves at zero reused (``persistent``), and zeroed before every launch (a
memset; the block would fold that into scale_rows, which already clears the range flag).

Prediction (written before the first GPU run): cuBLAS takes 4.5-5.6 us for each of the two GEMMs
at 131-541 rows (profiles of db4f1dd and 4ffd770: a 64 x 112 tile's 16-step K loop on ~120 SMs).
Four programs per tile should bring each to 2.5-3.5 us at M <= 541, about -2 us per GEMM, -3 to
-4 us per small W075 case (~-1.5 us on the mean) if the block used it; no gain from ~1024 rows
on, where the tiles already fill the SMs.
"""
import argparse
import json
import statistics

import torch

from inductor_gqa.kernels import linear, tuning
from inductor_gqa.lower.fp16_plans import _mm16_out16

K = 1024
SHAPES = [("qkv fp16 out", 1536, torch.float16), ("qkv fp32 out", 1536, torch.float32),
          ("o_proj fp32 out", 1024, torch.float32)]


def t_us(fn):
    return statistics.median(tuning.time_ms(fn, reps=20) for _ in range(3)) * 1e3


def cublas(a, w, out_dtype):
    if out_dtype == torch.float16:
        return _mm16_out16(a, w.t())
    return torch.mm(a, w.t(), out_dtype=torch.float32)


def compare(y, ref):
    if y.dtype == torch.float16:
        # fp16 ulps between the two (the products are summed in another order)
        ulp = (ref.float().abs().clamp_min(2.0 ** -14) * 2.0 ** -10)
        return dict(max_ulps=float(((y.float() - ref.float()).abs() / ulp).max()))
    return dict(max_rel=float(((y - ref).abs() / ref.abs().clamp_min(1e-3)).max()))


def bench(m, g):
    rows = []
    a = (torch.randn(m, K, device="cuda", generator=g) * 2).half()
    for name, n, out_dtype in SHAPES:
        w = (torch.randn(n, K, device="cuda", generator=g) * 2).half()
        ref = cublas(a, w, out_dtype)
        rep = dict(rows=m, gemm=name, cublas_us=t_us(lambda: cublas(a, w, out_dtype)))
        best = None
        for cfg in linear.SPLITK_CONFIGS:
            bm, bn, bk, gm, nw, ns, split = cfg
            ws = linear.splitk_workspace(m, n, bm, bn, split, a.device)
            y = torch.empty(m, n, device="cuda", dtype=out_dtype)

            def run(ws=ws, y=y, cfg=cfg):
                linear.launch_splitk(a, w, y, ws, *cfg[:4], cfg[6], cfg[4], cfg[5])
            try:
                y.fill_(float("nan"))
                run()
                first = y.clone()
                y.fill_(float("nan"))
                run()
                torch.cuda.synchronize()
                r = dict(cfg=cfg, us=t_us(run), repeatable=bool(torch.equal(first, y)),
                         **compare(y, ref))
            except Exception as e:  # noqa: BLE001
                r = dict(cfg=cfg, error=f"{type(e).__name__}: {str(e)[:200]}")
            rep.setdefault("splitk", []).append(r)
            if "us" in r and (best is None or r["us"] < best[0]):
                best = (r["us"], cfg, ws, y)
        if best is not None:
            _, cfg, ws, y = best

            def zeroed():
                ws[1].zero_()
                linear.launch_splitk(a, w, y, ws, *cfg[:4], cfg[6], cfg[4], cfg[5])
            rep["best"] = dict(cfg=cfg, us=best[0], us_with_memset=t_us(zeroed))
        print(json.dumps(rep), flush=True)
        rows.append(rep)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="131,256,422,512,541,1024,2048")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    report = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=[])
    for m in (int(v) for v in a.rows.split(",")):
        report["rows"] += bench(m, g)
        if a.out:
            with open(a.out, "w") as f:
                json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
