"""Host-side rules of kernels/probs_split.py (its Gluon kernel runs on Hopper GPUs only; it is
compiled for sm_90 by sm90_compile.py and checked on the GPU by perf/experiments/
probs_split_bench.py)."""

import pytest
import torch

from inductor_gqa.kernels import probs_split
from inductor_gqa.lower import attention as lower_attention

CFG = (64, 128, 4, 2, 4)        # 512 keys per program


def _copies(b=1, s=4096, h=16, hk=4, d=64):
    q = torch.zeros(b * s, h * d, dtype=torch.float16)
    k = torch.zeros(b * s, hk * d, dtype=torch.float16)
    return q, k, k.clone()


@pytest.mark.parametrize("seq, ok", [(512, False), (513, True), (4096, True), (4097, False)])
def test_two_to_eight_programs_per_row_tile(seq, ok):
    # one program's worth of keys is probs_staged's; more than 8 programs per row tile is not
    # offered (the grid needs a group resident at once)
    q, k, v = _copies(s=seq)
    assert probs_split.split_of(seq, CFG) == -(-seq // 512)
    assert probs_split.supported(q, k, v, seq, 64, 0, 1.0, False, CFG) is ok


@pytest.mark.parametrize("why", ["causal", "mask", "scale", "dtype", "head_dim", "warps"])
def test_outside_its_scope_it_is_not_a_candidate(why):
    q, k, v = _copies()
    mask_kind, scale, d, causal, cfg = 0, 1.0, 64, False, CFG
    if why == "causal":
        causal = True
    elif why == "mask":
        mask_kind = 1
    elif why == "scale":
        scale = -1.0
    elif why == "dtype":
        q = q.to(torch.bfloat16)
    elif why == "head_dim":
        d = 48
    else:
        cfg = (64, 128, 8, 2, 4)
    assert not probs_split.supported(q, k, v, 4096, d, mask_kind, scale, causal, cfg)


def test_opt_in_and_never_on_cpu(monkeypatch):
    q, k, v = _copies()
    flag = torch.zeros(1, dtype=torch.int32)
    monkeypatch.delenv("INDUCTOR_GQA_SPLIT_ROWS", raising=False)
    assert not probs_split.enabled()
    monkeypatch.setenv("INDUCTOR_GQA_SPLIT_ROWS", "1")
    assert probs_split.enabled()
    assert probs_split.candidates(q, k, v, 4096, 64, 0, 1.0, False) == []      # CPU tensors
    assert lower_attention._split_candidates((q, k, v, flag), 4096, 64, 0, 1.0, False) == []
    assert lower_attention._split_candidates(None, 4096, 64, 0, 1.0, False) == []


def test_workspace_and_launch_checks():
    q, k, v = _copies(b=2, s=1024)
    cnt, ws_ml, ws_o = probs_split.workspace(2, 1024, 16, 64, ("split",) + CFG, "cpu")
    groups = 2 * 16 * (1024 // 64)
    assert cnt.shape == (1 + 2 * groups,) and int(cnt.abs().sum()) == 0
    assert ws_ml.numel() == groups * 2 * 2 * 64 and ws_o.numel() == groups * 2 * 64 * 64
    out = torch.empty(2, 1024, 16 * 64, dtype=torch.float16)
    flag = torch.zeros(1, dtype=torch.int32)
    probs16 = torch.empty(2, 16, 1024, 1024, dtype=torch.float16)
    with pytest.raises(ValueError, match="float32"):
        probs_split.launch(q, k, v, out, probs16, flag, (cnt, ws_ml, ws_o), 2, 1024, 16, 4, 64,
                           1.0, CFG, guard=1)
    probs = torch.empty(1, 16, 512, 512)
    with pytest.raises(ValueError, match="not covered"):       # one program per row tile
        probs_split.launch(q[:512], k[:512], v[:512], out, probs, flag, (cnt, ws_ml, ws_o), 1,
                           512, 16, 4, 64, 1.0, CFG, guard=1)
