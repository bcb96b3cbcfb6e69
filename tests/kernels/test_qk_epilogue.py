"""qk_epilogue.py's token-major programs (``qk_norm_rope_(tokens=)``) against its head-row
programs: the same fp16 copies and the same range flag, through the interpreter."""
import pytest
import torch

from inductor_gqa.kernels.qk_epilogue import qk_norm_rope_


def _inputs(g, b, s, h, hk, d, in16, norm, bad=None):
    """Scaled products of one fused QKV GEMM (column slices), their inverse power-of-two scales,
    RoPE tables and norm weights. ``bad``: "tiny" or "overflow" plants one bad head row in k."""
    n = b * s
    dt = torch.float16 if in16 else torch.float32
    qkv = (torch.randn(n, (h + 2 * hk) * d, generator=g) * 4.0).to(dt)
    scales = (2.0 ** torch.randint(-3, 4, (n,), generator=g).float(),
              2.0 ** torch.randint(-3, 4, (h * d,), generator=g).float(),
              2.0 ** torch.randint(-3, 4, (hk * d,), generator=g).float(),
              2.0 ** torch.randint(-3, 4, (hk * d,), generator=g).float())
    if bad == "tiny":
        qkv[1, h * d:h * d + d] = 2.0 ** -20
    elif bad == "overflow" and not in16:
        qkv[n - 1, h * d + d - 1] = 2.0 ** 30
    ang = torch.randn(b, s, d // 2, generator=g)
    cos = torch.cat((ang.cos(), ang.cos()), -1)
    sin = torch.cat((ang.sin(), ang.sin()), -1)
    weights = ((torch.rand(d, generator=g) + 0.5, torch.rand(d, generator=g) + 0.5)
               if norm != "none" else (None, None))
    return qkv, scales, cos, sin, weights


def _run(qkv, scales, cos, sin, weights, b, s, h, hk, d, norm, rope, in16, tokens, wo=None):
    q, k, v = qkv[:, :h * d], qkv[:, h * d:(h + hk) * d], qkv[:, (h + hk) * d:]
    copies = tuple(torch.full(a.shape, float("nan"), dtype=torch.float16) for a in (q, k, v))
    flag = torch.zeros(1, dtype=torch.int32)
    wo_arg = (wo, torch.full(wo.shape, float("nan"), dtype=torch.float16)) if wo is not None \
        else None
    qk_norm_rope_(q, k, *weights, cos if rope != "none" else None,
                  sin if rope != "none" else None, b, s, h, hk, d, norm, 1e-6, rope,
                  d if rope != "none" else 0, v=v, copies=copies, flag=flag, scales=scales,
                  store32=False, in16=in16, tokens=tokens, wo=wo_arg)
    return copies + ((wo_arg[1],) if wo_arg else ()), flag.item()


@pytest.mark.parametrize("h,hk,d,tokens", [(4, 1, 16, (2, 4)), (6, 2, 16, (4, 2)),
                                           (3, 3, 8, (1, 1)), (8, 2, 32, (8, 4))])
@pytest.mark.parametrize("norm,rope,in16", [("none", "half", True), ("none", "half", False),
                                            ("fp32_weight", "half", True),
                                            ("cast_weight", "none", False)])
def test_tokens_match_head_rows(h, hk, d, tokens, norm, rope, in16):
    g = torch.Generator().manual_seed(h * 100 + d)
    b, s = 2, 5         # 10 tokens: partial last programs for every tokens-per-program
    args = _inputs(g, b, s, h, hk, d, in16, norm)
    wo = torch.randn(12, h * d, generator=g) if d == 16 else None
    ref, ref_flag = _run(*args, b, s, h, hk, d, norm, rope, in16, None, wo)
    got, got_flag = _run(*args, b, s, h, hk, d, norm, rope, in16, tokens, wo)
    assert got_flag == ref_flag == 0
    exact = norm == "none"      # a norm's sum may be reduced in another order
    for a, r in zip(got, ref):
        assert not a.isnan().any()
        torch.testing.assert_close(a.float(), r.float(), rtol=0 if exact else 2e-3,
                                   atol=0 if exact else 2e-3)


@pytest.mark.parametrize("bad,in16", [("tiny", True), ("tiny", False), ("overflow", False)])
def test_tokens_raise_the_flag_as_head_rows_do(bad, in16):
    g = torch.Generator().manual_seed(7)
    b, s, h, hk, d = 1, 6, 4, 2, 16
    args = _inputs(g, b, s, h, hk, d, in16, "none", bad=bad)
    _, ref_flag = _run(*args, b, s, h, hk, d, "none", "half", in16, None)
    _, got_flag = _run(*args, b, s, h, hk, d, "none", "half", in16, (2, 2))
    assert got_flag == ref_flag == 1


def test_tokens_refuse_what_they_do_not_cover():
    g = torch.Generator().manual_seed(1)
    b, s, h, hk, d = 1, 4, 2, 1, 16
    qkv, scales, cos, sin, weights = _inputs(g, b, s, h, hk, d, True, "none")
    q, k, v = qkv[:, :h * d], qkv[:, h * d:(h + hk) * d], qkv[:, (h + hk) * d:]
    copies = tuple(torch.empty(a.shape, dtype=torch.float16) for a in (q, k, v))
    flag = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="token-major"):     # a partial rotary dim
        qk_norm_rope_(q, k, None, None, cos[..., :8], sin[..., :8], b, s, h, hk, d, "none",
                      1e-6, "half", 8, v=v, copies=copies, flag=flag, scales=scales,
                      store32=False, in16=True, tokens=(2, 2))
    with pytest.raises(ValueError, match="token-major"):     # no scales
        qk_norm_rope_(q.float(), k.float(), None, None, cos, sin, b, s, h, hk, d, "none",
                      1e-6, "half", d, v=v.float(), copies=copies, flag=flag, store32=False,
                      tokens=(2, 2))
