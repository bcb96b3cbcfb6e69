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
