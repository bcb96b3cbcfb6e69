"""GPU check: a non-finite input in one batch must not reach another batch's outputs when the
block's probabilities take the staged kernels (kernels/probs_staged.py, Gluon; they do not run
on the CPU).

At ragged S a row's last key tile reaches past S, and the copy engine loads those rows of the
[B*S, cols] K/V views from the next batch. Their scores are masked to -inf and their p is 0, but
the P @ V product multiplies that 0 with the next batch's V rows, and 0 * inf or NaN is NaN;
eager attention keeps batches apart. The first run of this script (runs/7e7e108) showed the leak
in the kernel and that zeroing those V rows in shared memory stops it, at 119 -> 126 us for the
449x16 ping-pong. Instead, the fp16 copies' range rule now raises the flag for any non-finite
value, so such inputs never reach the staged kernels: the float32 fallback (masked loads) runs
(docs/kernels.md note 39).

    PYTHONPATH=$PWD python perf/experiments/staged_batch_isolation.py

Whole block, W075 "high", every choice preferring a staged config, S in (449, 373, 211, 131),
B = 2, causal and not: NaN in one hidden_states value of batch 1's token 3 (a row batch 0's
last key tile over-reads). Prediction: batch 0's outputs pass the workload's tolerance against
the float32 reference and are finite; batch 1's are non-finite exactly where eager's are. Exit
status 1 otherwise.
Outcome (runs/7462dcd): batch 0 passes in all 8; batch 1's o and the non-causal probabilities
as eager's, but not the causal probabilities: eager's NaN rows are NaN in their masked columns
too, where the causal kernels zero-fill the tiles above the diagonal they skip. The check is
now per row for the probabilities (a row non-finite where eager's is).
"""
import sys

import torch

from inductor_gqa import workloads as wl
from inductor_gqa.kernels import tuning
from inductor_gqa.lower import block
from perf.kernels_check import w075_block


def _prefer_staged(key, cands, run):
    liked = [c for c in cands if "staged" in str(c)]
    return liked[0] if liked else cands[0]


def main() -> int:
    tuning.pick = _prefer_staged
    bad = 0
    for s in (449, 373, 211, 131):
        for causal in (False, True):
            inp = wl.make_inputs(wl.W075, s, 2, device="cuda", seed=s)
            inp["hidden_states"][1, 3, 7] = float("nan")
            torch.set_float32_matmul_precision("highest")
            with torch.no_grad():
                ref = wl.W075.fn(**inp, is_causal=causal)
            torch.set_float32_matmul_precision("high")
            t, spec = w075_block(inp, causal)
            with torch.no_grad():
                got = block.run_block(t, spec)
            torch.cuda.synchronize()
            at = wl.atol(wl.W075, s, 2)
            line = []
            for name, o, r in zip(("out", "probs"), got, ref):
                ok0, frac = wl.check(o[0], r[0], at, wl.W075.rtol)
                if name == "out":
                    same_nf = torch.equal(torch.isfinite(o[1]), torch.isfinite(r[1]))
                else:       # per row: the causal kernels zero-fill the tiles they skip
                    same_nf = torch.equal(torch.isfinite(o[1]).all(-1),
                                          torch.isfinite(r[1]).all(-1))
                bad += not (ok0 and same_nf)
                line.append(f"{name}: batch 0 ok={ok0} ({frac:.6f}), batch 1 non-finite as "
                            f"eager={same_nf}")
            print(f"S={s} causal={causal}: " + "; ".join(line), flush=True)
    print("PASS" if not bad else f"FAIL ({bad})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
