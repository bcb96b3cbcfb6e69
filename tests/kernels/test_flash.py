"""flash.py's attention launches against a PyTorch reference (CPU, Triton interpreter): every
MODE, sliding windows (with the skipped key tiles), logit softcapping, GQA head packing."""

from __future__ import annotations

import math

import pytest
import torch
from attention_ref import attention

from inductor_gqa.kernels import flash
from inductor_gqa.kernels.launch import direct_launches
from inductor_gqa.plan.configs import AttentionConfig


def reference(q, k, v, scale, causal, window, softcap):
    return attention(q, k, v, scale=scale, causal=causal, window=window, softcap=softcap)


def run(mode, q, k, v, scale, causal, window, softcap, cfg, stats_cfg=None):
    b, h, s, d = q.shape
    hk = k.shape[1]
    rows = lambda t, n: t.transpose(1, 2).reshape(b * s, n * d).contiguous()  # noqa: E731
    qr, kr, vr = rows(q, h), rows(k, hk), rows(v, hk)
    view = lambda t: (t, (s * t.stride(0), d, t.stride(0)))  # noqa: E731
    common = dict(batch=b, seq=s, num_heads=h, groups=h // hk, head_dim=d, scale=scale,
                  causal=causal, prec="ieee", window=window, softcap=softcap)
    o = torch.full((b, s, h * d), float("nan"))
    probs = torch.full((b, h, s, s), float("nan"))
    vv = (vr, (s * vr.stride(0), d, vr.stride(0), 1))
    with direct_launches():
        if mode == 0:
            (o,) = flash.launch(view(qr), view(kr), vv, o, mode=0, cfg=cfg, **common)
            probs = None
        elif mode == 3:
            o, probs = flash.launch(view(qr), view(kr), vv, o, mode=3, cfg=cfg, probs=probs,
                                    **common)
        else:
            ml = torch.full((b * h * s * 2,), float("nan"))
            (ml,) = flash.launch(view(qr), view(kr), vv, None, mode=1, cfg=stats_cfg or cfg,
                                 ml=ml, **common)
            o, probs = flash.launch(view(qr), view(kr), vv, o, mode=2, cfg=cfg, probs=probs,
                                    ml=ml, **common)
    return o.view(b, s, h, d).transpose(1, 2), probs


@pytest.mark.parametrize("mode", [0, 2, 3])
@pytest.mark.parametrize("causal,window", [(True, 0), (True, 5), (True, 40), (False, 7)])
@pytest.mark.parametrize("softcap", [0.0, 2.0])
@pytest.mark.parametrize("s", [29, 64])
def test_modes_windows_softcap(mode, causal, window, softcap, s):
    g = torch.Generator().manual_seed(s + window)
    b, h, hk, d = 2, 4, 2, 16
    q = torch.randn(b, h, s, d, generator=g)
    k = torch.randn(b, hk, s, d, generator=g)
    v = torch.randn(b, hk, s, d, generator=g)
    bn = 64 if mode == 3 else 16          # MODE 3: one key tile per row
    cfg = AttentionConfig(16, bn, 4, 1)
    o, p = run(mode, q, k, v, 0.5, causal, window, softcap, cfg)
    ref_o, ref_p = reference(q, k, v, 0.5, causal, window, softcap)
    torch.testing.assert_close(o, ref_o, atol=2e-5, rtol=1e-4)
    if p is not None:
        torch.testing.assert_close(p, ref_p, atol=2e-6, rtol=1e-4)


@pytest.mark.parametrize("gp", [1, 2])
def test_packed_heads_with_window(gp):
    g = torch.Generator().manual_seed(3)
    b, h, hk, s, d = 1, 4, 1, 45, 16
    q, k, v = (torch.randn(b, n, s, d, generator=g) for n in (h, hk, hk))
    o, p = run(2, q, k, v, 1 / math.sqrt(d), True, 9, 0.0, AttentionConfig(32, 16, 4, 1, gp=gp),
               stats_cfg=AttentionConfig(32, 16, 4, 1))
    ref_o, ref_p = reference(q, k, v, 1 / math.sqrt(d), True, 9, 0.0)
    torch.testing.assert_close(o, ref_o, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(p, ref_p, atol=2e-6, rtol=1e-4)
