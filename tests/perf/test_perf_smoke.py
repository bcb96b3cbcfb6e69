"""The perf job end to end on the CPU at tiny sizes (``python -m perf.run --smoke``): every row
kind (block, first_call in fresh processes, model, train_block), results.json/md, the gate, and the offline
gate against the committed baseline. About 35-45 s on two cores."""

import json
import os
import subprocess
import sys

import pytest

from perf import stats

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytest.importorskip("transformers")
# one worker runs the module's tests, so its fixture's perf run happens once (pytest -n)
pytestmark = pytest.mark.xdist_group("perf_smoke")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke")
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("OUT", None)
    cmd = [sys.executable, "-m", "perf.run", "--smoke", "--device", "cpu", "--workloads", "W075",
           "--cases", "0", "--impls", "eager,stock_static,backend", "--first-call-impls",
           "backend", "--models", "llama", "--model-attn", "sdpa", "--model-shapes", "1x16",
           "--model-layers", "1", "--model-tasks", "prefill,train", "--train-cases", "1",
           "--train-impls", "stock_static,backend",
           "--out", str(out)]
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    return p, out


def test_smoke_run_writes_every_row_kind(smoke):
    p, out = smoke
    log = p.stdout + p.stderr
    # the smoke run gates structure, fusion, errors and checks (no speed targets): it passes
    assert p.returncode == 0, log[-3000:]
    assert "estimated duration on an H200" in log
    doc = json.loads((out / "results.json").read_text())
    assert stats.validate(doc) == [], log[-2000:]
    rows = doc["rows"]
    assert {stats.kind(r) for r in rows} == {"block", "first_call", "model", "train_block"}
    bad = [(stats.row_key(r), r.get("status"), r.get("error")) for r in rows
           if r.get("status") != "ok"]
    assert not bad, bad
    blocks = {r["impl"]: r for r in rows if stats.kind(r) == "block"}
    assert set(blocks) == {"eager", "stock_static", "backend"}
    assert blocks["backend"]["fused"] and not blocks["stock_static"]["fused"]
    assert blocks["backend"]["check"]["passed"]
    assert blocks["backend"]["block_host_us"] > 0 and blocks["backend"]["host_scope"] == "op"
    assert blocks["backend"]["plain_vs_stock"] is not None
    first = {r["cache"]: r for r in rows if stats.kind(r) == "first_call"}
    assert set(first) == {"cold", "warm"}
    assert first["cold"]["first_call_s"] > 0 and first["warm"]["first_call_s"] > 0
    assert first["cold"]["fx_cache_hits"] == 0 and first["cold"]["blocks_fused"] == 1
    assert first["cold"]["fused"] and first["warm"]["fused"]      # per process, cache or not
    models = {r["impl"]: r for r in rows if stats.kind(r) == "model" and r["task"] == "prefill"}
    assert set(models) == {"eager", "stock_static", "backend"}
    trained = {r["impl"]: r for r in rows if stats.kind(r) == "model" and r["task"] == "train"}
    assert set(trained) == {"eager", "stock_static", "backend"}
    assert trained["backend"]["fused_layers"] == 1 and trained["backend"]["check"]["passed"]
    assert trained["backend"]["check"]["rule"] == "grad_vs_float32"
    ours = models["backend"]
    assert ours["layers"] == 1 and ours["blocks_seen"] == 1 and ours["check"]["passed"]
    assert ours["gpu_us"] > 0 and ours["plain_us"] > 0
    train = {r["impl"]: r for r in rows if stats.kind(r) == "train_block"}
    assert set(train) == {"stock_static", "backend"} and train["backend"]["fused"]
    assert train["backend"]["check"]["passed"] and train["backend"]["plain_us"] > 0
    assert blocks["backend"]["fused_by"] == "op"                 # the CPU path keeps the op
    g = doc["gate"]
    assert g["ok"] and not g["baseline"] and not g["failures"], g["failures"]
    assert not g["targets_applied"] and "smoke run" in g["targets_exempt"]
    assert doc["deadline_cut"] is None
    assert {stats.row_key(e) for e in doc["expected"]} == {stats.row_key(r) for r in rows}
    md = (out / "results.md").read_text()
    for part in ("## Summary", "Block host time", "## First calls", "## Models",
                 "## Training steps", "## Gate", "**Smoke run**"):
        assert part in md, part


def test_smoke_results_gate_offline_against_the_committed_baseline(smoke, capsys):
    """The committed baseline is schema 1 until a run of this job replaces it: refused."""
    from perf import gate as gate_cli
    _, out = smoke
    rc = gate_cli.main([str(out / "results.json"), "--baseline",
                        os.path.join(REPO, "perf", "baselines", "nvidia-h200.json")])
    text = capsys.readouterr().out
    assert rc == 1 and "baseline schema 1 is not comparable; rerun" in text
