"""Host-side rules of kernels/stats_overlap.py (its Gluon kernel runs on Hopper GPUs only; it is
compiled for sm_90 by sm90_compile.py and checked on the GPU by the perf job)."""

import pytest
import torch

from inductor_gqa.kernels import stats_overlap
from inductor_gqa.lower import attention as lower_attention


def _copies(b=1, s=512, h=16, hk=4, d=64):
    q = torch.zeros(b * s, h * d, dtype=torch.float16)
    k = torch.zeros(b * s, hk * d, dtype=torch.float16)
    return q, k, k.clone()


def test_it_takes_probs_staged_operands(monkeypatch):
    # the operand rule (fp16, 16-byte rows, no mask tensor, scale > 0, head_dim) is
    # probs_staged.operands_ok's, tested with that kernel
    q, k, v = _copies()
    assert stats_overlap.supported(q, k, v, 64, 0, 1.0, (64, 128, 4, 2))
    monkeypatch.setattr(stats_overlap.probs_staged, "operands_ok", lambda *a: False)
    assert not stats_overlap.supported(q, k, v, 64, 0, 1.0, (64, 128, 4, 2))


@pytest.mark.parametrize("cfg", [(64, 128, 8, 2),      # one warpgroup: 16 rows per warp
                                 (128, 64, 8, 2)])     # key tiles a multiple of the row tile
def test_tile_rules(cfg):
    q, k, v = _copies()
    assert not stats_overlap.supported(q, k, v, 64, 0, 1.0, cfg)


def test_no_candidates_on_cpu_or_when_switched_off(monkeypatch):
    q, k, v = _copies()
    flag = torch.zeros(1, dtype=torch.int32)
    assert stats_overlap.candidates(q, k, v, 64, 0, 1.0) == []
    assert lower_attention._overlap_candidates((q, k, v, flag), 64, 0, 1.0) == []
    assert lower_attention._overlap_candidates(None, 64, 0, 1.0) == []
    monkeypatch.setattr(stats_overlap.probs_staged, "available", lambda device: True)
    if stats_overlap.HAVE_GLUON:
        assert stats_overlap.candidates(q, k, v, 64, 0, 1.0) == [
            ("overlap",) + c for c in stats_overlap.CONFIGS]
    monkeypatch.setenv("INDUCTOR_GQA_STATS_OVERLAP", "0")
    assert lower_attention._overlap_candidates((q, k, v, flag), 64, 0, 1.0) == []


def test_launch_rejects_what_it_cannot_run():
    q, k, _ = _copies()
    flag = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="not covered"):
        stats_overlap.launch(q, k, torch.empty(16 * 512 * 2), flag, 1, 512, 16, 4, 64, 1.0,
                             False, ("overlap", 64, 128, 8, 2))
    with pytest.raises(ValueError, match="float32"):
        stats_overlap.launch(q, k, torch.empty(16 * 512), flag, 1, 512, 16, 4, 64, 1.0, False,
                             (64, 128, 4, 2))
