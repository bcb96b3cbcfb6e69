"""Plain calls (the caller captures no CUDA graph) under torch.compile's modes: ours and stock
Inductor, default and mode="reduce-overhead" (Inductor's CUDA-graph trees, which now reach our
backend: install.inductor_gqa_backend passes ``mode`` on as stock Inductor reads it).

Per case and implementation: the median time of one call from an idle device (perf.bench's
plain-launch measure, L2 flushed first), the per-call time of 50 calls issued back to back, and
the workload's tolerance check on fresh inputs (two rounds, new tensors each: CUDA-graph trees
copy them into their static inputs).

    PYTHONPATH=$PWD python perf/experiments/plain_modes.py [--cases W075-high:131x1,...] [--out F]

Prediction (before the GPU run): our default plain call is host-bound at ~1.1-2 ms (perf.run's
plain column, run 5ade1a8: 131x1 1475 us, stock 616, eager 602); with "reduce-overhead" one
graph replay replaces our ~10 launches and the op's Python, so our plain call should fall to
~100-300 us at small sizes, below stock's default, and stay correct on fresh inputs.
"""
import argparse
import json
import time

import torch

import inductor_gqa
from inductor_gqa import workloads as wl
from perf import bench

IMPLS = {
    "stock": dict(backend="inductor"),
    "stock-ro": dict(backend="inductor", mode="reduce-overhead"),
    "ours": dict(backend="inductor_gqa"),
    "ours-ro": dict(backend="inductor_gqa", mode="reduce-overhead"),
    # inductor_gqa.install() and stock torch.compile: our pass inside stock Inductor's modes
    "install-ro": dict(backend="inductor", mode="reduce-overhead"),
}


def loop_us(call, n=50):
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        call()
    torch.cuda.synchronize()
    return 1e6 * (time.perf_counter() - t0) / n


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default="W075-high:131x1,W075-high:512x4,W075-high:2048x1,"
                                      "W092:128x1,W092:512x2")
    p.add_argument("--impls", default="stock,stock-ro,ours,ours-ro")
    p.add_argument("--form", default="fn", choices=("fn", "module"),
                   help="module: the nn.Module form, weights as parameters (not copied by "
                        "CUDA-graph trees)")
    p.add_argument("--out", default="")
    a = p.parse_args()
    rows = []
    by_workload = {}
    for spec in a.cases.split(","):
        name, shape = spec.split(":")
        wname, _, prec = name.partition("-")
        s, b = (int(v) for v in shape.split("x"))
        by_workload.setdefault((wname, prec or "highest"), []).append((s, b))
    dev = torch.device("cuda")
    # the pass runs on every compile (a cache hit would skip it and leave the counters empty)
    torch._inductor.config.fx_graph_cache = False
    torch._functorch.config.enable_autograd_cache = False
    from torch._dynamo.utils import counters
    for (wname, prec), cases in by_workload.items():
        w = wl.WORKLOADS[wname]
        torch.set_float32_matmul_precision(prec if w.dtype == torch.float32 else "highest")
        for impl in a.impls.split(","):
            torch._dynamo.reset()
            if impl.startswith("install"):
                inductor_gqa.install()
            else:
                inductor_gqa.uninstall()
            counters["inductor_gqa"].clear()
            mod = bench.make_module(w, dev) if a.form == "module" else None
            fn = torch.compile(mod if mod is not None else w.fn, **IMPLS[impl])

            def call(inputs):
                if mod is None:
                    return fn(**inputs)
                return fn(*bench.load_module(mod, w, inputs))

            for i, (s, b) in enumerate(cases):
                inp = bench.make_inputs(w, s, b, dev, seed=0)
                if i == 0:
                    bench.mark_dynamic(inp, w, "backed")
                args = bench.load_module(mod, w, inp) if mod is not None else None
                run = (lambda: fn(*args)) if mod is not None else (lambda: fn(**inp))
                t0 = time.perf_counter()
                with torch.no_grad():
                    for _ in range(3):
                        run()
                torch.cuda.synchronize()
                first = time.perf_counter() - t0
                with torch.no_grad():
                    plain = bench.plain_time_us(run, runs=15)
                    loop = loop_us(run)
                    checks = []
                    for seed in (1, 2):
                        fresh = bench.make_inputs(w, s, b, dev, seed=seed)
                        outs = bench.as_tuple(call(fresh))
                        outs = tuple(o.clone() for o in outs)
                        checks.append(bench.check_outputs(w, s, b, outs,
                                                          bench.reference(w, fresh)))
                row = dict(case=f"{wname}-{prec}:{s}x{b}", form=a.form,
                           impl=impl, fused=counters["inductor_gqa"]["blocks_fused"] > 0,
                           plain_us=plain, loop_us=loop, warm_s=first,
                           passed=all(c["passed"] for c in checks),
                           min_frac=min(min(c["fracs"]) for c in checks))
                rows.append(row)
                print(json.dumps(row), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(torch=torch.__version__, form=a.form, rows=rows), f, indent=1)
    print("\ncase                 " + " ".join(f"{i:>18}" for i in a.impls.split(",")))
    for case in dict.fromkeys(r["case"] for r in rows):
        cells = []
        for impl in a.impls.split(","):
            r = next((r for r in rows if r["case"] == case and r["impl"] == impl), None)
            cells.append(f"{r['plain_us']:7.0f}/{r['loop_us']:6.0f}{'' if r['passed'] else '!'}"
                         if r else " " * 18)
        print(f"{case:20s} " + " ".join(f"{c:>18}" for c in cells))
    print("(plain us from an idle device / us per call back to back; ! = check failed)")


if __name__ == "__main__":
    main()
