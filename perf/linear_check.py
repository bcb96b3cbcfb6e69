"""GPU check of the projection GEMM choice for float32 under "highest": error of the 3xTF32 Triton
GEMM and of cuBLAS's IEEE GEMM against float64, and the measured time of every candidate.

    PYTHONPATH=$PWD python perf/linear_check.py
"""

import torch

from inductor_gqa.kernels import tuning
from inductor_gqa.lower.linear import linear, linear_key


def main():
    torch.set_float32_matmul_precision("highest")
    print(f"{'M':>6} {'N':>5} {'K':>5}  {'err 3xTF32':>10} {'err cuBLAS':>10}  chosen (ms per call)")
    for m in (512, 2048, 8192):
        for n in (1024, 256):
            k = 1024
            x = torch.randn(m, k, device="cuda")
            w = torch.randn(n, k, device="cuda") * 0.02
            ref = (x.double() @ w.double().t())
            ours = linear(x, w, None, "tf32x3")            # measures and caches the choice
            forced = torch.empty_like(ours)
            from inductor_gqa.kernels import linear as lk
            lk.launch(x, w, None, forced, "tf32x3", 128, 128, 32, 8, 8, 3)
            blas = torch.nn.functional.linear(x, w)
            rel = lambda a: ((a.double() - ref).norm() / ref.norm()).item()  # noqa: E731
            times = tuning.TIMINGS.get(linear_key(m, n, k, "tf32x3", False), [])
            best = ", ".join(f"{c if isinstance(c, str) else c[:3]}={ms:.4f}" for c, ms in times[:3])
            print(f"{m:6d} {n:5d} {k:5d}  {rel(forced):10.2e} {rel(blas):10.2e}  {best}  "
                  f"(ours vs ref {rel(ours):.1e})")


if __name__ == "__main__":
    main()
