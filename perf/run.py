"""The perf job: what a user gets from eager, stock torch.compile and inductor_gqa.

    export PYTHONPATH=$PWD
    python -m perf.run                                   # every suite, outputs in $OUT or
                                                         # perf/results/<gpu-slug>/
    python -m perf.run --baseline perf/baselines/nvidia-h200.json   # + regression gate
    python -m perf.run --smoke                           # tiny sizes, end to end, CPU or GPU
    python -m perf.run --estimate                        # the duration estimate, then exit

Suites (``--suites``): ``blocks`` (W075 and W092, every case: GPU time, plain-call time,
correctness, SOL), ``first-call`` (first calls in fresh processes, cold and warm caches, for a
subset of cases), ``models`` (whole-model prefill of five transformers architectures),
``train`` (training steps of W092's block: forward + backward, peak and saved memory).
See docs/perf.md for what every figure means and how the gate decides.
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
from typing import Optional

T0 = time.time()

if __package__ in (None, ""):                       # python perf/run.py
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    __package__ = "perf"

from perf import stats  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUITES = ("blocks", "first-call", "models", "train")
DEFAULT_IMPLS = ("eager", "stock_static", "stock_dynamic", "backend")
# the smoke run's cases (S, B) per workload (at bench.SMOKE_DIMS)
SMOKE_CASES = {"W075": ((33, 2), (16, 1)), "W092": ((32, 2), (17, 1))}
# first calls by default: one representative case per workload (all 48 cases x implementations x
# two caches, a fresh process each, take hours; one cold first call of ours compiles and times
# every kernel candidate of its buckets, 1-2 minutes on a fresh H200 machine)
FIRST_CALL_AUTO = {"W075": (131, 1), "W092": (512, 4)}

# rough seconds on an H200 (warm Triton cache; a fresh machine adds minutes to ours' first calls),
# from the runs in docs/perf.md "Time budget": the printed estimate
EST = {"row": 2.5, "compile_dynamic": 12.0, "compile_static": 7.0, "process": 10.0,
       "tune": {"W075/high": 150.0, "W075/highest": 60.0, "W092/bf16": 60.0},
       # first call (cold, warm cache), process start not included
       "first_call": {"eager": (2.0, 1.0), "stock": (25.0, 10.0),
                      "ours": {"W075": (100.0, 40.0), "W092": (40.0, 15.0)}}}


def split(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def _config_table() -> dict:
    """The plan table the compiled blocks read on this GPU: its file and content hash."""
    import hashlib
    try:
        import torch
        from inductor_gqa.plan import configs
        if not torch.cuda.is_available():
            return {}
        path = configs.TABLES_DIR / f"{configs.gpu_slug(torch.cuda.get_device_name())}.json"
    except Exception:  # noqa: BLE001 - reported as absent
        return {}
    if not path.exists():
        return {"file": None}
    return {"file": str(path.name), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()[:16]}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m perf.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suites", default=",".join(SUITES), help="comma list of " + ",".join(SUITES))
    p.add_argument("--workloads", default="W075,W092", help="comma list (W075,W092)")
    p.add_argument("--cases", default="all",
                   help="'all', case indices (0,7,15) or SxB labels (128x4,4096x1)")
    p.add_argument("--impls", default=",".join(DEFAULT_IMPLS),
                   help="comma list of " + ",".join(stats.IMPLS) + " ('stock' = stock_dynamic)")
    p.add_argument("--forms", default="fn", help="comma list of fn,module")
    p.add_argument("--precisions", default=None,
                   help="float32 matmul precisions for W075 (W092 is bf16); default "
                        "highest,high (smoke: high)")
    p.add_argument("--dynamic", default="unbacked", choices=("unbacked", "backed", "static"),
                   help="ours and stock_dynamic: B and S symbolic in one compilation (unbacked: "
                        "B too, no B=1 recompile); static: every compiled impl per case")
    p.add_argument("--mode", default=None, help="torch.compile mode for every compiled impl "
                                                "(default: torch.compile's default)")
    p.add_argument("--replays", type=int, default=None, help="graph replays per block (10)")
    p.add_argument("--blocks", type=int, default=None, help="blocks of replays (5)")
    p.add_argument("--plain-runs", type=int, default=None, help="plain calls per case (20)")
    p.add_argument("--check-rounds", type=int, default=None,
                   help="fresh-input correctness rounds (3)")
    p.add_argument("--no-profile", action="store_true", help="skip kernel counting/host time")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--deadline", type=float, default=560.0,
                   help="seconds from start after which remaining work is skipped")
    p.add_argument("--quick", action="store_true",
                   help="cases 0 and 7, 1 check round, 3x10 replays, 5 plain runs")
    p.add_argument("--smoke", action="store_true",
                   help="tiny sizes end to end (every suite, CPU timers without a GPU)")
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"),
                   help="cpu only with --smoke")
    p.add_argument("--estimate", action="store_true", help="print the duration estimate, exit")
    p.add_argument("--out", default=None, help="output dir (default $OUT or perf/results/<gpu>)")
    p.add_argument("--baseline", default=None, help="baseline JSON to gate against")
    p.add_argument("--noise-floor", type=float, default=None,
                   help=f"min regression threshold (default: baseline's, else "
                        f"{stats.DEFAULT_NOISE_FLOOR})")
    p.add_argument("--noise-k", type=float, default=stats.DEFAULT_NOISE_K,
                   help="threshold = max(floor, k * measured spread)")
    p.add_argument("--plain-tolerance", type=float, default=stats.DEFAULT_PLAIN_TOL,
                   help="ours' plain call may be this fraction slower than stock's best")
    p.add_argument("--first-call-tolerance", type=float, default=stats.DEFAULT_FIRST_CALL_TOL)
    p.add_argument("--first-call-slack", type=float, default=stats.DEFAULT_FIRST_CALL_SLACK_S,
                   help="seconds a first call may grow over baseline * (1 + tolerance)")
    p.add_argument("--gate-impls", default=",".join(stats.OURS),
                   help="implementations whose figures are gated ('all' for every one)")
    g = p.add_argument_group("first-call suite")
    g.add_argument("--first-call-cases", default="auto",
                   help="auto (W075 131x1 under 'high', or the first precision asked for; W092 "
                        "512x4; smoke: the first case), all, none, or SxB / WORKLOAD:SxB / "
                        "WORKLOAD/PRECISION:SxB tokens")
    g.add_argument("--first-call-impls", default=None,
                   help="default: the implementations of --impls")
    g.add_argument("--first-call-timeout", type=float, default=300.0,
                   help="seconds one process may take")
    g = p.add_argument_group("models suite")
    g.add_argument("--models", default=None, help="comma list of llama,qwen3,mistral,gemma2,"
                                                  "glm4moe (default all)")
    g.add_argument("--model-attn", default="sdpa,eager")
    g.add_argument("--model-shapes", default=None, help="BxS list (default 4x512,1x2048)")
    g.add_argument("--model-impls", default=None, help="default eager,stock_static,backend")
    g.add_argument("--model-layers", type=int, default=None, help="default 4 (smoke 2)")
    g.add_argument("--model-tasks", default="prefill",
                   help="comma list of prefill (no_grad forward), train (forward + backward)")
    g = p.add_argument_group("train suite (W092's block, forward + backward)")
    g.add_argument("--train-cases", default="all", help="W092 case indices or SxB (as --cases)")
    g.add_argument("--train-impls", default=None, help="default eager,stock_static,backend")
    g.add_argument("--train-options", default=None,
                   help='JSON of inductor_gqa Options for ours, added to {"fuse_with_grad": true}'
                   ' (e.g. {"training_core": "kernels"})')
    return p


def parse_args(argv=None):
    """The options, with the selection lists resolved (``*_list``) and the defaults of --smoke
    and --quick applied."""
    a = _parser().parse_args(argv)
    from perf import models
    a.suites_list = split(a.suites)
    for s in a.suites_list:
        if s not in SUITES:
            raise SystemExit(f"unknown suite {s!r} (choose from {SUITES})")
    a.impls_list = [stats.IMPL_ALIASES.get(i, i) for i in split(a.impls)]
    for i in a.impls_list:
        if i not in stats.IMPLS:
            raise SystemExit(f"unknown implementation {i!r} (choose from {stats.IMPLS})")
    defaults = dict(replays=10, blocks=5, plain_runs=20, check_rounds=3)
    if a.smoke:
        defaults = dict(replays=3, blocks=2, plain_runs=3, check_rounds=1)
    if a.quick:
        defaults = dict(replays=10, blocks=3, plain_runs=5, check_rounds=1)
        if a.cases == "all":
            a.cases = "0,7"
    for k, v in defaults.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.precisions is None:
        a.precisions = "high" if a.smoke else "highest,high"
    a.models_list = split(a.models) if a.models else list(models.MODELS)
    for m in a.models_list:
        if m not in models.SPECS:
            raise SystemExit(f"unknown model {m!r} (choose from {models.MODELS})")
    a.model_attn_list = split(a.model_attn)
    a.model_tasks_list = split(a.model_tasks)
    for t in a.model_tasks_list:
        if t not in stats.TASKS:
            raise SystemExit(f"unknown model task {t!r} (choose from {stats.TASKS})")
    if a.model_shapes:
        a.model_shapes_list = [tuple(int(v) for v in t.split("x")) for t in split(a.model_shapes)]
    else:
        a.model_shapes_list = list(models.SMOKE_SHAPES if a.smoke else models.SHAPES)
    a.model_impls_list = [stats.IMPL_ALIASES.get(i, i)
                          for i in split(a.model_impls or ",".join(models.IMPLS))]
    if a.model_layers is None:
        a.model_layers = 2 if a.smoke else models.LAYERS
    from perf import train
    from inductor_gqa.workloads import W092
    a.train_cases_list = select_cases(a.train_cases, SMOKE_CASES["W092"] if a.smoke
                                      else W092.cases)
    a.train_options_dict = dict(train.GRAD_OPTIONS, **json.loads(a.train_options or "{}"))
    a.train_impls_list = [stats.IMPL_ALIASES.get(i, i)
                          for i in split(a.train_impls or ",".join(train.TRAIN_IMPLS))]
    a.first_call_impls_list = ([stats.IMPL_ALIASES.get(i, i) for i in split(a.first_call_impls)]
                               if a.first_call_impls else list(a.impls_list))
    return a


def workload_cases(args, workload) -> tuple:
    return SMOKE_CASES[workload.name] if args.smoke else workload.cases


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


def precisions_of(args, workload) -> list[str]:
    import torch
    return split(args.precisions) if workload.dtype == torch.float32 else ["bf16"]


def first_call_cases(args, workload, precision: str) -> list[tuple[int, int]]:
    """The cases whose first calls are measured for one workload and precision."""
    cases = workload_cases(args, workload)
    spec = args.first_call_cases
    if "first-call" not in args.suites_list or spec == "none":
        return []
    if spec == "auto":
        precs = precisions_of(args, workload)
        if precision != ("high" if "high" in precs else precs[0]):
            return []
        c = cases[0] if args.smoke else FIRST_CALL_AUTO.get(workload.name)
        return [c] if c in cases else []
    if spec == "all":
        return list(cases)
    out = []
    for tok in split(spec):
        name, _, case = tok.rpartition(":")
        wname, _, prec = name.partition("/")
        if (wname and wname != workload.name) or (prec and prec != precision):
            continue
        out += [c for c in select_cases(case, cases) if c not in out]
    return out


def expected_rows(args) -> list[dict]:
    """The key fields of every row this selection asks for, in the order the suites run: the
    gate fails on any of them missing (``expected`` in results.json)."""
    from inductor_gqa import workloads as wl
    out = []
    forms = split(args.forms)
    for name in split(args.workloads):
        w = wl.WORKLOADS[name]
        cases = select_cases(args.cases, workload_cases(args, w))
        for prec in precisions_of(args, w):
            if "blocks" in args.suites_list:
                out += [{"kind": "block", "workload": name, "precision": prec, "impl": impl,
                         "form": form, "seq": s, "batch": b}
                        for form in forms for impl in args.impls_list for s, b in cases]
            out += [{"kind": "first_call", "workload": name, "precision": prec, "impl": impl,
                     "form": forms[0], "seq": s, "batch": b, "cache": cache}
                    for s, b in first_call_cases(args, w, prec)
                    for impl in args.first_call_impls_list for cache in ("cold", "warm")]
    if "models" in args.suites_list:
        out += [{"kind": "model", "model": m, "attn": attn, "task": task, "impl": impl,
                 "seq": s, "batch": b}
                for m in args.models_list for attn in args.model_attn_list
                for task in args.model_tasks_list for b, s in args.model_shapes_list
                for impl in args.model_impls_list]
    if "train" in args.suites_list:
        out += [{"kind": "train_block", "workload": "W092", "impl": impl, "seq": s, "batch": b}
                for s, b in args.train_cases_list for impl in args.train_impls_list]
    return out


def _selection(args):
    """Whether a baseline row is one this run was asked for: a run of one workload or suite is
    gated on those rows only."""
    keys = {stats.row_key(r) for r in expected_rows(args)}
    return lambda row: stats.row_key(row) in keys


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


def collect_env(device: str) -> dict:
    import torch
    import triton
    try:
        import transformers
        tf = transformers.__version__
    except Exception:  # noqa: BLE001
        tf = None
    cuda = device.startswith("cuda")
    return {"gpu": torch.cuda.get_device_name(0) if cuda else "cpu", "device": device,
            "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
            "transformers": tf, "python": sys.version.split()[0], "git_commit": git_commit(),
            "sm_count": torch.cuda.get_device_properties(0).multi_processor_count if cuda
            else None, "cpu_count": os.cpu_count(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def over_deadline(args, reserve: float = 0.0) -> bool:
    """Past the deadline, or too close to it to start a step expected to take ``reserve`` s."""
    return time.time() - T0 > args.deadline - reserve


# --------------------------------------------------------------------------------------- estimate
def estimate(args) -> dict:
    """Rough seconds per suite on an H200 for this selection (EST's per-step costs)."""
    from inductor_gqa import workloads as wl
    from perf import models
    e = {"blocks": 0.0, "first-call": 0.0, "models": 0.0, "train": 0.0}
    forms = split(args.forms)
    for name in split(args.workloads):
        w = wl.WORKLOADS[name]
        n = len(select_cases(args.cases, workload_cases(args, w)))
        for prec in precisions_of(args, w):
            if "blocks" in args.suites_list:
                tuned = False
                for _ in forms:
                    for impl in args.impls_list:
                        e["blocks"] += n * EST["row"]
                        if impl == "eager":
                            continue
                        if impl == "stock_static" or args.dynamic == "static":
                            e["blocks"] += n * EST["compile_static"]
                        else:
                            e["blocks"] += EST["compile_dynamic"]
                        if impl in stats.OURS and not tuned:
                            e["blocks"] += EST["tune"].get(f"{name}/{prec}", 60.0)
                            tuned = True
            for _ in first_call_cases(args, w, prec):
                for impl in args.first_call_impls_list:
                    fc = EST["first_call"]
                    cost = (fc["ours"][name] if impl in stats.OURS
                            else fc["eager"] if impl == "eager" else fc["stock"])
                    e["first-call"] += 2 * EST["process"] + sum(cost)
    if "models" in args.suites_list:
        e["models"] = len(args.model_tasks_list) * models.estimate_s(
            len(args.models_list), len(args.model_attn_list), len(args.model_shapes_list),
            args.model_impls_list)
    if "train" in args.suites_list:
        from perf import train
        e["train"] = train.estimate_s(len(args.train_cases_list), args.train_impls_list)
    e["total"] = sum(e.values())
    return e


def estimate_text(args) -> str:
    e = estimate(args)
    parts = ", ".join(f"{k} {v / 60:.1f} min" for k, v in e.items() if k != "total" and v)
    text = (f"estimated duration on an H200{' (of full-size work)' if args.smoke else ''}: "
            f"{e['total'] / 60:.1f} min ({parts}; rough, from earlier runs' compile and tuning "
            f"times; a fresh machine is slower)")
    if e["total"] > args.deadline:
        text += (f"; over the {args.deadline:.0f} s deadline: split it into commands by "
                 f"--suites / --workloads / --precisions / --models (docs/perf.md)")
    return text


# ----------------------------------------------------------------------------------------- blocks
class _Variant:
    """One compiled (workload, precision, form, implementation): the function or module under
    test and how to call it on a case's inputs. Ours and stock_dynamic compile once for every
    case; ``per_case`` implementations (stock at its best) compile afresh for each."""

    def __init__(self, args, workload, form, impl, compile_, device):
        from perf import bench
        self.args, self.workload, self.form, self.impl = args, workload, form, impl
        self.dims = bench.SMOKE_DIMS if args.smoke else None
        self.fn = bench.block_fn(workload, self.dims)
        self.mod = (bench.make_module(workload, device, self.dims) if form == "module"
                    else None)
        self.compile_ = compile_
        self.per_case = bench.per_case(impl, args.dynamic)
        self.target = None if self.per_case else self.compiled()

    def compiled(self):
        return self.compile_(self.fn if self.form == "fn" else self.mod)

    def for_case(self) -> None:
        if self.per_case:                     # stock at its best: a fresh static compile per case
            import torch._dynamo
            torch._dynamo.reset()
            self.target = self.compiled()

    def inputs(self, s, b, device, seed, dynamic: bool = False) -> dict:
        from perf import bench
        inputs = bench.make_inputs(self.workload, s, b, device, seed=seed, dims=self.dims)
        if dynamic and self.impl != "eager" and not self.per_case:
            bench.mark_dynamic(inputs, self.workload, self.args.dynamic)
        return inputs

    def call(self, inputs: dict):
        from perf import bench
        target = self.target
        if self.form == "fn":
            return lambda: target(**inputs)
        call_args = bench.load_module(self.mod, self.workload, inputs)
        return lambda: target(*call_args)


def _check_case(args, var: _Variant, row: dict, cid: int, device) -> None:
    """The correctness check of one case: fresh inputs each round, against the eager reference."""
    from perf import bench
    s, b = row["seq"], row["batch"]
    fracs, passed, c = [], True, None
    for r in range(args.check_rounds):
        ci = var.inputs(s, b, device, args.seed * 100003 + 1000 * (r + 1) + cid)
        outs = bench.as_tuple(var.call(ci)())
        refs = bench.reference(var.workload, ci, var.fn)
        c = bench.check_outputs(var.workload, s, b, outs, refs)
        fracs.append(min(c["fracs"]) if c["fracs"] else 0.0)
        passed &= c["passed"]
        del ci, outs, refs
    if c is not None:
        row["check"] = {"passed": bool(passed), "min_frac": min(fracs),
                        "rounds": args.check_rounds, "atol": c["atol"], "rtol": c["rtol"]}


def _time_case(args, call, row: dict, device) -> None:
    """GPU time, plain call and profile of one case; ``fused`` from this case's own call (our
    op or kernels ran), whatever compilation or cache served it."""
    from perf import bench
    try:
        info = {}
        gpu, meds, spread = bench.device_time_us(call, device, args.replays, args.blocks,
                                                 info=info)
        row.update(gpu_us=gpu, block_medians=meds, spread=spread, **info)
    except Exception as e:             # e.g. not capturable: still time plainly
        row["error"] = f"graph capture/replay: {type(e).__name__}: {e}"[:500]
    row["plain_us"], row["plain_spread"] = bench.plain_time_us(call, args.plain_runs, device)
    prof = bench.profile_call(call, device, calls=1 if args.no_profile else 3)
    row.update({k: prof[k] for k in bench.FUSION_FIELDS} if args.no_profile else prof)


def _run_case(args, var: _Variant, row: dict, first: bool, v: dict, device) -> None:
    """One case of a variant, into ``row``: first call, check, timings."""
    from torch._dynamo.utils import counters

    from perf import bench
    s, b = row["seq"], row["batch"]
    cid = workload_cases(args, var.workload).index((s, b))
    try:
        var.for_case()
        fused0 = counters["inductor_gqa"].get("blocks_fused", 0)
        inputs = var.inputs(s, b, device, args.seed * 100003 + cid, dynamic=True)
        _, first_s = bench.wall(var.call(inputs), device)
        row["inproc_first_s"] = first_s      # this process, earlier variants' caches
        if first or var.per_case:
            v["compile_s"] = max(v["compile_s"] or 0.0, first_s)
        row["blocks_fused"] = counters["inductor_gqa"].get("blocks_fused", 0) - fused0
        _check_case(args, var, row, cid, device)
        _time_case(args, var.call(inputs), row, device)   # module weights: the timing inputs
        row["status"] = "ok" if row.get("gpu_us") else "error"
        del inputs
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {e}"[:1000]
        traceback.print_exc()
    bench.sync(device)
    log(f"{var.workload.name}/{row['precision']}/{var.impl}/{var.form} {s}x{b}: "
        f"{row['status']} gpu {row.get('gpu_us', float('nan')):.1f} us "
        f"(spread {row.get('spread', 0) * 100:.1f}%) plain "
        f"{row.get('plain_us', float('nan')):.1f} us kernels {row.get('kernels')} "
        f"fused {row.get('fused')} host {row.get('block_host_us') or float('nan'):.1f} us"
        f" check {stats.check_cell(row)} first call {row.get('inproc_first_s', 0):.2f}s"
        + (f" ERROR {row['error'][:200]}" if row.get("error") else ""))


def run_variant(args, workload, precision, form, impl, cases, rows, variants, device):
    """One (workload, precision, form, implementation): a row per case, and its variant."""
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters

    from inductor_gqa import workloads as wl
    from perf import bench

    sized = bench.sized(workload, bench.SMOKE_DIMS if args.smoke else None)
    torch._dynamo.reset()
    v = {"workload": workload.name, "precision": precision, "impl": impl, "form": form,
         "status": "ok", "compile_s": None, "graphs": None, "error": None}
    variants.append(v)

    def new_row(s, b, status):
        return {"kind": "block", "workload": workload.name, "precision": precision,
                "impl": impl, "form": form, "seq": s, "batch": b, "status": status,
                "sol_us": wl.sol_seconds(sized, s, b) * 1e6}

    if over_deadline(args, 0.0 if impl == "eager" else EST["compile_dynamic"]):
        v["status"] = "skipped"
        rows.extend(new_row(s, b, "skipped") for s, b in cases)
        return
    try:
        ctx = bench.implementation(impl, args.mode, args.dynamic)
        compile_ = ctx.__enter__()
    except bench.Unavailable as e:
        v["status"], v["error"] = "unavailable", str(e)
        log(f"{workload.name}/{precision}/{impl}/{form}: unavailable: {e}")
        rows.extend(dict(new_row(s, b, "unavailable"), error=str(e)) for s, b in cases)
        return
    graphs0 = counters["stats"]["unique_graphs"]
    counters["inductor_gqa"].clear()
    try:
        var = _Variant(args, workload, form, impl, compile_, device)
        for i, (s, b) in enumerate(cases):
            row = new_row(s, b, "error")
            rows.append(row)
            if over_deadline(args):
                row["status"] = "skipped"
                continue
            _run_case(args, var, row, i == 0, v, device)
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
        if bench.is_cuda(device):
            torch.cuda.empty_cache()


def run_blocks(args, rows, variants, device, save) -> None:
    import torch

    from inductor_gqa import workloads as wl
    for name in split(args.workloads):
        workload = wl.WORKLOADS[name]
        cases = select_cases(args.cases, workload_cases(args, workload))
        for prec in precisions_of(args, workload):
            if prec != "bf16":
                torch.set_float32_matmul_precision(prec)
            for form in split(args.forms):
                for impl in args.impls_list:
                    run_variant(args, workload, prec, form, impl, cases, rows, variants, device)
                    save()
            torch.set_float32_matmul_precision("highest")


# ------------------------------------------------------------------------------------- first call
def run_first_calls(args, rows, device, save) -> str:
    """First calls in fresh processes, cold then warm cache, for the selected subset. Returns the
    note the results state about the subset."""
    from inductor_gqa import workloads as wl
    from perf import bench, first_call
    if bench.is_cuda(device):
        import torch
        torch.cuda.empty_cache()
    form = split(args.forms)[0]
    picked, total = [], 0
    for name in split(args.workloads):
        w = wl.WORKLOADS[name]
        for prec in precisions_of(args, w):
            total += len(workload_cases(args, w))
            for s, b in first_call_cases(args, w, prec):
                picked.append(f"{name}/{prec} {s}x{b}")
                for impl in args.first_call_impls_list:
                    spec = {"workload": name, "precision": prec, "impl": impl, "form": form,
                            "seq": s, "batch": b, "dynamic": args.dynamic, "mode": args.mode}

                    def left():
                        rest = args.deadline - (time.time() - T0) - 5.0
                        return None if rest < 10 else min(args.first_call_timeout, rest)

                    for r in first_call.cold_and_warm(spec, left, device, args.smoke):
                        rows.append(r)
                        log(f"first call {stats.row_key(r)}: {r['status']} "
                            f"{r.get('first_call_s') or float('nan'):.2f}s (process "
                            f"{r.get('wall_s') or float('nan'):.1f}s, fx cache hits "
                            f"{r.get('fx_cache_hits')})"
                            + (f" ERROR {r['error'][:300]}" if r.get("error") else ""))
                    save()
    note = (f"first calls selected for {len(picked)} of {total} (workload/precision, case) "
            f"selections: {', '.join(picked) or 'none'}; implementations "
            f"{', '.join(args.first_call_impls_list)}, form {form}."
            + (" A representative subset: every case in fresh processes, cold and warm, does "
               "not fit the 10-minute command." if len(picked) < total else ""))
    log(note)
    return note


# ------------------------------------------------------------------------------------------- main
def write_json(path: str, doc: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=False)
    os.replace(tmp, path)


TIMING_GPU = (
    "gpu_us: median over blocks x replays of CUDA-graph replays, events around each replay, back "
    "to back (warm L2), each graph holding calls_per_graph calls (a replay of at least 200 us) "
    "and its time divided by that; spread: (max-min)/median of the block medians; plain_us: "
    "median over plain_runs plain calls, each from an idle device (L2 flushed, synchronized), "
    "wall time until the device is done; first_call_s: the first call of a new shape in a fresh "
    "process (inputs ready), empty cache directory (cold) and again with it warm")
TIMING_CPU = ("CPU stand-ins: gpu_us is the median wall time of back-to-back calls in the same "
              "blocks; plain_us as on a GPU (wall time of one call); first calls as on a GPU")


def _device(args) -> Optional[str]:
    """The device of this run ("cuda" or "cpu"), or None (after saying why) when there is
    none it may run on."""
    import torch
    cuda = torch.cuda.is_available() and args.device != "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        print("perf.run: --device cuda but no CUDA device", file=sys.stderr)
        return None
    if not cuda and not args.smoke:
        print("perf.run needs a CUDA GPU (or --smoke for the tiny end-to-end run)",
              file=sys.stderr)
        return None
    return "cuda" if cuda else "cpu"


def _settings(args, floor, cuda: bool) -> dict:
    settings = {k: getattr(args, k) for k in (
        "suites", "workloads", "cases", "impls", "forms", "precisions", "dynamic", "mode",
        "replays", "blocks", "plain_runs", "check_rounds", "seed", "deadline", "smoke",
        "first_call_cases", "first_call_timeout", "model_attn", "model_layers", "model_tasks",
        "plain_tolerance", "first_call_tolerance", "first_call_slack", "train_options")}
    settings.update(
        first_call_impls=args.first_call_impls_list, models=args.models_list,
        model_shapes=[f"{b}x{s}" for b, s in args.model_shapes_list],
        model_impls=args.model_impls_list, noise_floor=floor, noise_k=args.noise_k,
        train_cases=[f"{s}x{b}" for s, b in args.train_cases_list],
        train_impls=args.train_impls_list, estimate_s=estimate(args),
        timing=TIMING_GPU if cuda else TIMING_CPU)
    return settings


def _run_suites(args, doc: dict, device: str, save) -> None:
    import torch
    rows, variants, settings = doc["rows"], doc["variants"], doc["settings"]
    with torch.no_grad():
        if "blocks" in args.suites_list:
            run_blocks(args, rows, variants, device, save)
        if "first-call" in args.suites_list:
            settings["first_call_note"] = run_first_calls(args, rows, device, save)
        if "models" in args.suites_list:
            from perf import models
            models.run_suite(args, rows, variants, device,
                             lambda reserve=0.0: over_deadline(args, reserve), log, save)
    if "train" in args.suites_list:
        from perf import train
        with torch.enable_grad():
            train.run_blocks(args, rows, variants, device,
                             lambda reserve=0.0: over_deadline(args, reserve), log, save)


def _gate(args, doc: dict, baseline, floor) -> dict:
    """The gate over the finished run; a deadline cut is recorded first (the gate fails it)."""
    from perf import gate
    skipped = sum(1 for r in doc["rows"] if r["status"] == "skipped" and not r.get("error"))
    doc["deadline_cut"] = {"deadline_s": args.deadline, "skipped": skipped} if skipped else None
    gated = None if args.gate_impls == "all" else split(args.gate_impls)
    return gate.gate(doc, baseline, floor=floor, k=args.noise_k, impls=gated,
                     scope=_selection(args), plain_tol=args.plain_tolerance,
                     first_call_tol=args.first_call_tolerance,
                     first_call_slack_s=args.first_call_slack)


def _write_outputs(doc: dict, out_dir: str, save) -> str:
    save()
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(stats.markdown_report(doc))
    wrote = "results.json, results.md"
    try:
        from perf import plot
        plot.plot(doc, os.path.join(out_dir, "perf.png"))
        wrote += ", perf.png"
    except Exception as e:
        log(f"plot failed: {type(e).__name__}: {e}")
    return wrote


def _print_report(doc: dict) -> None:
    rows = doc["rows"]
    problems = [r for r in rows if r["status"] in ("error",) or r.get("error")]
    for r in problems[:20]:
        print(f"problem {stats.row_key(r)}: {r['status']} {(r.get('error') or '')[:300]}")
    for v in doc["variants"]:
        if v["status"] != "ok":
            print(f"variant {v.get('workload') or v.get('model')}/"
                  f"{v.get('precision') or v.get('attn')}/{v['impl']}/"
                  f"{v.get('form') or v.get('seq')}: {v['status']} {v.get('error') or ''}")
    print(stats.gate_text(doc["gate"]))


def _print_tables(doc: dict) -> None:
    rows = doc["rows"]
    if any(stats.kind(r) == "block" for r in rows):
        print(stats.summary_table(stats.summarize(rows)))
    if doc["host_time"]:
        ht = doc["host_time"]
        print(f"\nblock host time {ht['key']}: {ht['us']:.1f} us (target <= "
              f"{ht['target_us']:.0f} us: {'met' if ht['met'] else 'NOT met'})")
    if any(stats.kind(r) == "first_call" for r in rows):
        print("\n" + stats.first_call_table(rows))
    if any(stats.kind(r) == "model" for r in rows):
        print("\n" + stats.model_table(rows))
    if any(stats.kind(r) == "train_block" for r in rows):
        print("\n" + stats.train_table(rows))


def main(argv=None) -> int:
    args = parse_args(argv)
    print(estimate_text(args), flush=True)
    if args.estimate:
        return 0
    device = _device(args)
    if device is None:
        return 2
    import torch._functorch.config
    import torch._inductor.config

    import inductor_gqa  # noqa: F401  (registers the op and, when present, the backend)
    from perf import first_call

    # compile afresh in this process, so that counters["inductor_gqa"] sees every compilation
    # (a cache hit skips the pass); the first-call suite measures the caches in subprocesses
    torch._inductor.config.fx_graph_cache = False
    torch._functorch.config.enable_autograd_cache = False
    if args.smoke and device == "cpu":
        first_call.smoke_config()

    env = collect_env(device)
    default_out = (os.path.join(REPO, "out", "smoke") if args.smoke
                   else os.path.join(REPO, "perf", "results", slug(env["gpu"])))
    out_dir = args.out or os.environ.get("OUT") or default_out
    os.makedirs(out_dir, exist_ok=True)
    json_path = os.path.join(out_dir, "results.json")
    baseline = None
    if args.baseline:
        with open(args.baseline) as f:
            baseline = json.load(f)
    floor = args.noise_floor
    if floor is None:
        floor = (baseline or {}).get("settings", {}).get("noise_floor",
                                                         stats.DEFAULT_NOISE_FLOOR)
    doc = {"schema": stats.SCHEMA, "env": env, "settings": _settings(args, floor, device == "cuda"),
           "expected": expected_rows(args), "rows": [], "variants": []}
    log(f"{env['gpu']} torch {env['torch']} triton {env['triton']} transformers "
        f"{env['transformers']} commit {env['git_commit']} -> {out_dir}")

    def save():
        write_json(json_path, doc)

    _run_suites(args, doc, device, save)
    stats.add_ratios(doc["rows"])
    doc["wall_s"] = time.time() - T0
    doc["gate"] = _gate(args, doc, baseline, floor)
    host_case = (("W075", "high") + SMOKE_CASES["W075"][0]) if args.smoke else stats.HOST_CASE
    doc["host_time"] = stats.host_time(doc["rows"], host_case)
    # the kernel configs are chosen while compiling, from the GPU's measured table: name it
    doc["config_table"] = _config_table()
    wrote = _write_outputs(doc, out_dir, save)
    _print_report(doc)
    # 3: cut by the deadline (the gate fails it too); 1: the gate failed
    rc = 3 if doc["deadline_cut"] else (0 if doc["gate"]["ok"] else 1)
    if doc["deadline_cut"]:
        print(f"INCOMPLETE: work skipped after the {args.deadline:.0f}s deadline")
    print(f"\nwrote {out_dir}/{wrote} in {doc['wall_s']:.0f}s (exit {rc})\n")
    _print_tables(doc)
    return rc


if __name__ == "__main__":
    sys.exit(main())
