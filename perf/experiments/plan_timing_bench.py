"""The fp16-copies plans of W075 "high" timed side by side per case: the plan choice's own
CUDA-graph timings of the whole block (every plan, not only the best three), with the fused
launch's cos/sin from tables or from the angles (INDUCTOR_GQA_FUSED_ANGLES), and one check of
the fused plan forced against the float32 reference (the workload's tolerance rule).

    PYTHONPATH=$PWD python perf/experiments/plan_timing_bench.py [--cases 512x16,...] [--out F]

Prediction (before the GPU run; docs/kernels.md note 48): cos/sin from the angles (no table
loads, no shared-memory layout change in the epilogue: sm_90 code 5672 -> 4904 instructions
at 128x128) takes f16tma at 8192 rows from ~57 to ~52 us; f16tma32 (x read as float32, its
fp16 copy never written) saves scale_rows' x pass (~14 us of its 17.5 at 8192 rows) for a
slower GEMM loop (register A operand, twice the A bytes): 512x16 and 449x16 -8 to -12 us
against f16proj16, 4096-row cases -4 to -6, small cases within +-1.

Outcome (runs/profiles/plan_timing_744fad6.json, at 744fad6): the angles take f16tma 218.7 ->
213.5 us at 512x16, 212.4 -> 208.9 at 449x16, 119.0 -> 113.9 at 512x8 (ahead of f16proj16
there now), 494 -> 486 at 4096x1 (f16proj16 still ahead), ties at 2048x1 and 1024x2.
f16tma32 was 40-45 us slower than f16tma at 8192 rows and 17-23 us at 2048-4096: removed (in
history at 744fad6). Both plans pass the check at every case.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from inductor_gqa.kernels import tuning          # noqa: E402
from inductor_gqa.lower import block             # noqa: E402
from inductor_gqa.workloads import W075, atol, check, make_inputs   # noqa: E402
from perf.kernels_check import w075_block        # noqa: E402

CASES = "512x16,449x16,512x8,4096x1,2048x1,1024x2,373x8,512x4,256x8,131x1,541x1"


def plan_timings():
    return {str(k[-1]): [(c, round(ms * 1e3, 2)) for c, ms in v]
            for k, v in tuning.TIMINGS.items() if k[0] == "plan"}


def drop_plan_choices():
    for d in (tuning._CACHE, tuning.TIMINGS):
        for k in [k for k in d if k[0] == "plan"]:
            del d[k]


def forced(plan, t, spec):
    pick = tuning.pick
    tuning.pick = lambda key, cands, run: (plan if key[0] == "plan" and plan in cands
                                            else pick(key, cands, run))
    try:
        return block.run_block(dict(t), spec)
    finally:
        tuning.pick = pick


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=CASES)
    ap.add_argument("--out", default="")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run (with TRITON_INTERPRET=1 "
                    "and INDUCTOR_GQA_KERNELS_ON_CPU=1 set, small cases; nothing is timed)")
    a = ap.parse_args()
    dev = a.device
    report = {"device": torch.cuda.get_device_name() if dev == "cuda" else dev,
              "torch": torch.__version__}
    for case in a.cases.split(","):
        s, b = (int(v) for v in case.split("x"))
        torch.manual_seed(s * 7 + b)
        inp = make_inputs(W075, s, b, device=dev)
        torch.set_float32_matmul_precision("highest")
        with torch.no_grad():
            ref = W075.fn(**inp)
        torch.set_float32_matmul_precision("high")
        t, spec = w075_block(inp, False)
        rep = {}
        for angles in ("1", "0"):
            os.environ["INDUCTOR_GQA_FUSED_ANGLES"] = angles
            drop_plan_choices()
            with torch.no_grad():
                block.run_block(dict(t), spec)
            rep[f"angles={angles}"] = next(iter(plan_timings().values()), None)
            for plan in ("f16tma",):
                with torch.no_grad():
                    got = forced(plan, t, spec)
                rep[f"angles={angles} {plan} check"] = [
                    check(o, r, atol(W075, s, b), W075.rtol)[1] for o, r in zip(got, ref)]
        os.environ["INDUCTOR_GQA_FUSED_ANGLES"] = "1"
        report[case] = rep
        print(case, json.dumps(rep), flush=True)
        if a.out:
            with open(a.out, "w") as f:
                json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
