"""Host-side rules of kernels/probs_staged.py (its Gluon kernels run on Hopper GPUs only; they are
compiled for sm_90 by sm90_compile.py and checked on the GPU by the perf job)."""

import pytest
import torch

from inductor_gqa.kernels import host, probs_staged
from inductor_gqa.lower import attention as lower_attention


def _copies(b=1, s=512, h=16, hk=4, d=64):
    q = torch.zeros(b * s, h * d, dtype=torch.float16)
    k = torch.zeros(b * s, hk * d, dtype=torch.float16)
    return q, k, k.clone()


def test_shared_memory_bounds_the_sequence():
    q, k, v = _copies()
    pp = (64, 128, 4, 2, "pp")
    # two warpgroups' staged rows of 512 keys fit an H200 block, 541 keys do not
    assert probs_staged.supported(q, k, v, 512, 64, 0, 1.0, pp)
    assert not probs_staged.supported(q, k, v, 541, 64, 0, 1.0, pp)
    assert probs_staged.supported(q, k, v, 541, 64, 0, 1.0, (64, 128, 4, 2))
    assert probs_staged.smem_bytes(512, 64, pp) == 2 * probs_staged.smem_bytes(
        512, 64, pp[:4]) + 16


@pytest.mark.parametrize("why", ["mask", "scale", "dtype", "head_dim", "stride"])
def test_outside_its_scope_it_is_not_a_candidate(why):
    q, k, v = _copies()
    mask_kind, scale, d = 0, 1.0, 64
    if why == "mask":
        mask_kind = 1
    elif why == "scale":
        scale = -1.0
    elif why == "dtype":
        q = q.to(torch.bfloat16)
    elif why == "head_dim":
        d = 48
    else:
        q = torch.zeros(512, 16 * 64 + 3, dtype=torch.float16)[:, :16 * 64]
    assert not probs_staged.supported(q, k, v, 512, d, mask_kind, scale, (64, 128, 4, 2))


def test_no_candidates_on_cpu_or_when_switched_off(monkeypatch):
    q, k, v = _copies()
    flag = torch.zeros(1, dtype=torch.int32)
    assert probs_staged.candidates(q, k, v, 512, 64, 0, 1.0) == []
    assert lower_attention._staged_candidates((q, k, v, flag), 512, 64, 0, 1.0) == []
    assert lower_attention._staged_candidates(None, 512, 64, 0, 1.0) == []
    monkeypatch.setenv("INDUCTOR_GQA_STAGED", "0")
    assert lower_attention._staged_candidates((q, k, v, flag), 512, 64, 0, 1.0) == []


def test_launch_rejects_what_it_cannot_write():
    q, k, v = _copies()
    out = torch.empty(1, 512, 16 * 64, dtype=torch.float16)
    flag = torch.zeros(1, dtype=torch.int32)
    probs16 = torch.empty(1, 16, 512, 512, dtype=torch.float16)
    with pytest.raises(ValueError, match="float32"):
        probs_staged.launch(q, k, v, out, probs16, flag, 1, 512, 16, 4, 64, 1.0, False,
                            ("staged", 64, 128, 4, 2))
    probs = torch.empty(1, 16, 512, 512)
    with pytest.raises(ValueError, match="not covered"):
        probs_staged.launch(q, k, v, out, probs, flag, 1, 541, 16, 4, 64, 1.0, False,
                            (64, 128, 4, 2, "pp"))
    with pytest.raises(ValueError, match="16 rows per warp"):
        probs_staged.launch(q, k, v, out, probs, flag, 1, 512, 16, 4, 64, 1.0, False,
                            (64, 128, 8, 2))
    # four heads per row tile need four query heads per KV head
    with pytest.raises(ValueError, match="heads per row tile"):
        probs_staged.launch(q, k, v, out, probs, flag, 1, 512, 16, 2, 64, 1.0, False,
                            (64, 128, 4, 2, "pp", "gp4"))


def test_packed_configs_name_their_heads():
    assert probs_staged.heads_per_program((64, 128, 4, 2)) == 1
    assert probs_staged.heads_per_program(("staged", 64, 128, 4, 2, "pp", "gp4")[1:]) == 4
    assert all(probs_staged.heads_per_program(c) == 4 for c in probs_staged.PACKED_CONFIGS)


@pytest.mark.parametrize("major, ok", [(8, False), (9, True), (10, False)])
def test_hopper_only(monkeypatch, major, ok):
    # warpgroup MMA is Hopper's: older GPUs lack it and Blackwell runs other tensor-core
    # instructions, so those keep flash.py's passes
    # (host.capability asks torch once per device; the test stands in for that question)
    monkeypatch.setattr(host, "_capability", lambda index: (major, 0))
    got = probs_staged.available(torch.device("cuda", 0))
    assert got == (ok and probs_staged.HAVE_GLUON)
