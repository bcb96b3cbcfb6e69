"""CPU tests for the pure-Python parts of the perf job (row kinds, gate, threshold, tables, SOL,
schema, merge, the run's selections and estimate)."""

import json
import math

import pytest

from inductor_gqa import workloads as wl
from perf import gate, stats


def row(impl="backend", gpu=100.0, spread=0.01, seq=128, batch=4, status="ok", form="fn",
        workload="W075", precision="high", check=True, fused=None, plain=None):
    r = {"kind": "block", "workload": workload, "precision": precision, "impl": impl,
         "form": form, "seq": seq, "batch": batch, "status": status,
         "gpu_us": gpu if status == "ok" else None, "spread": spread, "sol_us": 10.0,
         "plain_us": plain if plain is not None else (gpu * 1.5 if gpu else None)}
    if check is not None:
        r["check"] = {"passed": check, "min_frac": 1.0 if check else 0.5}
    r["fused"] = (impl in stats.OURS) if fused is None else fused
    return r


def mrow(impl="backend", gpu=1000.0, plain=1100.0, fused=4, layers=4, check=True, spread=0.01,
         model="llama", attn="sdpa", seq=512, batch=4, status="ok"):
    r = {"kind": "model", "model": model, "attn": attn, "task": "prefill", "impl": impl,
         "seq": seq, "batch": batch, "status": status, "gpu_us": gpu, "plain_us": plain,
         "spread": spread, "layers": layers}
    if impl != "eager":
        r["fused_layers"] = fused
        r["check"] = {"passed": check, "min_frac": 1.0 if check else 0.9}
    return r


def frow(impl="backend", cache="cold", s=10.0, seq=131, batch=1, status="ok"):
    return {"kind": "first_call", "workload": "W075", "precision": "high", "impl": impl,
            "form": "fn", "seq": seq, "batch": batch, "cache": cache, "status": status,
            "first_call_s": s if status == "ok" else None, "fused": impl in stats.OURS}


def doc(rows, expected=None, **settings):
    """A result document as perf.run writes it; ``expected`` (the rows the run was asked for)
    defaults to the rows themselves."""
    exp = rows if expected is None else expected
    return {"schema": stats.SCHEMA, "env": {"gpu": "NVIDIA H200", "torch": "2.11",
                                            "triton": "3.6", "git_commit": "abc"},
            "settings": settings, "rows": rows,
            "expected": [{f: r[f] for f in ("kind",) + stats.KINDS[stats.kind(r)]}
                         for r in exp]}


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
    assert stats.floor_for({"W075": 0.07, "models": 0.03}, mrow()) == 0.03
    assert stats.floor_for({"W075": 0.07}, row()) == 0.07


def test_row_keys_per_kind():
    assert stats.row_key(row()) == "W075/high/backend/fn/S128xB4"
    assert stats.row_key(frow(cache="warm")) == "first_call/W075/high/backend/fn/S131xB1/warm"
    assert stats.row_key(mrow()) == "model/llama/sdpa/prefill/backend/S512xB4"
    train = dict(mrow(), task="train")
    assert stats.row_key(train) == "model/llama/sdpa/train/backend/S512xB4"
    assert stats.row_key(row()) != stats.row_key(frow(seq=128, batch=4))


def test_gate_passes_within_noise_and_fails_beyond():
    base = doc([row(gpu=100.0), row(impl="install", gpu=100.0)], noise_floor=0.05)
    ok = gate.gate(doc([row(gpu=104.0), row(impl="install", gpu=96.0)]), base)
    assert ok["ok"] and ok["compared"] == 2 and not ok["regressions"]
    bad = gate.gate(doc([row(gpu=110.0), row(impl="install", gpu=100.0)]), base)
    assert not bad["ok"]
    assert len(bad["regressions"]) == 1 and bad["regressions"][0]["ratio"] == pytest.approx(1.1)
    assert "+10.0%" in bad["failures"][0] and "threshold 5.0%" in bad["failures"][0]
    text = stats.gate_text(bad)
    assert text.startswith("gate: FAIL") and "W075/high/backend/fn/S128xB4" in text


def test_gate_refuses_a_run_on_another_gpu():
    base = doc([row(gpu=100.0)], noise_floor=0.05)
    other = doc([row(gpu=90.0)])
    other["env"]["gpu"] = "NVIDIA H100 80GB HBM3"
    g = gate.gate(other, base)
    assert not g["ok"] and "is not the baseline's (NVIDIA H200)" in g["failures"][0]
    assert gate.gate(doc([row(gpu=90.0)]), base)["ok"]


def test_gate_warns_on_other_library_versions():
    base = doc([row(gpu=100.0)], noise_floor=0.05)
    newer = doc([row(gpu=100.0)])
    newer["env"]["torch"] = "2.13"
    g = gate.gate(newer, base)
    assert g["ok"] and g["warnings"] == ["torch 2.13 here, 2.11 in the baseline"]
    assert "warning (not gated) torch 2.13 here" in stats.gate_text(g)


def test_gate_noisy_case_gets_wider_threshold():
    base = doc([row(gpu=100.0, spread=0.06)], noise_floor=0.05)
    assert gate.gate(doc([row(gpu=110.0, spread=0.01)]), base)["ok"]       # 12% allowed
    assert not gate.gate(doc([row(gpu=113.0, spread=0.01)]), base)["ok"]


def test_gate_only_ours_by_default():
    base = doc([row(impl="stock_dynamic", gpu=100.0), row(gpu=100.0)])
    cur = doc([row(impl="stock_dynamic", gpu=250.0), row(gpu=100.0)])   # ours 2.5x: target met
    g = gate.gate(cur, base)
    assert g["ok"] and g["compared"] == 1
    assert not gate.gate(cur, base, impls=None)["ok"]


def test_gate_fails_on_check_missing_error_and_lost_fusion():
    base = doc([row(gpu=100.0, fused=True), row(seq=256, gpu=50.0)])
    g = gate.gate(doc([row(gpu=100.0, fused=False, check=False)],
                      expected=base["rows"]), base)
    msgs = "\n".join(g["failures"])
    assert not g["ok"]
    assert "correctness check failed" in msgs
    assert "not in this run" in msgs                       # the S256 row is gone
    assert "1 selected rows missing: W075/high/backend/fn/S256xB4" in msgs
    assert "fused op" in msgs and "not fused" in msgs
    g = gate.gate(doc([row(gpu=100.0), row(seq=256, status="error")]), base)
    assert any("error now" in f for f in g["failures"])
    assert any("error (" in f for f in g["failures"])      # and the within-run rule


def test_gate_scope_leaves_rows_the_run_was_not_asked_for():
    base = doc([row(gpu=100.0), row(workload="W092", precision="bf16", gpu=800.0)])
    cur = doc([row(gpu=100.0)])
    g = gate.gate(cur, base)                              # by default, the run's selection
    assert g["ok"] and g["compared"] == 1 and g["outside"] == 1
    assert not gate.gate(doc([row(gpu=100.0)], expected=base["rows"]), base)["ok"]
    g = gate.gate(cur, base, scope=lambda r: r["workload"] == "W075")
    assert g["ok"] and g["compared"] == 1 and g["outside"] == 1
    assert "1 baseline rows outside this run's selection" in stats.gate_text(g)
    g = gate.gate(doc([]), base, scope=lambda r: r["workload"] == "W075")
    assert not g["ok"]                                     # asked for and missing: still a FAIL


def test_gate_check_failure_of_reference_impl_is_a_warning():
    base = doc([row(gpu=100.0)])
    cur = doc([row(gpu=100.0), row(impl="stock_static", gpu=300.0, plain=200.0, check=False)])
    g = gate.gate(cur, base)
    assert g["ok"] and len(g["warnings"]) == 1 and "stock_static" in g["warnings"][0]
    assert "warning (not gated)" in stats.gate_text(g)
    assert not gate.gate(cur, base, impls=None)["ok"]


def test_gate_floor_from_baseline_or_argument():
    base = doc([row(gpu=100.0)], noise_floor=0.2)
    assert gate.gate(doc([row(gpu=115.0)]), base)["ok"]
    assert not gate.gate(doc([row(gpu=115.0)]), base, floor=0.05)["ok"]


def test_plain_call_rule_against_the_faster_stock():
    """Ours' plain call may not be slower than the faster of the two stock rows."""
    rows = [row(impl="stock_static", gpu=300.0, plain=400.0),
            row(impl="stock_dynamic", gpu=300.0, plain=900.0), row(plain=410.0)]
    g = gate.gate(doc(rows))                              # no baseline: within-run rules
    assert g["ok"] and not g["baseline"]                   # +2.5%, within 5%
    rows[2]["plain_us"] = 500.0
    g = gate.gate(doc(rows))
    assert not g["ok"] and g["plain_slower"] == ["W075/high/backend/fn/S128xB4"]
    assert "torch.compile static" in g["failures"][0] and "1.250" in g["failures"][0]
    assert gate.gate(doc(rows), plain_tol=0.3)["ok"]
    assert gate.gate(doc([row(plain=10_000.0)]))["ok"]    # nothing to compare with


def test_models_rules():
    rows = [mrow(impl="eager", gpu=2000.0, plain=2100.0), mrow(impl="stock_static"),
            mrow(gpu=950.0, plain=1000.0)]
    assert gate.gate(doc(rows))["ok"]
    rows[2].update(fused_layers=3, rejected={"softcapping": 1})
    g = gate.gate(doc(rows))
    assert not g["ok"] and "3 of 4 layers fused (softcapping x1)" in g["failures"][0]
    rows[2].update(fused_layers=4, gpu_us=1100.0)
    g = gate.gate(doc(rows))
    assert not g["ok"] and "gpu_us 1100.0 us against torch.compile static's 1000.0: ours / " \
        "stock 1.100, at most 1.00x (+5.0% noise) (model_gpu)" in g["failures"][0]
    rows[2].update(gpu_us=1000.0, plain_us=1300.0)
    assert "(model_plain)" in gate.gate(doc(rows))["failures"][0]


def test_first_call_regression_against_the_baseline():
    base = doc([frow(s=10.0), frow(cache="warm", s=4.0)])
    assert gate.gate(doc([frow(s=14.0), frow(cache="warm", s=4.5)]), base)["ok"]  # 10*1.25+2
    g = gate.gate(doc([frow(s=15.0), frow(cache="warm", s=4.0)]), base)
    assert not g["ok"] and "first_call/W075/high/backend/fn/S131xB1/cold" in g["failures"][0]
    assert "10.00 -> 15.00 s" in g["failures"][0]
    g = gate.gate(doc([frow(s=15.0), frow(cache="warm", s=4.0)]), base, first_call_slack_s=5)
    assert g["ok"]
    g = gate.gate(doc([frow(s=5.0, status="error")]), base)
    assert not g["ok"]                                    # an error, and the warm row missing


def test_old_format_baseline_is_refused():
    """A schema-1 baseline is not comparable: the gate fails with the reason instead of
    comparing nothing (an empty run used to pass with 0 rows compared)."""
    old = {"schema": "inductor_gqa.perf/1", "env": {"gpu": "NVIDIA H200"},
           "settings": {"noise_floor": 0.05},
           "rows": [{k: v for k, v in row(gpu=100.0).items() if k != "kind"}]}
    up = stats.upgrade(old)                                # merge still reads old runs
    assert [r["impl"] for r in up["rows"]] == ["backend"] and "plain_us_events" in up["rows"][0]
    g = gate.gate(doc([row(gpu=100.0)]), old)
    assert not g["ok"] and g["failures"] == [gate.REFUSED_SCHEMA_1] and g["compared"] == 0
    assert "baseline schema 1 is not comparable; rerun" in stats.gate_text(g)
    g = gate.gate(doc([row()]), {"schema": "something/9", "rows": []})
    assert not g["ok"] and "not compared" in g["failures"][0]


def test_derive_floor():
    a = doc([row(seq=s, gpu=100.0) for s in range(1, 21)])
    b = doc([row(seq=s, gpu=100.0 * (1 + 0.001 * s)) for s in range(1, 21)])
    d = stats.derive_floor(a, b)
    assert d["n"] == 20 and d["max"] == pytest.approx(0.02)
    assert d["p95"] == pytest.approx(0.019)
    assert d["suggested_floor"] == pytest.approx(0.02)
    assert stats.derive_floor(a, doc([]))["n"] == 0


def test_ratios_and_summary():
    rows = [row(impl="eager", gpu=400.0), row(impl="stock_dynamic", gpu=200.0),
            row(impl="stock_static", gpu=160.0, plain=100.0), row(gpu=100.0),
            row(impl="eager", gpu=800.0, seq=256), row(impl="stock_dynamic", gpu=400.0, seq=256),
            row(gpu=300.0, seq=256, check=False)]
    stats.add_ratios(rows)
    ours = rows[3]
    assert ours["speedup_vs_eager"] == 4.0 and ours["speedup_vs_stock_dynamic"] == 2.0
    assert ours["speedup_vs_stock_static"] == pytest.approx(1.6)
    assert ours["plain_vs_stock"] == pytest.approx(1.5)    # 150 against stock static's 100
    assert ours["frac_sol"] == pytest.approx(0.1)
    summ = {s["impl"]: s for s in stats.summarize(rows)}
    s = summ["backend"]
    assert s["gpu_us"] == 200.0 and s["vs_stock_dynamic"] == pytest.approx(200 / 300)
    assert s["vs_stock_static"] == pytest.approx(100 / 160)   # only the shared case
    assert s["frac_sol"] == pytest.approx(10 / 200)
    assert (s["passed"], s["checked"]) == (1, 2)
    assert [x["impl"] for x in stats.summarize(rows)] == ["eager", "stock_static",
                                                          "stock_dynamic", "backend"]
    table = stats.summary_table(stats.summarize(rows))
    assert table.splitlines()[0].startswith("| workload |") and "1/2 FAIL" in table


def test_host_time_line():
    r = row(seq=131, batch=1)
    r.update(block_host_us=24.0, host_scope="op", host_timer="cuda_launches")
    ht = stats.host_time([row(), r])
    assert ht["us"] == 24.0 and ht["met"] and ht["key"] == "W075/high/backend/fn/S131xB1"
    assert stats.host_time([row()]) is None
    assert stats.host_time([dict(r, seq=33, batch=2)], ("W075", "high", 33, 2))["us"] == 24.0


def test_markdown_report_and_schema():
    rows = [row(impl="stock_dynamic", gpu=200.0), row(gpu=100.0, fused=True),
            row(impl="install", status="unavailable", check=None),
            frow(), frow(cache="warm", s=3.0), frow(impl="stock_static", s=20.0),
            mrow(impl="stock_static"), mrow(gpu=900.0, plain=900.0)]
    stats.add_ratios(rows)
    d = doc(rows, dynamic="unbacked", blocks=5, replays=10, plain_runs=20, check_rounds=3,
            first_call_note="first calls measured for 1 of 48")
    d["gate"] = gate.gate(d)
    assert stats.validate(d) == []
    md = stats.markdown_report(d)
    for part in ("## Summary", "## W075 (high)", "unavailable", "## First calls",
                 "first calls measured for 1 of 48", "10.0 / 3.0", "20.0 / -", "## Models",
                 "4/4", "## Gate"):
        assert part in md, part
    json.dumps(d)                                          # serialisable
    broken = dict(d, schema="x", rows=[{"kind": "block", "status": "ok", "gpu_us": "fast"},
                                       {"kind": "what"}])
    errs = stats.validate(broken)
    assert any("schema" in e for e in errs) and any("gpu_us" in e for e in errs)
    assert any("unknown" in e for e in errs)


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


def test_run_selections_and_estimate():
    from perf import run
    a = run.parse_args([])
    assert a.impls_list == ["eager", "stock_static", "stock_dynamic", "backend"]
    assert a.first_call_impls_list == a.impls_list
    assert run.first_call_cases(a, wl.W075, "high") == [(131, 1)]
    assert run.first_call_cases(a, wl.W075, "highest") == []       # one W075 precision
    assert run.first_call_cases(a, wl.W092, "bf16") == [(512, 4)]
    e = run.estimate(a)
    assert e["total"] == pytest.approx(e["blocks"] + e["first-call"] + e["models"]
                                       + e["train"])
    assert a.train_cases_list == list(wl.W092.cases) and a.model_tasks_list == ["prefill"]
    assert a.train_impls_list == ["eager", "stock_static", "backend"]
    assert a.train_options_dict == {"fuse_with_grad": True}
    assert e["total"] > a.deadline and "split it" in run.estimate_text(a)
    a = run.parse_args(["--precisions", "highest"])
    assert run.first_call_cases(a, wl.W075, "highest") == [(131, 1)]
    a = run.parse_args(["--first-call-cases", "W092:128x1,2048x1,W075/highest:4096x1",
                        "--impls", "stock,backend"])
    assert a.impls_list == ["stock_dynamic", "backend"]
    assert run.first_call_cases(a, wl.W075, "high") == [(2048, 1)]
    assert run.first_call_cases(a, wl.W075, "highest") == [(2048, 1), (4096, 1)]
    assert run.first_call_cases(a, wl.W092, "bf16") == [(128, 1), (2048, 1)]
    a = run.parse_args(["--suites", "blocks", "--workloads", "W092"])
    assert run.first_call_cases(a, wl.W092, "bf16") == [] and run.estimate(a)["models"] == 0
    a = run.parse_args(["--smoke"])
    assert a.precisions == "high" and a.model_layers == 2 and a.check_rounds == 1
    assert run.first_call_cases(a, wl.W075, "high") == [run.SMOKE_CASES["W075"][0]]
    with pytest.raises(SystemExit):
        run.parse_args(["--impls", "fast"])
    with pytest.raises(SystemExit):
        run.parse_args(["--model-tasks", "finetune"])
    a = run.parse_args(["--suites", "train", "--train-cases", "14,128x4",
                        "--train-options", '{"training_core": "kernels"}'])
    assert a.train_cases_list == [(2048, 1), (128, 4)]
    assert a.train_options_dict == {"fuse_with_grad": True, "training_core": "kernels"}
    scope = run._selection(a)
    train_row = dict(kind="train_block", workload="W092", impl="backend", seq=2048, batch=1)
    assert scope(train_row) and not scope(dict(train_row, seq=512)) and not scope(row())
    scope = run._selection(run.parse_args(["--workloads", "W075", "--suites", "blocks"]))
    assert scope(row()) and not scope(row(form="module")) and not scope(frow())
    assert not scope(mrow()) and not scope(row(workload="W092", precision="bf16"))
    assert run.main(["--estimate"]) == 0                     # no GPU needed


def test_gate_cli(tmp_path):
    from perf import gate as gate_cli
    base = doc([row(gpu=100.0)], noise_floor=0.05)
    cur = doc([row(gpu=120.0)])
    pb, pc, po = tmp_path / "b.json", tmp_path / "c.json", tmp_path / "o.json"
    pb.write_text(json.dumps(base))
    pc.write_text(json.dumps(cur))
    assert gate_cli.main([str(pc), "--baseline", str(pb)]) == 1
    assert gate_cli.main([str(pb), "--baseline", str(pb)]) == 0
    assert gate_cli.main([str(pc)]) == 0                  # within-run rules only
    assert gate_cli.main(["--derive", str(pb), str(pc)]) == 0
    assert gate_cli.main(["--promote", str(pc), "--floor", "0.3", "-o", str(po)]) == 0
    assert json.loads(po.read_text())["settings"]["noise_floor"] == 0.3
    assert gate_cli.main([str(pc), "--baseline", str(po)]) == 0
    old = tmp_path / "old.json"
    old.write_text(json.dumps(dict(base, schema="inductor_gqa.perf/1")))
    with pytest.raises(SystemExit):
        gate_cli.main(["--promote", str(old), "-o", str(po)])


def test_committed_baseline_is_refused_while_in_schema_1(tmp_path, capsys):
    """The committed H200 baseline is schema 1 until a run of this job replaces it: the gate
    refuses it, even for a run of exactly its rows."""
    import os

    from perf import gate as gate_cli
    path = os.path.join(os.path.dirname(__file__), "..", "..", "perf", "baselines",
                        "nvidia-h200.json")
    base = json.load(open(path))
    cur = doc([dict(r, kind="block", impl=stats.IMPL_ALIASES.get(r["impl"], r["impl"]),
                    fused=r["impl"] == "backend")
               for r in base["rows"] if r["impl"] in ("backend", "stock") and r["form"] == "fn"])
    pc = tmp_path / "c.json"
    pc.write_text(json.dumps(cur))
    rc = gate_cli.main([str(pc), "--baseline", path])
    out = capsys.readouterr().out
    assert "gate:" in out
    if base.get("schema") in stats.OLD_SCHEMAS:
        assert rc == 1 and "baseline schema 1 is not comparable; rerun" in out


def test_merge_takes_each_selection_from_its_run(tmp_path):
    from perf import merge
    a = doc([row(gpu=100.0, workload="W075"), row(gpu=1.0, workload="W092", status="skipped"),
             frow(), mrow(model="qwen3")])
    b = doc([row(gpu=9.0, workload="W075"), row(gpu=200.0, workload="W092"), mrow()])
    pa, pb, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "out"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    assert merge.main(["--take", f"W075={pa}", "--take", f"W092={pb}",
                       "--take", f"models={pb}", "-o", str(out)]) == 0
    m = json.loads((out / "results.json").read_text())
    kinds = sorted((stats.kind(r), r.get("workload") or r.get("model"), r.get("gpu_us"))
                   for r in m["rows"])
    assert kinds == [("block", "W075", 100.0), ("block", "W092", 200.0),
                     ("first_call", "W075", None), ("model", "llama", 1000.0)]
    assert m["settings"]["merged_from"] == {"W075": str(pa), "W092": str(pb),
                                            "models": str(pb)}
    assert "gate" in m and (out / "results.md").exists()
    c = doc([frow(s=42.0)])                                  # first calls from their own run
    pc = tmp_path / "c.json"
    pc.write_text(json.dumps(c))
    assert merge.main(["--take", f"W075={pa}", "--take", f"first_call={pc}",
                       "-o", str(out)]) == 0
    m = json.loads((out / "results.json").read_text())
    fc = [r for r in m["rows"] if stats.kind(r) == "first_call"]
    assert len(fc) == 1 and fc[0]["first_call_s"] == 42.0  # the later take wins
    with pytest.raises(SystemExit):
        merge.main(["--take", f"W075={pa}", "--take", f"W075={pb}", "-o", str(out)])


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
