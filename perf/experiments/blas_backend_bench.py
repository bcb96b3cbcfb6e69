"""Experiment: the fp16-copies plans' two GEMMs (Q/K/V on the scaled copies, [M, 1024] x
[1536, 1024]^T, and o_proj, [M, 1024] x [1024, 1024]^T, fp16 operands) under torch's two BLAS
back ends, cuBLAS (the default) and cuBLASLt (``torch.backends.cuda.preferred_blas_library``),
with the output dtypes the plans use (float32 via ``out_dtype``, or fp16 with fp16 split-K
reductions off). CUDA-graph replay, medians; results compared bitwise between the back ends.

Prediction: the GEMMs are 60-68 us of 512x16's 220 us at ~630 TFLOP/s; if cuBLASLt's heuristic
picks other kernels for these shapes, up to ~10% either way per shape, which would make the back
end a per-bucket choice worth timing in the plan; if it picks the same kernels, equal times.

    PYTHONPATH=$PWD python perf/experiments/blas_backend_bench.py [--out F]
"""
import argparse
import json
import statistics

import torch

from inductor_gqa.kernels import tuning
from inductor_gqa.lower import fp16_plans


def t_us(fn):
    return statistics.median(tuning.time_ms(fn, reps=10) for _ in range(3)) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    wqkv = (torch.randn(1536, 1024, device="cuda", generator=g) * 0.05).half()
    wo = (torch.randn(1024, 1024, device="cuda", generator=g) * 0.02).half()
    rows = []
    for m in (131, 541, 1024, 2048, 4096, 7184, 8192):
        x = torch.randn(m, 1024, device="cuda", generator=g).half()
        o = (torch.randn(m, 1024, device="cuda", generator=g) * 0.3).half()
        ops = {"qkv32": lambda: fp16_plans._mm16(x, wqkv.t()),
               "qkv16": lambda: fp16_plans._mm16_out16(x, wqkv.t()),
               "o32": lambda: fp16_plans._mm16(o, wo.t())}
        for name, fn in ops.items():
            got = {}
            for lib in ("cublas", "cublaslt"):
                torch.backends.cuda.preferred_blas_library(lib)
                ref = fn()
                torch.cuda.synchronize()
                got[lib] = (t_us(fn), ref)
            torch.backends.cuda.preferred_blas_library("cublas")
            same = torch.equal(got["cublas"][1], got["cublaslt"][1])
            rows.append(dict(m=m, op=name, cublas_us=got["cublas"][0],
                             cublaslt_us=got["cublaslt"][0], bitwise_equal=same))
            print(rows[-1], flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
