"""The perf regression job: W075 and W092, every case, eager / torch.compile / inductor_gqa.

    export PYTHONPATH=$PWD
    python -m perf.run                                   # everything, outputs in $OUT or
                                                         # perf/results/<gpu-slug>/
    python -m perf.run --baseline perf/baselines/nvidia-h200.json   # + regression gate

See docs/perf.md for what every figure means and how the noise threshold is derived.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import traceback

T0 = time.time()

if __package__ in (None, ""):                       # python perf/run.py
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    __package__ = "perf"

from perf import stats  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m perf.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", default="W075,W092", help="comma list (W075,W092)")
    p.add_argument("--cases", default="all",
                   help="'all', case indices (0,7,15) or SxB labels (128x4,4096x1)")
    p.add_argument("--impls", default=",".join(stats.IMPLS),
                   help="comma list of eager,stock,backend,install")
    p.add_argument("--forms", default=",".join(stats.FORMS), help="comma list of fn,module")
    p.add_argument("--precisions", default="highest,high",
                   help="float32 matmul precisions for W075 (W092 is bf16)")
    p.add_argument("--dynamic", default="unbacked", choices=("unbacked", "backed", "static"),
                   help="B and S symbolic in one compilation (unbacked: B too, no B=1 recompile)")
    p.add_argument("--replays", type=int, default=10, help="graph replays per block")
    p.add_argument("--blocks", type=int, default=5, help="blocks of replays (spread = noise)")
    p.add_argument("--plain-runs", type=int, default=10, help="plain launches per case")
    p.add_argument("--check-rounds", type=int, default=3, help="fresh-input correctness rounds")
    p.add_argument("--no-profile", action="store_true", help="skip kernel counting")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--deadline", type=float, default=560.0,
                   help="seconds from start after which remaining cases are skipped")
    p.add_argument("--quick", action="store_true",
                   help="cases 0 and 7, 1 check round, 3x10 replays, 5 plain runs")
    p.add_argument("--out", default=None, help="output dir (default $OUT or perf/results/<gpu>)")
    p.add_argument("--baseline", default=None, help="baseline JSON to gate against")
    p.add_argument("--noise-floor", type=float, default=None,
                   help=f"min regression threshold (default: baseline's, else "
                        f"{stats.DEFAULT_NOISE_FLOOR})")
    p.add_argument("--noise-k", type=float, default=stats.DEFAULT_NOISE_K,
                   help="threshold = max(floor, k * measured spread)")
    p.add_argument("--gate-impls", default=",".join(stats.OURS),
                   help="implementations whose times are gated ('all' for every one)")
    a = p.parse_args(argv)
    if a.quick:
        if a.cases == "all":
            a.cases = "0,7"
        a.check_rounds, a.blocks, a.plain_runs = min(a.check_rounds, 1), 3, 5
    return a


def split(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def _selection(args, names, forms, impls):
    """Whether a baseline row is one this run was asked for (workload, precision, impl, form,
    case): a run of one workload is gated on that workload's rows only."""
    from inductor_gqa import workloads as wl

    precs = set(split(args.precisions)) | {"bf16"}

    def asked(row) -> bool:
        w = wl.WORKLOADS.get(row["workload"])
        return (row["workload"] in names and row["precision"] in precs and row["impl"] in impls
                and row["form"] in forms and w is not None
                and (row["seq"], row["batch"]) in select_cases(args.cases, w.cases))
    return asked


def select_cases(spec: str, cases) -> list[tuple[int, int]]:
    if spec == "all":
        return list(cases)
    out = []
    for tok in split(spec):
        if re.fullmatch(r"\d+", tok):
            i = int(tok)
            if i < len(cases):
                out.append(cases[i])
        else:
            m = re.fullmatch(r"(\d+)x(\d+)", tok)
            if not m:
                raise SystemExit(f"bad case {tok!r}: use an index or SxB")
            c = (int(m.group(1)), int(m.group(2)))
            if c in cases:
                out.append(c)
    return out


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"


def git_commit() -> str:
    # PERF_GIT_COMMIT first: a copied working tree may sit in a stale checkout, whose HEAD
    # (plus "-dirty") would name the wrong commit
    if os.environ.get("PERF_GIT_COMMIT"):
        return os.environ["PERF_GIT_COMMIT"]
    try:
        c = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                           text=True, timeout=10)
        if c.returncode == 0:
            d = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=REPO, capture_output=True, text=True, timeout=10)
            return c.stdout.strip() + ("-dirty" if d.stdout.strip() else "")
    except Exception:
        pass
    return "unknown"


def collect_env() -> dict:
    import torch
    import triton
    return {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "triton": triton.__version__, "cuda": torch.version.cuda,
            "python": sys.version.split()[0], "git_commit": git_commit(),
            "sm_count": torch.cuda.get_device_properties(0).multi_processor_count,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def run_variant(args, workload, precision, form, impl, cases, rows, variants):
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters

    from perf import bench

    torch._dynamo.reset()
    v = {"workload": workload.name, "precision": precision, "impl": impl, "form": form,
         "status": "ok", "compile_s": None, "graphs": None, "error": None}
    variants.append(v)
    base = {"workload": workload.name, "precision": precision, "impl": impl, "form": form}
    from inductor_gqa import workloads as wl

    def new_row(s, b, status):
        return dict(base, seq=s, batch=b, status=status,
                    sol_us=wl.sol_seconds(workload, s, b) * 1e6)

    if time.time() - T0 > args.deadline:
        v["status"] = "skipped"
        rows.extend(new_row(s, b, "skipped") for s, b in cases)
        return
    try:
        ctx = bench.implementation(impl)
        compile_ = ctx.__enter__()
    except bench.Unavailable as e:
        v["status"], v["error"] = "unavailable", str(e)
        log(f"{workload.name}/{precision}/{impl}/{form}: unavailable: {e}")
        rows.extend(dict(new_row(s, b, "unavailable"), error=str(e)) for s, b in cases)
        return
    dev = "cuda"
    graphs0 = counters["stats"]["unique_graphs"]
    try:
        if form == "fn":
            target = compile_(workload.fn)

            def make_call(inputs):
                return lambda: target(**inputs)
        else:
            mod = bench.make_module(workload, dev)
            target = compile_(mod)

            def make_call(inputs):
                call_args = bench.load_module(mod, workload, inputs)
                return lambda: target(*call_args)

        for i, (s, b) in enumerate(cases):
            row = new_row(s, b, "error")
            rows.append(row)
            if time.time() - T0 > args.deadline:
                row["status"] = "skipped"
                continue
            cid = workload.cases.index((s, b))
            try:
                inputs = bench.make_inputs(workload, s, b, dev, seed=args.seed * 100003 + cid)
                if impl != "eager":
                    bench.mark_dynamic(inputs, workload, args.dynamic)
                call = make_call(inputs)
                _, first_s = bench.wall(call)
                row["first_call_s"] = first_s
                if i == 0:
                    v["compile_s"] = first_s
                # correctness, fresh inputs each round
                fracs, passed = [], True
                for r in range(args.check_rounds):
                    ci = bench.make_inputs(workload, s, b, dev,
                                           seed=args.seed * 100003 + 1000 * (r + 1) + cid)
                    outs = bench.as_tuple(make_call(ci)())
                    refs = bench.reference(workload, ci)
                    c = bench.check_outputs(workload, s, b, outs, refs)
                    fracs.append(min(c["fracs"]) if c["fracs"] else 0.0)
                    passed &= c["passed"]
                    del ci, outs, refs
                if args.check_rounds:
                    row["check"] = {"passed": bool(passed), "min_frac": min(fracs),
                                    "rounds": args.check_rounds, "atol": c["atol"],
                                    "rtol": c["rtol"]}
                call = make_call(inputs)          # module weights back to the timing inputs
                try:
                    info = {}
                    gpu, meds, spread = bench.graph_time_us(call, args.replays, args.blocks,
                                                            info=info)
                    row.update(gpu_us=gpu, block_medians=meds, spread=spread, **info)
                except Exception as e:             # e.g. not capturable: still time plainly
                    row["error"] = f"graph capture/replay: {type(e).__name__}: {e}"[:500]
                row["plain_us"] = bench.plain_time_us(call, args.plain_runs)
                if not args.no_profile:
                    row["kernels"], row["fused"] = bench.profile_call(call)
                row["status"] = "ok" if row.get("gpu_us") else "error"
                del inputs, call
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {e}"[:1000]
                traceback.print_exc()
            torch.cuda.synchronize()
            log(f"{workload.name}/{precision}/{impl}/{form} {s}x{b}: "
                f"{row['status']} gpu {row.get('gpu_us', float('nan')):.1f} us "
                f"(spread {row.get('spread', 0) * 100:.1f}%) plain "
                f"{row.get('plain_us', float('nan')):.1f} us kernels {row.get('kernels')} "
                f"fused {row.get('fused')} check "
                f"{stats.check_cell(row)} first call {row.get('first_call_s', 0):.2f}s"
                + (f" ERROR {row['error'][:200]}" if row.get("error") else ""))
    except Exception as e:
        v["status"], v["error"] = "error", f"{type(e).__name__}: {e}"[:1000]
        traceback.print_exc()
    finally:
        v["graphs"] = counters["stats"]["unique_graphs"] - graphs0
        try:
            ctx.__exit__(None, None, None)
        except Exception as e:
            v["error"] = (v["error"] or "") + f" exit: {type(e).__name__}: {e}"
        torch._dynamo.reset()
        torch.cuda.empty_cache()


def write_json(path: str, doc: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=False)
    os.replace(tmp, path)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("perf.run needs a CUDA GPU", file=sys.stderr)
        return 2
    import inductor_gqa  # noqa: F401  (registers the op and, when present, the backend)
    from inductor_gqa import workloads as wl

    env = collect_env()
    out_dir = args.out or os.environ.get("OUT") or os.path.join(REPO, "perf", "results",
                                                                  slug(env["gpu"]))
    os.makedirs(out_dir, exist_ok=True)
    json_path = os.path.join(out_dir, "results.json")
    names = split(args.workloads)
    impls = [i for i in split(args.impls)]
    forms = split(args.forms)
    for i in impls:
        if i not in stats.IMPLS:
            raise SystemExit(f"unknown implementation {i!r} (choose from {stats.IMPLS})")
    baseline = None
    if args.baseline:
        with open(args.baseline) as f:
            baseline = json.load(f)
    floor = args.noise_floor
    if floor is None:
        floor = (baseline or {}).get("settings", {}).get("noise_floor",
                                                         stats.DEFAULT_NOISE_FLOOR)
    settings = {k: getattr(args, k) for k in ("workloads", "cases", "impls", "forms",
                                              "precisions", "dynamic", "replays", "blocks",
                                              "plain_runs", "check_rounds", "seed", "deadline")}
    settings.update(noise_floor=floor, noise_k=args.noise_k, timing=(
        "gpu_us: median over blocks x replays of CUDA-graph replays, events around each replay, "
        "back to back (warm L2), each graph holding calls_per_graph calls (a replay of at least "
        "200 us) and its time divided by that; spread: (max-min)/median of the block medians; plain_us: median "
        "of plain calls, L2 flushed and device idle before each"))
    doc = {"schema": stats.SCHEMA, "env": env, "settings": settings, "rows": [],
           "variants": []}
    log(f"{env['gpu']} torch {env['torch']} triton {env['triton']} commit {env['git_commit']}"
        f" -> {out_dir}")
    rows, variants = doc["rows"], doc["variants"]
    with torch.no_grad():
        for name in names:
            workload = wl.WORKLOADS[name]
            cases = select_cases(args.cases, workload.cases)
            precs = split(args.precisions) if workload.dtype == torch.float32 else ["bf16"]
            for prec in precs:
                if prec != "bf16":
                    torch.set_float32_matmul_precision(prec)
                for form in forms:
                    for impl in impls:
                        run_variant(args, workload, prec, form, impl, cases, rows, variants)
                        write_json(json_path, doc)
                torch.set_float32_matmul_precision("highest")
    stats.add_ratios(rows)
    doc["wall_s"] = time.time() - T0
    gated = None if args.gate_impls == "all" else split(args.gate_impls)
    bad_checks = stats.check_failures(doc, only=gated)
    rc = 1 if bad_checks else 0
    if baseline is not None:
        g = stats.gate(doc, baseline, floor=floor, k=args.noise_k, impls=gated,
                       scope=_selection(args, names, forms, impls))
        doc["gate"] = g
        rc = 0 if g["ok"] else 1
    incomplete = any(r["status"] == "skipped" for r in rows)
    from inductor_gqa.kernels import tuning
    # a kernel config that failed for a reason other than resources is a bug, not a slow config
    doc["candidate_failures"] = tuning.failure_report()
    if doc["candidate_failures"]:
        rc = 1
    # choices made untimed inside a CUDA-graph capture (reported, not failed: a key the eager
    # first call never reached, as the norm/RoPE launch's choice was at e3adf91)
    doc["untimed_choices"] = tuning.untimed_report()
    # the named choices' timings (plans, the fused projection's configs): choice noise between
    # runs shows here (at 5637e55, 1024x2 took f16proj16 where a bench had f16tma 5% ahead)
    doc["choices"] = tuning.choice_report()
    write_json(json_path, doc)
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(stats.markdown_report(doc))
    try:
        from perf import plot
        plot.plot(doc, os.path.join(out_dir, "perf.png"))
    except Exception as e:
        log(f"plot failed: {type(e).__name__}: {e}")
    problems = [r for r in rows if r["status"] in ("error",) or r.get("error")]
    for r in problems[:20]:
        print(f"problem {stats.row_key(r)}: {r['status']} {r.get('error', '')[:300]}")
    for v in variants:
        if v["status"] != "ok":
            print(f"variant {v['workload']}/{v['precision']}/{v['impl']}/{v['form']}: "
                  f"{v['status']} {v.get('error') or ''}")
    if baseline is not None:
        print(stats.gate_text(doc["gate"]))
    else:
        for msg in bad_checks:
            print(f"FAIL {msg}")
        for msg in stats.check_failures(doc, exclude=gated or ()):
            if gated is not None:
                print(f"warning (not gated) {msg}")
    for k, v in doc["candidate_failures"].items():
        print(f"CANDIDATE FAILED {k}: {v}")
    for k, v in doc["untimed_choices"].items():
        print(f"UNTIMED CHOICE {k}: {v} (first met under graph capture)")
    if incomplete:
        print(f"INCOMPLETE: cases skipped after the {args.deadline:.0f}s deadline")
        rc = rc or 3
    print(f"\nwrote {out_dir}/results.json, results.md, perf.png in {doc['wall_s']:.0f}s "
          f"(exit {rc})\n")
    print(stats.summary_table(stats.summarize(rows)))
    return rc


if __name__ == "__main__":
    sys.exit(main())
