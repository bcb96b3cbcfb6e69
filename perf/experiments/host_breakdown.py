"""Where a plain call's host time goes, without a profiler's own cost (perf_counter only).

perf.run's plain-launch column has the W075 "high" block at ~1.4-1.6 ms per call at every size
(e2e36ca: 131x1 1417 us, 4096x1 1505) against 0.47-0.8 ms for stock torch.compile at small
sizes, so the block is host-bound without CUDA graphs. cProfile (host_profile.py) puts most of
it in the custom op's dispatch frame, which may be its own overhead. This times, per call:

* ``full``: the compiled function (Dynamo guards, AOT wrapper, the custom op's dispatch, ours);
* ``block``: ``lower.block.run_block`` called directly with the tensors the op received;
* inside ``block``: Triton's ``JITFunction.run`` (each launch), the cuBLAS GEMMs (``_mm16``);
* ``triton_run_replay``: one call's Triton launches again, back to back through
  ``JITFunction.run`` with the same arguments and nothing else (Triton's share alone);
* ``inclusive``: every function of the package (and a few torch and torch.cuda calls) wrapped
  with a timer, inclusive microseconds and calls per block call, largest first (the wrappers
  add ~1 us per call).

Results: runs/profiles/host_breakdown_*.json (the run at 0961cd6 also timed a launch path that
bypassed Triton's argument binding, since removed: docs/kernels.md note 52).

    PYTHONPATH=$PWD python perf/experiments/host_breakdown.py [--cases 131x1] [--calls 300]
"""
import argparse
import importlib
import json
import sys
import time
import types

import torch
import triton.runtime.jit as tjit

import inductor_gqa  # noqa: F401  (registers the backend)
from inductor_gqa import workloads as wl
from inductor_gqa.lower import block as lower_block
from inductor_gqa.lower import fp16_plans
from perf import bench
from perf.experiments.gqa_pack_bench import run_cases

# the op's module (the package's name ``attention_block`` is the op itself)
op = importlib.import_module("inductor_gqa.op.attention_block")


class Timer:
    def __init__(self):
        self.t, self.n = 0.0, 0

    def wrap(self, fn):
        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.t += time.perf_counter() - t0
                self.n += 1
        return timed


def per_call_us(fn, calls):
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return 1e6 * (t1 - t0) / calls


_TORCH_CALLS = [(torch, n) for n in ("empty", "zeros", "empty_like", "mm", "broadcast_to")] + [
    (torch.cuda, n) for n in ("get_device_capability", "get_device_properties",
                              "is_current_stream_capturing", "current_stream", "is_available",
                              "current_device", "stream", "Event")]


def inclusive(fn, calls):
    """{name: (us per call, calls per call)} for the package's functions and methods and
    _TORCH_CALLS, each wrapped with a timer while ``fn`` runs ``calls`` times."""
    timers, undo = {}, []

    def patch(owner, name, f, label):
        t = timers.setdefault(label, Timer())
        undo.append((owner, name, f))
        setattr(owner, name, t.wrap(f))

    mods = [m for n, m in list(sys.modules.items())
            if n.startswith("inductor_gqa") and isinstance(m, types.ModuleType)]
    for m in mods:
        for k, v in list(vars(m).items()):
            if isinstance(v, types.FunctionType) and v.__module__.startswith("inductor_gqa"):
                # one timer per function, wherever it was imported to
                patch(m, k, v, f"{v.__module__.split('.')[-1]}.{v.__name__}")
            elif isinstance(v, type) and v.__module__.startswith("inductor_gqa") and \
                    v.__module__ == m.__name__:
                for mk, mv in list(vars(v).items()):
                    if isinstance(mv, types.FunctionType):
                        patch(v, mk, mv, f"{v.__name__}.{mk}")
    for owner, name in _TORCH_CALLS:
        if hasattr(owner, name):
            patch(owner, name, getattr(owner, name), f"{owner.__name__}.{name}")
    t_jit = timers.setdefault("triton JITFunction.run", Timer())
    undo.append((tjit.JITFunction, "run", tjit.JITFunction.run))
    tjit.JITFunction.run = t_jit.wrap(tjit.JITFunction.run)
    try:
        fn()
        for t in timers.values():
            t.t, t.n = 0.0, 0
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    finally:
        for owner, name, f in reversed(undo):
            setattr(owner, name, f)
    rows = sorted(((1e6 * t.t / calls, t.n / calls, k) for k, t in timers.items() if t.n),
                  reverse=True)
    return {k: [round(us, 1), round(n, 2)] for us, n, k in rows[:60]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default="131x1")
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--out", default="")
    a = p.parse_args()
    torch.set_float32_matmul_precision("high")
    w = wl.WORKLOADS["W075"]
    fn = torch.compile(w.fn, backend="inductor_gqa")

    def one_case(case):
        s, b = (int(t) for t in case.split("x"))
        inp = bench.make_inputs(w, s, b, torch.device("cuda"), seed=0)
        for _ in range(3):
            fn(**inp)
        seen = []

        def spy(tensors, spec):
            if not seen:
                seen.append((dict(tensors), spec))
            return None
        op.register_kernels(spy)
        fn(**inp)
        op._kernel_backends.remove(spy)
        tensors, spec = seen[0]
        row = {"full": per_call_us(lambda: fn(**inp), a.calls),
               "block": per_call_us(lambda: lower_block.run_block(tensors, spec), a.calls)}
        # inside the block: Triton's run and the cuBLAS GEMMs
        jit_t, mm_t = Timer(), Timer()
        launches = []
        orig_run, orig_mm = tjit.JITFunction.run, fp16_plans._mm16

        def run(self, *args, grid, warmup, **kwargs):
            kernel = orig_run(self, *args, grid=grid, warmup=warmup, **kwargs)
            if len(launches) < 64:
                launches.append((self, args, kwargs, grid))
            return kernel
        tjit.JITFunction.run = jit_t.wrap(run)
        fp16_plans._mm16 = mm_t.wrap(orig_mm)
        try:
            calls = a.calls // 3
            per_call_us(lambda: lower_block.run_block(tensors, spec), calls)
        finally:
            tjit.JITFunction.run, fp16_plans._mm16 = orig_run, orig_mm
        n = calls + 1
        row.update(triton_run_us=1e6 * jit_t.t / n, triton_launches=jit_t.n / n,
                   mm16_us=1e6 * mm_t.t / n, mm16_calls=mm_t.n / n)
        # one call's launches again, each through JITFunction.run alone (the same arguments)
        one_call = launches[:int(round(jit_t.n / n))]

        def replay():
            for jf, args, kwargs, grid in one_call:
                orig_run(jf, *args, grid=grid, warmup=False, **kwargs)
        row["triton_run_replay_us"] = per_call_us(replay, a.calls)
        row["kernels"] = [jf.fn.__name__ for jf, *_ in one_call]
        row["inclusive"] = inclusive(lambda: lower_block.run_block(tensors, spec), a.calls // 3)
        print(case, json.dumps(row), flush=True)
        return row

    run_cases(one_case, a.cases, a.out)


if __name__ == "__main__":
    main()
