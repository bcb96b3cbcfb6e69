"""perf.modes' pure-Python parts (the modes themselves need a CUDA GPU)."""
import pytest
import torch

from inductor_gqa import workloads as wl
from perf import modes


def test_cases_parse_workload_seq_batch():
    assert modes._parse_cases("W075:131x1,W092:512x4") == [(wl.W075, 131, 1), (wl.W092, 512, 4)]


def test_aoti_runner_is_valid_python():
    compile(modes._AOTI_RUNNER, "<aoti runner>", "exec")


def test_every_mode_has_a_precision_for_each_workload():
    assert set(modes.PRECISION) == set(wl.WORKLOADS)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU answer")
def test_refuses_without_a_gpu(capsys):
    assert modes.main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().out


def test_bad_selection_is_refused_before_anything_runs():
    with pytest.raises(SystemExit, match="unknown mode"):
        modes.main(["--modes", "fastest"])
    with pytest.raises(SystemExit, match="bad case"):
        modes.main(["--cases", "W075:131"])
    with pytest.raises(SystemExit, match="bad case"):
        modes.main(["--cases", "W999:131x1"])


def _row(**kw):
    base = dict(workload="W075", seq=131, batch=1, mode="default", impl="ours", passed=True,
                blocks_fused=1, cudagraph_skips=0, plain_us=100.0, first_s=2.0)
    return {**base, **kw}


def test_a_row_of_ours_fails_when_unfused_out_of_tolerance_or_graphless():
    assert modes.row_status(_row()) == "ok"
    assert modes.row_status(_row(blocks_fused=0)) == "failed"
    assert modes.row_status(_row(impl="stock", blocks_fused=0)) == "ok"
    assert modes.row_status(_row(passed=False)) == "failed"
    assert modes.row_status(_row(mode="reduce-overhead", cudagraph_skips=1)) == "failed"
    assert modes.row_status(_row(mode="reduce-overhead", impl="stock", cudagraph_skips=1)) \
        == "failed"


def test_compare_pairs_stock_and_ours_per_case_and_mode():
    rows = [_row(impl="stock", plain_us=200.0, first_s=4.0), _row(),
            _row(mode="aoti", impl="stock"), _row(mode="aoti", error="boom")]
    (c,) = modes.compare(rows)
    assert (c["mode"], c["plain_ratio"], c["first_ratio"]) == ("default", 0.5, 0.5)
