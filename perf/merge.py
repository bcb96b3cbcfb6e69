"""Merge the rows of finished runs into one result set (JSON, markdown, plot).

    python -m perf.merge --take W075/high=A/results.json --take W092=B/results.json \
        --take first_call=C/results.json --take models=D/results.json -o perf/results/nvidia-h200

Used when the job was split into several commands (each under the 10-minute limit), or when a
change touched one workload or precision only. Selectors: ``W075`` every block and first-call
row of that workload, ``W075/high`` one precision's; ``first_call``, ``first_call/W075`` or
``first_call/W075/high`` first-call rows only; ``models`` every model row, ``models/llama`` one
model's. A row taken twice keeps the later take's. The merged file records where its rows came
from (settings.merged_from), the rows each take was asked for that its selector keeps
(``expected``), and carries the gate's within-run rules. Old-format runs are read as block
rows (with no expected rows recorded, the merged set's gate fails: rerun).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from . import gate, stats


def _wanted(selector: str):
    head, _, rest = selector.partition("/")
    if head == "models":
        return lambda r: stats.kind(r) == "model" and (not rest or r.get("model") == rest)
    kinds = ("block", "first_call")
    if head == "first_call":
        kinds = ("first_call",)
        head, _, rest = rest.partition("/")
    return lambda r: (stats.kind(r) in kinds and (not head or r.get("workload") == head)
                      and (not rest or r.get("precision") == rest))


def merge(takes: dict) -> dict:
    docs = {}
    for sel, path in takes.items():
        with open(path) as f:
            docs[sel] = stats.upgrade(json.load(f))
    first = next(iter(docs.values()))
    out = dict(first, rows=[], variants=[])
    out["settings"] = dict(first["settings"], merged_from=dict(takes))
    rows: dict = {}
    expected: dict = {}
    notes = []
    for sel, d in docs.items():
        wanted = _wanted(sel)
        if d.get("expected") is None:
            expected = None                 # an older run: its selection is not recorded
        elif expected is not None:
            expected.update((stats.row_key(e), e) for e in d["expected"] if wanted(e))
        for r in d["rows"]:
            if wanted(r):
                rows.pop(stats.row_key(r), None)
                rows[stats.row_key(r)] = r
        out["variants"] += [v for v in d.get("variants", []) if wanted(dict(
            v, kind="model" if v.get("model") else "block"))]
        if d["settings"].get("first_call_note") and any(
                stats.kind(r) == "first_call" and wanted(r) for r in d["rows"]):
            notes.append(f"{sel}: {d['settings']['first_call_note']}")
    out["rows"] = list(rows.values())
    out["expected"] = None if expected is None else list(expected.values())
    out["settings"]["first_call_note"] = " ".join(notes) or None
    for k in ("gate", "host_time", "deadline_cut"):     # a cut take's rows say so (skipped)
        out.pop(k, None)
    stats.add_ratios(out["rows"])
    out["host_time"] = stats.host_time(out["rows"])
    out["gate"] = gate.gate(out)         # the gate's within-run rules over the merged rows
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--take", action="append", required=True,
                   help="SELECTOR=results.json (W075, W075/high, first_call, models, models/llama)")
    p.add_argument("-o", "--out", required=True)
    a = p.parse_args(argv)
    takes = {}
    for t in a.take:
        sel, _, path = t.partition("=")
        if sel in takes:
            raise SystemExit(f"selector {sel!r} given twice")
        takes[sel] = path
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
    print(stats.gate_text(doc["gate"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
