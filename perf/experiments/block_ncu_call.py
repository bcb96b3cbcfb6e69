"""One W075 "high" block call under the profiler's capture range, for ncu.

The block runs twice first (its choices are timed and cached), then once between
``torch.cuda.profiler.start()`` and ``stop()``, so ``ncu --profile-from-start off`` sees exactly
one call's kernels with the tuner's choices:

    ncu --profile-from-start off --clock-control none --metrics ... \\
        python perf/experiments/block_ncu_call.py --case 4096x1
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from inductor_gqa.lower import block     # noqa: E402
from inductor_gqa.workloads import W075, make_inputs   # noqa: E402
from perf.kernels_check import w075_block   # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", default="4096x1")
    a = ap.parse_args()
    s, b = (int(v) for v in a.case.split("x"))
    torch.manual_seed(s * 7 + b)
    inp = make_inputs(W075, s, b, device="cuda")
    torch.set_float32_matmul_precision("high")
    t, spec = w075_block(inp, False)
    with torch.no_grad():
        for _ in range(2):
            block.run_block(dict(t), spec)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        block.run_block(dict(t), spec)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
