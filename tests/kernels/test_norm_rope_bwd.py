"""norm_rope_bwd.py against torch.autograd on a float64 reference of qk_epilogue.norm_rope's
math (CPU, Triton interpreter): every norm style, RoPE half / interleaved / partial rotary, no
norm or no RoPE, tables with any values (halves that differ: the exact transpose, not only a
rotation by the negative angle) and broadcast over the batch, a padded head size, the fused
dqkv buffer, 16-bit activations; the reference itself against the forward kernel."""

from __future__ import annotations

import pytest
import torch

from inductor_gqa.kernels import norm_rope_bwd, qk_epilogue
from inductor_gqa.kernels.launch import direct_launches


def forward_ref(x, w, cos, sin, *, norm, rope, rotary_dim, eps):
    """x [B, S, heads, D]; cos/sin [B or 1, S, R]; the epilogue in the input's dtype (float64
    here), no roundings."""
    if norm != "none":
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        x = h * (1.0 + w) if norm == "fp32_one_plus_weight" else h * w
    if rope == "none":
        return x
    r = rotary_dim
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    xr, xp = x[..., :r], x[..., r:]
    if rope == "half":
        rot = torch.cat((-xr[..., r // 2:], xr[..., :r // 2]), -1)
    else:
        rot = torch.stack((-xr[..., 1::2], xr[..., ::2]), -1).flatten(-2)
    return torch.cat((xr * c + rot * s, xp), -1)


def case(b, s, h, hk, d, r, seed, dtype=torch.float32, table_batch=None):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b * s, h * d, generator=g).to(dtype) * 3
    k = torch.randn(b * s, hk * d, generator=g).to(dtype) * 3
    wq = (1 + 0.3 * torch.randn(d, generator=g)).to(dtype)
    wk = (1 + 0.3 * torch.randn(d, generator=g)).to(dtype)
    tb = b if table_batch is None else table_batch
    cos = torch.randn(tb, s, r, generator=g).to(dtype)       # any values: the exact transpose
    sin = torch.randn(tb, s, r, generator=g).to(dtype)
    gq = torch.randn(b * s, h * d, generator=g).to(dtype)
    gk = torch.randn(b * s, hk * d, generator=g).to(dtype)
    return q, k, wq, wk, cos, sin, gq, gk


def reference_grads(x, w, cos, sin, gout, *, b, s, heads, d, norm, rope, rotary_dim, eps):
    x64 = x.double().reshape(b, s, heads, d).requires_grad_()
    w64 = w.double().requires_grad_()
    out = forward_ref(x64, w64, cos.double(), sin.double(), norm=norm, rope=rope,
                      rotary_dim=rotary_dim, eps=eps)
    (out * gout.double().reshape(b, s, heads, d)).sum().backward()
    return x64.grad.reshape(b * s, heads * d), (w64.grad if norm != "none" else None)


def run(q, k, wq, wk, cos, sin, gq, gk, *, b, s, h, hk, d, norm, rope, r, eps=1e-5,
        fused=False):
    bc = lambda t: torch.broadcast_to(t, (b, s, t.shape[-1]))  # noqa: E731
    kw = dict(q=q, k=k, q_norm_weight=wq, k_norm_weight=wk, cos=bc(cos), sin=bc(sin), seq=s,
              num_heads=h, num_kv_heads=hk, head_dim=d, norm=norm, eps=eps, rope=rope,
              rotary_dim=r, rows=4)
    with direct_launches():
        if fused:
            buf = torch.full((b * s, (h + 2 * hk) * d), 5.0, dtype=gq.dtype)
            buf[:, :h * d] = gq
            buf[:, h * d:(h + hk) * d] = gk
            buf, dwq, dwk = norm_rope_bwd.launch(dqkv=buf, **kw)
            assert (buf[:, (h + hk) * d:] == 5.0).all()
            return buf[:, :h * d], buf[:, h * d:(h + hk) * d], dwq, dwk
        return norm_rope_bwd.launch(gq.clone(), gk.clone(), **kw)


def check(got, q, k, wq, wk, cos, sin, gq, gk, *, b, s, h, hk, d, norm, rope, r, eps=1e-5,
          atol=1e-5, rtol=1e-5):
    dq, dk, dwq, dwk = got
    for x, w, g, heads, dx, dw in ((q, wq, gq, h, dq, dwq), (k, wk, gk, hk, dk, dwk)):
        want_x, want_w = reference_grads(x, w, cos, sin, g, b=b, s=s, heads=heads, d=d,
                                         norm=norm, rope=rope, rotary_dim=r, eps=eps)
        torch.testing.assert_close(dx.double(), want_x, atol=atol, rtol=rtol)
        if norm == "none":
            assert dw is None
        else:
            assert dw.dtype == torch.float32 and dw.shape == (d,)
            torch.testing.assert_close(dw.double(), want_w, atol=atol * 10, rtol=rtol)


@pytest.mark.parametrize("norm", ["none", "fp32_weight", "cast_weight", "fp32_one_plus_weight"])
@pytest.mark.parametrize("rope,d,r", [("half", 16, 16), ("interleaved", 16, 16),
                                      ("half", 16, 8), ("interleaved", 24, 12),
                                      ("none", 16, 0)])
def test_norm_rope_styles(norm, rope, d, r):
    if norm == "none" and rope == "none":
        pytest.skip("nothing to differentiate")
    b, s, h, hk = 2, 7, 4, 2
    t = case(b, s, h, hk, d, max(r, 2), seed=d + r)
    dims = dict(b=b, s=s, h=h, hk=hk, d=d, norm=norm, rope=rope, r=r)
    check(run(*t, **dims), *t, **dims)


@pytest.mark.parametrize("rope,r", [("half", 16), ("interleaved", 8)])
def test_fused_buffer_and_broadcast_tables(rope, r):
    b, s, h, hk, d = 2, 5, 2, 1, 16
    t = case(b, s, h, hk, d, r, seed=3, table_batch=1)
    dims = dict(b=b, s=s, h=h, hk=hk, d=d, norm="fp32_weight", rope=rope, r=r)
    check(run(*t, fused=True, **dims), *t, **dims)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit(dtype):
    b, s, h, hk, d = 1, 9, 4, 1, 32
    t = case(b, s, h, hk, d, 32, seed=4, dtype=dtype)
    dims = dict(b=b, s=s, h=h, hk=hk, d=d, norm="cast_weight", rope="half", r=32)
    got = run(*t, **dims)
    assert got[0].dtype == dtype
    check(got, *t, **dims, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("norm,rope,r", [("fp32_weight", "half", 16),
                                         ("fp32_one_plus_weight", "interleaved", 8)])
def test_reference_is_the_forward_kernel(norm, rope, r):
    """The function differentiated above is the one qk_epilogue.norm_rope computes."""
    b, s, h, hk, d = 1, 6, 2, 2, 16
    q, k, wq, wk, cos, sin, _, _ = case(b, s, h, hk, d, r, seed=5)
    bc = lambda t: torch.broadcast_to(t, (b, s, r))  # noqa: E731
    with direct_launches():
        oq, ok = qk_epilogue.norm_rope(
            q.clone(), k.clone(), q_norm_weight=wq, k_norm_weight=wk, cos=bc(cos), sin=bc(sin),
            seq=s, num_heads=h, num_kv_heads=hk, head_dim=d, norm=norm, eps=1e-5, eps_k=1e-5,
            rope=rope, rotary_dim=r)
    for x, w, o, n in ((q, wq, oq, h), (k, wk, ok, hk)):
        want = forward_ref(x.double().reshape(b, s, n, d), w.double(), cos.double(),
                           sin.double(), norm=norm, rope=rope, rotary_dim=r, eps=1e-5)
        torch.testing.assert_close(o.double().reshape(b, s, n, d), want, atol=1e-5, rtol=1e-5)


def test_launch_errors():
    q = torch.zeros(4, 32)
    with pytest.raises(ValueError, match="pre-norm"):
        norm_rope_bwd.launch(q.clone(), q.clone(), seq=4, num_heads=2, num_kv_heads=2,
                             head_dim=16, norm="fp32_weight", rope="none")
