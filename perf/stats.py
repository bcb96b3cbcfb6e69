"""Pure-Python parts of the perf job: statistics, noise threshold, gate, summaries, tables, schema.

Nothing here needs a GPU (or torch); tests/perf/ covers it on CPU.
"""

from __future__ import annotations

import math
import statistics
from typing import Callable, Iterable, Optional

SCHEMA = "inductor_gqa.perf/1"

# Implementations, in table order. "stock" is plain torch.compile; "backend" is
# torch.compile(backend="inductor_gqa"); "install" is plain torch.compile after inductor_gqa.install().
IMPLS = ("eager", "stock", "backend", "install")
IMPL_LABELS = {"eager": "eager", "stock": "torch.compile", "backend": "backend=inductor_gqa",
               "install": "install()"}
OURS = ("backend", "install")
FORMS = ("fn", "module")

DEFAULT_NOISE_FLOOR = 0.05   # smallest slowdown the gate ever calls a regression (5%)
DEFAULT_NOISE_K = 2.0        # multiple of the measured spread that still counts as noise

ROW_KEYS = ("workload", "precision", "impl", "form", "seq", "batch", "status")


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


def floor_for(floor, workload: str) -> float:
    """The noise floor of one workload: a number, or a {workload: number} mapping."""
    if isinstance(floor, dict):
        return floor.get(workload, DEFAULT_NOISE_FLOOR)
    return floor


def derive_floor(run_a: dict, run_b: dict, quantile: float = 0.95,
                 impls: Optional[Iterable[str]] = None,
                 workload: Optional[str] = None) -> dict:
    """Run-to-run noise from two full runs of the same code on the same kind of GPU.

    For every case timed OK in both, r = |t_b / t_a - 1| (GPU time). Returns the distribution and a
    suggested floor: the `quantile` of r rounded up to the next 0.5%, at least 1%.
    """
    a = index_rows(run_a)
    b = index_rows(run_b)
    impls = set(impls) if impls else None
    rs = []
    for key, ra in a.items():
        rb = b.get(key)
        if rb is None or ra.get("status") != "ok" or rb.get("status") != "ok":
            continue
        if impls and ra["impl"] not in impls:
            continue
        if workload and ra["workload"] != workload:
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
def case_label(seq: int, batch: int) -> str:
    return f"S{seq}xB{batch}"


def row_key(row: dict) -> str:
    return "/".join((row["workload"], row["precision"], row["impl"], row["form"],
                     case_label(row["seq"], row["batch"])))


def index_rows(result: dict) -> dict:
    return {row_key(r): r for r in result.get("rows", [])}


def add_ratios(rows: list[dict]) -> None:
    """Fill speedup_vs_eager / speedup_vs_stock (same workload, precision, form, case) in place."""
    by = {row_key(r): r for r in rows}
    for r in rows:
        for other, field in (("eager", "speedup_vs_eager"), ("stock", "speedup_vs_stock")):
            ref = by.get(row_key(dict(r, impl=other)))
            ok = (ref is not None and r.get("gpu_us") and ref.get("gpu_us"))
            r[field] = (ref["gpu_us"] / r["gpu_us"]) if ok else None
        r["frac_sol"] = (r["sol_us"] / r["gpu_us"]) if r.get("gpu_us") and r.get("sol_us") else None


def summarize(rows: list[dict]) -> list[dict]:
    """Means over cases per (workload, precision, impl, form).

    gpu_us / sol_us: arithmetic means over the cases timed OK; vs_stock: mean time over the stock
    compile's mean time on the same cases (> 1 is slower); frac_sol: mean SOL / mean time; checks:
    passed / checked.
    """
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
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
             "gpu_us": None, "plain_us": None, "sol_us": None, "vs_stock": None,
             "frac_sol": None}
        if ok:
            s["gpu_us"] = statistics.fmean(r["gpu_us"] for r in ok)
            s["sol_us"] = statistics.fmean(r["sol_us"] for r in ok)
            s["frac_sol"] = s["sol_us"] / s["gpu_us"]
            plain = [r["plain_us"] for r in ok if r.get("plain_us")]
            s["plain_us"] = statistics.fmean(plain) if plain else None
            pairs = [(r["gpu_us"], by[row_key(dict(r, impl="stock"))]["gpu_us"]) for r in ok
                     if by.get(row_key(dict(r, impl="stock")), {}).get("gpu_us")]
            if pairs:
                s["vs_stock"] = (statistics.fmean(a for a, _ in pairs)
                                 / statistics.fmean(b for _, b in pairs))
        out.append(s)
    order = {i: n for n, i in enumerate(IMPLS)}
    out.sort(key=lambda s: (s["workload"], s["precision"] != "highest", order.get(s["impl"], 9),
                            s["form"]))
    return out


# ------------------------------------------------------------------------------------------- gate
def check_failures(result: dict, only=None, exclude=None) -> list[str]:
    """Rows whose correctness check failed (only: those impls; exclude: all but those impls)."""
    out = []
    for r in result.get("rows", []):
        if only is not None and r["impl"] not in only:
            continue
        if exclude is not None and r["impl"] in exclude:
            continue
        c = r.get("check")
        if c and not c.get("passed"):
            out.append(f"{row_key(r)}: correctness check failed "
                       f"(min pass fraction {c.get('min_frac', 0.0):.4f} < 0.99)")
    return out


def gate(current: dict, baseline: dict, floor: Optional[float] = None,
         k: float = DEFAULT_NOISE_K, impls: Optional[Iterable[str]] = OURS,
         scope: Optional[Callable[[dict], bool]] = None) -> dict:
    """Compare a run with a baseline. Returns {"ok", "failures", "regressions", "compared", ...}.

    A failure is: a correctness check of a gated implementation that failed in the current run
    (failed checks of other implementations are listed as warnings); a gated baseline row that
    is missing, errored or unavailable now; a row whose GPU time grew by more than threshold();
    a row that ran the fused op in the baseline and does not now; a run on another GPU model
    than the baseline's (its times say nothing about a regression: a machine pool may hand out
    an H100 for an H200).
    ``scope(baseline_row)``: whether the run was asked for that row (a run of some workloads or
    cases); rows outside it are counted in "outside", not required.
    """
    if floor is None:
        floor = baseline.get("settings", {}).get("noise_floor", DEFAULT_NOISE_FLOOR)
    impls = set(impls) if impls else None
    cur = index_rows(current)
    failures, regressions, improvements = [], [], []
    compared = outside = 0
    warnings = check_failures(current, exclude=impls)
    failures += check_failures(current, only=impls)
    env, base_env = current.get("env", {}), baseline.get("env", {})
    if env.get("gpu") and base_env.get("gpu") and env["gpu"] != base_env["gpu"]:
        failures.append(f"this run's GPU ({env['gpu']}) is not the baseline's "
                        f"({base_env['gpu']}): its times cannot be compared with it")
    for lib in ("torch", "triton"):     # the same code may compile differently: say so
        if env.get(lib) and base_env.get(lib) and env[lib] != base_env[lib]:
            warnings.append(f"{lib} {env[lib]} here, {base_env[lib]} in the baseline")
    for key, b in index_rows(baseline).items():
        if b.get("status") != "ok" or not b.get("gpu_us"):
            continue
        if impls and b["impl"] not in impls:
            continue
        if scope is not None and not scope(b):
            outside += 1
            continue
        r = cur.get(key)
        if r is None:
            failures.append(f"{key}: in the baseline but not in this run")
            continue
        if r.get("status") != "ok" or not r.get("gpu_us"):
            failures.append(f"{key}: {r.get('status')} now ({r.get('error') or 'no time'})")
            continue
        compared += 1
        ratio = r["gpu_us"] / b["gpu_us"]
        thr = threshold(b.get("spread"), r.get("spread"), floor_for(floor, b["workload"]), k)
        entry = {"key": key, "base_us": b["gpu_us"], "cur_us": r["gpu_us"], "ratio": ratio,
                 "threshold": thr}
        if ratio > 1.0 + thr:
            regressions.append(entry)
            failures.append(f"{key}: {b['gpu_us']:.1f} -> {r['gpu_us']:.1f} us "
                            f"(+{(ratio - 1) * 100:.1f}%, threshold {thr * 100:.1f}%)")
        elif ratio < 1.0 / (1.0 + thr):
            improvements.append(entry)
        if b.get("fused") and not r.get("fused"):
            failures.append(f"{key}: ran the fused op in the baseline, does not now")
    return {"ok": not failures, "failures": failures, "warnings": warnings,
            "regressions": regressions,
            "improvements": improvements, "compared": compared, "outside": outside,
            "noise_floor": floor,
            "noise_k": k, "impls": sorted(impls) if impls else "all"}


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
    header = ["workload", "prec", "impl", "form", "GPU us", "plain us", "vs stock", "SOL frac",
              "checks"]
    rows = []
    for s in summary:
        checks = f"{s['passed']}/{s['checked']}" + (" FAIL" if s["passed"] < s["checked"] else "")
        if s["errors"]:
            checks += f" ({s['errors']} err)"
        rows.append([s["workload"], s["precision"], IMPL_LABELS.get(s["impl"], s["impl"]),
                     s["form"], _f(s["gpu_us"]), _f(s["plain_us"]), _f(s["vs_stock"], "{:.3f}"),
                     _f(s["frac_sol"], "{:.3f}"), checks])
    return md_table(header, rows)


def case_table(rows: list[dict]) -> str:
    header = ["case", "impl", "form", "GPU us", "spread", "plain us", "kernels", "fused",
              "x eager", "x stock", "SOL us", "SOL frac", "check"]
    out = []
    for r in rows:
        status = r.get("status")
        out.append([case_label(r["seq"], r["batch"]), IMPL_LABELS.get(r["impl"], r["impl"]),
                    r["form"], _f(r.get("gpu_us")) if status == "ok" else status,
                    _f(r.get("spread"), "{:.1%}"), _f(r.get("plain_us")),
                    _f(r.get("kernels"), "{}"), {True: "yes", False: "no"}.get(r.get("fused"), "-"),
                    _f(r.get("speedup_vs_eager"), "{:.2f}"),
                    _f(r.get("speedup_vs_stock"), "{:.2f}"), _f(r.get("sol_us")),
                    _f(r.get("frac_sol"), "{:.3f}"), check_cell(r)])
    return md_table(header, out)


def gate_text(g: dict) -> str:
    fl = g["noise_floor"]
    fl = (", ".join(f"{w} {v * 100:.1f}%" for w, v in sorted(fl.items())) if isinstance(fl, dict)
          else f"{fl * 100:.1f}%")
    lines = [f"gate: {'PASS' if g['ok'] else 'FAIL'} ({g['compared']} timed rows compared, "
             f"implementations {g['impls']}, floor {fl}, k {g['noise_k']})"]
    if g.get("outside"):
        lines.append(f"  {g['outside']} baseline rows outside this run's selection, not compared")
    lines += [f"  FAIL {f}" for f in g["failures"]]
    lines += [f"  warning (not gated) {w}" for w in g.get("warnings", [])]
    for e in g["improvements"]:
        lines.append(f"  faster {e['key']}: {e['base_us']:.1f} -> {e['cur_us']:.1f} us "
                     f"({(e['ratio'] - 1) * 100:+.1f}%)")
    return "\n".join(lines)


def markdown_report(result: dict) -> str:
    env, st = result.get("env", {}), result.get("settings", {})
    parts = [f"# Perf results: {env.get('gpu', '?')}", "",
             f"torch {env.get('torch')}, triton {env.get('triton')}, commit "
             f"{env.get('git_commit')}, dynamic={st.get('dynamic')}, "
             f"{st.get('blocks')}x{st.get('replays')} graph replays, "
             f"{st.get('plain_runs')} plain launches, {st.get('check_rounds')} check rounds.", "",
             "## Summary (means over cases)", "", summary_table(summarize(result["rows"])), ""]
    if result.get("gate"):
        parts += ["## Gate", "", "```", gate_text(result["gate"]), "```", ""]
    if result.get("variants"):
        vrows = [[v["workload"], v["precision"], IMPL_LABELS.get(v["impl"], v["impl"]), v["form"],
                  v.get("status"), _f(v.get("compile_s"), "{:.1f}"), _f(v.get("graphs"), "{}"),
                  (v.get("error") or "")[:120]] for v in result["variants"]]
        parts += ["## Variants", "", md_table(["workload", "prec", "impl", "form", "status",
                                               "first call s", "graphs", "note"], vrows), ""]
    groups: dict[tuple, list[dict]] = {}
    for r in result["rows"]:
        groups.setdefault((r["workload"], r["precision"]), []).append(r)
    for (w, p), rs in groups.items():
        parts += [f"## {w} ({p})", "", case_table(rs), ""]
    return "\n".join(parts)


# ----------------------------------------------------------------------------------------- schema
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
        for f in ROW_KEYS:
            if f not in r:
                errs.append(f"rows[{i}].{f} missing")
        if r.get("status") == "ok":
            for f in ("gpu_us", "sol_us", "spread"):
                if not isinstance(r.get(f), (int, float)):
                    errs.append(f"rows[{i}].{f} not a number")
    return errs
