"""Experiment: W075's projection GEMMs under "high" on fp16 copies instead of TF32 (next step of
docs/kernels.md note 14). Times, by CUDA-graph replay: the four cuBLAS TF32 GEMMs as the block runs
them (q, k, V^T, o), the same products with fp16 operands and fp32 output
(``torch.mm(..., out_dtype=torch.float32)`` where this torch has it, else fp16 output), and the
fp32 -> fp16 conversions the copies would cost. Also the error of both against float64.

    PYTHONPATH=$PWD python perf/experiments/fp16_gemm_bench.py
"""
import statistics

import torch

from inductor_gqa.kernels import tuning


def t_us(fn):
    return statistics.median(tuning.time_ms(fn, reps=10) for _ in range(3)) * 1e3


def main():
    torch.set_float32_matmul_precision("high")
    g = torch.Generator(device="cuda").manual_seed(0)
    wq, wk, wv, wo = (torch.randn(n, 1024, device="cuda", generator=g) * 0.02
                      for n in (1024, 256, 256, 1024))
    try:
        torch.mm(wq[:16].half(), wq[:16].half().t(), out_dtype=torch.float32)
        out32 = True
    except (TypeError, RuntimeError):
        out32 = False
    print("fp32 output from fp16 mm:", out32)
    for m in (131, 512, 2048, 4096, 7184, 8192):
        x = torch.randn(m, 1024, device="cuda", generator=g)
        o = torch.randn(m, 1024, device="cuda", generator=g) * 0.3

        def tf32():
            torch.nn.functional.linear(x, wq)
            torch.nn.functional.linear(x, wk)
            torch.mm(wv, x.t())
            torch.nn.functional.linear(o, wo)

        x16, o16 = x.half(), o.half()
        w16 = [w.half() for w in (wq, wk, wv, wo)]

        def mm16(a, b):
            return torch.mm(a, b, out_dtype=torch.float32) if out32 else torch.mm(a, b)

        def f16():
            mm16(x16, w16[0].t())
            mm16(x16, w16[1].t())
            mm16(w16[2], x16.t())
            mm16(o16, w16[3].t())

        def conv():
            x.half()
            o.half()
            for w in (wq, wk, wv, wo):
                w.half()

        ref = x.double() @ wq.double().t()
        e32 = (torch.nn.functional.linear(x, wq).double() - ref).abs().max().item()
        e16 = (mm16(x16, w16[0].t()).double() - ref).abs().max().item()
        print(f"M={m}: tf32 {t_us(tf32):.1f} us, fp16 {t_us(f16):.1f} us, conversions "
              f"{t_us(conv):.1f} us; max err q: tf32 {e32:.2e}, fp16 {e16:.2e}", flush=True)


if __name__ == "__main__":
    main()
