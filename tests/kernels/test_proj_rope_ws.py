"""Host-side rules of kernels/proj_rope_ws.py (its Gluon kernel runs on Hopper GPUs only; it is
compiled for sm_90 by sm90_compile.py and checked on the GPU against proj_rope.py's kernel by
perf/experiments/proj_rope_ws_bench.py and the perf job)."""

import pytest
import torch

from inductor_gqa.kernels import host, proj_rope_ws

PARTS = (1024, 256, 256)      # W075: 16 query heads, 4 KV heads of 64


@pytest.mark.parametrize("norm,rope,rotary,angles,ok", [
    ("none", "half", 64, True, True),            # W075: cos/sin from the angles
    ("none", "none", 0, False, True),            # no RoPE (the kernel's ROPE=0 form)
    ("none", "half", 64, False, False),          # cos/sin tables: proj_rope's kernel
    ("fp32_weight", "half", 64, True, False),    # a per-head norm: proj_rope's kernel
    ("none", "half", 32, True, False),           # partial rotary
    ("none", "interleaved", 64, True, False),
])
def test_covers(norm, rope, rotary, angles, ok):
    assert proj_rope_ws.covers(64, norm, rope, rotary, angles) == (ok and proj_rope_ws.HAVE_GLUON)


def test_head_sizes():
    assert not proj_rope_ws.covers(256, "none", "half", 256, True)
    assert not proj_rope_ws.covers(24, "none", "half", 24, True)
    assert not proj_rope_ws.covers(256, "none", "none", 0, False)
    assert not proj_rope_ws.covers(16, "none", "half", 16, True)     # compiles; not run on a GPU
    assert proj_rope_ws.covers(128, "none", "half", 128, True) == proj_rope_ws.HAVE_GLUON
    assert proj_rope_ws.covers(32, "none", "none", 0, False) == proj_rope_ws.HAVE_GLUON


def test_tiles_hold_whole_heads_of_one_part():
    assert all(proj_rope_ws.config_fits(c, PARTS, 64) for c in proj_rope_ws.CONFIGS)
    assert not proj_rope_ws.config_fits(("ws", 128, 128, 64, 4), (1024, 64, 64), 64)
    assert not proj_rope_ws.config_fits(("ws", 128, 128, 64, 4), PARTS, 96)


def test_no_candidates_on_cpu():
    assert proj_rope_ws.candidates(PARTS, 64, torch.device("cpu"), "none", "half", 64,
                                   True) == []


@pytest.mark.parametrize("major, ok", [(8, False), (9, True), (10, False)])
def test_hopper_only(monkeypatch, major, ok):
    # warpgroup MMA is Hopper's (host.capability asks torch once per device; the test stands in)
    monkeypatch.setattr(host, "_capability", lambda index: (major, 0))
    dev = torch.device("cuda", 0)
    assert proj_rope_ws.available(dev) == (ok and proj_rope_ws.HAVE_GLUON)
    got = proj_rope_ws.candidates(PARTS, 64, dev, "none", "half", 64, True)
    assert got == (list(proj_rope_ws.CONFIGS) if ok and proj_rope_ws.HAVE_GLUON else [])


def test_launch_rejects_what_it_cannot_write():
    m, k = 131, 1024
    x16 = torch.zeros(m, k, dtype=torch.float16)
    w16 = torch.zeros(sum(PARTS), k, dtype=torch.float16)
    inv = torch.ones(m)
    winv = torch.ones(sum(PARTS))
    flag = torch.zeros(1, dtype=torch.int32)
    out = torch.empty(m, sum(PARTS), dtype=torch.float16)
    angles = (torch.ones(32), torch.arange(m)[None])
    cfg = proj_rope_ws.CONFIGS[0]
    with pytest.raises(ValueError, match="not covered"):      # float32 output
        proj_rope_ws.launch(x16, w16, inv, winv, out.float(), flag, PARTS, m, 64, "half", cfg,
                            angles=angles)
    with pytest.raises(ValueError, match="not covered"):      # RoPE without the angles
        proj_rope_ws.launch(x16, w16, inv, winv, out, flag, PARTS, m, 64, "half", cfg)
    with pytest.raises(ValueError, match="not covered"):      # a tile across two parts
        proj_rope_ws.launch(x16, w16, inv, winv, out, flag, PARTS, m, 64, "half",
                            ("ws", 128, 512, 64, 4), angles=angles)
    if proj_rope_ws.HAVE_GLUON:
        with pytest.raises(ValueError, match="16-byte aligned"):
            proj_rope_ws.launch(x16[:, 1:1001], w16[:, :1000], inv, winv, out, flag, PARTS, m,
                                64, "half", cfg, angles=angles)
        with pytest.raises(ValueError, match="inv_freq"):
            proj_rope_ws.launch(x16, w16, inv, winv, out, flag, PARTS, m, 64, "half", cfg,
                                angles=(torch.ones(16), torch.arange(m)[None]))
