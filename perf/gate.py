"""The perf job's gate, and offline tools over result JSONs (no GPU needed).

    python -m perf.gate RESULTS.json [--baseline perf/baselines/nvidia-h200.json]
        the gate on a finished run (the same as at the end of perf.run); exit 1 on a failure
    python -m perf.gate --derive RUN_A.json RUN_B.json [--derive-impls eager,stock_static]
        run-to-run noise of two full runs; prints the suggested noise floor per workload (rows
        of implementations whose code differs between the runs must be left out)
    python -m perf.gate --promote RUN.json --floor W075=0.07,W092=0.15,models=0.05 -o BASELINE.json
        write RUN as the new baseline with the noise floor (one number, or one per workload)

The gate has three parts (docs/perf.md, "The gate"):

1. Structure, every run (the CPU smoke run too): every row the run was asked for
   (``expected``, written by perf.run from its selection) is there; no row was skipped (a
   deadline cut the run); no row of ours errored or is unavailable; every row of ours is fused,
   as that case's own compiled code ran it (block and first-call rows: the profile of a call of
   that case; model rows: every layer; training rows: that case's compilation), passed its
   correctness check and, for models, gave finite logits.
2. Targets, THRESHOLDS below (issue 53's "Done when" list), on full-size runs only: a smoke run
   has tiny sizes and, on a CPU, wall-clock stand-ins for GPU time, so the gate records the
   targets as not applied there. A target whose stock rows the run did not select is noted as
   not checked; a selected stock row without a figure fails it.
3. With ``--baseline``, the regression comparison with a baseline of the current schema. A
   baseline in schema 1 is refused: its rows are not comparable.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Callable, Iterable, Optional

if __package__ in (None, ""):
    import os
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from perf import stats  # noqa: E402
from perf.stats import OURS, STOCKS, kind, peer, row_key  # noqa: E402


# -------------------------------------------------------------------------------------- targets
@dataclasses.dataclass(frozen=True)
class Target:
    """One comparison of ours with stock, taken from issue 53's "Done when" list.

    ``compare``: "ratio" (ours' figure over stock's, at most ``limit``) or "speedup" (stock's
    figure over ours', at least ``limit``); ``per``: "case" (every row) or "mean" (the mean of
    ours' figures over the cases against stock's mean); ``noise``: the measurement allowance
    added to a per-case limit: "plain" (``--plain-tolerance``, 5%), "gpu" (max(5%, k x the two
    rows' spread)), or None (strict). Stock is the faster stock row of the same case
    (stock_static or stock_dynamic, whichever the run selected).
    """

    kind: str                 # row kind
    figure: str               # row field compared
    compare: str              # "ratio" | "speedup"
    limit: float
    per: str = "case"         # "case" | "mean"
    noise: Optional[str] = None
    where: tuple = ()         # (field, value) pairs a row must match
    doc: str = ""


THRESHOLDS = {
    "block_plain": Target(
        "block", "plain_us", "ratio", 1.00, noise="plain",
        doc="every block case: ours' plain call at most stock's"),
    "W092_gpu": Target(
        "block", "gpu_us", "speedup", 1.6, per="mean", where=(("workload", "W092"),),
        doc="W092: mean GPU time at least 1.6x faster than stock's"),
    "W075_high_gpu": Target(
        "block", "gpu_us", "speedup", 2.2, per="mean",
        where=(("workload", "W075"), ("precision", "high")),
        doc='W075 "high": mean GPU time at least 2.2x faster than stock\'s'),
    "W075_highest_gpu": Target(
        "block", "gpu_us", "speedup", 1.3, per="mean",
        where=(("workload", "W075"), ("precision", "highest")),
        doc='W075 "highest": mean GPU time at least 1.3x faster than stock\'s'),
    "first_call": Target(
        "first_call", "first_call_s", "ratio", 2.0, where=(("cache", "cold"),),
        doc="every first-call case, cold cache: ours at most 2x stock's"),
    "model_plain": Target(
        "model", "plain_us", "ratio", 1.00, noise="plain", where=(("task", "prefill"),),
        doc="every prefill model row: ours' plain call at most stock's"),
    "model_gpu": Target(
        "model", "gpu_us", "ratio", 1.00, noise="gpu", where=(("task", "prefill"),),
        doc="every prefill model row: ours' GPU time at most stock's"),
    "model_1x2048_gpu": Target(
        "model", "gpu_us", "speedup", 1.05,
        where=(("task", "prefill"), ("batch", 1), ("seq", 2048)),
        doc="models at (B, S) = (1, 2048): GPU time at least 1.05x faster than stock's"),
    "model_1x2048_plain": Target(
        "model", "plain_us", "speedup", 1.05,
        where=(("task", "prefill"), ("batch", 1), ("seq", 2048)),
        doc="models at (B, S) = (1, 2048): plain call at least 1.05x faster than stock's"),
}

REFUSED_SCHEMA_1 = "baseline schema 1 is not comparable; rerun"


@dataclasses.dataclass
class Verdict:
    """What the gate collects while it runs its rules."""

    failures: list = dataclasses.field(default_factory=list)
    warnings: list = dataclasses.field(default_factory=list)
    notes: list = dataclasses.field(default_factory=list)
    figures: dict = dataclasses.field(default_factory=dict)     # target -> measured value
    plain_slower: list = dataclasses.field(default_factory=list)


def _few(keys: list, n: int = 8) -> str:
    more = f", ... {len(keys) - n} more" if len(keys) > n else ""
    return ", ".join(keys[:n]) + more


# ------------------------------------------------------------------------------------ structure
def expected_keys(current: dict) -> Optional[list]:
    """The keys of the rows the run was asked for, or None when the results record none."""
    exp = current.get("expected")
    return None if exp is None else [row_key(e) for e in exp]


def _missing_and_cut(current: dict, v: Verdict) -> None:
    rows = current.get("rows", [])
    exp = expected_keys(current)
    if exp is None:
        v.failures.append("the results record no expected rows (settings of an older job): "
                          "missing rows cannot be checked; rerun")
    elif not exp:
        v.failures.append("the run selected no rows")
    if not rows:
        v.failures.append("the run has no rows")
    have = {row_key(r) for r in rows}
    missing = [k for k in (exp or []) if k not in have]
    if missing:
        v.failures.append(f"{len(missing)} selected rows missing: {_few(missing)}")
    # skipped with a reason (a warm first call after a failed cold one): that reason; without
    # one: the deadline
    skipped = [row_key(r) for r in rows if r.get("status") == "skipped" and not r.get("error")]
    v.failures += [f"{row_key(r)}: skipped ({r['error'][:200]})" for r in rows
                   if r.get("status") == "skipped" and r.get("error")]
    cut = current.get("deadline_cut")
    if cut or skipped:
        after = f" after the {cut['deadline_s']:.0f} s deadline" if cut else ""
        v.failures.append(f"the run was cut{after}: {len(skipped)} rows skipped"
                          + (f" ({_few(skipped)})" if skipped else ""))


SUITE_KINDS = {"blocks": "block", "first-call": "first_call", "models": "model",
               "train": "train_block"}


def _names(text) -> list:
    return [x.strip() for x in (text or "").split(",") if x.strip()]


def _empty_selections(current: dict, v: Verdict) -> None:
    """A suite, workload or model the run selected whose selection matches no row (e.g. a case
    label no workload has). Merged sets are left to their takes' own gates: their settings are
    the first take's."""
    st = current.get("settings") or {}
    exp = current.get("expected")
    if exp is None or st.get("merged_from"):
        return
    suites = _names(st.get("suites"))
    empty = [s for s in suites if s in SUITE_KINDS
             and not (s == "first-call" and st.get("first_call_cases") == "none")
             and not any(kind(e) == SUITE_KINDS[s] for e in exp)]
    if "blocks" in suites:
        empty += [f"blocks {w}" for w in _names(st.get("workloads"))
                  if not any(kind(e) == "block" and e["workload"] == w for e in exp)]
    if "models" in suites:
        empty += [f"models {m}" for m in st.get("models") or []
                  if not any(kind(e) == "model" and e["model"] == m for e in exp)]
    if empty:
        v.failures.append(f"selected, but no row asked for: {', '.join(empty)}")


def _is_fused(r: dict) -> Optional[bool]:
    """Whether a row of ours ran fused, from that case's own compiled code (None: not
    recorded)."""
    k = kind(r)
    if k == "model":
        if r.get("layers") is None:
            return None
        return (r.get("fused_layers") or 0) >= r["layers"]
    return r.get("fused")


def _fusion_failure(r: dict) -> Optional[str]:
    fused = _is_fused(r)
    if fused:
        return None
    key = row_key(r)
    if fused is None:
        return f"{key}: fusion not recorded"
    if kind(r) == "model":
        why = ", ".join(f"{n} x{c}" for n, c in sorted((r.get("rejected") or {}).items()))
        return (f"{key}: {r.get('fused_layers') or 0} of {r['layers']} layers fused"
                + (f" ({why})" if why else ""))
    return f"{key}: not fused (no op or kernel of ours ran in this case's call)"


def _check_failure(r: dict, by: dict, checked: bool) -> Optional[str]:
    c, key = r.get("check"), row_key(r)
    if kind(r) == "first_call":
        return None
    if not c:
        return f"{key}: no correctness check" if checked else None
    if c.get("finite") is False:
        return f"{key}: NaN or Inf in the output"
    if c.get("passed"):
        return None
    ctx = [f"{stats.IMPL_LABELS[s]} {stats.check_cell(p)}" for s in STOCKS if s != r["impl"]
           for p in [peer(by, r, s)] if p and p.get("check")]
    return (f"{key}: correctness check failed (min pass fraction {c.get('min_frac', 0.0):.4f}"
            f" < 0.99" + (f"; {', '.join(ctx)}" if ctx else "") + ")")


def _rows(current: dict, impls, v: Verdict) -> None:
    """Per row: ours must be ok, fused and checked; other implementations' errors, failed
    checks and unavailability are warnings (their figures are then missing for the targets)."""
    rows = current.get("rows", [])
    by = {row_key(r): r for r in rows}
    checked = (current.get("settings") or {}).get("check_rounds", 1) != 0
    for r in rows:
        gated = impls is None or r["impl"] in impls
        out = v.failures if gated else v.warnings
        status, key = r.get("status"), row_key(r)
        if status in ("error", "unavailable"):
            out.append(f"{key}: {status} ({(r.get('error') or '')[:200]})")
            continue
        if status != "ok":
            continue                             # skipped: the cut's failure
        problem = _check_failure(r, by, checked and gated)
        if problem:
            out.append(problem)
        if gated and r["impl"] in OURS:
            problem = _fusion_failure(r)
            if problem:
                v.failures.append(problem)


# -------------------------------------------------------------------------------------- targets
def _matches(r: dict, t: Target) -> bool:
    return kind(r) == t.kind and all(r.get(f) == val for f, val in t.where)


def _stock(by: dict, r: dict, figure: str) -> Optional[tuple[str, float]]:
    """(impl, figure) of the faster stock row of the same case that has the figure."""
    found = [(p[figure], s) for s in STOCKS for p in [peer(by, r, s)]
             if p and p.get("status") == "ok" and p.get(figure)]
    return (min(found)[1], min(found)[0]) if found else None


def _stock_selected(r: dict, expected: Optional[set]) -> bool:
    if expected is None:
        return True
    return any(row_key(dict(r, impl=s)) in expected for s in STOCKS)


def _allowance(t: Target, r: dict, stock_row: dict, ctx: dict) -> float:
    if t.noise == "plain":
        return ctx["plain_tol"]
    if t.noise == "gpu":
        return stats.threshold(stock_row.get("spread"), r.get("spread"),
                               stats.DEFAULT_NOISE_FLOOR, ctx["k"])
    return 0.0


def _case_target(name: str, t: Target, r: dict, by: dict, ctx: dict, v: Verdict) -> None:
    key = row_key(r)
    st = _stock(by, r, t.figure)
    if st is None:
        v.failures.append(f"{key}: no stock {t.figure} to compare with ({name})")
        return
    impl, ref = st
    ours = r.get(t.figure)
    if not ours:
        v.failures.append(f"{key}: no {t.figure} ({name})")
        return
    allow = _allowance(t, r, peer(by, r, impl), ctx)
    ratio = ours / ref if t.compare == "ratio" else ref / ours
    ok = (ratio <= t.limit * (1 + allow) if t.compare == "ratio"
          else ratio >= t.limit)
    if ok:
        return
    if name == "block_plain":
        v.plain_slower.append(key)
    unit = "s" if t.figure.endswith("_s") else "us"
    what = "ours / stock" if t.compare == "ratio" else "speedup over stock"
    bound = f"at most {t.limit:.2f}x" if t.compare == "ratio" else f"at least {t.limit:.2f}x"
    v.failures.append(f"{key}: {t.figure} {ours:.1f} {unit} against {stats.IMPL_LABELS[impl]}'s "
                      f"{ref:.1f}: {what} {ratio:.3f}, {bound}"
                      + (f" (+{allow * 100:.1f}% noise)" if allow else "") + f" ({name})")


def _mean_target(name: str, t: Target, rows: list, by: dict, v: Verdict) -> None:
    pairs = [(r[t.figure], st[1]) for r in rows if r.get(t.figure)
             for st in [_stock(by, r, t.figure)] if st]
    if len(pairs) < len(rows):
        v.failures.append(f"{name}: {len(rows) - len(pairs)} of {len(rows)} cases without a "
                          f"figure of ours and stock's")
    if not pairs:
        return
    ours = sum(a for a, _ in pairs) / len(pairs)
    ref = sum(b for _, b in pairs) / len(pairs)
    speedup = ref / ours
    v.figures[name] = speedup
    if speedup < t.limit:
        v.failures.append(f"{name}: mean {t.figure} {ours:.1f} us against stock's {ref:.1f} "
                          f"over {len(pairs)} cases: {speedup:.2f}x, at least {t.limit:.2f}x")


def _targets(current: dict, impls, ctx: dict, v: Verdict) -> None:
    """THRESHOLDS over the rows of ours that ran (ok); a target with no such row does not
    apply, one whose stock rows were not selected is noted as not checked."""
    rows = current.get("rows", [])
    by = {row_key(r): r for r in rows}
    exp = expected_keys(current)
    exp = None if exp is None else set(exp)
    for name, t in THRESHOLDS.items():
        ours = [r for r in rows if _matches(r, t) and r["impl"] in OURS
                and (impls is None or r["impl"] in impls) and r.get("status") == "ok"]
        unchecked = [r for r in ours if not _stock_selected(r, exp)]
        if unchecked:
            v.notes.append(f"{name} not checked for {len(unchecked)} rows: no stock row "
                           "selected")
        ours = [r for r in ours if r not in unchecked]
        if t.per == "mean":
            for impl in sorted({r["impl"] for r in ours}):
                _mean_target(name if impl == "backend" else f"{name}/{impl}", t,
                             [r for r in ours if r["impl"] == impl], by, v)
            continue
        for r in ours:
            _case_target(name, t, r, by, ctx, v)


def speed_exempt(current: dict) -> Optional[str]:
    """Why the targets do not apply to this run (None: they do)."""
    if (current.get("settings") or {}).get("smoke"):
        return "a smoke run (tiny sizes; on a CPU, wall-clock stand-ins for GPU time)"
    if (current.get("env") or {}).get("device") == "cpu":
        return "a CPU run"
    return None


# ------------------------------------------------------------------------------------- baseline
def _refusal(baseline: dict) -> Optional[str]:
    schema = baseline.get("schema")
    if schema in stats.OLD_SCHEMAS:
        return REFUSED_SCHEMA_1
    if schema != stats.SCHEMA:
        return f"the baseline's schema is {schema!r}, not {stats.SCHEMA!r}: not compared"
    return None


def _env_against(current: dict, baseline: dict, v: Verdict) -> None:
    env, base_env = current.get("env", {}), baseline.get("env", {})
    if env.get("gpu") and base_env.get("gpu") and env["gpu"] != base_env["gpu"]:
        v.failures.append(f"this run's GPU ({env['gpu']}) is not the baseline's "
                          f"({base_env['gpu']}): its times cannot be compared with it")
    for lib in ("torch", "triton"):     # the same code may compile differently: say so
        if env.get(lib) and base_env.get(lib) and env[lib] != base_env[lib]:
            v.warnings.append(f"{lib} {env[lib]} here, {base_env[lib]} in the baseline")


def _compare_row(key: str, b: dict, r: dict, floor, ctx: dict, out: dict, v: Verdict) -> None:
    metric = stats.METRICS[kind(b)]
    ratio = r[metric] / b[metric]
    if kind(b) == "first_call":
        limit = b[metric] * (1 + ctx["first_call_tol"]) + ctx["first_call_slack_s"]
        thr, unit, fmt = limit / b[metric] - 1, "s", "{:.2f}"
    else:
        thr = stats.threshold(b.get("spread"), r.get("spread"), stats.floor_for(floor, b),
                              ctx["k"])
        unit, fmt = "us", "{:.1f}"
    entry = {"key": key, "base": b[metric], "cur": r[metric], "ratio": ratio,
             "threshold": thr, "unit": unit}
    if ratio > 1.0 + thr:
        out["regressions"].append(entry)
        v.failures.append(f"{key}: {fmt.format(b[metric])} -> {fmt.format(r[metric])} {unit} "
                          f"(+{(ratio - 1) * 100:.1f}%, threshold {thr * 100:.1f}%)")
    elif ratio < 1.0 / (1.0 + thr):
        out["improvements"].append(entry)
    if b.get("fused") and not r.get("fused"):
        v.failures.append(f"{key}: ran the fused op in the baseline, does not now")


def _against_baseline(current: dict, baseline: dict, floor, impls, scope, ctx: dict,
                      v: Verdict) -> dict:
    """Every gated baseline row the run was asked for: present and ok now, its time within the
    noise threshold, still fused."""
    out = {"compared": 0, "outside": 0, "regressions": [], "improvements": []}
    _env_against(current, baseline, v)
    cur = stats.index_rows(current)
    for key, b in stats.index_rows(baseline).items():
        metric = stats.METRICS.get(kind(b))
        if metric is None or b.get("status") != "ok" or not b.get(metric):
            continue
        if impls and b["impl"] not in impls:
            continue
        if scope is not None and not scope(b):
            out["outside"] += 1
            continue
        r = cur.get(key)
        if r is None:
            v.failures.append(f"{key}: in the baseline but not in this run")
        elif r.get("status") != "ok" or not r.get(metric):
            v.failures.append(f"{key}: {r.get('status')} now ({r.get('error') or 'no time'})")
        else:
            out["compared"] += 1
            _compare_row(key, b, r, floor, ctx, out, v)
    return out


# ----------------------------------------------------------------------------------------- gate
def gate(current: dict, baseline: Optional[dict] = None, floor=None,
         k: float = stats.DEFAULT_NOISE_K, impls: Optional[Iterable[str]] = OURS,
         scope: Optional[Callable[[dict], bool]] = None,
         plain_tol: float = stats.DEFAULT_PLAIN_TOL,
         first_call_tol: float = stats.DEFAULT_FIRST_CALL_TOL,
         first_call_slack_s: float = stats.DEFAULT_FIRST_CALL_SLACK_S) -> dict:
    """The gate's verdict on a result document (module docstring). ``impls``: the
    implementations gated (ours by default; None: every one); ``scope(baseline_row)``: whether
    the run was asked for that baseline row (default: the run's expected rows)."""
    impls = set(impls) if impls else None
    ctx = {"plain_tol": plain_tol, "k": k, "first_call_tol": first_call_tol,
           "first_call_slack_s": first_call_slack_s}
    v = Verdict()
    _missing_and_cut(current, v)
    _empty_selections(current, v)
    _rows(current, impls, v)
    exempt = speed_exempt(current)
    if exempt:
        v.notes.append(f"targets not applied: {exempt}; structure, fusion, errors and checks "
                       "gated")
    else:
        _targets(current, impls, ctx, v)
    base = {"compared": 0, "outside": 0, "regressions": [], "improvements": []}
    schema = None
    if baseline is not None:
        schema = baseline.get("schema")
        if floor is None:
            floor = baseline.get("settings", {}).get("noise_floor", stats.DEFAULT_NOISE_FLOOR)
        refused = _refusal(baseline)
        if refused:
            v.failures.append(refused)
        else:
            if scope is None and current.get("expected") is not None:
                keys = set(expected_keys(current))
                scope = lambda r: row_key(r) in keys   # noqa: E731
            base = _against_baseline(current, baseline, floor, impls, scope, ctx, v)
    return dict(base, ok=not v.failures, failures=v.failures, warnings=v.warnings,
                notes=v.notes, figures=v.figures, targets_applied=exempt is None,
                targets_exempt=exempt,
                thresholds={n: t.limit for n, t in THRESHOLDS.items()},
                noise_floor=floor if floor is not None else stats.DEFAULT_NOISE_FLOOR,
                noise_k=k, impls=sorted(impls) if impls else "all", plain_tol=plain_tol,
                plain_slower=v.plain_slower, baseline=baseline is not None,
                baseline_schema=schema)


def thresholds_table() -> str:
    """THRESHOLDS as a markdown table (docs/perf.md carries a copy)."""
    body = [[n, t.kind, t.figure, "ours / stock <=" if t.compare == "ratio" else
             "stock / ours >=", f"{t.limit:.2f}", t.per, t.noise or "-", t.doc]
            for n, t in THRESHOLDS.items()]
    return stats.md_table(["target", "rows", "figure", "compare", "limit", "per", "noise",
                           "what"], body)


# ------------------------------------------------------------------------------------------ CLI
def load(path: str) -> dict:
    """A result document of this job (schema 2); anything else is refused."""
    with open(path) as f:
        d = json.load(f)
    if d.get("schema") in stats.OLD_SCHEMAS:
        raise SystemExit(f"{path}: schema 1 ({d['schema']}) is not comparable; rerun")
    errs = stats.validate(d)
    if errs:
        raise SystemExit(f"{path}: not a perf result: " + "; ".join(errs[:5]))
    return d


def _floor(text: str):
    """'0.05' -> 0.05; 'W075=0.02,W092=0.14' -> {'W075': 0.02, 'W092': 0.14}."""
    if "=" not in text:
        return float(text)
    return {w: float(v) for w, v in (part.split("=") for part in text.split(","))}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m perf.gate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="?")
    p.add_argument("--baseline")
    p.add_argument("--noise-floor", type=float, default=None)
    p.add_argument("--noise-k", type=float, default=stats.DEFAULT_NOISE_K)
    p.add_argument("--plain-tolerance", type=float, default=stats.DEFAULT_PLAIN_TOL)
    p.add_argument("--first-call-tolerance", type=float, default=stats.DEFAULT_FIRST_CALL_TOL)
    p.add_argument("--first-call-slack", type=float, default=stats.DEFAULT_FIRST_CALL_SLACK_S)
    p.add_argument("--gate-impls", default=",".join(OURS))
    p.add_argument("--derive", nargs=2, metavar=("RUN_A", "RUN_B"))
    p.add_argument("--quantile", type=float, default=0.95)
    p.add_argument("--derive-impls", default=None,
                   help="comma list of implementations to derive from (default: all)")
    p.add_argument("--promote")
    p.add_argument("--floor", type=_floor, default=None)
    p.add_argument("--thresholds", action="store_true", help="print the targets table, exit")
    p.add_argument("-o", "--output")
    return p


def _derive(a) -> int:
    run_a, run_b = load(a.derive[0]), load(a.derive[1])
    impls = a.derive_impls.split(",") if a.derive_impls else None
    out = {"all": stats.derive_floor(run_a, run_b, a.quantile, impls)}
    for w in sorted({r.get("workload") or "models" for r in run_a["rows"]
                     if kind(r) in ("block", "model")}):
        out[w] = stats.derive_floor(run_a, run_b, a.quantile, impls, workload=w)
    print(json.dumps(out, indent=1))
    return 0


def _promote(a) -> int:
    if not a.output:
        raise SystemExit("--promote needs -o OUTPUT")
    d = load(a.promote)
    d.pop("gate", None)
    if a.floor is not None:
        d["settings"]["noise_floor"] = a.floor
    with open(a.output, "w") as f:
        json.dump(d, f, indent=1)
    print(f"wrote baseline {a.output} (noise floor {d['settings'].get('noise_floor')})")
    return 0


def main(argv=None) -> int:
    p = _parser()
    a = p.parse_args(argv)
    if a.thresholds:
        print(thresholds_table())
        return 0
    if a.derive:
        return _derive(a)
    if a.promote:
        return _promote(a)
    if not a.results:
        p.error("give RESULTS.json [--baseline B], or --derive, or --promote")
    cur = load(a.results)
    base = None
    if a.baseline:
        with open(a.baseline) as f:
            base = json.load(f)          # the gate refuses a baseline it cannot compare
    impls = None if a.gate_impls == "all" else [x for x in a.gate_impls.split(",") if x]
    g = gate(cur, base, floor=a.noise_floor, k=a.noise_k, impls=impls,
             plain_tol=a.plain_tolerance, first_call_tol=a.first_call_tolerance,
             first_call_slack_s=a.first_call_slack)
    print(stats.gate_text(g))
    return 0 if g["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
