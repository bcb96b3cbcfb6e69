"""A few small calls of the fused block, for compute-sanitizer (memcheck, racecheck).

    compute-sanitizer --tool memcheck python -m perf.sanitize_block --cases W075-high:131x1
    compute-sanitizer --tool racecheck python -m perf.sanitize_block --cases W092:128x1

Each case runs the op's GPU path once (W075 also causal), every config choice taking candidate
``--config`` of its list, or the first one matching ``--prefer`` (no config timing runs under
the tool), and checks the outputs against
the workload's tolerance rule so a bad launch cannot pass silently.

``--overflow`` (W075 under "high"): the block gets Wq * 2^-18 and Wk * 2^18, so every k exceeds
fp16's range while q @ k^T is exactly the workload's (power-of-two scales, and RoPE is linear):
the fp16-copies plan must raise its flag and run the float32 fallback kernels, and the result is
checked against the unscaled reference. ``--overflow-wo``: o_proj's weight times 2^20, so its
fp16 copy overflows (the flag raised by that copy's launch, on a side stream under graph capture)
and o_proj takes the guarded float32 GEMM; the output is scaled back (exact) before the check.
``--graph``: the outputs checked are those of a CUDA-graph
replay of the block (where the guarded fallbacks run on a side stream beside the fp16 o_proj).
"""

from __future__ import annotations

import argparse
import sys

import torch

from inductor_gqa import workloads as wl
from inductor_gqa.kernels import tuning
from inductor_gqa.lower import block

from .kernels_check import w075_block, w092_block
from .profile_block import parse_case


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default="W075-high:131x1,W075-highest:373x1,W092:131x1")
    p.add_argument("--config", type=int, default=0,
                   help="index of the candidate config every choice takes (no timing)")
    p.add_argument("--prefer", default="",
                   help="take the first candidate whose text contains this (e.g. gp4: packed "
                        "query heads; comma-separated alternatives, tried in order: f16tma,ws "
                        "takes the fused-projection plan and its warp-specialized launch), "
                        "else candidate --config")
    p.add_argument("--overflow", action="store_true",
                   help="W075: scale Wq/Wk by 2^-18/2^18 so k overflows fp16 (fallback path)")
    p.add_argument("--overflow-wo", action="store_true",
                   help="W075: scale Wo by 2^20 so its fp16 copy overflows (fallback o_proj)")
    p.add_argument("--graph", action="store_true",
                   help="check the outputs of a CUDA-graph replay of the block (outputs "
                        "NaN-poisoned before the replay) instead of a plain call")
    a = p.parse_args(argv)

    tags = [t for t in a.prefer.split(",") if t]
    taken = set()
    tuning.pick = preferring(tags, a.config, taken)
    bad = 0
    for spec in a.cases.split(","):
        workload, precision, s, b = parse_case(spec)
        wname = workload.name
        for causal in ((False, True) if wname == "W075" else (False,)):
            inp = wl.make_inputs(workload, s, b, device="cuda", seed=s + b)
            torch.set_float32_matmul_precision("highest")
            with torch.no_grad():
                ref = (workload.fn(**inp, is_causal=causal) if wname == "W075"
                       else (workload.fn(**inp),))
            torch.set_float32_matmul_precision(precision)
            t, blk = w075_block(inp, causal) if wname == "W075" else w092_block(inp)
            if a.overflow and wname == "W075":
                t.update(wq=t["wq"] * 2.0 ** -18, wk=t["wk"] * 2.0 ** 18)
            if a.overflow_wo and wname == "W075":
                t.update(wo=t["wo"] * 2.0 ** 20)
            got = block.run_block(t, blk)
            torch.cuda.synchronize()
            if a.graph:
                got = _replayed(lambda: block.run_block(t, blk))
            outs = got[:len(ref)]
            if a.overflow_wo and wname == "W075":
                outs = (outs[0] * 2.0 ** -20,) + tuple(outs[1:])
            at = wl.atol(workload, s, b)
            for o, r in zip(outs, ref):
                ok, frac = wl.check(o, r, at, workload.rtol)
                bad += not ok
                print(f"{spec} causal={causal}: ok={ok} pass_frac={frac:.5f}", flush=True)
            if tags:    # which preferred candidates the case's choices took
                print(f"{spec} causal={causal}: preferred choices taken: {sorted(taken)}",
                      flush=True)
                taken.clear()
    return 1 if bad else 0


def preferring(tags, config=0, taken=None):
    """A stand-in for ``tuning.pick`` (no timing): each choice takes the first candidate whose
    text contains the first of ``tags`` that any candidate contains, else candidate ``config``
    (the last if there are fewer); the preferred choices taken are added to ``taken``."""
    def pick(key, cands, run):
        for tag in tags:
            liked = [c for c in cands if tag in str(c)]
            if liked:
                if taken is not None:
                    taken.add(str(liked[0]))
                return liked[0]
        return cands[min(config, len(cands) - 1)]
    return pick


def _replayed(call):
    """The outputs of one replay of a CUDA graph of ``call`` (captured on a side stream, as the
    perf job does), NaN-poisoned before the replay so an output it does not write fails."""
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        with torch.cuda.graph(g, stream=side):
            got = call()
    torch.cuda.current_stream().wait_stream(side)
    for o in got:
        if o.is_floating_point():
            o.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    return got


if __name__ == "__main__":
    sys.exit(main())
