"""Pure-Python parts of the perf job: row kinds and keys, statistics, noise threshold, the gate,
summaries, tables, schema.

Nothing here needs a GPU (or torch); tests/perf/ covers it on CPU.

Rows. Every row of a result document has a ``kind``; its key fields identify it within a run and
across runs (the gate matches a run's rows with a baseline's by key):

| kind | key fields | what it measures |
| --- | --- | --- |
| ``block`` | workload, precision, impl, form, seq, batch | one attention block (W075/W092) |
| ``first_call`` | workload, precision, impl, form, seq, batch, cache | the first call of a new shape in a fresh process, cache ``cold`` or ``warm`` |
| ``model`` | model, attn, task, impl, seq, batch | a whole model; task ``prefill`` (forward, no_grad) now, ``train`` (forward + backward, peak memory) reserved |

A new kind (or task) needs an entry in KINDS (and METRICS for the gate); the gate and the tables
handle the rest by kind.
"""

from __future__ import annotations

import math
import statistics
from typing import Iterable, Optional

SCHEMA = "inductor_gqa.perf/2"
# schema 1: block rows only, no kind field, impl "stock" = stock torch.compile with the job's
# dynamic shapes, plain_us timed with CUDA events around the call
OLD_SCHEMAS = ("inductor_gqa.perf/1",)

# Implementations, in table order. stock_static: torch.compile(f, dynamic=False), compiled per
# case (stock at its best); stock_dynamic: torch.compile(f) with the same dynamic shapes as ours;
# backend: torch.compile(f, backend="inductor_gqa"); install: plain torch.compile after
# inductor_gqa.install().
IMPLS = ("eager", "stock_static", "stock_dynamic", "backend", "install")
IMPL_ALIASES = {"stock": "stock_dynamic"}      # schema 1's name
IMPL_LABELS = {"eager": "eager", "stock_static": "torch.compile static",
               "stock_dynamic": "torch.compile dynamic", "backend": "backend=inductor_gqa",
               "install": "install()"}
OURS = ("backend", "install")
STOCKS = ("stock_static", "stock_dynamic")
FORMS = ("fn", "module")

KINDS = {
    "block": ("workload", "precision", "impl", "form", "seq", "batch"),
    "first_call": ("workload", "precision", "impl", "form", "seq", "batch", "cache"),
    "model": ("model", "attn", "task", "impl", "seq", "batch"),
    "train_block": ("workload", "impl", "seq", "batch"),
}
# per kind: the time the baseline gate compares, and whether a row of that kind reports fusion
METRICS = {"block": "gpu_us", "model": "gpu_us", "first_call": "first_call_s",
           "train_block": "gpu_us"}
TASKS = ("prefill", "train")       # "train": forward + backward with peak memory (perf/train.py)

DEFAULT_NOISE_FLOOR = 0.05   # smallest slowdown the gate ever calls a regression (5%)
DEFAULT_NOISE_K = 2.0        # multiple of the measured spread that still counts as noise
DEFAULT_PLAIN_TOL = 0.05     # ours' plain call may be this much slower than stock's best
DEFAULT_FIRST_CALL_TOL = 0.25   # first call: allowed relative growth over the baseline ...
DEFAULT_FIRST_CALL_SLACK_S = 2.0   # ... plus this many seconds (process and compile noise)
HOST_TARGET_US = 30.0        # the block's own host time at W075 131x1 (issue target)
HOST_CASE = ("W075", "high", 131, 1)


# ------------------------------------------------------------------------------------- statistics
def median(xs: Iterable[float]) -> float:
    xs = [float(x) for x in xs]
    if not xs:
        raise ValueError("median of nothing")
    return statistics.median(xs)


def rel_spread(block_medians: Iterable[float]) -> float:
    """Relative spread of repeated medians: (max - min) / median. 0 for fewer than two values."""
    xs = [float(x) for x in block_medians]
    if len(xs) < 2:
        return 0.0
    m = median(xs)
    return (max(xs) - min(xs)) / m if m > 0 else 0.0


def summarize_blocks(blocks: list[list[float]]) -> tuple[float, list[float], float]:
    """Timings in blocks of repeats -> (median over all samples, per-block medians, spread)."""
    flat = [x for b in blocks for x in b]
    meds = [median(b) for b in blocks if b]
    return median(flat), meds, rel_spread(meds)


def threshold(spread_base: Optional[float], spread_cur: Optional[float],
              floor: float = DEFAULT_NOISE_FLOOR, k: float = DEFAULT_NOISE_K) -> float:
    """Allowed relative slowdown for one case: max(floor, k * max(spread_base, spread_cur))."""
    s = max(spread_base or 0.0, spread_cur or 0.0)
    return max(floor, k * s)


def floor_for(floor, row_or_workload) -> float:
    """The noise floor of one row: a number, or a {workload: number} mapping ("models" for model
    rows)."""
    if isinstance(floor, dict):
        if isinstance(row_or_workload, dict):
            name = row_or_workload.get("workload") or "models"
        else:
            name = row_or_workload
        return floor.get(name, DEFAULT_NOISE_FLOOR)
    return floor


def derive_floor(run_a: dict, run_b: dict, quantile: float = 0.95,
                 impls: Optional[Iterable[str]] = None,
                 workload: Optional[str] = None) -> dict:
    """Run-to-run noise from two full runs of the same code on the same kind of GPU.

    For every block or model row timed OK in both, r = |t_b / t_a - 1| (GPU time). Returns the
    distribution and a suggested floor: the `quantile` of r rounded up to the next 0.5%, at
    least 1%.
    """
    a = index_rows(run_a)
    b = index_rows(run_b)
    impls = set(impls) if impls else None
    rs = []
    for key, ra in a.items():
        rb = b.get(key)
        if kind(ra) not in ("block", "model"):
            continue
        if rb is None or ra.get("status") != "ok" or rb.get("status") != "ok":
            continue
        if impls and ra["impl"] not in impls:
            continue
        if workload and (ra.get("workload") or "models") != workload:
            continue
        if not ra.get("gpu_us") or not rb.get("gpu_us"):
            continue
        rs.append(abs(rb["gpu_us"] / ra["gpu_us"] - 1.0))
    if not rs:
        return {"n": 0, "suggested_floor": DEFAULT_NOISE_FLOOR}
    rs.sort()
    q = rs[min(len(rs) - 1, int(math.ceil(quantile * len(rs))) - 1)]
    return {"n": len(rs), "p50": rs[len(rs) // 2], f"p{int(quantile * 100)}": q, "max": rs[-1],
            "suggested_floor": max(0.01, math.ceil(q * 200) / 200)}


# ------------------------------------------------------------------------------------------- rows
def kind(row: dict) -> str:
    return row.get("kind", "block")


def case_label(seq: int, batch: int) -> str:
    return f"S{seq}xB{batch}"


def row_key(row: dict) -> str:
    """A row's identity: block rows keep schema 1's form (W075/high/backend/fn/S128xB4), other
    kinds are prefixed with the kind."""
    k = kind(row)
    fields = KINDS[k]
    parts = []
    for f in fields:
        if f == "seq":
            parts.append(case_label(row["seq"], row["batch"]))
        elif f != "batch":
            parts.append(str(row[f]))
    return "/".join(parts if k == "block" else [k] + parts)


def peer(by: dict, row: dict, impl: str) -> Optional[dict]:
    """The row of another implementation for the same case (same kind and other key fields)."""
    return by.get(row_key(dict(row, impl=impl)))


def index_rows(result: dict) -> dict:
    return {row_key(r): r for r in result.get("rows", [])}


def upgrade(doc: dict) -> dict:
    """A schema-1 document in schema 2's terms: block rows, stock -> stock_dynamic. Its plain_us
    were timed with CUDA events (not wall time to a synchronize): kept as plain_us_events."""
    if doc.get("schema") not in OLD_SCHEMAS:
        return doc
    out = dict(doc, schema=SCHEMA, upgraded_from=doc.get("schema"), rows=[])
    for r in doc.get("rows", []):
        r = dict(r, kind="block", impl=IMPL_ALIASES.get(r["impl"], r["impl"]))
        if "plain_us" in r:
            r["plain_us_events"] = r.pop("plain_us")
        out["rows"].append(r)
    out["variants"] = [dict(v, impl=IMPL_ALIASES.get(v["impl"], v["impl"]))
                       for v in doc.get("variants", [])]
    return out


def best_stock_plain(by: dict, row: dict) -> Optional[tuple[str, float]]:
    """(impl, plain_us) of the faster stock row for the same case, if any was timed."""
    best = None
    for s in STOCKS:
        p = peer(by, row, s)
        if p and p.get("plain_us"):
            if best is None or p["plain_us"] < best[1]:
                best = (s, p["plain_us"])
    return best


def add_ratios(rows: list[dict]) -> None:
    """Per block/model row, in place: speedup_vs_<impl> (that impl's gpu_us over this row's; > 1
    is faster) for eager and both stock settings, plain_vs_stock (this row's plain_us over the
    faster stock row's; < 1 is faster) and, for block rows, frac_sol."""
    by = {row_key(r): r for r in rows}
    for r in rows:
        if kind(r) not in ("block", "model", "train_block"):
            continue
        for other in ("eager",) + STOCKS:
            ref = peer(by, r, other)
            ok = ref is not None and r.get("gpu_us") and ref.get("gpu_us")
            r[f"speedup_vs_{other}"] = (ref["gpu_us"] / r["gpu_us"]) if ok else None
        best = best_stock_plain(by, r)
        r["plain_vs_stock"] = (r["plain_us"] / best[1]) if best and r.get("plain_us") else None
        if kind(r) == "block":
            r["frac_sol"] = ((r["sol_us"] / r["gpu_us"])
                             if r.get("gpu_us") and r.get("sol_us") else None)


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def summarize(rows: list[dict]) -> list[dict]:
    """Block rows: means over cases per (workload, precision, impl, form).

    gpu_us / plain_us / sol_us: arithmetic means over the cases timed OK; vs_<stock>: mean GPU
    time over that stock row's mean on the same cases (> 1 is slower); plain_vs_stock: mean plain
    time over the faster stock row's mean plain time on the same cases; frac_sol: mean SOL / mean
    time; checks: passed / checked.
    """
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if kind(r) == "block":
            groups.setdefault((r["workload"], r["precision"], r["impl"], r["form"]), []).append(r)
    by = {row_key(r): r for r in rows}
    out = []
    for (w, p, impl, form), rs in groups.items():
        ok = [r for r in rs if r.get("status") == "ok" and r.get("gpu_us")]
        checked = [r for r in rs if r.get("check")]
        passed = [r for r in checked if r["check"].get("passed")]
        s = {"workload": w, "precision": p, "impl": impl, "form": form, "cases": len(rs),
             "timed": len(ok), "checked": len(checked), "passed": len(passed),
             "errors": sum(1 for r in rs if r.get("status") == "error"),
             "gpu_us": None, "plain_us": None, "sol_us": None, "frac_sol": None,
             "vs_stock_static": None, "vs_stock_dynamic": None, "plain_vs_stock": None}
        if ok:
            s["gpu_us"] = statistics.fmean(r["gpu_us"] for r in ok)
            s["sol_us"] = statistics.fmean(r["sol_us"] for r in ok)
            s["frac_sol"] = s["sol_us"] / s["gpu_us"]
            s["plain_us"] = _mean(r.get("plain_us") for r in ok)
            for st in STOCKS:
                pairs = [(r["gpu_us"], peer(by, r, st)["gpu_us"]) for r in ok
                         if (peer(by, r, st) or {}).get("gpu_us")]
                if pairs:
                    s[f"vs_{st}"] = (statistics.fmean(a for a, _ in pairs)
                                     / statistics.fmean(b for _, b in pairs))
            pairs = [(r["plain_us"], best_stock_plain(by, r)[1]) for r in ok
                     if r.get("plain_us") and best_stock_plain(by, r)]
            if pairs:
                s["plain_vs_stock"] = (statistics.fmean(a for a, _ in pairs)
                                       / statistics.fmean(b for _, b in pairs))
        out.append(s)
    order = {i: n for n, i in enumerate(IMPLS)}
    out.sort(key=lambda s: (s["workload"], s["precision"] != "highest", order.get(s["impl"], 9),
                            s["form"]))
    return out


def host_time(rows: list[dict], case: tuple = HOST_CASE) -> Optional[dict]:
    """The block's own host time at ``case`` (workload, precision, S, B; W075 "high" 131x1 by
    default) for our backend (function form first): the row's block_host_us and its source."""
    w, p, s, b = case
    cands = [r for r in rows if kind(r) == "block" and r.get("workload") == w
             and r.get("precision") == p and r.get("seq") == s and r.get("batch") == b
             and r.get("impl") in OURS and r.get("block_host_us") is not None]
    if not cands:
        return None
    cands.sort(key=lambda r: (r["impl"] != "backend", r["form"] != "fn"))
    r = cands[0]
    return {"key": row_key(r), "us": r["block_host_us"], "scope": r.get("host_scope"),
            "timer": r.get("host_timer"), "target_us": HOST_TARGET_US,
            "met": r["block_host_us"] <= HOST_TARGET_US}


# ----------------------------------------------------------------------------------------- format
def _f(x, fmt="{:.1f}", none="-"):
    return none if x is None else fmt.format(x)


def md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def check_cell(r: dict) -> str:
    c = r.get("check")
    if r.get("status") not in ("ok", None) and not c:
        return r.get("status", "-")
    if not c:
        return "-"
    return ("pass" if c.get("passed") else "FAIL") + f" {c.get('min_frac', 0) * 100:.2f}%"


def summary_table(summary: list[dict]) -> str:
    header = ["workload", "prec", "impl", "form", "GPU us", "plain us", "plain/stock",
              "GPU/stock static", "GPU/stock dyn", "SOL frac", "checks"]
    rows = []
    for s in summary:
        checks = f"{s['passed']}/{s['checked']}" + (" FAIL" if s["passed"] < s["checked"] else "")
        if s["errors"]:
            checks += f" ({s['errors']} err)"
        rows.append([s["workload"], s["precision"], IMPL_LABELS.get(s["impl"], s["impl"]),
                     s["form"], _f(s["gpu_us"]), _f(s["plain_us"]),
                     _f(s["plain_vs_stock"], "{:.3f}"), _f(s["vs_stock_static"], "{:.3f}"),
                     _f(s["vs_stock_dynamic"], "{:.3f}"), _f(s["frac_sol"], "{:.3f}"), checks])
    return md_table(header, rows)


def _fused_cell(r: dict) -> str:
    return {True: "yes", False: "no"}.get(r.get("fused"), "-")


def case_table(rows: list[dict]) -> str:
    header = ["case", "impl", "form", "GPU us", "spread", "plain us", "plain/stock",
              "x eager", "x stock static", "x stock dyn", "SOL us", "SOL frac", "kernels",
              "fused", "host us", "check"]
    out = []
    for r in rows:
        status = r.get("status")
        out.append([case_label(r["seq"], r["batch"]), IMPL_LABELS.get(r["impl"], r["impl"]),
                    r["form"], _f(r.get("gpu_us")) if status == "ok" else status,
                    _f(r.get("spread"), "{:.1%}"), _f(r.get("plain_us")),
                    _f(r.get("plain_vs_stock"), "{:.2f}"),
                    _f(r.get("speedup_vs_eager"), "{:.2f}"),
                    _f(r.get("speedup_vs_stock_static"), "{:.2f}"),
                    _f(r.get("speedup_vs_stock_dynamic"), "{:.2f}"), _f(r.get("sol_us")),
                    _f(r.get("frac_sol"), "{:.3f}"), _f(r.get("kernels"), "{}"), _fused_cell(r),
                    _f(r.get("block_host_us")), check_cell(r)])
    return md_table(header, out)


def first_call_table(rows: list[dict]) -> str:
    """First calls per case and implementation: cold cache / warm cache, seconds."""
    fc = [r for r in rows if kind(r) == "first_call"]
    cases: dict[tuple, dict] = {}
    impls = []
    for r in fc:
        c = cases.setdefault((r["workload"], r["precision"], r["form"], r["seq"], r["batch"]), {})
        if r["impl"] not in impls:
            impls.append(r["impl"])
        val = (_f(r.get("first_call_s"), "{:.1f}") if r.get("status") == "ok"
               else r.get("status", "-"))
        c.setdefault(r["impl"], {})[r["cache"]] = val
    order = {i: n for n, i in enumerate(IMPLS)}
    impls.sort(key=lambda i: order.get(i, 9))
    header = ["workload", "prec", "form", "case"] + [
        f"{IMPL_LABELS.get(i, i)} cold / warm s" for i in impls]
    body = []
    for (w, p, form, s, b), c in cases.items():
        body.append([w, p, form, case_label(s, b)] + [
            f"{c.get(i, {}).get('cold', '-')} / {c.get(i, {}).get('warm', '-')}" for i in impls])
    return md_table(header, body)


def model_table(rows: list[dict]) -> str:
    header = ["model", "attn", "task", "case", "impl", "GPU us", "spread", "plain us",
              "plain/stock", "x eager", "x stock", "fused layers", "peak MiB", "check"]
    body = []
    for r in rows:
        if kind(r) != "model":
            continue
        status = r.get("status")
        fused = ("-" if r.get("layers") is None or r["impl"] not in OURS
                 else f"{r.get('fused_layers') or 0}/{r['layers']}")
        body.append([r["model"], r["attn"], r["task"], case_label(r["seq"], r["batch"]),
                     IMPL_LABELS.get(r["impl"], r["impl"]),
                     _f(r.get("gpu_us")) if status == "ok" else status,
                     _f(r.get("spread"), "{:.1%}"), _f(r.get("plain_us")),
                     _f(r.get("plain_vs_stock"), "{:.2f}"),
                     _f(r.get("speedup_vs_eager"), "{:.2f}"),
                     _f(r.get("speedup_vs_stock_static") or r.get("speedup_vs_stock_dynamic"),
                        "{:.2f}"),
                     fused, _f(r.get("peak_mib"), "{:.0f}"), check_cell(r)])
    return md_table(header, body)


def train_table(rows: list[dict]) -> str:
    header = ["case", "impl", "step GPU us", "spread", "plain us", "x eager", "x stock",
              "peak MiB", "saved MiB", "fwd grad / no_grad us", "fused", "grad check"]
    body = []
    for r in rows:
        if kind(r) != "train_block":
            continue
        status = r.get("status")
        fwd = (f"{_f(r.get('fwd_grad_us'))} / {_f(r.get('fwd_nograd_us'))}"
               if r.get("fwd_grad_us") else "-")
        body.append([case_label(r["seq"], r["batch"]), IMPL_LABELS.get(r["impl"], r["impl"]),
                     _f(r.get("gpu_us")) if status == "ok" else status,
                     _f(r.get("spread"), "{:.1%}"), _f(r.get("plain_us")),
                     _f(r.get("speedup_vs_eager"), "{:.2f}"),
                     _f(r.get("speedup_vs_stock_static"), "{:.2f}"),
                     _f(r.get("peak_mib"), "{:.0f}"), _f(r.get("saved_mib"), "{:.0f}"), fwd,
                     "-" if r["impl"] not in OURS else ("yes" if r.get("fused") else "no"),
                     check_cell(r)])
    return md_table(header, body)


GATE_TEXT_FAILURES = 60     # failures printed in full; the JSON keeps all of them


def gate_text(g: dict) -> str:
    """The gate's verdict (perf/gate.py) as printed lines."""
    fl = g["noise_floor"]
    fl = (", ".join(f"{w} {v * 100:.1f}%" for w, v in sorted(fl.items())) if isinstance(fl, dict)
          else f"{fl * 100:.1f}%")
    base = (f"{g['compared']} baseline rows compared, floor {fl}, k {g['noise_k']}"
            if g.get("baseline") else "no baseline")
    targets = ("targets applied" if g.get("targets_applied", True)
               else "targets not applied")
    lines = [f"gate: {'PASS' if g['ok'] else 'FAIL'} ({base}; {targets}; implementations "
             f"{g['impls']}, plain calls within {g.get('plain_tol', DEFAULT_PLAIN_TOL) * 100:.0f}%"
             f" of stock's)"]
    lines += [f"  note: {n}" for n in g.get("notes", [])]
    limits = g.get("thresholds", {})
    lines += [f"  {name}: {x:.2f}x stock (at least {limits.get(name.split('/')[0], 0):.2f}x)"
              for name, x in sorted(g.get("figures", {}).items())]
    if g.get("outside"):
        lines.append(f"  {g['outside']} baseline rows outside this run's selection, not compared")
    fails = g["failures"]
    lines += [f"  FAIL {f}" for f in fails[:GATE_TEXT_FAILURES]]
    if len(fails) > GATE_TEXT_FAILURES:
        lines.append(f"  ... {len(fails) - GATE_TEXT_FAILURES} more failures (results.json)")
    lines += [f"  warning (not gated) {w}" for w in g.get("warnings", [])]
    for e in g["improvements"]:
        unit = e.get("unit", "us")
        lines.append(f"  faster {e['key']}: {e['base']:.1f} -> {e['cur']:.1f} {unit} "
                     f"({(e['ratio'] - 1) * 100:+.1f}%)")
    return "\n".join(lines)


def markdown_report(result: dict) -> str:
    env, st = result.get("env", {}), result.get("settings", {})
    rows = result.get("rows", [])
    parts = [f"# Perf results: {env.get('gpu', '?')}", "",
             f"torch {env.get('torch')}, triton {env.get('triton')}, transformers "
             f"{env.get('transformers')}, commit {env.get('git_commit')}, "
             f"dynamic={st.get('dynamic')}, mode={st.get('mode')}, "
             f"{st.get('blocks')}x{st.get('replays')} timed replays, "
             f"{st.get('plain_runs')} plain calls, {st.get('check_rounds')} check rounds.", ""]
    if st.get("timing"):
        parts += [f"Timing: {st['timing']}", ""]
    if st.get("smoke"):
        parts += ["**Smoke run** (tiny sizes; on a CPU, wall-clock timers stand in for CUDA-graph "
                  "replay): the figures test the job, not the code.", ""]
    if any(kind(r) == "block" for r in rows):
        parts += ["## Summary (block rows, means over cases)", "",
                  summary_table(summarize(rows)), ""]
    ht = result.get("host_time") or host_time(rows)
    if ht:
        parts += [f"Block host time (first to last kernel launch of the block, profiler) at "
                  f"{ht['key']}: **{ht['us']:.1f} us** (target <= {ht['target_us']:.0f} us: "
                  f"{'met' if ht['met'] else 'not met'}; scope {ht['scope']}, "
                  f"{ht['timer']}).", ""]
    if any(kind(r) == "first_call" for r in rows):
        fc = st.get("first_call_note") or ""
        parts += ["## First calls (fresh process, seconds: empty cache / warm on-disk caches)",
                  "", fc, "", first_call_table(rows), ""]
    if any(kind(r) == "model" for r in rows):
        parts += ["## Models", "", model_table(rows), ""]
    if any(kind(r) == "train_block" for r in rows):
        parts += ["## Training steps, W092's block (forward + backward)", "",
                  train_table(rows), ""]
    if result.get("gate"):
        parts += ["## Gate", "", "```", gate_text(result["gate"]), "```", ""]
    if result.get("variants"):
        vrows = [[v.get("workload") or v.get("model"), v.get("precision") or v.get("attn"),
                  IMPL_LABELS.get(v["impl"], v["impl"]), v.get("form") or v.get("task", "-"),
                  v.get("status"), _f(v.get("compile_s"), "{:.1f}"), _f(v.get("graphs"), "{}"),
                  (v.get("error") or "")[:120]] for v in result["variants"]]
        parts += ["## Variants", "", md_table(["workload/model", "prec/attn", "impl",
                                               "form/task", "status", "first call s",
                                               "graphs", "note"], vrows), ""]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if kind(r) == "block":
            groups.setdefault((r["workload"], r["precision"]), []).append(r)
    for (w, p), rs in groups.items():
        parts += [f"## {w} ({p})", "", case_table(rs), ""]
    return "\n".join(parts)


# ----------------------------------------------------------------------------------------- schema
REQUIRED_OK = {"block": ("gpu_us", "sol_us", "spread"), "first_call": ("first_call_s",),
               "model": ("plain_us",), "train_block": ("plain_us",)}


def validate(result: dict) -> list[str]:
    """Problems with a result document (empty list = valid)."""
    errs = []
    if result.get("schema") != SCHEMA:
        errs.append(f"schema is {result.get('schema')!r}, expected {SCHEMA!r}")
    for field in ("env", "settings", "rows"):
        if field not in result:
            errs.append(f"missing {field}")
    for f in ("gpu", "torch", "triton", "git_commit"):
        if f not in result.get("env", {}):
            errs.append(f"env.{f} missing")
    for i, r in enumerate(result.get("rows", [])):
        k = kind(r)
        if k not in KINDS:
            errs.append(f"rows[{i}].kind {k!r} unknown")
            continue
        for f in KINDS[k] + ("status",):
            if f not in r:
                errs.append(f"rows[{i}].{f} missing")
        if r.get("status") == "ok":
            for f in REQUIRED_OK[k]:
                if not isinstance(r.get(f), (int, float)):
                    errs.append(f"rows[{i}].{f} not a number")
    for i, e in enumerate(result.get("expected") or []):
        if kind(e) not in KINDS or any(f not in e for f in KINDS[kind(e)]):
            errs.append(f"expected[{i}] is not a row key")
    return errs
