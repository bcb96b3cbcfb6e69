"""Where a plain call's host time goes on the GPU machine (no CUDA graph): the W075 "high"
function compiled with the backend, called back to back, with cProfile around the calls.

perf.run's plain-launch column (run 3ec1218) has ours at 1.15-2.1 ms per call against 1.0-1.6
for stock torch.compile and 0.56-1.3 for eager, so the block is host-bound there. This splits the
host time into the op's own Python (lower/), Triton's launcher (JITFunction.run and below),
cuBLAS calls and the custom op's dispatch, to say which to shorten.

    PYTHONPATH=$PWD python perf/experiments/host_profile.py [--cases 131x1,512x16] [--calls 200]
"""
import argparse
import cProfile
import io
import pstats
import time

import torch

import inductor_gqa  # noqa: F401  (registers the backend)
from inductor_gqa import workloads as wl
from perf import bench


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default="131x1,512x16")
    p.add_argument("--calls", type=int, default=200)
    a = p.parse_args()
    torch.set_float32_matmul_precision("high")
    w = wl.WORKLOADS["W075"]
    fn = torch.compile(w.fn, backend="inductor_gqa")
    for case in a.cases.split(","):
        s, b = (int(t) for t in case.split("x"))
        inp = bench.make_inputs(w, s, b, torch.device("cuda"), seed=0)
        for _ in range(5):
            fn(**inp)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(a.calls):
            fn(**inp)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        print(f"{case}: host {1e6 * (t1 - t0) / a.calls:.0f} us per call issued, "
              f"{1e6 * (t2 - t0) / a.calls:.0f} us per call with the GPU's tail", flush=True)
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(a.calls):
            fn(**inp)
        pr.disable()
        torch.cuda.synchronize()
        out = io.StringIO()
        st = pstats.Stats(pr, stream=out)
        st.sort_stats("cumulative").print_stats(45)
        print(out.getvalue()[-9000:], flush=True)
        out = io.StringIO()
        pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(30)
        print(out.getvalue()[-6000:], flush=True)


if __name__ == "__main__":
    main()
