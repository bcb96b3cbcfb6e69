"""Merge the rows of finished runs per workload into one result set (JSON, markdown, plot).

    python -m perf.merge --take W075=runs/18cf826/results.json --take W092=runs/aab5fa9/results.json \
        -o perf/results/nvidia-h200

Used when a run did not finish a workload (deadline) and an earlier run of the same code for that
workload did, or when a change touched one precision only (``--take W075/high=...``): the merged
file records where each workload's rows came from (settings.merged_from).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from . import stats


def merge(takes: dict) -> dict:
    docs = {}
    for w, path in takes.items():
        with open(path) as f:
            docs[w] = json.load(f)
    first = next(iter(docs.values()))
    out = dict(first, rows=[], variants=[])
    out["settings"] = dict(first["settings"], merged_from=dict(takes))
    for w, d in docs.items():
        # "W075" takes every row of the workload, "W075/high" only that precision's
        workload, _, prec = w.partition("/")

        def wanted(r):
            return r["workload"] == workload and (not prec or r.get("precision") == prec)

        out["rows"] += [r for r in d["rows"] if wanted(r)]
        out["variants"] += [v for v in d.get("variants", []) if wanted(v)]
    out.pop("gate", None)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--take", action="append", required=True,
                   help="WORKLOAD=results.json or WORKLOAD/PRECISION=results.json")
    p.add_argument("-o", "--out", required=True)
    a = p.parse_args(argv)
    takes = dict(t.split("=", 1) for t in a.take)
    doc = merge(takes)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(doc, f, indent=1)
    with open(os.path.join(a.out, "results.md"), "w") as f:
        f.write(stats.markdown_report(doc))
    try:
        from . import plot
        plot.plot(doc, os.path.join(a.out, "perf.png"))
    except Exception as e:  # noqa: BLE001
        print(f"plot failed: {type(e).__name__}: {e}")
    print(stats.summary_table(stats.summarize(doc["rows"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
