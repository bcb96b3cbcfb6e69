"""Check: the fused projection launch's in-kernel cos/sin (docs/kernels.md note 48) at large
positions, on the GPU, where the hardware's sin/cos run after the launch's own reduction by 2*pi.

The W075 block with position_ids = arange(S) + offset (plus 1000 per batch row), offsets up to
2^21 (float32 still holds every position exactly; eager converts them with .float() too). For
each offset: the f16tma plan forced, cos/sin from the angles (the default) and from the tables
(INDUCTOR_GQA_FUSED_ANGLES=0), each against the float32 reference by the workload's tolerance
rule, and the two against each other (largest difference of attn_output and attn_weights).

Prediction (before the GPU run): the reduction's error is ~2^-22 of |r| <= pi plus the MUFU
approximation's ~2^-21, whatever the offset (k * 2pi is exact inside the FMA and 2pi's
float32 remainder is carried by the second FMA), so both forms pass at every offset and differ
by about what they differ at offset 0 (fp16-copy roundings flipped by ~1e-6 in cos/sin).

    PYTHONPATH=$PWD python perf/experiments/angles_positions_check.py [--out F]
    TRITON_INTERPRET=1 INDUCTOR_GQA_KERNELS_ON_CPU=1 PYTHONPATH=$PWD \\
        python perf/experiments/angles_positions_check.py --device cpu --cases 33x2  # smoke
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from inductor_gqa.workloads import W075, atol, check, make_inputs   # noqa: E402
from perf.kernels_check import w075_block        # noqa: E402
from plan_timing_bench import forced             # noqa: E402  (this folder is sys.path[0])

OFFSETS = (0, 4096, 65536, 1 << 20, 1 << 21)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="512x2,131x1")
    ap.add_argument("--out", default="")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    dev = a.device
    report = {"device": torch.cuda.get_device_name() if dev == "cuda" else dev,
              "torch": torch.__version__}
    ok = True
    for case in a.cases.split(","):
        s, b = (int(v) for v in case.split("x"))
        for off in OFFSETS:
            torch.manual_seed(s + b + off)
            inp = make_inputs(W075, s, b, device=dev)
            inp["position_ids"] = (torch.arange(s, device=dev)[None] + off
                                   + 1000 * torch.arange(b, device=dev)[:, None])
            torch.set_float32_matmul_precision("highest")
            with torch.no_grad():
                ref = W075.fn(**inp)
            torch.set_float32_matmul_precision("high")
            t, spec = w075_block(inp, False)
            rep, outs = {}, {}
            for angles in ("1", "0"):
                os.environ["INDUCTOR_GQA_FUSED_ANGLES"] = angles
                with torch.no_grad():
                    outs[angles] = got = forced("f16tma", t, spec)
                rep[f"angles={angles} pass"] = [
                    check(o, r, atol(W075, s, b), W075.rtol)[1] for o, r in zip(got, ref)]
                rep[f"angles={angles} max err"] = [
                    float((o - r).abs().max()) for o, r in zip(got, ref)]
                ok &= all(check(o, r, atol(W075, s, b), W075.rtol)[0] for o, r in zip(got, ref))
            os.environ["INDUCTOR_GQA_FUSED_ANGLES"] = "1"
            rep["angles vs tables"] = [float((x - y).abs().max())
                                       for x, y in zip(outs["1"], outs["0"])]
            report[f"{case} +{off}"] = rep
            print(case, off, json.dumps(rep), flush=True)
            if a.out:
                with open(a.out, "w") as f:
                    json.dump(report, f, indent=1)
    print("all pass" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
