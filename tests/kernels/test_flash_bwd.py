"""flash_bwd.py's gradients against torch.autograd on an eager float64 reference of the same
attention (CPU, Triton interpreter). The forward statistics and output come from flash.py itself
(MODE 1's ``ml``, or MODE 0's own with STORE_ML, checked equal to MODE 1's; the output of
MODE 0 or MODE 2), so the contract between the two is tested too:
GQA ratios 1/2/4, ragged S, causal, sliding windows, softcapping, every mask kind with wholly
masked rows (SDPA: zeros; explicit: eager's NaN pattern), a gradient into the returned
probabilities, 16-bit operands, the fused dqkv buffer."""

from __future__ import annotations

import math

import pytest
import torch

from attention_ref import attention

from inductor_gqa.kernels import flash, flash_bwd
from inductor_gqa.kernels.flash_bwd import BackwardConfig
from inductor_gqa.kernels.launch import direct_launches
from inductor_gqa.op.attention_core import ml_of_lse
from inductor_gqa.plan.configs import AttentionConfig

CFG = BackwardConfig(16, 16, 16, 16, 4, 1, pre_m=16)
FWD = AttentionConfig(16, 16, 4, 1)


def reference(q, k, v, do, *, scale, causal=False, window=0, softcap=0.0, mask=None,
              mask_kind="none", mask_fill=float("-inf"), empty_zero=False, dprobs=None,
              divisor=None):
    """Eager attention in float64 and its autograd gradients (dq, dk, dv): q [B, H, S, D], k/v
    [B, Hkv, S, D], do [B, H, S, D]; masks applied with masked_fill / add as eager code does."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    o, p = attention(q, k, v, scale=scale, causal=causal, window=window, softcap=softcap,
                     mask=mask, mask_kind=mask_kind, mask_fill=mask_fill,
                     empty_zero=empty_zero, divisor=divisor)
    loss = (o * do.double()).sum()
    if dprobs is not None:
        loss = loss + (p * dprobs.double()).sum()
    loss.backward()
    return q.grad, k.grad, v.grad


def rows(t):
    """[B, n, S, D] -> [B*S, n*D] rows, as flash.py reads them."""
    b, n, s, d = t.shape
    return t.transpose(1, 2).reshape(b * s, n * d).contiguous()


def heads(t, b, s, n, d):
    return t.reshape(b, s, n, d).transpose(1, 2)


def run(q, k, v, do, *, scale, causal=False, window=0, softcap=0.0, mask=None, mask_kind="none",
        mask_fill=float("-inf"), empty_zero=False, dprobs=None, probs_mode=False, fused=False,
        prec="ieee", cfg=CFG, v_kmajor=False, online_ml=False):
    """Forward with flash.py (ml from MODE 1; o from MODE 0, or MODE 2 with probabilities),
    then flash_bwd.launch; returns (dq, dk, dv) as [B, heads, S, D] float32."""
    b, h, s, d = q.shape
    hk = k.shape[1]
    dt = q.dtype
    upcast = dt != torch.float32
    qr, kr, vr = rows(q), rows(k), rows(v)
    view = lambda t: (t, (s * t.stride(0), d, t.stride(0)))  # noqa: E731
    vv = (vr, (s * vr.stride(0), d, vr.stride(0), 1))
    if v_kmajor:        # V^T [Hkv*D, B*S], the float32 native plan's layout
        vt = vr.t().contiguous()
        vv = (vt, (s, d * b * s, 1, b * s))
    code = flash.MASK_CODES[mask_kind]
    mk = None
    if mask is not None:
        mk = mask.view(torch.uint8) if mask.dtype == torch.bool else mask
        mk = torch.broadcast_to(mk, (b, h, s, s))
    common = dict(batch=b, seq=s, num_heads=h, groups=h // hk, head_dim=d, scale=scale,
                  causal=causal, prec=prec, window=window, softcap=softcap, mask=mk,
                  mask_kind=code, mask_fill=mask_fill, empty_zero=empty_zero, upcast=upcast)
    o = torch.empty((b, s, h * d), dtype=dt)
    ml = torch.empty((b * h * s * 2,))
    probs = None
    with direct_launches():
        (ml,) = flash.launch(view(qr), view(kr), vv, None, mode=1, cfg=FWD, ml=ml,
                             v_kmajor=v_kmajor, **common)
        if probs_mode:
            probs = torch.empty((b, h, s, s), dtype=dt)
            o, probs = flash.launch(view(qr), view(kr), vv, o, mode=2, cfg=FWD, probs=probs,
                                    ml=ml, v_kmajor=v_kmajor, **common)
        elif online_ml:     # the training forward: MODE 0 stores the statistics itself
            ml1 = ml
            o, ml = flash.launch(view(qr), view(kr), vv, o, mode=0, cfg=FWD,
                                 ml=torch.empty_like(ml), v_kmajor=v_kmajor, store_ml=True,
                                 **common)
            torch.testing.assert_close(ml, ml1, rtol=1e-6, atol=0, equal_nan=True)
        else:
            (o,) = flash.launch(view(qr), view(kr), vv, o, mode=0, cfg=FWD, v_kmajor=v_kmajor,
                                **common)
        dor = rows(do)
        ov = (o, (s * h * d, d, h * d))
        kw = dict(common, cfg=cfg, ml=ml, probs=probs if dprobs is not None else None,
                  dprobs=dprobs)
        if fused:
            dqkv = torch.full((b * s, (h + 2 * hk) * d + 8), 7.0, dtype=dt)
            (dqkv,) = flash_bwd.launch(view(qr), view(kr), vv, ov, view(dor), dqkv=dqkv, **kw)
            assert (dqkv[:, (h + 2 * hk) * d:] == 7.0).all()
            dq = dqkv[:, :h * d]
            dk = dqkv[:, h * d:(h + hk) * d]
            dv = dqkv[:, (h + hk) * d:(h + 2 * hk) * d]
        else:
            dq, dk, dv = flash_bwd.launch(view(qr), view(kr), vv, ov, view(dor), **kw)
    return (heads(dq.float(), b, s, h, d), heads(dk.float(), b, s, hk, d),
            heads(dv.float(), b, s, hk, d))


def inputs(b, h, hk, s, d, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(b, n, s, d, generator=g).to(dtype) for n in (h, hk, hk, h))
    return q, k, v, do


def check(got, want, atol, rtol):
    for name, x, y in zip(("dq", "dk", "dv"), got, want):
        torch.testing.assert_close(x.double(), y, atol=atol, rtol=rtol, equal_nan=True,
                                   msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("hk", [4, 2, 1])                  # GQA ratios 1, 2, 4
@pytest.mark.parametrize("causal,window", [(False, 0), (True, 0), (True, 7), (False, 9)])
@pytest.mark.parametrize("s", [37, 48])
def test_gqa_causal_window(hk, causal, window, s):
    q, k, v, do = inputs(1, 4, hk, s, 16, seed=s + 10 * hk + window)
    kw = dict(scale=0.3, causal=causal, window=window)
    check(run(q, k, v, do, **kw), reference(q, k, v, do, **kw), 2e-5, 1e-4)


@pytest.mark.parametrize("softcap", [1.5])
@pytest.mark.parametrize("causal", [False, True])
def test_softcap(softcap, causal):
    q, k, v, do = inputs(2, 4, 2, 29, 16, seed=5)
    kw = dict(scale=0.7, causal=causal, softcap=softcap)
    check(run(q, k, v, do, online_ml=True, **kw), reference(q, k, v, do, **kw), 2e-5, 1e-4)


def test_head_dim_padding_and_div_scale():
    # head_dim 24 (a padded tile); the explicit form's `s / scale` reaches the kernels as its
    # effective multiplier 1 / scale
    q, k, v, do = inputs(1, 2, 1, 21, 24, seed=8)
    kw = dict(causal=True)
    check(run(q, k, v, do, scale=1 / math.sqrt(24.0), **kw),
          reference(q, k, v, do, scale=None, divisor=math.sqrt(24.0), **kw), 2e-5, 1e-4)


def _mask(kind, b, s, seed, empty_rows=(), fill_rows=()):
    """A [B, 1, S, S] mask (broadcast over heads: stride 0) with the rows ``empty_rows`` wholly
    masked."""
    g = torch.Generator().manual_seed(seed)
    if kind == "additive":
        m = torch.randn(b, 1, s, s, generator=g)
        m = m.masked_fill(torch.rand(b, 1, s, s, generator=g) < 0.3, float("-inf"))
        for r in empty_rows:
            m[:, :, r] = float("-inf")
        return m
    keep = torch.rand(b, 1, s, s, generator=g) > 0.3
    for r in empty_rows:
        keep[:, :, r] = False
    return keep if kind == "bool_keep" else ~keep


@pytest.mark.parametrize("kind", ["bool_keep", "additive"])
@pytest.mark.parametrize("empty_zero", [True, False])
@pytest.mark.parametrize("causal", [False, True])
def test_masks_with_empty_rows(kind, empty_zero, causal):
    """Rows 3 and 30 wholly masked (a key tile above row 3's diagonal is skipped when causal).
    SDPA (empty_zero): zero gradients from those rows; explicit: eager's NaN (dV NaN for every
    key of the head, dQ/dK NaN only where no masked_fill zeroed the score's gradient)."""
    b, h, hk, s, d = 2, 4, 2, 35, 16
    q, k, v, do = inputs(b, h, hk, s, d, seed=3)
    m = _mask(kind, b, s, 4, empty_rows=(3, 30))
    kw = dict(scale=0.5, causal=causal, mask=m, mask_kind=kind, empty_zero=empty_zero)
    got, want = run(q, k, v, do, online_ml=True, **kw), reference(q, k, v, do, **kw)
    if not empty_zero:
        assert want[2].isnan().all()            # the pattern the kernels must reproduce
    check(got, want, 2e-5, 1e-4)


@pytest.mark.parametrize("fill", [-1e9, float("-inf")])
def test_bool_fill(fill):
    """bool_fill: the fill overrides the causal -inf (no tile is skipped); a finite fill's
    scores get no gradient, and a row it fills wholly is uniform (its max, -1e9 in log2 units,
    would swallow log2(sum) in a single log-sum-exp); an infinite fill empties row 5 (NaN, as
    eager)."""
    b, h, hk, s, d = 1, 4, 1, 33, 16
    q, k, v, do = inputs(b, h, hk, s, d, seed=6)
    m = _mask("bool_fill", b, s, 7, empty_rows=(5,))
    kw = dict(scale=0.5, causal=True, mask=m, mask_kind="bool_fill", mask_fill=fill)
    check(run(q, k, v, do, **kw), reference(q, k, v, do, **kw), 2e-5, 1e-4)


def test_additive_finfo_min_rows():
    """HF-style additive masks: finfo.min on masked scores, rows 0 and 17 wholly masked (eager:
    uniform probabilities over every key)."""
    b, h, hk, s, d = 1, 2, 1, 30, 16
    q, k, v, do = inputs(b, h, hk, s, d, seed=14)
    m = torch.zeros(b, 1, s, s)
    m = m.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), torch.finfo(torch.float32).min)
    m[:, :, [0, 17]] = torch.finfo(torch.float32).min
    kw = dict(scale=0.5, mask=m, mask_kind="additive", empty_zero=False)
    check(run(q, k, v, do, **kw), reference(q, k, v, do, **kw), 2e-5, 1e-4)


@pytest.mark.parametrize("causal", [False, True])
def test_gradient_into_probabilities(causal):
    """The probabilities are returned (explicit core) and get a gradient of their own."""
    b, h, hk, s, d = 1, 4, 2, 26, 16
    q, k, v, do = inputs(b, h, hk, s, d, seed=9)
    dp = torch.randn(b, h, s, s, generator=torch.Generator().manual_seed(1))
    kw = dict(scale=0.4, causal=causal)
    check(run(q, k, v, do, dprobs=dp, probs_mode=True, **kw),
          reference(q, k, v, do, dprobs=dp, **kw), 2e-5, 1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit(dtype):
    q, k, v, do = inputs(1, 4, 2, 40, 32, seed=11, dtype=dtype)
    m = _mask("additive", 1, 40, 2)
    kw = dict(scale=32 ** -0.5, causal=True, window=20, mask=m.to(dtype), mask_kind="additive")
    got = run(q, k, v, do, online_ml=True, **kw)
    want = reference(q, k, v, do, **kw)
    check(got, want, 3e-2, 3e-2)


def test_fused_dqkv_buffer_kmajor_v_tf32():
    """dq, dk, dv written as column blocks of one [B*S, ld] buffer (columns past them kept);
    V read K-major (V^T, the float32 plan's layout); float32 at PREC tf32 (the interpreter
    computes exact products)."""
    q, k, v, do = inputs(2, 4, 2, 19, 16, seed=12)
    kw = dict(scale=0.25, causal=True)
    check(run(q, k, v, do, fused=True, prec="tf32", v_kmajor=True, **kw),
          reference(q, k, v, do, **kw), 2e-5, 1e-4)


def test_lse_statistics_and_launch_errors():
    """The log-sum-exp form of the statistics gives the same gradients as ml, and so does a
    natural-log LSE (the library's forward) turned into ml by ``ml_of_lse``; misuse is
    refused."""
    b, h, hk, s, d = 1, 2, 1, 17, 16
    q, k, v, do = inputs(b, h, hk, s, d, seed=13)
    qr, kr, vr, dor = rows(q), rows(k), rows(v), rows(do)
    view = lambda t: (t, (s * t.stride(0), d, t.stride(0)))  # noqa: E731
    vv = (vr, (s * vr.stride(0), d, vr.stride(0), 1))
    common = dict(batch=b, seq=s, num_heads=h, groups=h // hk, head_dim=d, scale=0.5,
                  causal=True, prec="ieee")
    with direct_launches():
        (ml,) = flash.launch(view(qr), view(kr), vv, None, mode=1, cfg=FWD,
                             ml=torch.empty(b * h * s * 2), **common)
        (o,) = flash.launch(view(qr), view(kr), vv, torch.empty(b, s, h * d), mode=0, cfg=FWD,
                            **common)
        ov = (o, (s * h * d, d, h * d))
        m_, l_ = ml.view(-1, 2).unbind(1)
        lse = m_ + torch.log2(l_)
        a = flash_bwd.launch(view(qr), view(kr), vv, ov, view(dor), cfg=CFG, ml=ml, **common)
        c = flash_bwd.launch(view(qr), view(kr), vv, ov, view(dor), cfg=CFG, lse=lse, **common)
        nat = ml_of_lse((lse / math.log2(math.e)).view(b, h, s))
        e = flash_bwd.launch(view(qr), view(kr), vv, ov, view(dor), cfg=CFG, ml=nat, **common)
        for x, y, z in zip(a, c, e):
            torch.testing.assert_close(x, y)
            torch.testing.assert_close(x, z)
        with pytest.raises(ValueError, match="exactly one"):
            flash_bwd.launch(view(qr), view(kr), vv, ov, view(dor), cfg=CFG, **common)
        with pytest.raises(ValueError, match="probs and dprobs"):
            flash_bwd.launch(view(qr), view(kr), vv, ov, view(dor), cfg=CFG, ml=ml,
                             dprobs=torch.zeros(b, h, s, s), **common)
