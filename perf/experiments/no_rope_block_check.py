"""Check: a float32 block without RoPE under "high", with the fused projection's warp-specialized
launch forced (proj_rope_ws's no-RoPE form, offered since docs/kernels.md note 60), against the
op's float64 reference, plain and in a CUDA-graph replay (outputs NaN-poisoned first).

W075's shapes and weights with RoPE left out (16 query heads, 4 KV heads of 64, scale 1.0,
probabilities returned), fresh inputs per round; W075's tolerance rule per output. Every plan
choice takes f16tma and every fused-projection choice its first "ws" config (as
``perf.sanitize_block --prefer f16tma,ws``); the script prints the preferred choices taken, so a
run that fell back to other kernels shows it.

    PYTHONPATH=$PWD python perf/experiments/no_rope_block_check.py [--cases 131x1,...]

``--device cpu`` (with TRITON_INTERPRET=1 and INDUCTOR_GQA_KERNELS_ON_CPU=1): a smoke run of the
script itself on small cases (no Gluon there, no graph replay).
"""
import argparse
import sys

import torch

from inductor_gqa import workloads as wl
from inductor_gqa.kernels import tuning
from inductor_gqa.lower import block
from inductor_gqa.op.reference import attention_block_reference
from inductor_gqa.plan.spec import BlockSpec
from perf.kernels_check import _empty_tensors
from perf.sanitize_block import _replayed, preferring


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="131x1,373x8,512x16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    taken = set()
    tuning.pick = preferring(("f16tma", "ws"), 0, taken)
    spec = BlockSpec(num_heads=16, num_kv_heads=4, head_dim=64, core="explicit", scale=1.0,
                     return_probs=True)
    bad = 0
    for case in a.cases.split(","):
        s, b = (int(v) for v in case.split("x"))
        for rnd in range(a.rounds):
            inp = wl.make_inputs(wl.W075, s, b, device=a.device, seed=1000 * rnd + s + b)
            t = _empty_tensors()
            t.update(x=inp["hidden_states"], wq=inp["q_proj_weight"], wk=inp["k_proj_weight"],
                     wv=inp["v_proj_weight"], wo=inp["o_proj_weight"])
            with torch.no_grad():
                ref = attention_block_reference(**{k: (v.double() if v is not None else None)
                                                   for k, v in t.items()}, spec=spec)
                torch.set_float32_matmul_precision("high")
                forms = [("plain", block.run_block(dict(t), spec))]
                if a.device == "cuda":
                    torch.cuda.synchronize()
                    forms.append(("graph", _replayed(lambda: block.run_block(dict(t), spec))))
            at = wl.atol(wl.W075, s, b)
            for form, got in forms:
                fracs = []
                for o, r in zip(got, ref):
                    ok, frac = wl.check(o, r.float(), at, wl.W075.rtol)
                    bad += not ok
                    fracs.append(round(frac, 5))
                print(f"{case} round {rnd} {form}: pass fractions {fracs}", flush=True)
        print(f"{case}: preferred choices taken {sorted(taken)}", flush=True)
        taken.clear()
    print("all pass" if not bad else f"{bad} outputs FAILED", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
