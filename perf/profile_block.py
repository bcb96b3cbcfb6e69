"""Per-kernel breakdown of one compiled call: which kernels run and how long each takes.

    PYTHONPATH=$PWD python -m perf.profile_block --impl backend --cases W075-high:131x1,W092:128x1

Compiles the workload function as the perf job does (same dynamic marking), warms up, then
profiles ``--calls`` calls and prints every CUDA kernel with its launches per call and mean time,
and the call's GPU time from CUDA-graph replay, then the kernel plans the pass chose (its
counters). ``--options '{"tuned_tables": false}'``
compiles the backend with those Options, for A/B runs. ``--forms fn,module`` profiles the
function form, then the nn.Module form, in one process (a choice line printed under the module
form is a key the function form did not reach).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys

import torch

from torch._dynamo.utils import counters

from inductor_gqa import workloads as wl

from . import bench


def parse_case(spec: str):
    name, shape = spec.split(":")
    s, b = (int(v) for v in shape.split("x"))
    workload, _, precision = name.partition("-")
    return getattr(wl, workload), precision or "highest", s, b


def compiled(workload, impl, options=None, form="fn"):
    """One compilation per workload, implementation and form (B and S symbolic, reused across
    cases) -> make_call(inputs) giving a zero-argument call."""
    if options and impl == "backend":
        def compile_(f):
            return torch.compile(f, backend="inductor_gqa", options=options)
    else:
        ctx = bench.implementation(impl)
        compile_ = ctx.__enter__()      # "install" stays installed for the rest of the run
    if form == "fn":
        target = compile_(workload.fn)
        return lambda inputs: (lambda: target(**inputs))
    mod = bench.make_module(workload, "cuda")
    target = compile_(mod)

    def make_call(inputs):
        args = bench.load_module(mod, workload, inputs)
        return lambda: target(*args)
    return make_call


def profile_case(make_call, workload, precision, s, b, impl, dynamic, calls):
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    torch.set_float32_matmul_precision(precision)
    inputs = bench.make_inputs(workload, s, b, "cuda", seed=0)
    if impl != "eager":
        bench.mark_dynamic(inputs, workload, dynamic)
    call = make_call(inputs)
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    gpu_us = bench.graph_time_us(call, replays=10, blocks=3)[0]
    per = collections.OrderedDict()
    for e in prof.events():
        if e.device_type != DeviceType.CUDA:
            continue
        n, us = per.get(e.name, (0, 0.0))
        per[e.name] = (n + 1, us + e.time_range.elapsed_us())
    rows = [dict(kernel=k[:110], per_call=n / calls, us=us / calls) for k, (n, us) in per.items()]
    return rows, gpu_us


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default="W075-high:131x1,W075-high:4096x1,W092:128x1")
    p.add_argument("--impl", default="backend")
    p.add_argument("--dynamic", default="unbacked")
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--options", default="", help="JSON dict of inductor_gqa Options fields")
    p.add_argument("--out", default="")
    p.add_argument("--forms", default="fn", help="comma list of fn,module (the perf job's forms)")
    a = p.parse_args(argv)
    report = {}
    fns = {}
    seen = set()
    torch._dynamo.reset()
    for form in a.forms.split(","):
        for spec in a.cases.split(","):
            _one(a, form, spec, fns, seen, report)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0


def _one(a, form, spec, fns, seen, report):
    workload, precision, s, b = parse_case(spec)
    if (workload.name, form) not in fns:
        fns[workload.name, form] = compiled(workload, a.impl,
                                            json.loads(a.options) if a.options else None, form)
    rows, gpu_us = profile_case(fns[workload.name, form], workload, precision, s, b, a.impl,
                                a.dynamic, a.calls)
    spec = f"{spec} {form}" if form != "fn" else spec
    report[spec] = dict(gpu_us=gpu_us, kernels=rows)
    total = sum(r["us"] for r in rows)
    print(f"\n== {spec} ({a.impl} {a.options}): GPU time {gpu_us:.1f} us (graph replay), "
          f"{sum(r['per_call'] for r in rows):.0f} kernels, {total:.1f} us summed kernel time")
    for r in rows:
        print(f"  {r['per_call']:4.1f}x {r['us']:8.1f} us  {r['kernel']}")
    plans = {k: v for k, v in counters["inductor_gqa"].items() if k.startswith("plan")}
    print(f"  plans compiled so far: {plans}")
    report[spec]["plans"] = plans


if __name__ == "__main__":
    sys.exit(main())
