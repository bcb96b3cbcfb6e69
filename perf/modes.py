"""The ways a user compiles or ships a model, each checked on the seed workloads (one GPU).

    python -m perf.modes [--out DIR] [--cases W075:131x1,W092:128x1] [--modes ...]

Per (case, mode, implementation): the block fused (the pass's counters), the workload's
tolerance rule on fresh inputs (W075 under "high"; reference: the eager function under
"highest"), the first call, the median plain call and, under ``reduce-overhead``, the CUDA-graph
skips Inductor counted (a skip means the mode silently runs without graphs). Each mode runs
stock Inductor (``stock``: ``backend="inductor"``, or a package built without our pass) and
ours (``ours``) side by side. Modes:

- ``default``: ``torch.compile(f, backend="inductor_gqa")``, static shapes;
- ``reduce-overhead``, ``max-autotune``: the same with that ``mode=`` (CUDA-graph trees, GEMM
  autotuning);
- ``dynamic``: ``dynamic=True``, then two more sequence lengths through the same compilation;
- ``cpp_wrapper``: Inductor's C++ wrapper (``torch._inductor.config.cpp_wrapper``);
- ``aoti``: ``torch.export`` + ``aoti_compile_and_package`` with ``inductor_gqa.installed()``,
  then the package loaded and run in a fresh process that never imports this package (how a
  compiled model ships).

Writes ``modes.json`` to ``--out`` (default ``$OUT``, else the current directory). Exit status 1
when a row of ours errored, did not fuse, missed the tolerance or (``reduce-overhead``) skipped
CUDA graphs; stock's rows are recorded for comparison (a stock error is its own, not ours).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

import torch
from torch._dynamo.utils import counters

from inductor_gqa import workloads as wl
from perf import bench

MODES = ("default", "cpp_wrapper", "aoti", "reduce-overhead", "dynamic", "max-autotune")
IMPLS = ("stock", "ours")
PRECISION = {"W075": "high", "W092": "high"}

# Run in the fresh process of the aoti mode: loads the package and runs it; prints one JSON line.
_AOTI_RUNNER = r"""
import json, sys, time, torch
pkg, inputs_path, out_path = sys.argv[1:4]
torch.set_float32_matmul_precision(sys.argv[4])
torch.cuda.init()                       # the package's container expects a live CUDA context
args = torch.load(inputs_path)
torch.cuda.synchronize()
runner = torch._inductor.aoti_load_package(pkg)
t = time.perf_counter(); out = runner(*args); torch.cuda.synchronize()
first = time.perf_counter() - t
times = []
for _ in range(10):
    torch.cuda.synchronize(); t = time.perf_counter(); runner(*args); torch.cuda.synchronize()
    times.append((time.perf_counter() - t) * 1e6)
out = out if isinstance(out, (tuple, list)) else (out,)
torch.save([o.cpu() for o in out], out_path)
print(json.dumps({"first_s": first, "plain_us": sorted(times)[5],
                  "imported_inductor_gqa": any(m.startswith("inductor_gqa") for m in sys.modules)}))
"""


def _parse_cases(spec: str) -> list[tuple[wl.Workload, int, int]]:
    out = []
    for tok in spec.split(","):
        try:
            name, sb = tok.split(":")
            s, b = (int(v) for v in sb.split("x"))
            out.append((wl.WORKLOADS[name], s, b))
        except (KeyError, ValueError):
            raise SystemExit(f"bad case {tok!r}: WORKLOAD:SxB with WORKLOAD one of "
                             f"{sorted(wl.WORKLOADS)}, e.g. W075:131x1") from None
    return out


class _FnModule(torch.nn.Module):
    """The function form as a module, inputs positional in the workload's order (torch.export)."""

    def __init__(self, fn, names):
        super().__init__()
        self.fn, self.names = fn, names

    def forward(self, *args):
        return self.fn(**dict(zip(self.names, args)))


def _check(w, s, b, call, seeds, precision) -> tuple[bool, float]:
    """The tolerance rule over fresh inputs; call(inputs) -> outputs."""
    passed, worst = True, 1.0
    for seed in seeds:
        inputs = bench.make_inputs(w, s, b, "cuda", seed)
        torch.set_float32_matmul_precision(precision)
        outs = bench.as_tuple(call(inputs))
        refs = bench.reference(w, inputs)
        torch.set_float32_matmul_precision(precision)
        chk = bench.check_outputs(w, s, b, outs, refs)
        passed &= chk["passed"]
        worst = min([worst] + chk["fracs"])
    return bool(passed), worst


def _compiled_row(w, s, b, mode: str, precision: str, impl: str) -> dict:
    import inductor_gqa  # noqa: F401  (registers the backend)
    kw: dict = {"backend": "inductor_gqa" if impl == "ours" else "inductor"}
    if mode in ("reduce-overhead", "max-autotune"):
        kw["mode"] = mode
    kw["dynamic"] = mode == "dynamic"
    patch = {"cpp_wrapper": True} if mode == "cpp_wrapper" else {}
    row: dict = {}
    with torch._inductor.config.patch(patch), torch.no_grad():
        c = torch.compile(w.fn, **kw)
        inputs = bench.make_inputs(w, s, b, "cuda", 0)
        t = time.perf_counter()
        c(**inputs)
        torch.cuda.synchronize()
        row["first_s"] = round(time.perf_counter() - t, 2)
        row["passed"], row["min_frac"] = _check(w, s, b, lambda x: c(**x), (101, 102), precision)
        if mode == "dynamic":
            for s2 in (s + 37, 2 * s):
                ok, frac = _check(w, s2, b, lambda x: c(**x), (103,), precision)
                row["passed"] &= ok
                row["min_frac"] = min(row["min_frac"], frac)
            row["seqs"] = [s, s + 37, 2 * s]
        inputs = bench.make_inputs(w, s, b, "cuda", 104)
        row["plain_us"] = round(bench.plain_time_us(lambda: c(**inputs), 20)[0], 1)
    return row


def _aoti_row(w, s, b, precision: str, workdir: str, impl: str) -> dict:
    import contextlib

    import inductor_gqa
    inputs = bench.make_inputs(w, s, b, "cuda", 101)
    names = list(inputs)
    args = tuple(inputs[n] for n in names)
    ep = torch.export.export(_FnModule(w.fn, names), args)
    pkg = os.path.join(workdir, f"{w.name}_{s}x{b}_{impl}.pt2")
    t = time.perf_counter()
    scope = inductor_gqa.installed() if impl == "ours" else contextlib.nullcontext()
    with scope, torch.no_grad():
        torch._inductor.aoti_compile_and_package(ep, package_path=pkg)
    row: dict = {"compile_s": round(time.perf_counter() - t, 2)}
    in_path, out_path = os.path.join(workdir, "inputs.pt"), os.path.join(workdir, "outputs.pt")
    torch.save(args, in_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}   # the package unreachable
    proc = subprocess.run([sys.executable, "-X", "faulthandler", "-c", _AOTI_RUNNER, pkg,
                           in_path, out_path, precision],
                          capture_output=True, text=True, timeout=300, cwd=workdir, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"package run failed (rc {proc.returncode}): {proc.stderr[-2000:]}")
    row.update(json.loads(proc.stdout.strip().splitlines()[-1]))
    row["first_s"], row["plain_us"] = round(row["first_s"], 2), round(row["plain_us"], 1)
    outs = tuple(o.cuda() for o in torch.load(out_path))
    refs = bench.reference(w, inputs)
    chk = bench.check_outputs(w, s, b, outs, refs)
    row["passed"], row["min_frac"] = chk["passed"], min(chk["fracs"])
    return row


def run_one(w, s, b, mode: str, workdir: str, impl: str = "ours") -> dict:
    precision = PRECISION[w.name]
    torch._dynamo.reset()
    counters.clear()
    torch.set_float32_matmul_precision(precision)
    row = {"workload": w.name, "seq": s, "batch": b, "mode": mode, "impl": impl,
           "precision": precision}
    try:
        row.update(_aoti_row(w, s, b, precision, workdir, impl) if mode == "aoti"
                   else _compiled_row(w, s, b, mode, precision, impl))
        row["blocks_fused"] = counters["inductor_gqa"]["blocks_fused"]
        row["rejected"] = {k: v for k, v in counters["inductor_gqa"].items()
                           if k.startswith("rejected")}
        row["cudagraph_skips"] = counters["inductor"]["cudagraph_skips"]
        row["status"] = row_status(row)
    except Exception as e:  # one mode's failure must not hide the others'
        row["status"], row["error"] = "error", f"{type(e).__name__}: {e}"[:2000]
        traceback.print_exc()
    print(json.dumps(row), flush=True)
    return row


def row_status(row: dict) -> str:
    """"ok", or "failed": the tolerance missed, (ours) no block fused, or CUDA graphs skipped
    under ``reduce-overhead``."""
    if not row["passed"]:
        return "failed"
    if row["impl"] == "ours" and row["blocks_fused"] < 1:
        return "failed"
    if row["mode"] == "reduce-overhead" and row.get("cudagraph_skips", 0):
        return "failed"
    return "ok"


def compare(rows: list) -> list:
    """Per (case, mode) with both rows ok: ours' plain call and first call over stock's."""
    by = {}
    for r in rows:
        by.setdefault((r["workload"], r["seq"], r["batch"], r["mode"]), {})[r["impl"]] = r
    out = []
    for (wname, s, b, mode), pair in by.items():
        st, us = pair.get("stock"), pair.get("ours")
        if not (st and us) or "error" in st or "error" in us:
            continue
        out.append({"workload": wname, "seq": s, "batch": b, "mode": mode,
                    "plain_ratio": round(us["plain_us"] / st["plain_us"], 3),
                    "first_ratio": round(us["first_s"] / max(st["first_s"], 1e-3), 3)})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.modes", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default="W075:131x1,W092:128x1")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--impls", default=",".join(IMPLS))
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    modes = [m for m in a.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            raise SystemExit(f"unknown mode {m!r} (choose from {MODES})")
    impls = [i for i in a.impls.split(",") if i]
    for i in impls:
        if i not in IMPLS:
            raise SystemExit(f"unknown implementation {i!r} (choose from {IMPLS})")
    cases = _parse_cases(a.cases)
    if not torch.cuda.is_available():
        print("perf.modes needs a CUDA GPU")
        return 2
    torch._inductor.config.fx_graph_cache = False     # a cache hit would leave the counters empty
    out = a.out or os.environ.get("OUT") or "."
    os.makedirs(out, exist_ok=True)
    rows: list = []
    doc = {"env": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "commit": os.environ.get("PERF_GIT_COMMIT")}, "rows": rows}
    with tempfile.TemporaryDirectory() as workdir:
        for m in modes:
            for w, s, b in cases:
                for impl in impls:
                    rows.append(run_one(w, s, b, m, workdir, impl))
                    doc["compare"] = compare(rows)
                    with open(os.path.join(out, "modes.json"), "w") as f:  # kept if cut short
                        json.dump(doc, f, indent=1)
    for c in doc.get("compare", []):
        print(f"  {c['workload']} {c['seq']}x{c['batch']} {c['mode']:16s} ours/stock: plain "
              f"{c['plain_ratio']:.2f}, first call {c['first_ratio']:.2f}")
    bad = [r for r in rows if r["status"] != "ok"]
    print(f"modes: {len(rows) - len(bad)} of {len(rows)} ok"
          + "".join(f"\n  {r['workload']} {r['seq']}x{r['batch']} {r['mode']} {r['impl']}: "
                    f"{r.get('error') or r.get('rejected') or _why(r)}" for r in bad))
    return 1 if any(r["impl"] == "ours" for r in bad) else 0


def _why(row: dict) -> str:
    if row.get("cudagraph_skips"):
        return f"CUDA graphs skipped ({row['cudagraph_skips']})"
    if not row.get("passed", True):
        return "tolerance"
    return "not fused"


if __name__ == "__main__":
    sys.exit(main())
