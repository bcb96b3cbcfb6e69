"""Host cost of the op's own Python path (CPU only): ``lower.block.run_block`` for a W075 "high"
block (f16proj plan) with every Triton launch and the fp16 GEMMs stubbed out, so what is timed is
our launch preparation (checks, buffers, choice lookups, argument lists), not kernels or Triton's
launcher. Without CUDA graphs this cost is paid on every call, before the GPU has work.

    python perf/experiments/host_overhead.py [--calls 300] [--profile]

Measured on the repository's 2-core CPU machine: 263 us per call at 03da13b, 201 us after the
launchers stopped calling ``triton.cdiv``/``triton.next_power_of_2`` (ba85d3e).
"""
import argparse
import cProfile
import os
import pstats
import time

os.environ["TRITON_INTERPRET"] = "1"            # kernels as Python objects, no GPU needed
os.environ["INDUCTOR_GQA_KERNELS_ON_CPU"] = "1"

import torch  # noqa: E402
import triton.runtime.interpreter as interpreter  # noqa: E402

from inductor_gqa.lower import block, fp16_plans  # noqa: E402
from inductor_gqa.plan.spec import BlockSpec  # noqa: E402

NONE = ("bq", "bk", "bv", "q_norm_weight", "k_norm_weight", "cos", "sin", "attn_mask", "bo",
        "runtime_scale", "runtime_eps", "runtime_k_eps")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--profile", action="store_true", help="also print the top functions")
    a = ap.parse_args()
    interpreter.InterpretedFunction.__getitem__ = lambda self, grid: (lambda *x, **k: None)
    fp16_plans._mm16 = lambda x, w: torch.empty((x.shape[0], w.shape[1]))
    torch.set_float32_matmul_precision("high")
    spec = BlockSpec(num_heads=16, num_kv_heads=4, head_dim=64, norm="none", eps=1e-6,
                     rope="half", rotary_dim=64, core="explicit", scale=1.0, scale_op="mul",
                     causal=False, mask="none", mask_fill=0.0, return_probs=True)
    b, s, e = 1, 16, 1024
    t = dict(x=torch.randn(b, s, e), wq=torch.randn(1024, e), wk=torch.randn(256, e),
             wv=torch.randn(256, e), wo=torch.randn(1024, 1024), inv_freq=torch.rand(32),
             position_ids=torch.arange(s)[None].expand(b, s), **{k: None for k in NONE})
    for _ in range(5):
        block.run_block(t, spec)
    t0 = time.perf_counter()
    for _ in range(a.calls):
        block.run_block(t, spec)
    print(f"run_block: {(time.perf_counter() - t0) / a.calls * 1e6:.0f} us per call "
          "(launches and GEMMs stubbed)")
    if a.profile:
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(100):
            block.run_block(t, spec)
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
