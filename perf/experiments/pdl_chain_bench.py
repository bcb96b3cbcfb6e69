"""Programmatic dependent launch (PDL) on a chain of short Triton kernels under CUDA-graph replay.

    python perf/experiments/pdl_chain_bench.py

Each kernel waits for its predecessor (``griddepcontrol.wait``) before touching memory, then lets
its dependents launch; with ``launch_pdl=True`` the next kernel's launch and block scheduling can
overlap this one's tail. Prints the replay time per chain with and without PDL, for chains of
Triton kernels alone and with a cuBLAS GEMM between them, and checks the results are identical.
"""

import json
import sys

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def step_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    tl.store(y_ptr + offs, x * 0.5 + 1.0, mask=m)


def chain(bufs, n, length, pdl, gemm=None):
    block = 1024
    grid = (triton.cdiv(n, block),)
    for i in range(length):
        a, b = bufs[i % 2], bufs[(i + 1) % 2]
        if gemm is not None and i % 3 == 2:
            w, out = gemm
            torch.mm(a.view(-1, w.shape[0]), w, out=out)
            a = out.view(-1)
        kw = {"launch_pdl": True} if pdl else {}
        step_kernel[grid](a, b, n, BLOCK=block, PDL=pdl, **kw)


def replay_us(fn, reps=2000):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(50):
        g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(reps):
            g.replay()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) * 1000 / reps)
    return sorted(times)[2]


def main():
    out = {}
    for n in (131 * 1024, 8192 * 1024):
        for length in (8,):
            for with_gemm in (False, True):
                res = {}
                finals = {}
                for pdl in (False, True):
                    torch.manual_seed(0)
                    bufs = [torch.randn(n, device="cuda"), torch.empty(n, device="cuda")]
                    gemm = None
                    if with_gemm:
                        w = torch.randn(1024, 1024, device="cuda") * 0.01
                        gemm = (w, torch.empty(n // 1024, 1024, device="cuda"))
                    res[pdl] = replay_us(lambda: chain(bufs, n, length, pdl, gemm))
                    chain(bufs, n, length, pdl, gemm)
                    torch.cuda.synchronize()
                    finals[pdl] = bufs[length % 2].clone()
                same = bool(torch.equal(finals[False], finals[True]))
                key = f"n={n} kernels={length} gemm={with_gemm}"
                out[key] = {"plain_us": round(res[False], 2), "pdl_us": round(res[True], 2),
                            "identical": same}
                print(key, out[key], flush=True)
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
