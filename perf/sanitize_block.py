"""Run compiled blocks once each, for compute-sanitizer (memcheck, racecheck) on the GPU.

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \\
        python -m perf.sanitize_block --cases W075-high:131x1,W075-high:373x1,W092:131x1

Each case is compiled with ``backend="inductor_gqa"`` (static shapes), run on fresh inputs and
checked against the workload's tolerance rule, so a kernel that reads or writes out of bounds
shows in the tool's report and a wrong result in this script's. ``--overflow`` scales the
inputs so that W075's fp16 copies leave fp16's range and the guarded float32 fallback runs.
``--train``: a training step instead (``fuse_with_grad``, the core on our kernels: flash.py
storing its statistics, flash_bwd.py), every gradient checked against eager's (perf/train.py's
rule).
"""

from __future__ import annotations

import argparse
import sys

import torch

from inductor_gqa import workloads as wl

from . import bench
from .profile_block import parse_case


def run_case(spec: str, overflow: bool) -> bool:
    workload, precision, s, b = parse_case(spec)
    torch.set_float32_matmul_precision(precision)
    torch._dynamo.reset()
    inputs = bench.make_inputs(workload, s, b, "cuda", seed=0)
    if overflow and workload.name == "W075":
        inputs["q_proj_weight"] = inputs["q_proj_weight"] * 2.0 ** -18
        inputs["k_proj_weight"] = inputs["k_proj_weight"] * 2.0 ** 18
    fn = torch.compile(workload.fn, backend="inductor_gqa", dynamic=False)
    with torch.no_grad():
        outs = bench.as_tuple(fn(**inputs))
        torch.cuda.synchronize()
        refs = bench.reference(workload, inputs)
    torch.set_float32_matmul_precision(precision)
    chk = bench.check_outputs(workload, s, b, outs, refs)
    print(f"{spec}{' overflow' if overflow else ''}: {'pass' if chk['passed'] else 'FAIL'} "
          f"{chk['fracs']}", flush=True)
    return chk["passed"]


def run_train_case(spec: str) -> bool:
    from .train import grad_check
    workload, precision, s, b = parse_case(spec)
    torch.set_float32_matmul_precision(precision)
    torch._dynamo.reset()
    inputs = bench.make_inputs(workload, s, b, "cuda", seed=0)
    leaves = {k: v.requires_grad_(v.is_floating_point() and k not in ("cos", "sin", "inv_freq"))
              for k, v in inputs.items()}
    wanted = [v for v in leaves.values() if v.requires_grad]

    def grads(f):
        outs = bench.as_tuple(f(**leaves))
        seeds = [torch.ones_like(o) / o.shape[-1] for o in outs]
        return torch.autograd.grad(outs, wanted, seeds)

    fn = torch.compile(workload.fn, backend="inductor_gqa", dynamic=False,
                       options={"fuse_with_grad": True, "training_core": "kernels"})
    got = grads(fn)
    torch.cuda.synchronize()
    torch.set_float32_matmul_precision("highest")
    ok, frac = grad_check(got, grads(workload.fn))
    print(f"{spec} train: {'pass' if ok else 'FAIL'} {frac:.4f}", flush=True)
    return ok


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.sanitize_block")
    p.add_argument("--cases", default="W075-high:131x1,W075-high:373x1,W092:131x1")
    p.add_argument("--overflow", action="store_true")
    p.add_argument("--train", action="store_true")
    a = p.parse_args(argv)
    run = run_train_case if a.train else (lambda c: run_case(c, a.overflow))
    ok = all([run(c) for c in a.cases.split(",")])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
