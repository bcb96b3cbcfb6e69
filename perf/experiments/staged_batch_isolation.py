"""GPU check: a non-finite V value in one batch must not reach another batch's outputs in the
staged probabilities kernels (kernels/probs_staged.py, Gluon; they do not run on the CPU).

At ragged S a row's last key tile reaches past S, and the copy engine loads those rows of the
[B*S, cols] K/V views from the next batch. Their scores are masked to -inf and their p is 0, but
the P @ V product multiplies that 0 with the next batch's V rows, and 0 * inf or NaN is NaN;
eager attention keeps batches apart. ZERO_TAIL (INDUCTOR_GQA_STAGED_ZERO_TAIL=1) zeroes a tile's
V rows past S before the product (docs/kernels.md note 39).

    PYTHONPATH=$PWD python perf/experiments/staged_batch_isolation.py

For each staged config, S in (449, 373, 211, 131), causal and not, B = 2, with ZERO_TAIL off and
on: one launch on clean inputs, one with NaN in batch 1's first 8 V rows (the rows batch 0's last
tile over-reads); batch 0's o and probabilities must be bitwise the clean run's. Outputs
NaN-poisoned before each launch; the clean runs of both settings must also agree bitwise.
Prediction (written before the first GPU run): off, batch 0's o turns NaN in every case (each
row's last key tile crosses S at these S, causal or not); on, batch 0 is bitwise unchanged
everywhere. Exit status 1 if ZERO_TAIL leaks or changes a clean result.
"""
import os
import sys

import torch

import gqa_pack_bench    # inputs (this folder is sys.path[0])
from inductor_gqa.kernels import probs_staged

H, HK, D = gqa_pack_bench.H, gqa_pack_bench.HK, gqa_pack_bench.D


def run(c, cfg, causal, zero_tail):
    os.environ["INDUCTOR_GQA_STAGED_ZERO_TAIL"] = "1" if zero_tail else "0"
    c.o.fill_(float("nan"))
    c.probs.fill_(float("nan"))
    c.flag.zero_()
    probs_staged.launch(c.q, c.k, c.v, c.o, c.probs, c.flag, c.b, c.s, H, H // HK, D, 1.0,
                        causal, cfg, guard=1)
    torch.cuda.synchronize()
    return c.o[0].clone(), c.probs[0].clone()


def main() -> int:
    bad = 0
    for s in (449, 373, 211, 131):
        c = gqa_pack_bench.Case(s, 2)
        for causal in (False, True):
            for cfg in probs_staged.CONFIGS:
                if not probs_staged.supported(c.q, c.k, c.v, s, D, 0, 1.0, cfg):
                    continue
                clean = {}
                for zero_tail in (False, True):
                    o_ref, p_ref = clean[zero_tail] = run(c, cfg, causal, zero_tail)
                    clean_v = c.v.clone()
                    c.v[s:s + 8] = float("nan")
                    o, p = run(c, cfg, causal, zero_tail)
                    c.v.copy_(clean_v)
                    same = torch.equal(o, o_ref) and torch.equal(p, p_ref)
                    bad += zero_tail and not same
                    print(f"S={s} causal={causal} {cfg} zero_tail={zero_tail}: batch 0 "
                          f"unchanged={same} (NaN in its o: {int(torch.isnan(o).sum())})",
                          flush=True)
                agree = all(torch.equal(a, b) for a, b in zip(clean[False], clean[True]))
                bad += not agree
                print(f"    clean results equal with and without ZERO_TAIL: {agree}", flush=True)
    print("PASS" if not bad else f"FAIL: {bad} checks")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
