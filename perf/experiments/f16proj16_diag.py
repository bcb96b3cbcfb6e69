"""Why did f16proj16 fail W075's probabilities check on the H200? One case, both plans forced,
the range flag read after the call, errors and non-finite counts per output."""
import os
import sys

import torch

import inductor_gqa.kernels.tuning as tu
from inductor_gqa.lower import block, fp16_plans
from inductor_gqa.workloads import W075, make_inputs, check, atol
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from kernels_check import w075_block   # noqa: E402

os.environ["INDUCTOR_GQA_FP16_QKV_OUT"] = "1"
flags = []
rf = fp16_plans._range_flag
fp16_plans._range_flag = lambda x: (flags.append(rf(x)), flags[-1])[1]
orig = tu.pick
for case in sys.argv[1:] or ["128x4", "512x1"]:
    s, b = (int(v) for v in case.split("x"))
    for r in range(3):
        torch.manual_seed(1000 * r + s * 7 + b)
        inp = make_inputs(W075, s, b, device="cuda")
        torch.set_float32_matmul_precision("highest")
        with torch.no_grad():
            ref = W075.fn(**inp)
        torch.set_float32_matmul_precision("high")
        for plan in ("f16proj", "f16proj16"):
            tu.pick = lambda key, c, run, plan=plan: (plan if key and key[0] == "plan"
                                                      else orig(key, c, run))
            t, spec = w075_block(inp, False)
            torch.empty(1 << 28, device="cuda").fill_(float("nan"))
            got = block.run_block(dict(t), spec)
            torch.cuda.synchronize()
            msg = [f"{case} r{r} {plan} flag={int(flags[-1].item())}"]
            for i in range(2):
                o, rr = got[i], ref[i]
                nf = (~torch.isfinite(o)).sum().item()
                d = (o - rr).abs().nan_to_num(0)
                ok, frac = check(o, rr, atol(W075, s, b), 1e-5)
                msg.append(f"out{i}: nonfinite={nf} maxerr={d.max().item():.2e} frac={frac:.4f}")
            print(" | ".join(msg), flush=True)
