"""Check: a conditional node in a captured CUDA graph (``kernels/graph_branch.py``) runs its body
only when the flag is raised, replay after replay, with a programmatic-dependent Triton launch
after the node (the block's next kernel may be one).

Prediction: the driver's JIT links the set kernel's ``cudaGraphSetConditional`` (as the PTX of
other projects relies on), the body runs exactly on the replays whose flag is nonzero, and the
launch after the node keeps working. Prints PASS or what failed.

    PYTHONPATH=$PWD python perf/experiments/graph_branch_check.py
"""
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from inductor_gqa.kernels import graph_branch, pdl   # noqa: E402


@triton.jit
def _bump(x_ptr, n, PDL: tl.constexpr):
    pdl.wait_for_predecessor(PDL)
    i = tl.arange(0, 1024)
    m = i < n
    tl.store(x_ptr + i, tl.load(x_ptr + i, mask=m) + 1.0, mask=m)


def main():
    dev = torch.device("cuda")
    ok = graph_branch.prepare(dev)
    print("prepare:", ok, graph_branch._READY.get(dev.index if dev.index is not None else 0))
    if not ok:
        print("FAIL: the set kernel did not load")
        return 1
    flag = torch.zeros(1, device=dev, dtype=torch.int32)
    y = torch.zeros(1000, device=dev)
    z = torch.zeros(1000, device=dev)
    opts = pdl.launch_options(dev)
    _bump[(1,)](z, 1000, **opts)            # compiled before the capture
    torch.cuda.synchronize()
    z.zero_()
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    with torch.cuda.graph(g):
        z.add_(1.0)
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            br = graph_branch.Branch(flag)
        z.mul_(2.0)
        main.wait_stream(side)
        with br.body():
            y.add_(10.0)
            _bump[(1,)](y, 1000, **opts)
        _bump[(1,)](z, 1000, **opts)        # after the node, with PDL where it is on
    bad = []
    expect_y, expect_z = 0.0, 0.0
    for r, f in enumerate([0, 1, 0, 0, 1, 1, 0]):
        flag.fill_(f)
        g.replay()
        torch.cuda.synchronize()
        expect_y += 11.0 if f else 0.0
        expect_z = (expect_z + 1.0) * 2.0 + 1.0
        if not (torch.all(y == expect_y) and torch.all(z == expect_z)):
            bad.append((r, f, y[0].item(), expect_y, z[0].item(), expect_z))
    print("replays (round, flag, y, expected, z, expected) wrong:", bad)
    print("PASS" if not bad else "FAIL")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
