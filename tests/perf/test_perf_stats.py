"""CPU tests for the pure-Python parts of the perf job (gate, threshold, tables, SOL, schema)."""

import json
import math

import pytest

from inductor_gqa import workloads as wl
from perf import stats


def row(impl="backend", gpu=100.0, spread=0.01, seq=128, batch=4, status="ok", form="fn",
        workload="W075", precision="high", check=True, fused=None):
    r = {"workload": workload, "precision": precision, "impl": impl, "form": form, "seq": seq,
         "batch": batch, "status": status, "gpu_us": gpu if status == "ok" else None,
         "spread": spread, "sol_us": 10.0, "plain_us": gpu * 1.5 if gpu else None}
    if check is not None:
        r["check"] = {"passed": check, "min_frac": 1.0 if check else 0.5}
    if fused is not None:
        r["fused"] = fused
    return r


def doc(rows, **settings):
    return {"schema": stats.SCHEMA, "env": {"gpu": "NVIDIA H200", "torch": "2.11",
                                            "triton": "3.6", "git_commit": "abc"},
            "settings": settings, "rows": rows}


def test_median_and_spread():
    assert stats.median([3, 1, 2]) == 2
    assert stats.rel_spread([100, 102, 98]) == pytest.approx(0.04)
    assert stats.rel_spread([5.0]) == 0.0
    med, meds, spread = stats.summarize_blocks([[10, 11, 12], [20, 21, 22]])
    assert meds == [11, 21] and med == 16.0 and spread == pytest.approx(10 / 16)


def test_threshold_floor_and_spread():
    assert stats.threshold(0.001, 0.002, floor=0.05, k=2) == 0.05
    assert stats.threshold(0.04, 0.01, floor=0.05, k=2) == pytest.approx(0.08)
    assert stats.threshold(None, None, floor=0.03) == 0.03


def test_gate_passes_within_noise_and_fails_beyond():
    base = doc([row(gpu=100.0), row(impl="install", gpu=100.0)], noise_floor=0.05)
    ok = stats.gate(doc([row(gpu=104.0), row(impl="install", gpu=96.0)]), base)
    assert ok["ok"] and ok["compared"] == 2 and not ok["regressions"]
    bad = stats.gate(doc([row(gpu=110.0), row(impl="install", gpu=100.0)]), base)
    assert not bad["ok"]
    assert len(bad["regressions"]) == 1 and bad["regressions"][0]["ratio"] == pytest.approx(1.1)
    assert "+10.0%" in bad["failures"][0] and "threshold 5.0%" in bad["failures"][0]
    text = stats.gate_text(bad)
    assert text.startswith("gate: FAIL") and "W075/high/backend/fn/S128xB4" in text


def test_gate_refuses_a_run_on_another_gpu():
    base = doc([row(gpu=100.0)], noise_floor=0.05)
    other = doc([row(gpu=90.0)])
    other["env"]["gpu"] = "NVIDIA H100 80GB HBM3"
    g = stats.gate(other, base)
    assert not g["ok"] and "is not the baseline's (NVIDIA H200)" in g["failures"][0]
    assert stats.gate(doc([row(gpu=90.0)]), base)["ok"]


def test_gate_warns_on_other_library_versions():
    base = doc([row(gpu=100.0)], noise_floor=0.05)
    newer = doc([row(gpu=100.0)])
    newer["env"]["torch"] = "2.13"
    g = stats.gate(newer, base)
    assert g["ok"] and g["warnings"] == ["torch 2.13 here, 2.11 in the baseline"]
    assert "warning (not gated) torch 2.13 here" in stats.gate_text(g)


def test_gate_noisy_case_gets_wider_threshold():
    base = doc([row(gpu=100.0, spread=0.06)], noise_floor=0.05)
    assert stats.gate(doc([row(gpu=110.0, spread=0.01)]), base)["ok"]       # 12% allowed
    assert not stats.gate(doc([row(gpu=113.0, spread=0.01)]), base)["ok"]


def test_gate_only_ours_by_default():
    base = doc([row(impl="stock", gpu=100.0), row(gpu=100.0)])
    g = stats.gate(doc([row(impl="stock", gpu=200.0), row(gpu=100.0)]), base)
    assert g["ok"] and g["compared"] == 1
    g = stats.gate(doc([row(impl="stock", gpu=200.0), row(gpu=100.0)]), base, impls=None)
    assert not g["ok"]


def test_gate_fails_on_check_missing_error_and_lost_fusion():
    base = doc([row(gpu=100.0, fused=True), row(seq=256, gpu=50.0)])
    g = stats.gate(doc([row(gpu=100.0, fused=False, check=False)]), base)
    msgs = "\n".join(g["failures"])
    assert not g["ok"]
    assert "correctness check failed" in msgs
    assert "not in this run" in msgs                       # the S256 row is gone
    assert "fused op" in msgs
    g = stats.gate(doc([row(gpu=100.0), row(seq=256, status="error")]), base)
    assert any("error now" in f for f in g["failures"])


def test_gate_scope_leaves_rows_the_run_was_not_asked_for():
    base = doc([row(gpu=100.0), row(workload="W092", precision="bf16", gpu=800.0)])
    cur = doc([row(gpu=100.0)])
    assert not stats.gate(cur, base)["ok"]                 # strict: the W092 row is missing
    g = stats.gate(cur, base, scope=lambda r: r["workload"] == "W075")
    assert g["ok"] and g["compared"] == 1 and g["outside"] == 1
    assert "1 baseline rows outside this run's selection" in stats.gate_text(g)
    g = stats.gate(doc([]), base, scope=lambda r: r["workload"] == "W075")
    assert not g["ok"]                                     # asked for and missing: still a FAIL


def test_gate_check_failure_of_reference_impl_is_a_warning():
    base = doc([row(gpu=100.0)])
    g = stats.gate(doc([row(gpu=100.0), row(impl="stock", gpu=90.0, check=False)]), base)
    assert g["ok"] and len(g["warnings"]) == 1 and "stock" in g["warnings"][0]
    assert "warning (not gated)" in stats.gate_text(g)
    g = stats.gate(doc([row(gpu=100.0), row(impl="stock", gpu=90.0, check=False)]), base,
                   impls=None)
    assert not g["ok"]


def test_gate_floor_from_baseline_or_argument():
    base = doc([row(gpu=100.0)], noise_floor=0.2)
    assert stats.gate(doc([row(gpu=115.0)]), base)["ok"]
    assert not stats.gate(doc([row(gpu=115.0)]), base, floor=0.05)["ok"]


def test_derive_floor():
    a = doc([row(seq=s, gpu=100.0) for s in range(1, 21)])
    b = doc([row(seq=s, gpu=100.0 * (1 + 0.001 * s)) for s in range(1, 21)])
    d = stats.derive_floor(a, b)
    assert d["n"] == 20 and d["max"] == pytest.approx(0.02)
    assert d["p95"] == pytest.approx(0.019)
    assert d["suggested_floor"] == pytest.approx(0.02)
    assert stats.derive_floor(a, doc([]))["n"] == 0


def test_ratios_and_summary():
    rows = [row(impl="eager", gpu=400.0), row(impl="stock", gpu=200.0), row(gpu=100.0),
            row(impl="eager", gpu=800.0, seq=256), row(impl="stock", gpu=400.0, seq=256),
            row(gpu=300.0, seq=256, check=False)]
    stats.add_ratios(rows)
    assert rows[2]["speedup_vs_eager"] == 4.0 and rows[2]["speedup_vs_stock"] == 2.0
    assert rows[2]["frac_sol"] == pytest.approx(0.1)
    summ = {s["impl"]: s for s in stats.summarize(rows)}
    ours = summ["backend"]
    assert ours["gpu_us"] == 200.0 and ours["vs_stock"] == pytest.approx(200 / 300)
    assert ours["frac_sol"] == pytest.approx(10 / 200)
    assert (ours["passed"], ours["checked"]) == (1, 2)
    assert [s["impl"] for s in stats.summarize(rows)] == ["eager", "stock", "backend"]
    table = stats.summary_table(stats.summarize(rows))
    assert table.splitlines()[0].startswith("| workload |") and "1/2 FAIL" in table


def test_markdown_report_and_schema():
    rows = [row(impl="stock", gpu=200.0), row(gpu=100.0, fused=True),
            row(impl="install", status="unavailable", check=None)]
    stats.add_ratios(rows)
    d = doc(rows, dynamic="unbacked", blocks=5, replays=10, plain_runs=10, check_rounds=3)
    assert stats.validate(d) == []
    md = stats.markdown_report(d)
    assert "## Summary" in md and "## W075 (high)" in md and "unavailable" in md
    json.dumps(d)                                          # serialisable
    broken = dict(d, schema="x", rows=[{"status": "ok", "gpu_us": "fast"}])
    errs = stats.validate(broken)
    assert any("schema" in e for e in errs) and any("gpu_us" in e for e in errs)


def test_sol_matches_published_means():
    """workloads.sol_seconds reproduces the published mean SOL (22.2 us, 616 us)."""
    w075 = sum(wl.sol_seconds(wl.W075, s, b) for s, b in wl.W075.cases) / 16 * 1e6
    w092 = sum(wl.sol_seconds(wl.W092, s, b) for s, b in wl.W092.cases) / 16 * 1e6
    assert w075 == pytest.approx(22.2, abs=0.1)
    assert w092 == pytest.approx(616, abs=1)


def test_case_selection_and_slug():
    from perf.run import select_cases, slug
    assert select_cases("all", wl.W075.cases) == list(wl.W075.cases)
    assert select_cases("0,15", wl.W075.cases) == [(128, 4), (4096, 1)]
    assert select_cases("4096x1,999x9", wl.W075.cases) == [(4096, 1)]
    assert slug("NVIDIA H200") == "nvidia-h200"
    assert math.isfinite(stats.DEFAULT_NOISE_FLOOR)


def test_gate_cli(tmp_path):
    from perf import gate as gate_cli
    base = doc([row(gpu=100.0)], noise_floor=0.05)
    cur = doc([row(gpu=120.0)])
    pb, pc, po = tmp_path / "b.json", tmp_path / "c.json", tmp_path / "o.json"
    pb.write_text(json.dumps(base))
    pc.write_text(json.dumps(cur))
    assert gate_cli.main([str(pc), "--baseline", str(pb)]) == 1
    assert gate_cli.main([str(pb), "--baseline", str(pb)]) == 0
    assert gate_cli.main(["--derive", str(pb), str(pc)]) == 0
    assert gate_cli.main(["--promote", str(pc), "--floor", "0.3", "-o", str(po)]) == 0
    assert json.loads(po.read_text())["settings"]["noise_floor"] == 0.3
    assert gate_cli.main([str(pc), "--baseline", str(po)]) == 0


def test_merge_takes_each_workload_from_its_run(tmp_path):
    from perf import merge
    a = doc([row(gpu=100.0, workload="W075"), row(gpu=1.0, workload="W092", status="skipped")])
    b = doc([row(gpu=9.0, workload="W075"), row(gpu=200.0, workload="W092")])
    pa, pb, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "out"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    assert merge.main(["--take", f"W075={pa}", "--take", f"W092={pb}", "-o", str(out)]) == 0
    m = json.loads((out / "results.json").read_text())
    assert sorted((r["workload"], r["gpu_us"]) for r in m["rows"]) == [("W075", 100.0),
                                                                       ("W092", 200.0)]
    assert m["settings"]["merged_from"] == {"W075": str(pa), "W092": str(pb)}
    assert (out / "results.md").exists()


def test_merge_takes_one_precision_from_another_run(tmp_path):
    from perf import merge
    a = doc([row(gpu=100.0, workload="W075", precision="highest"),
             row(gpu=50.0, workload="W075", precision="high")])
    b = doc([row(gpu=40.0, workload="W075", precision="high")])
    pa, pb, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "out"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    assert merge.main(["--take", f"W075/highest={pa}", "--take", f"W075/high={pb}",
                       "-o", str(out)]) == 0
    m = json.loads((out / "results.json").read_text())
    assert sorted((r["precision"], r["gpu_us"]) for r in m["rows"]) == [("high", 40.0),
                                                                        ("highest", 100.0)]
