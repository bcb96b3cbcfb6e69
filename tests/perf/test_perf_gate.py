"""CPU tests of the perf gate (perf/gate.py): every failure it must catch, and a passing run.

Result documents are built the way perf.run writes them: ``expected`` (the rows the run was
asked for), ``rows``, ``settings``, ``deadline_cut``.
"""

import copy
import json
import os

import pytest

from perf import gate, stats

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BLOCK_CASES = ((128, 4), (512, 1))
PRECISIONS = (("W075", "high"), ("W075", "highest"), ("W092", "bf16"))


def block(workload, precision, impl, seq, batch, gpu, plain):
    r = {"kind": "block", "workload": workload, "precision": precision, "impl": impl,
         "form": "fn", "seq": seq, "batch": batch, "status": "ok", "gpu_us": gpu,
         "plain_us": plain, "spread": 0.01, "sol_us": 10.0, "fused": impl in stats.OURS}
    if impl != "eager":
        r["check"] = {"passed": True, "min_frac": 1.0}
    return r


def first(impl, cache, s):
    return {"kind": "first_call", "workload": "W075", "precision": "high", "impl": impl,
            "form": "fn", "seq": 131, "batch": 1, "cache": cache, "status": "ok",
            "first_call_s": s, "fused": impl in stats.OURS}


def model(impl, batch, seq, gpu, plain):
    r = {"kind": "model", "model": "llama", "attn": "sdpa", "task": "prefill", "impl": impl,
         "seq": seq, "batch": batch, "status": "ok", "gpu_us": gpu, "plain_us": plain,
         "spread": 0.01, "layers": 4}
    if impl != "eager":
        r["fused_layers"] = 4 if impl in stats.OURS else 0
        r["check"] = {"passed": True, "min_frac": 1.0, "finite": True}
    return r


def train(impl):
    return {"kind": "train_block", "workload": "W092", "impl": impl, "seq": 128, "batch": 4,
            "status": "ok", "gpu_us": 500.0, "plain_us": 600.0, "fused": impl in stats.OURS,
            "check": {"passed": True, "min_frac": 1.0}}


def passing() -> dict:
    """A run that meets every target: ours 3x stock's GPU time, plain calls faster, first calls
    1.3x stock's, models 1.1x stock's, everything fused and checked."""
    rows = []
    for w, p in PRECISIONS:
        for s, b in BLOCK_CASES:
            rows += [block(w, p, "eager", s, b, 900.0, 950.0),
                     block(w, p, "stock_static", s, b, 300.0, 120.0),
                     block(w, p, "stock_dynamic", s, b, 330.0, 130.0),
                     block(w, p, "backend", s, b, 100.0, 100.0)]
    rows += [first(i, c, s) for i, s in (("stock_static", 15.0), ("backend", 20.0))
             for c in ("cold", "warm")]
    for b, s in ((4, 512), (1, 2048)):
        rows += [model("eager", b, s, 2000.0, 2100.0), model("stock_static", b, s, 1000.0, 1050.0),
                 model("backend", b, s, 900.0, 950.0)]
    rows += [train("stock_static"), train("backend")]
    stats.add_ratios(rows)
    return {"schema": stats.SCHEMA, "env": {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.13",
                                            "triton": "3.7", "git_commit": "abc",
                                            "device": "cuda"},
            "settings": {"smoke": False, "check_rounds": 3}, "deadline_cut": None,
            "expected": [{f: r[f] for f in ("kind",) + stats.KINDS[stats.kind(r)]}
                         for r in rows],
            "rows": rows}


def find(d: dict, **match) -> dict:
    hits = [r for r in d["rows"] if all(r.get(k) == v for k, v in match.items())]
    assert len(hits) == 1, (match, len(hits))
    return hits[0]


def failing(d: dict, *parts: str) -> dict:
    """The gate's verdict on d, asserted to fail with a message containing every part."""
    g = gate.gate(d)
    text = "\n".join(g["failures"])
    assert not g["ok"], g
    for p in parts:
        assert p in text, (p, text)
    return g


def test_a_complete_run_passes():
    g = gate.gate(passing())
    assert g["ok"], g["failures"]
    assert g["targets_applied"] and not g["warnings"] and not g["notes"]
    assert g["figures"] == pytest.approx({"W092_gpu": 3.0, "W075_high_gpu": 3.0,
                                          "W075_highest_gpu": 3.0})
    assert "W092_gpu: 3.00x stock (at least 1.60x)" in stats.gate_text(g)


# ------------------------------------------------------------------------------------ structure
def test_a_run_with_no_rows_fails():
    d = dict(passing(), rows=[], expected=[])
    failing(d, "the run selected no rows", "the run has no rows")
    failing(dict(passing(), rows=[]), "the run has no rows", "selected rows missing")


def test_an_empty_run_against_the_schema_1_baseline_fails():
    with open(os.path.join(REPO, "perf", "baselines", "nvidia-h200.json")) as f:
        base = json.load(f)
    base = dict(base, schema="inductor_gqa.perf/1")
    g = gate.gate(dict(passing(), rows=[]), base)
    assert not g["ok"] and gate.REFUSED_SCHEMA_1 in g["failures"] and g["compared"] == 0


def test_results_that_record_no_selection_fail():
    d = passing()
    del d["expected"]
    failing(d, "record no expected rows")


@pytest.mark.parametrize("what,gone", [
    ("suite", lambda r: stats.kind(r) == "model"),
    ("workload", lambda r: r.get("workload") == "W092" and stats.kind(r) == "block"),
    ("case", lambda r: stats.kind(r) == "block" and r["seq"] == 512),
    ("implementation", lambda r: r["impl"] == "stock_dynamic"),
    ("row of ours", lambda r: r["impl"] == "backend" and r.get("cache") == "warm"),
])
def test_a_selected_row_that_is_missing_fails(what, gone):
    d = passing()
    d["rows"] = [r for r in d["rows"] if not gone(r)]
    failing(d, "selected rows missing")


def test_a_selected_suite_or_workload_that_matches_nothing_fails():
    from perf import run
    args = run.parse_args(["--suites", "blocks,models", "--workloads", "W075,W092",
                           "--cases", "4096x1", "--models", "llama"])
    d = passing()
    d["settings"].update(suites=args.suites, workloads=args.workloads, models=args.models_list)
    d["expected"] = run.expected_rows(args)
    d["rows"] = [dict(e, status="ok") for e in d["expected"]]
    assert {e["workload"] for e in d["expected"] if e["kind"] == "block"} == {"W075"}
    failing(d, "selected, but no row asked for: blocks W092")
    d["settings"].update(suites="blocks,first-call,models", first_call_cases="none")
    assert "first-call" not in "\n".join(gate.gate(d)["failures"])
    d["settings"]["first_call_cases"] = "W092:1x1"
    failing(d, "selected, but no row asked for: first-call, blocks W092")


def test_a_selection_without_a_workload_does_not_need_it():
    d = passing()
    keep = [r for r in d["rows"] if r.get("workload") != "W092"]
    d["rows"] = keep
    d["expected"] = [e for e in d["expected"] if e.get("workload") != "W092"]
    g = gate.gate(d)
    assert g["ok"] and "W092_gpu" not in g["figures"]


@pytest.mark.parametrize("status", ["error", "unavailable", "skipped"])
def test_a_row_of_ours_not_ok_fails(status):
    d = passing()
    r = find(d, kind="block", workload="W075", precision="high", impl="backend", seq=128)
    r.update(status=status, error="boom" if status != "skipped" else None)
    failing(d, f"W075/high/backend/fn/S128xB4: {status}" if status != "skipped"
            else "S128xB4")


def test_a_stock_row_without_figures_is_a_warning_and_fails_the_targets():
    d = passing()
    for impl in ("stock_static", "stock_dynamic"):
        find(d, kind="block", workload="W092", impl=impl, seq=512).update(
            status="unavailable", gpu_us=None, plain_us=None, error="no such thing")
    g = failing(d, "W092/bf16/backend/fn/S512xB1: no stock plain_us to compare with",
                "W092_gpu: 1 of 2 cases without a figure")
    assert any("stock_static/fn/S512xB1: unavailable" in w for w in g["warnings"])


def test_a_deadline_cut_fails_with_its_reason():
    d = passing()
    find(d, kind="model", impl="backend", seq=2048).update(status="skipped", gpu_us=None,
                                                           plain_us=None)
    d["deadline_cut"] = {"deadline_s": 540.0, "skipped": 1}
    failing(d, "the run was cut after the 540 s deadline: 1 rows skipped "
               "(model/llama/sdpa/prefill/backend/S2048xB1)")


def test_a_row_skipped_for_a_reason_is_not_a_deadline_cut():
    d = passing()
    find(d, kind="first_call", impl="backend", cache="warm").update(
        status="skipped", error="the cold-cache process failed", first_call_s=None)
    g = failing(d, "first_call/W075/high/backend/fn/S131xB1/warm: skipped (the cold-cache "
                   "process failed)")
    assert not any("cut" in f for f in g["failures"])


def test_the_run_records_a_deadline_cut_and_exits_3(monkeypatch):
    from perf import run
    args = run.parse_args(["--suites", "blocks", "--workloads", "W075", "--cases", "0",
                           "--precisions", "high", "--deadline", "540"])
    d = passing()
    d["rows"][0]["status"] = "skipped"
    g = run._gate(args, d, None, 0.05)
    assert d["deadline_cut"] == {"deadline_s": 540.0, "skipped": 1}
    assert not g["ok"] and any("cut after the 540 s deadline" in f for f in g["failures"])


# --------------------------------------------------------------------------------------- fusion
@pytest.mark.parametrize("match,change,message", [
    (dict(kind="block", workload="W092", impl="backend", seq=512), {"fused": False},
     "W092/bf16/backend/fn/S512xB1: not fused"),
    (dict(kind="block", workload="W092", impl="backend", seq=128), {"fused": None},
     "W092/bf16/backend/fn/S128xB4: fusion not recorded"),
    (dict(kind="first_call", impl="backend", cache="warm"), {"fused": False},
     "first_call/W075/high/backend/fn/S131xB1/warm: not fused"),
    (dict(kind="model", impl="backend", seq=512), {"fused_layers": 3, "rejected": {"mask": 1}},
     "3 of 4 layers fused (mask x1)"),
    (dict(kind="train_block", impl="backend"), {"fused": False},
     "train_block/W092/backend/S128xB4: not fused"),
])
def test_a_row_of_ours_that_did_not_fuse_fails(match, change, message):
    d = passing()
    find(d, **match).update(change)
    failing(d, message)


def test_fused_is_read_per_case_from_the_kernels_that_ran():
    from perf import bench
    assert "qkv_kernel" in bench.our_kernels() and "gqa_attention_kernel" in bench.our_kernels()
    assert bench.our_kernel("qkv_kernel_3") == "qkv_kernel"
    assert bench.our_kernel("gqa_attention_kernel") == "gqa_attention_kernel"
    assert bench.our_kernel("triton_poi_fused_add_0") is None
    assert bench.our_kernel("linear_kernel_x") is None
    assert set(bench.FUSION_FIELDS) >= {"fused", "our_kernels"}


# --------------------------------------------------------------------------------------- checks
@pytest.mark.parametrize("match,check,message", [
    (dict(kind="block", workload="W075", precision="highest", impl="backend", seq=128),
     {"passed": False, "min_frac": 0.9}, "correctness check failed"),
    (dict(kind="model", impl="backend", seq=512),
     {"passed": False, "min_frac": 0.0, "finite": False}, "NaN or Inf in the output"),
    (dict(kind="model", impl="backend", seq=2048), None, "no correctness check"),
])
def test_a_failed_or_missing_check_fails(match, check, message):
    d = passing()
    find(d, **match)["check"] = check
    failing(d, message)


# -------------------------------------------------------------------------------------- targets
def _set(match, **figures):
    def change(d):
        for r in d["rows"]:
            if all(r.get(k) == v for k, v in match.items()):
                r.update(figures)
    return change


TARGET_BREAKS = {
    "block_plain": _set(dict(kind="block", workload="W075", precision="high", impl="backend",
                             seq=512), plain_us=130.0),
    "W092_gpu": _set(dict(kind="block", workload="W092", impl="backend"), gpu_us=200.0),
    "W075_high_gpu": _set(dict(kind="block", precision="high", impl="backend"), gpu_us=150.0),
    "W075_highest_gpu": _set(dict(kind="block", precision="highest", impl="backend"),
                             gpu_us=250.0),
    "first_call": _set(dict(kind="first_call", impl="backend", cache="cold"),
                       first_call_s=31.0),
    "model_plain": _set(dict(kind="model", impl="backend", seq=512), plain_us=1150.0),
    "model_gpu": _set(dict(kind="model", impl="backend", seq=512), gpu_us=1100.0),
    "model_1x2048_gpu": _set(dict(kind="model", impl="backend", seq=2048), gpu_us=980.0),
    "model_1x2048_plain": _set(dict(kind="model", impl="backend", seq=2048), plain_us=1030.0),
}


def test_every_target_has_a_breaking_case():
    assert set(TARGET_BREAKS) == set(gate.THRESHOLDS)


@pytest.mark.parametrize("name", sorted(TARGET_BREAKS))
def test_a_missed_target_fails(name):
    d = passing()
    TARGET_BREAKS[name](d)
    failing(d, f"({name})" if gate.THRESHOLDS[name].per == "case" else f"{name}: mean")


def test_targets_allow_the_measurement_noise_of_per_case_comparisons():
    d = passing()
    _set(dict(kind="block", workload="W075", precision="high", impl="backend", seq=512),
         plain_us=124.0)(d)                        # 3.3% over stock's 120 us: within 5%
    _set(dict(kind="model", impl="backend", seq=512), gpu_us=1040.0)(d)   # +4%: within 5%
    assert gate.gate(d)["ok"]
    assert not gate.gate(d, plain_tol=0.0)["ok"]


def test_the_smoke_run_gates_structure_only_and_says_so():
    d = passing()
    for name in TARGET_BREAKS:
        TARGET_BREAKS[name](d)
    assert not gate.gate(d)["ok"]
    d["settings"]["smoke"] = True
    g = gate.gate(d)
    assert g["ok"] and not g["targets_applied"] and "smoke run" in g["targets_exempt"]
    assert "targets not applied" in stats.gate_text(g)
    find(d, kind="block", workload="W092", impl="backend", seq=512)["fused"] = False
    failing(d, "not fused")                        # structure still gated on a smoke run


def test_a_target_without_selected_stock_rows_is_noted_not_failed():
    d = passing()
    d["rows"] = [r for r in d["rows"] if r["impl"] not in stats.STOCKS]
    d["expected"] = [e for e in d["expected"] if e["impl"] not in stats.STOCKS]
    g = gate.gate(d)
    assert g["ok"] and any("block_plain not checked for 6 rows" in n for n in g["notes"])


# ------------------------------------------------------------------------------------- baseline
def test_a_current_schema_baseline_is_still_compared():
    base = passing()
    cur = copy.deepcopy(base)
    assert gate.gate(cur, base)["compared"] > 0 and gate.gate(cur, base)["ok"]
    _set(dict(kind="block", workload="W092", impl="backend", seq=128), gpu_us=120.0)(cur)
    g = gate.gate(cur, base)
    assert not g["ok"] and "W092/bf16/backend/fn/S128xB4: 100.0 -> 120.0 us" in g["failures"][0]


# ------------------------------------------------------------------------------ run and docs
def test_the_run_expects_every_row_of_its_selection():
    from perf import run
    a = run.parse_args([])
    exp = run.expected_rows(a)
    by_kind = {k: sum(1 for e in exp if e["kind"] == k) for k in stats.KINDS}
    assert by_kind == {"block": 3 * 16 * 4, "first_call": 2 * 4 * 2, "model": 5 * 2 * 2 * 3,
                       "train_block": 16 * 3}
    a = run.parse_args(["--suites", "blocks", "--workloads", "W092", "--cases", "0,7",
                        "--impls", "stock,backend"])
    assert sorted(stats.row_key(e) for e in run.expected_rows(a)) == [
        "W092/bf16/backend/fn/S128xB1", "W092/bf16/backend/fn/S373xB8",
        "W092/bf16/stock_dynamic/fn/S128xB1", "W092/bf16/stock_dynamic/fn/S373xB8"]


def test_expected_rows_are_validated():
    d = passing()
    assert stats.validate(d) == []
    d["expected"].append({"kind": "block", "workload": "W075"})
    assert stats.validate(d) == [f"expected[{len(d['expected']) - 1}] is not a row key"]


def test_the_docs_carry_every_threshold():
    text = open(os.path.join(REPO, "docs", "perf.md")).read()
    for name, t in gate.THRESHOLDS.items():
        lines = [ln for ln in text.splitlines() if ln.startswith(f"| `{name}` |")]
        assert any(ln.endswith(f"| {t.limit:.2f} | {t.per} | {t.noise or '-'} |")
                   for ln in lines), name
    assert gate.thresholds_table().count("\n") == len(gate.THRESHOLDS) + 1


def test_the_gate_cli_refuses_a_schema_1_result(tmp_path):
    p = tmp_path / "old.json"
    p.write_text(json.dumps(dict(passing(), schema="inductor_gqa.perf/1")))
    with pytest.raises(SystemExit, match="schema 1"):
        gate.main([str(p)])
    p.write_text(json.dumps(passing()))
    assert gate.main([str(p)]) == 0 and gate.main(["--thresholds"]) == 0


def test_the_known_kernel_names_cover_the_package():
    """The fallback names (should a kernels module fail to import) list every kernel found."""
    from perf import bench
    assert set(bench.our_kernels()) <= set(bench.KNOWN_KERNELS)
