"""Offline gate and noise-floor tools over result JSONs (no GPU needed).

    python -m perf.gate RESULTS.json [--baseline perf/baselines/nvidia-h200.json]
        the gate on a finished run: the within-run rules (ours' plain calls against stock's,
        every model layer fused, checks), and with --baseline the comparison with it; exit 1 on
        a failure
    python -m perf.gate --derive RUN_A.json RUN_B.json [--derive-impls eager,stock_static]
        run-to-run noise of two full runs; prints the suggested noise floor per workload (rows
        of implementations whose code differs between the runs must be left out)
    python -m perf.gate --promote RUN.json --floor W075=0.07,W092=0.15,models=0.05 -o BASELINE.json
        write RUN as the new baseline with the noise floor (one number, or one per workload)

A baseline in the old format (schema inductor_gqa.perf/1: block rows only) is read as such and
the gate says what it could compare; --promote takes only a run of this job.
"""

from __future__ import annotations

import argparse
import json
import sys

if __package__ in (None, ""):
    import os
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from perf import stats  # noqa: E402


def load(path: str, allow_old: bool = True) -> dict:
    with open(path) as f:
        d = json.load(f)
    if d.get("schema") in stats.OLD_SCHEMAS:
        if not allow_old:
            raise SystemExit(f"{path}: old format ({d['schema']}); take a run of this job "
                             f"({stats.SCHEMA})")
        print(f"note: {path} is in the old format ({d['schema']}): block rows only, read as "
              f"{stats.SCHEMA}")
        return stats.upgrade(d)
    errs = stats.validate(d)
    if errs:
        raise SystemExit(f"{path}: not a perf result: " + "; ".join(errs[:5]))
    return d


def _floor(text: str):
    """'0.05' -> 0.05; 'W075=0.02,W092=0.14' -> {'W075': 0.02, 'W092': 0.14}."""
    if "=" not in text:
        return float(text)
    return {w: float(v) for w, v in (part.split("=") for part in text.split(","))}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.gate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="?")
    p.add_argument("--baseline")
    p.add_argument("--noise-floor", type=float, default=None)
    p.add_argument("--noise-k", type=float, default=stats.DEFAULT_NOISE_K)
    p.add_argument("--plain-tolerance", type=float, default=stats.DEFAULT_PLAIN_TOL)
    p.add_argument("--first-call-tolerance", type=float, default=stats.DEFAULT_FIRST_CALL_TOL)
    p.add_argument("--first-call-slack", type=float, default=stats.DEFAULT_FIRST_CALL_SLACK_S)
    p.add_argument("--gate-impls", default=",".join(stats.OURS))
    p.add_argument("--derive", nargs=2, metavar=("RUN_A", "RUN_B"))
    p.add_argument("--quantile", type=float, default=0.95)
    p.add_argument("--derive-impls", default=None,
                   help="comma list of implementations to derive from (default: all)")
    p.add_argument("--promote")
    p.add_argument("--floor", type=_floor, default=None)
    p.add_argument("-o", "--output")
    a = p.parse_args(argv)
    if a.derive:
        run_a, run_b = load(a.derive[0]), load(a.derive[1])
        impls = a.derive_impls.split(",") if a.derive_impls else None
        out = {"all": stats.derive_floor(run_a, run_b, a.quantile, impls)}
        for w in sorted({r.get("workload") or "models" for r in run_a["rows"]
                         if stats.kind(r) in ("block", "model")}):
            out[w] = stats.derive_floor(run_a, run_b, a.quantile, impls, workload=w)
        print(json.dumps(out, indent=1))
        return 0
    if a.promote:
        if not a.output:
            raise SystemExit("--promote needs -o OUTPUT")
        d = load(a.promote, allow_old=False)
        d.pop("gate", None)
        if a.floor is not None:
            d["settings"]["noise_floor"] = a.floor
        with open(a.output, "w") as f:
            json.dump(d, f, indent=1)
        print(f"wrote baseline {a.output} (noise floor {d['settings'].get('noise_floor')})")
        return 0
    if not a.results:
        p.error("give RESULTS.json [--baseline B], or --derive, or --promote")
    cur = load(a.results, allow_old=False)
    base = None
    if a.baseline:
        with open(a.baseline) as f:
            base = json.load(f)          # the gate reads an old-format baseline itself
    impls = None if a.gate_impls == "all" else [x for x in a.gate_impls.split(",") if x]
    g = stats.gate(cur, base, floor=a.noise_floor, k=a.noise_k, impls=impls,
                   plain_tol=a.plain_tolerance, first_call_tol=a.first_call_tolerance,
                   first_call_slack_s=a.first_call_slack)
    print(stats.gate_text(g))
    return 0 if g["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
