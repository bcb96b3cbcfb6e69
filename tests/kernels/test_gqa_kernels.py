"""Fused kernels vs the eager reference, on CPU through the Triton interpreter (small shapes)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch


@pytest.fixture(autouse=True)
def kernels_on_cpu(monkeypatch):
    """Route the op to the kernels (interpreted) for this module's tests only."""
    monkeypatch.setenv("INDUCTOR_GQA_KERNELS_ON_CPU", "1")


from inductor_gqa.op import call_attention_block  # noqa: E402
from inductor_gqa.op.reference import attention_block_reference  # noqa: E402
from inductor_gqa.plan.spec import BlockSpec  # noqa: E402
from inductor_gqa.kernels import tuning  # noqa: E402
from inductor_gqa.lower import attention as attn, block, fp16_plans  # noqa: E402
from inductor_gqa.workloads import check  # noqa: E402


def _inputs(spec: BlockSpec, b, s, e, dtype, *, bias=False, wo=True, bo=False, cos_mode="freq",
            cos_shape="bsr", mask_shape=(None, None), seed=0):
    g = torch.Generator().manual_seed(seed)
    h, hk, d = spec.num_heads, spec.num_kv_heads, spec.head_dim

    def rn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dtype)

    t = dict(x=rn(b, s, e), wq=rn(h * d, e, scale=e ** -0.5), wk=rn(hk * d, e, scale=e ** -0.5),
             wv=rn(hk * d, e, scale=e ** -0.5), bq=None, bk=None, bv=None, q_norm_weight=None,
             k_norm_weight=None, cos=None, sin=None, inv_freq=None, position_ids=None,
             attn_mask=None, wo=None, bo=None)
    if bias:
        t.update(bq=rn(h * d), bk=rn(hk * d), bv=rn(hk * d))
    if wo:
        t["wo"] = rn(e, h * d, scale=(h * d) ** -0.5)
        if bo:
            t["bo"] = rn(e)
    if spec.norm != "none":
        t["q_norm_weight"] = (1.0 + 0.3 * torch.randn(d, generator=g)).to(dtype)
        t["k_norm_weight"] = (1.0 + 0.3 * torch.randn(d, generator=g)).to(dtype)
    if spec.rope != "none":
        r = spec.rotary_dim
        if cos_mode == "freq":
            t["inv_freq"] = 1.0 / 10000 ** (torch.arange(0, r, 2, dtype=torch.float32) / r)
            t["position_ids"] = (torch.arange(s)[None] + 3 * torch.arange(b)[:, None]).contiguous()
        else:
            lead = {"bsr": (b, s), "1sr": (1, s), "sr": (s,), "b1sr": (b, 1, s)}[cos_shape]
            ang = torch.rand(*lead, r, generator=g) * 2 * math.pi - math.pi
            t["cos"], t["sin"] = ang.cos().to(dtype), ang.sin().to(dtype)
    kind, shape = mask_shape
    if spec.mask != "none":
        full = torch.rand(b, h, s, s, generator=g)
        if spec.mask in ("bool_keep", "bool_fill"):
            m = full > 0.3
            eye = torch.eye(s, dtype=torch.bool)
            m = (m | eye) if spec.mask == "bool_keep" else (m & ~eye)
        else:
            m = (torch.randn(b, h, s, s, generator=g) * 2).to(dtype)
        shape = shape or (b, h, s, s)
        idx = tuple(slice(None) if n > 1 else slice(0, 1) for n in shape[-4:])
        m = m[(slice(None),) * (4 - len(shape)) + idx] if len(shape) == 4 else m[0, 0]
        t["attn_mask"] = m.reshape(shape).contiguous()
    return t


def _compare(spec, b, s, e, dtype, **kw):
    t = _inputs(spec, b, s, e, dtype, **kw)
    got = block.run_block(dict(t), spec)
    assert got is not None, "kernels declined a covered case"
    out, probs = got
    with torch.no_grad():
        ref, ref_p = attention_block_reference(**t, spec=spec)
    assert out.shape == ref.shape and out.dtype == ref.dtype and out.is_contiguous()
    if dtype == torch.float32:
        torch.testing.assert_close(out, ref, atol=2e-4, rtol=2e-4)
    else:
        ok, frac = check(out, ref, 3e-2, 5e-2)
        assert ok, frac
    if spec.return_probs:
        assert probs.shape == ref_p.shape and probs.dtype == ref_p.dtype
        if dtype == torch.float32:
            torch.testing.assert_close(probs, ref_p, atol=2e-5, rtol=1e-4)
        else:
            ok, frac = check(probs, ref_p, 1e-2, 5e-2)
            assert ok, frac
    else:
        assert probs.numel() == 0


F32 = torch.float32
BF16 = torch.bfloat16


# W075-like: fp32, RoPE from inv_freq, scale 1, probabilities, GQA 2:1 (S = 20: the row stride
# a multiple of 4 but not of 16, the probabilities passes' ROW4)
@pytest.mark.parametrize("s", [5, 17, 20, 33])
@pytest.mark.parametrize("causal", [False, True])
def test_w075_like(s, causal):
    spec = BlockSpec(num_heads=4, num_kv_heads=2, head_dim=16, rope="half", rotary_dim=16,
                     core="explicit", scale=1.0, causal=causal, return_probs=True)
    _compare(spec, 2, s, 64, F32)


@pytest.mark.parametrize("dtype,causal,mask,probs,s", [
    (F32, False, "none", True, 70), (F32, True, "none", True, 70), (F32, True, "bool_fill", True, 37),
    (F32, False, "additive", False, 37), (BF16, True, "none", False, 70),
    (BF16, False, "bool_keep", True, 33)])
def test_pipelined_scores(monkeypatch, dtype, causal, mask, probs, s):
    # flash.PIPELINE (next tile's q @ k^T issued before this tile's softmax): a candidate of the
    # probabilities pass on the GPU; here every pass is made to take it
    monkeypatch.setattr(attn, "_attention_candidates",
                        lambda *a, **k: [(32, 32, 4, 1, "pipeline")])
    spec = BlockSpec(num_heads=4, num_kv_heads=2, head_dim=16, core="explicit", scale=0.25,
                     scale_op="mul", causal=causal, mask=mask, mask_fill=-1e4,
                     return_probs=probs)
    _compare(spec, 2, s, 64, dtype, mask_shape=(mask, None))


def test_sdpa_choice_output_is_returned(monkeypatch):
    """When the library SDPA wins a bucket its own output tensor is the block's attention output."""
    monkeypatch.setattr(attn, "_attention_candidates", lambda *a, **k: [])
    monkeypatch.setattr(attn, "_sdpa_ok", lambda *a: True)
    spec = BlockSpec(num_heads=4, num_kv_heads=2, head_dim=16, core="sdpa", scale=0.25,
                     causal=True)
    _compare(spec, 2, 19, 64, BF16)


@pytest.mark.parametrize("dtype,causal,mask,s,high", [
    (F32, False, "none", 17, False), (F32, True, "none", 33, True), (F32, True, "bool_fill", 9, False),
    (F32, False, "additive", 70, True), (BF16, True, "bool_keep", 21, False)])
def test_single_pass_probabilities(monkeypatch, dtype, causal, mask, s, high):
    """flash.py's MODE 3 (whole row in one key tile): a candidate for S <= 256, the first one
    under the interpreter."""
    assert attn._single_pass_candidates(s)[0][1] >= s
    assert not attn._single_pass_candidates(257)
    monkeypatch.setenv("INDUCTOR_GQA_SINGLE_PASS", "0")
    assert not attn._single_pass_candidates(s)
    monkeypatch.delenv("INDUCTOR_GQA_SINGLE_PASS")
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if high else "highest")   # fp16 copies or not
    try:
        spec = BlockSpec(num_heads=4, num_kv_heads=2, head_dim=16, core="explicit", scale=0.25,
                         scale_op="mul", causal=causal, mask=mask, mask_fill=-1e4,
                         return_probs=True)
        if high:
            t = _inputs(spec, 2, s, 64, dtype, mask_shape=(mask, None))
            with torch.no_grad():
                ref, ref_p = attention_block_reference(**t, spec=spec)
            out, p = block.run_block(dict(t), spec)
            _close_high(out, ref, 2e-3)
            _close_high(p, ref_p, 2e-3)
        else:
            _compare(spec, 2, s, 64, dtype, mask_shape=(mask, None))
    finally:
        torch.set_float32_matmul_precision(old)


@pytest.fixture
def tf32_allowed(monkeypatch):
    """float32 matmul precision "high": the block may run its dots on fp16 copies (the "f16"
    plan: projections in float32; ``fp16_projections`` below for the first plan, "f16proj")."""
    monkeypatch.setenv("INDUCTOR_GQA_FP16_PROJECTIONS", "0")
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    yield
    torch.set_float32_matmul_precision(old)


def _w075_spec(causal=False, mask="none", probs=True):
    return BlockSpec(num_heads=4, num_kv_heads=2, head_dim=16, rope="half", rotary_dim=16,
                     core="explicit", scale=1.0, causal=causal, mask=mask, mask_fill=-1e4,
                     return_probs=probs)


def _close_high(got, ref, atol):
    # the workload rule: fp16 copies round like TF32 (10-bit significand, to nearest)
    ok, frac = check(got, ref, atol, 1e-5)
    assert ok and torch.isfinite(got).all(), frac


@pytest.mark.parametrize("causal,mask,probs,s", [(False, "none", True, 17), (True, "none", True, 33),
                                                (False, "bool_keep", True, 9),
                                                (True, "additive", False, 21)])
def test_f16_copies_under_high(tf32_allowed, monkeypatch, causal, mask, probs, s):
    """Under "high" float32 blocks may compute on fp16 copies (the first plan under the
    interpreter): same results as the float32 plan within TF32-like error."""
    spec = _w075_spec(causal, mask, probs)
    assert block.f16_operands_allowed(torch.float32, block.fp32_dot_precision())
    t = _inputs(spec, 2, s, 64, F32, mask_shape=(mask, None))
    with torch.no_grad():
        ref, ref_p = attention_block_reference(**t, spec=spec)
    out, p = block.run_block(dict(t), spec)
    _close_high(out, ref, 2e-3)
    if probs:
        _close_high(p, ref_p, 2e-3)
    monkeypatch.setenv("INDUCTOR_GQA_FP16_OPERANDS", "0")      # the float32 plan, for scale
    out32, _ = block.run_block(dict(t), spec)
    _close_high(out32, ref, 2e-3)


@pytest.mark.parametrize("proj", [False, True])
def test_f16_copies_odd_head_dim(tf32_allowed, monkeypatch, proj):
    """head_dim 24 (padded tiles) and 3 query heads per KV head, with RMSNorm, on fp16 copies."""
    if proj:
        monkeypatch.delenv("INDUCTOR_GQA_FP16_PROJECTIONS")
    spec = BlockSpec(num_heads=6, num_kv_heads=2, head_dim=24, norm="fp32_weight", eps=1e-6,
                     rope="half", rotary_dim=16, core="explicit", scale=24 ** -0.5, causal=True,
                     return_probs=True)
    t = _inputs(spec, 2, 11, 48, F32)
    with torch.no_grad():
        ref, ref_p = attention_block_reference(**t, spec=spec)
    out, p = block.run_block(dict(t), spec)
    _close_high(out, ref, 1e-3 * ref.abs().max().item())
    _close_high(p, ref_p, 2e-3)


@pytest.mark.parametrize("which,proj,few", [("q", False, False), ("v", False, False),
                                            ("v", False, True), ("v", True, True)])
def test_f16_copies_overflow_falls_back(tf32_allowed, monkeypatch, which, proj, few):
    """A value beyond fp16's range must not reach the fp16 kernels: the flag routes the block to
    the float32 kernels (without the fallback q or v would be inf and the outputs NaN). ``few``:
    the guarded launches (attention, epilogue finisher, o_proj) get 2 programs each, which loop
    over all the work; ``proj``: the f16proj plan (its epilogue finisher too)."""
    if few:
        monkeypatch.setattr(tuning, "GUARDED_PROGRAMS", 2)
    if proj:
        monkeypatch.delenv("INDUCTOR_GQA_FP16_PROJECTIONS")
    spec = _w075_spec()
    t = _inputs(spec, 2 if few else 1, 37 if few else 19, 64, F32)
    t["wq" if which == "q" else "wv"] = t["wq" if which == "q" else "wv"] * 3e5
    with torch.no_grad():
        ref, ref_p = attention_block_reference(**t, spec=spec)
    out, p = block.run_block(dict(t), spec)
    assert torch.isfinite(out).all() and torch.isfinite(p).all()
    torch.testing.assert_close(p, ref_p, atol=2e-3, rtol=1e-3)
    torch.testing.assert_close(out, ref, atol=2e-3 * ref.abs().max().item(), rtol=1e-3)


@pytest.mark.parametrize("proj", [False, True])
def test_f16_copies_tiny_values_fall_back(tf32_allowed, monkeypatch, proj):
    """V at 2^-20 of its usual scale would be fp16 subnormals (about 2^-25 absolute error, a few
    percent of the output): the flag routes the block to the float32 kernels, which keep TF32's
    relative error."""
    if proj:
        monkeypatch.delenv("INDUCTOR_GQA_FP16_PROJECTIONS")
    spec = _w075_spec()
    t = _inputs(spec, 1, 19, 64, F32)
    t["wv"] = t["wv"] * 2.0 ** -20
    with torch.no_grad():
        ref, ref_p = attention_block_reference(**t, spec=spec)
    out, p = block.run_block(dict(t), spec)
    _close_high(p, ref_p, 2e-3)
    torch.testing.assert_close(out, ref, atol=1e-3 * ref.abs().max().item(), rtol=0)


@pytest.mark.parametrize("proj", [False, True])
def test_nan_in_one_batch_stays_there(tf32_allowed, monkeypatch, proj):
    """A NaN in one token of batch 1 makes eager's batch 1 NaN and leaves batch 0 alone; on fp16
    copies the range flag sends the block to the float32 fallback (the staged GPU kernels read
    a batch's tail keys from the next batch, where 0 * NaN would cross over), which must do the
    same: batch 0 as the clean reference, batch 1 non-finite wherever eager's is."""
    if proj:
        monkeypatch.delenv("INDUCTOR_GQA_FP16_PROJECTIONS")
    spec = _w075_spec()
    t = _inputs(spec, 2, 19, 64, F32)
    t["x"] = t["x"].clone()
    t["x"][1, 5, 7] = float("nan")
    with torch.no_grad():
        ref, ref_p = attention_block_reference(**t, spec=spec)
    out, p = block.run_block(dict(t), spec)
    assert torch.isnan(ref[1]).any() and torch.isfinite(ref[0]).all()
    _close_high(p[0], ref_p[0], 2e-3)
    torch.testing.assert_close(out[0], ref[0], atol=2e-3 * ref[0].abs().max().item(), rtol=1e-3)
    assert torch.equal(torch.isfinite(out[1]), torch.isfinite(ref[1]))
    assert torch.equal(torch.isfinite(p[1]), torch.isfinite(ref_p[1]))


@pytest.mark.parametrize("proj", [False, True])
def test_fp16_o_proj(tf32_allowed, monkeypatch, proj):
    """With fp16 copies, o_proj runs on fp16 o and Wo (written by the attention and epilogue
    launches); INDUCTOR_GQA_FP16_OPROJ=0 keeps it in float32."""
    if proj:
        monkeypatch.delenv("INDUCTOR_GQA_FP16_PROJECTIONS")
    calls = []
    real = fp16_plans._o_proj16
    monkeypatch.setattr(fp16_plans, "_o_proj16", lambda *a: calls.append(1) or real(*a))
    spec = _w075_spec(causal=True)
    t = _inputs(spec, 2, 21, 64, F32)
    with torch.no_grad():
        ref, ref_p = attention_block_reference(**t, spec=spec)
    for off in ("1", "0"):
        monkeypatch.setenv("INDUCTOR_GQA_FP16_OPROJ", "0" if off == "0" else "1")
        calls.clear()
        out, p = block.run_block(dict(t), spec)
        assert len(calls) == (off == "1")
        _close_high(out, ref, 1e-3 * ref.abs().max().item())
        _close_high(p, ref_p, 2e-3)
    t_bias = _inputs(spec, 1, 5, 64, F32, bo=True)
    assert fp16_plans.fp16_o_proj(t_bias, spec, t_bias["x"]) is None      # a bias: float32 o_proj


@pytest.mark.parametrize("proj", [False, True])
def test_fp16_o_proj_tiny_output_falls_back(tf32_allowed, monkeypatch, proj):
    """V rows well inside fp16's range can still average to an output below it: x rows of
    alternating sign, Wq = 0 (uniform probabilities) and an odd S give o = v0 / S, 2^-13 / 19
    here. The attention kernel raises the flag and the float32 fallback (attention and o_proj)
    gives the result; fp16 subnormals would be ~0.5% off."""
    if proj:
        monkeypatch.delenv("INDUCTOR_GQA_FP16_PROJECTIONS")
    spec = _w075_spec()
    t = _inputs(spec, 1, 19, 64, F32)
    sign = torch.tensor([(-1.0) ** i for i in range(19)])
    t["x"] = sign[None, :, None] * t["x"][:, :1]
    t["wq"] = torch.zeros_like(t["wq"])
    v0 = t["x"][0, 0] @ t["wv"].t()
    t["wv"] = t["wv"] * (2.0 ** -13 / v0.abs().max())
    with torch.no_grad():
        ref, ref_p = attention_block_reference(**t, spec=spec)
    out, p = block.run_block(dict(t), spec)
    _close_high(p, ref_p, 2e-3)
    torch.testing.assert_close(out, ref, atol=1e-3 * ref.abs().max().item(), rtol=0)


def test_attention_fp16_output_range_flag():
    """An fp16 output row below 2^-14 (or at fp16's limit) raises the flag; normal rows do not."""
    from inductor_gqa.kernels import flash
    b, s, h, hk, d = 1, 8, 2, 1, 16
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(b * s, n * d, generator=g).half() for n in (h, hk))
    for scale, raised in ((1.0, False), (2.0 ** -18, True), (7e4, True)):
        v = torch.full((b * s, hk * d), scale).half()
        o = torch.full((b, s, h * d), float("nan")).half()
        flag = torch.zeros(1, dtype=torch.int32)
        flash.launch((q, (s * h * d, d, h * d)), (k, (s * hk * d, d, hk * d)),
                     (v, (s * hk * d, d, hk * d, 1)), o, None, None, None, b, s, h, h // hk, d,
                     1.0, 0.0, False, 0, 0, "ieee", True, 32, 32, 4, 1, flag=flag, guard=1)
        assert flag.item() == raised, scale


def test_linear_guard():
    from inductor_gqa.kernels import linear as lk
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(40, 24, generator=g), torch.randn(16, 24, generator=g)
    for flag, runs in ((0, False), (1, True)):
        y = torch.full((40, 16), float("nan"))
        lk.launch(x, w, None, y, "tf32x3", 32, 32, 32, 8, 4, 1,
                  flag=torch.tensor([flag], dtype=torch.int32), guard=2)
        if runs:
            torch.testing.assert_close(y, x @ w.t())
        else:
            assert torch.isnan(y).all()


def test_f16_overflow_flag():
    from inductor_gqa.kernels.qk_epilogue import qk_norm_rope_
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(6, 32, generator=g), torch.randn(6, 16, generator=g), torch.randn(6, 16, generator=g)
    cases = [(None, None)] + [(w, c) for w in ("q", "k", "v") for c in ("over", "tiny")]
    for which, how in cases + [("v", "zero"), ("q", "one small"), ("v", "nan"), ("k", "inf")]:
        qq, kk, vv = q.clone(), k.clone(), v.clone()
        if how == "over":
            dict(q=qq, k=kk, v=vv)[which][3, 5] = 7e4        # beyond fp16's 65504
        elif how == "tiny":     # one head row entirely below fp16's normal range
            a = dict(q=qq, k=kk, v=vv)[which]
            a[3, :16] *= 2.0 ** -17 / a[3, :16].abs().max()
        elif how == "zero":     # exact in fp16
            vv[3] = 0.0
        elif how == "one small":    # a small value in a normal row costs nothing
            qq[3, 5] = 1e-7
        elif how in ("nan", "inf"):     # non-finite: the float32 fallback keeps batches apart
            dict(q=qq, k=kk, v=vv)[which][3, 5] = float(how)
        raised = how in ("over", "tiny", "nan", "inf")
        copies = (torch.empty_like(qq, dtype=torch.float16),
                  torch.empty_like(kk, dtype=torch.float16),
                  torch.empty_like(vv, dtype=torch.float16), torch.zeros(1, dtype=torch.int32))
        qk_norm_rope_(qq, kk, None, None, None, None, 1, 6, 2, 1, 16, "none", 1e-6, "none", 0,
                      v=vv, copies=copies[:3], flag=copies[3])
        assert copies[3].item() == raised, (which, how)
        for c, x in zip(copies[:3], (qq, kk, vv)):     # round to nearest, elsewhere exact
            fine = x.abs() < 6e4        # (False for NaN)
            assert torch.equal(c.float()[fine], x.half().float()[fine])


@pytest.mark.parametrize("d", [16, 24])
def test_wo16_alone_matches_epilogue(d):
    """Wo's fp16 copy as a launch of its own (``wo16_``, the fp16 plans' side stream under
    graph capture) writes what the norm/RoPE launch's Wo programs write, and raises the flag
    for the same rows (a value beyond fp16's range, a row of D below its normal range)."""
    from inductor_gqa.kernels.qk_epilogue import qk_norm_rope_, wo16_
    g = torch.Generator().manual_seed(0)
    h, hk = 2, 1
    q, k, v = (torch.randn(6, n * d, generator=g) for n in (h, hk, hk))
    for how in (None, "over", "tiny"):
        wo = torch.randn(20, h * d, generator=g)
        if how == "over":
            wo[7, 3] = 7e4
        elif how == "tiny":
            wo[11, :d] *= 2.0 ** -17 / wo[11, :d].abs().max()
        copies = tuple(torch.empty_like(a, dtype=torch.float16) for a in (q, k, v))
        flag_in, flag_alone = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
        wo16_in = torch.full(wo.shape, float("nan"), dtype=torch.float16)
        qk_norm_rope_(q.clone(), k.clone(), None, None, None, None, 1, 6, h, hk, d, "none",
                      1e-6, "none", 0, v=v.clone(), copies=copies, flag=flag_in,
                      wo=(wo, wo16_in))
        wo16 = torch.full(wo.shape, float("nan"), dtype=torch.float16)
        wo16_(wo, wo16, flag_alone, d)
        assert flag_alone.item() == flag_in.item() == (how is not None), how
        assert torch.equal(wo16, wo16_in), how
    with pytest.raises(ValueError):
        wo16_(wo, wo16.float(), flag_alone, d)


@pytest.mark.parametrize("guard,flag,runs", [(1, 0, True), (1, 1, False), (2, 0, False),
                                             (2, 1, True)])
def test_attention_guard(guard, flag, runs):
    """GUARD 1 runs only while the overflow flag is clear, GUARD 2 only when it is set."""
    from inductor_gqa.kernels import flash
    b, s, h, hk, d = 1, 8, 2, 1, 16
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b * s, n * d, generator=g) for n in (h, hk, hk))
    o = torch.full((b, s, h * d), float("nan"))
    flash.launch((q, (s * h * d, d, h * d)), (k, (s * hk * d, d, hk * d)),
                 (v, (s * hk * d, d, hk * d, 1)), o, None, None, None, b, s, h, h // hk, d, 1.0,
                 0.0, False, 0, 0, "ieee", False, 32, 32, 4, 1,
                 flag=torch.tensor([flag], dtype=torch.int32), guard=guard)
    assert bool(torch.isfinite(o).all()) == runs


def test_scale_rows_exact_power_of_two_scales():
    from inductor_gqa.kernels.fp16_rows import scale_rows
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 40, generator=g)
    x[0] *= 1e30
    x[1] *= 1e-30
    x[2] = 0.0
    x[3, 5] = 7e4                      # a lone value beyond fp16's range
    w = torch.randn(3, 40, generator=g) * 0.02
    (x16, xi), (w16, wi) = scale_rows([x, w])
    assert torch.isfinite(x16.float()).all() and torch.isfinite(w16.float()).all()
    for a, a16, inv in ((x, x16, xi), (w, w16, wi)):
        m, ex = torch.frexp(inv)                    # reciprocal scales are powers of two
        assert torch.all(m == 0.5)
        amax = (a16.float().abs().amax(1))
        nz = a.abs().amax(1) > 0
        assert torch.all((amax[nz] >= 2 ** 13) & (amax[nz] <= 2 ** 14))
        torch.testing.assert_close(a16.float() * inv[:, None], a, rtol=2 ** -11, atol=0)
    assert xi[2] == 1.0 and torch.all(x16[2] == 0)
    flag = torch.tensor([7], dtype=torch.int32)     # the launch also clears the range flag
    scale_rows([w], zero=flag)
    assert flag.item() == 0
    with pytest.raises(ValueError, match="one-element int32"):
        scale_rows([w], zero=torch.zeros(2, dtype=torch.int32))


@pytest.fixture
def fp16_projections(monkeypatch, tf32_allowed):
    monkeypatch.delenv("INDUCTOR_GQA_FP16_PROJECTIONS")


@pytest.mark.parametrize("causal,mask,probs,s", [(False, "none", True, 17), (True, "none", True, 33),
                                                (False, "bool_keep", True, 9),
                                                (True, "additive", False, 21)])
def test_f16_projections_under_high(fp16_projections, causal, mask, probs, s):
    """The f16proj plan: Q/K/V GEMMs on scaled fp16 copies too (first plan under the
    interpreter)."""
    spec = _w075_spec(causal, mask, probs)
    t = _inputs(spec, 2, s, 64, F32, mask_shape=(mask, None))
    assert block.f16_projections_offered(t, t["x"])
    t["x"][0, 1] = 0.0                              # a zero row: scale 1
    with torch.no_grad():
        ref, ref_p = attention_block_reference(**t, spec=spec)
    out, p = block.run_block(dict(t), spec)
    # the projections' operands are rounded too now (as TF32 GEMMs round them on the GPU): error
    # ~2^-10 of the output's scale (outputs here reach ~3.5, the workloads' ~0.5)
    _close_high(out, ref, 1e-3 * ref.abs().max().item())
    if probs:
        _close_high(p, ref_p, 2e-3)


def test_f16_projections_not_with_biases(fp16_projections):
    spec = _w075_spec()
    t = _inputs(spec, 1, 5, 64, F32, bias=True)
    assert not block.f16_projections_offered(t, t["x"])


@pytest.mark.parametrize("norm", ["none", "fp32_weight"])
def test_f16_projections_overflow_falls_back(fp16_projections, norm):
    """Wq * 2^-18 and Wk * 2^18 leave the scores exact but put k beyond fp16: the guarded
    epilogue must finish q, k, v in float32 (scales undone) for the fallback kernels."""
    spec = BlockSpec(num_heads=4, num_kv_heads=2, head_dim=16, norm=norm, eps=1e-6,
                     rope="half", rotary_dim=16, core="explicit", scale=1.0, return_probs=True)
    t = _inputs(spec, 2, 13, 64, F32)
    with torch.no_grad():
        ref, ref_p = attention_block_reference(**t, spec=spec)
    if norm == "none":
        t.update(wq=t["wq"] * 2.0 ** -18, wk=t["wk"] * 2.0 ** 18)
    else:               # RMSNorm undoes a scale of k: overflow through the norm weight instead
        t.update(k_norm_weight=t["k_norm_weight"] * 2.0 ** 18, q_norm_weight=t["q_norm_weight"]
                 * 2.0 ** -18)
    out, p = block.run_block(dict(t), spec)
    assert torch.isfinite(out).all() and torch.isfinite(p).all()
    _close_high(p, ref_p, 2e-3)
    _close_high(out, ref, 1e-3 * ref.abs().max().item())


# W092-like: bf16, bias, QK RMSNorm, RoPE from cos/sin, causal, scale 1/sqrt(d), GQA 4:1
@pytest.mark.parametrize("s", [17, 33])
def test_w092_like(s):
    spec = BlockSpec(num_heads=4, num_kv_heads=1, head_dim=32, norm="fp32_weight", eps=1e-5,
                     rope="half", rotary_dim=32, core="explicit", scale=32 ** -0.5, causal=True)
    _compare(spec, 2, s, 64, BF16, bias=True, cos_mode="tensor")


@pytest.mark.parametrize("norm", ["fp32_weight", "cast_weight", "fp32_one_plus_weight"])
@pytest.mark.parametrize("rope,rdim", [("half", 32), ("interleaved", 32), ("half", 16),
                                       ("interleaved", 8), ("none", 0)])
def test_norm_rope_variants(norm, rope, rdim):
    spec = BlockSpec(num_heads=4, num_kv_heads=2, head_dim=32, norm=norm, eps=1e-6, rope=rope,
                     rotary_dim=rdim, core="sdpa", scale=32 ** -0.5, causal=False)
    _compare(spec, 1, 17, 64, F32, bias=True, cos_mode="tensor")


@pytest.mark.parametrize("rope,rdim", [("half", 16), ("interleaved", 32)])
@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("heads,kv", [(4, 2), (6, 3)])   # angles per token / per row
def test_rope_from_freq(rope, rdim, dtype, heads, kv):
    spec = BlockSpec(num_heads=heads, num_kv_heads=kv, head_dim=32, rope=rope, rotary_dim=rdim,
                     core="sdpa", scale=32 ** -0.5, causal=True)
    _compare(spec, 2, 17, 64, dtype, cos_mode="freq")


@pytest.mark.parametrize("cos_shape", ["1sr", "sr", "b1sr"])
def test_cos_broadcast(cos_shape):
    spec = BlockSpec(num_heads=4, num_kv_heads=2, head_dim=16, rope="half", rotary_dim=16,
                     core="sdpa", scale=0.25)
    _compare(spec, 2, 9, 64, F32, cos_mode="tensor", cos_shape=cos_shape)


@pytest.mark.parametrize("core,mask,fill,shape,causal", [
    ("sdpa", "bool_keep", float("-inf"), None, False),
    ("sdpa", "bool_keep", float("-inf"), (2, 1, 17, 17), True),
    ("sdpa", "additive", float("-inf"), (17, 17), False),
    ("explicit", "bool_keep", float("-inf"), (1, 1, 1, 17), False),
    ("explicit", "bool_fill", float("-inf"), None, True),
    ("explicit", "bool_fill", -1e4, (2, 1, 17, 17), True),
    ("explicit", "additive", float("-inf"), (2, 4, 17, 17), True),
])
@pytest.mark.parametrize("probs", [False, True])
def test_masks(core, mask, fill, shape, causal, probs):
    if probs and core == "sdpa":
        pytest.skip("sdpa core has no probabilities")
    spec = BlockSpec(num_heads=4, num_kv_heads=2, head_dim=16, core=core, scale=0.25,
                     scale_op="mul", causal=causal, mask=mask, mask_fill=fill,
                     return_probs=probs)
    _compare(spec, 2, 17, 64, F32, mask_shape=(mask, shape))


@pytest.mark.parametrize("mask", ["additive", "bool_fill"])
@pytest.mark.parametrize("probs", [False, True])
def test_finfo_min_masks_whole_rows(mask, probs):
    # finfo.min in log2 units must stay finite: a wholly masked row is uniform in eager
    spec = BlockSpec(num_heads=4, num_kv_heads=2, head_dim=16, core="explicit", scale=0.25,
                     scale_op="mul", mask=mask, mask_fill=torch.finfo(F32).min,
                     return_probs=probs)
    t = _inputs(spec, 2, 17, 64, F32, mask_shape=(mask, (2, 1, 17, 17)))
    m = t["attn_mask"]
    if mask == "additive":
        m[:, :, 3:5] = torch.finfo(F32).min
        m[:, :, 7, :9] = torch.finfo(F32).min
    else:
        m[:, :, 3:5] = True
        m[:, :, 7, :9] = True
    got = block.run_block(dict(t), spec)
    with torch.no_grad():
        ref, ref_p = attention_block_reference(**t, spec=spec)
    torch.testing.assert_close(got[0], ref, atol=2e-4, rtol=2e-4)
    if probs:
        torch.testing.assert_close(got[1], ref_p, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(got[1][:, :, 3], torch.full_like(got[1][:, :, 3], 1 / 17))


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("wo,bo", [(True, True), (False, False)])
def test_sdpa_core_no_probs(dtype, wo, bo):
    spec = BlockSpec(num_heads=4, num_kv_heads=2, head_dim=32, core="sdpa", scale=0.2,
                     causal=True)
    _compare(spec, 2, 33, 64, dtype, wo=wo, bo=bo)


def test_explicit_div_scale_bf16_probs():
    spec = BlockSpec(num_heads=4, num_kv_heads=2, head_dim=32, core="explicit", scale=4.0,
                     scale_op="div", causal=True, return_probs=True)
    _compare(spec, 1, 17, 64, BF16, bias=True)


def test_head_dim_not_power_of_two():
    spec = BlockSpec(num_heads=2, num_kv_heads=1, head_dim=24, rope="half", rotary_dim=24,
                     norm="fp32_weight", core="explicit", scale=24 ** -0.5, return_probs=True)
    _compare(spec, 1, 17, 48, F32, cos_mode="tensor")


def test_through_op():
    spec = BlockSpec(num_heads=4, num_kv_heads=2, head_dim=16, rope="half", rotary_dim=16,
                     core="explicit", scale=1.0, return_probs=True)
    t = _inputs(spec, 1, 9, 64, F32)
    out, probs = call_attention_block(spec, **{k: v for k, v in t.items() if v is not None})
    ref, ref_p = attention_block_reference(**t, spec=spec)
    torch.testing.assert_close(out, ref, atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(probs, ref_p, atol=2e-5, rtol=1e-4)


def test_cpu_without_opt_in_declines(monkeypatch):
    monkeypatch.setenv("INDUCTOR_GQA_KERNELS_ON_CPU", "0")
    spec = BlockSpec(num_heads=4, num_kv_heads=2, head_dim=16)
    t = _inputs(spec, 1, 5, 64, F32)
    assert block.run_block(t, spec) is None


def test_precision_read_at_call_time():
    old = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        assert block.fp32_dot_precision() == "tf32"
        torch.set_float32_matmul_precision("highest")
        assert block.fp32_dot_precision() in ("ieee", "tf32x3")
    finally:
        torch.set_float32_matmul_precision(old)


@pytest.mark.parametrize("bias", [False, True])
def test_linear_3xtf32_matches_fp32(bias):
    from inductor_gqa.lower.linear import linear

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 37, 48, generator=g)
    w = torch.randn(40, 48, generator=g)
    b = torch.randn(40, generator=g) if bias else None
    torch.testing.assert_close(linear(x, w, b, "tf32x3"), torch.nn.functional.linear(x, w, b),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("v_transposed", [False, True])
@pytest.mark.parametrize("prec", ["tf32", "tf32x3"])   # tf32: the separate library GEMMs
def test_qkv_one_launch(bias, v_transposed, prec):
    from inductor_gqa.lower.linear import qkv

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 37, 48, generator=g)
    ws = [(torch.randn(n, 48, generator=g), torch.randn(n, generator=g) if bias else None)
          for n in (64, 40, 24)]
    q, k, v = qkv(x, *ws, prec, v_transposed=v_transposed)
    ref = [torch.nn.functional.linear(x, w, b).reshape(74, -1) for w, b in ws]
    torch.testing.assert_close(q, ref[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k, ref[1], rtol=1e-5, atol=1e-5)
    assert v.is_contiguous() and q.is_contiguous() and k.is_contiguous()
    torch.testing.assert_close(v, ref[2].t() if v_transposed else ref[2], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scale_op", ["mul", "div"])
def test_runtime_scale_and_eps(scale_op):
    """Runtime floats arrive as 0-d tensors; kernels read them on the host, the reference uses
    them as tensors; the float fields are placeholders (0.0) and must not be used."""
    spec = BlockSpec(num_heads=4, num_kv_heads=2, head_dim=32, norm="fp32_weight", eps=0.0,
                     rope="half", rotary_dim=32, core="explicit", scale=0.0, scale_op=scale_op,
                     causal=True, return_probs=True)
    t = _inputs(spec, 2, 17, 64, F32)
    t.update(runtime_scale=torch.tensor(0.3), runtime_eps=torch.tensor(0.25),
             runtime_k_eps=torch.tensor(1e-3))
    out, probs = block.run_block(dict(t), spec)
    with torch.no_grad():
        ref, ref_p = attention_block_reference(**t, spec=spec)
    torch.testing.assert_close(out, ref, atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(probs, ref_p, atol=2e-5, rtol=1e-4)
    # the runtime values matter: other values, other results
    t2 = dict(t, runtime_eps=torch.tensor(0.5))
    assert not torch.allclose(block.run_block(dict(t2), spec)[0], out)


@pytest.mark.parametrize("gp", [2, 4])
@pytest.mark.parametrize("dtype,causal,mask,probs,s", [
    (F32, False, "none", True, 37), (F32, True, "none", True, 70), (F32, True, "bool_fill", True, 21),
    (F32, False, "additive", False, 37), (BF16, True, "none", False, 70),
    (BF16, False, "bool_keep", True, 33), (F32, True, "none", True, 64),
    (BF16, False, "none", True, 64)])
def test_query_heads_packed(monkeypatch, gp, dtype, causal, mask, probs, s):
    """flash.py's GP: the row tile holds gp query heads of one KV head (K/V tiles loaded once for
    all of them), in every pass and in the single-pass probabilities (MODE 3)."""
    monkeypatch.setattr(attn, "_attention_candidates",
                        lambda *a, **k: [(32, 32, 4, 1, f"gp{gp}")])
    monkeypatch.setattr(attn, "_single_pass_candidates",
                        lambda s, *a: [(32, 128, 4, 1, f"gp{gp}")] if s <= 128 and gp == 4
                        else [])
    spec = BlockSpec(num_heads=8, num_kv_heads=2, head_dim=16, core="explicit", scale=0.25,
                     scale_op="mul", causal=causal, mask=mask, mask_fill=-1e4,
                     return_probs=probs)
    _compare(spec, 2, s, 64, dtype, mask_shape=(mask, None))


def test_query_heads_packed_must_divide():
    from inductor_gqa.kernels import flash
    q = torch.zeros(8, 48)
    with pytest.raises(ValueError, match="query heads per program"):
        flash.launch((q, (8 * 48, 16, 48)), (q, (8 * 48, 16, 48)), (q, (8 * 48, 16, 48, 1)),
                     torch.empty(1, 8, 48), None, None, None, 1, 8, 3, 3, 16, 1.0, 0.0, False, 0,
                     0, "ieee", False, 32, 32, 4, 1, gp=2)


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("scale,s", [(-0.25, 64), (0.25, 64), (0.25, 45)])
def test_scale_in_exponent(monkeypatch, dtype, scale, s):
    """flash.py's FOLD (the scale applied in the exponent's FMA, 16-bit q) needs scale > 0 and
    no mask tensor; EVEN_N (S a multiple of the key tile) drops the key bound. A negative scale
    takes the plain path; both agree with eager."""
    monkeypatch.setattr(attn, "_attention_candidates", lambda *a, **k: [(32, 32, 4, 1)])
    spec = BlockSpec(num_heads=4, num_kv_heads=2, head_dim=16, core="explicit", scale=scale,
                     scale_op="mul", causal=True, return_probs=True)
    _compare(spec, 2, s, 64, dtype)


@pytest.mark.parametrize("dtype,mask,s", [(F32, "none", 37), (F32, "additive", 70),
                                          (BF16, "bool_keep", 33), (F32, "none", 45)])
@pytest.mark.parametrize("single", [False, True])
def test_aligned_ragged_stores(monkeypatch, dtype, mask, s, single):
    """flash.py's ALIGN4 (S % 4 != 0): a program's rows are one residue class mod 4 and its key
    tiles start DELTA columns early, so the probabilities go out as aligned 16-byte groups plus
    the partial groups at the row ends; every element is written once, as eager computes it."""
    monkeypatch.setattr(attn, "_attention_candidates",
                        lambda *a, **k: [(32, 32, 4, 1, "a4")])
    monkeypatch.setattr(attn, "_single_pass_candidates",
                        lambda s, *a: [(32, 128, 4, 1, "a4")] if single else [])
    spec = BlockSpec(num_heads=4, num_kv_heads=2, head_dim=16, core="explicit", scale=0.25,
                     scale_op="mul", causal=False, mask=mask, mask_fill=-1e4,
                     return_probs=True)
    _compare(spec, 3, s, 64, dtype, mask_shape=(mask, None))


def test_aligned_ragged_stores_only_where_they_apply():
    from inductor_gqa.kernels import flash
    assert flash.align4_ok(37, 2, False, 1, 32)
    assert not flash.align4_ok(64, 2, False, 1, 32)        # rows already aligned
    assert not flash.align4_ok(37, 1, False, 1, 32)        # the stats pass stores no rows
    assert not flash.align4_ok(37, 2, True, 1, 32)         # causal: the plain path
    assert not flash.align4_ok(37, 2, False, 4, 32)        # packed heads: rows of 4 heads
    assert not flash.align4_ok(126, 3, False, 1, 128)      # one tile must cover S + 3


def test_cached_staged_choice_outside_its_scope_runs_the_pair(tf32_allowed, monkeypatch):
    """A staged-probabilities config chosen for one S of a bucket may not fit another S of it
    (shared memory grows with S): the call then takes the two passes instead of failing."""
    spec = _w075_spec()
    t = _inputs(spec, 2, 17, 64, F32, mask_shape=("none", None))
    with torch.no_grad():
        ref, ref_p = attention_block_reference(**t, spec=spec)
    picked = []
    real_pick = tuning.pick

    def pick(key, cands, run):
        if key[-1] == 3:        # the one-launch / pair choice
            picked.append(key)
            return ("staged", 64, 128, 4, 2, "pp")
        return real_pick(key, cands, run)

    monkeypatch.setattr(tuning, "pick", pick)
    out, p = block.run_block(dict(t), spec)
    assert picked
    _close_high(out, ref, 2e-3)
    _close_high(p, ref_p, 2e-3)


def _force_plan(monkeypatch, plan):
    """The plan choice forced to ``plan`` wherever it is offered; returns the list of range
    flags the block makes (to check that no fallback, or one, ran)."""
    pick = tuning.pick
    monkeypatch.setattr(tuning, "pick", lambda key, cands, run: plan
                        if key[0] == "plan" and plan in cands else pick(key, cands, run))
    flags = []
    range_flag = fp16_plans._range_flag

    def spy_flag(x):
        flags.append(range_flag(x))
        return flags[-1]
    monkeypatch.setattr(fp16_plans, "_range_flag", spy_flag)
    return flags


# (causal, mask, probs, S, norm) of the fp16-operand plans' block tests
PLAN_CASES = [(False, "none", True, 17, "none"), (True, "none", True, 33, "none"),
              (True, "additive", False, 21, "none"), (False, "none", True, 17, "fp32_weight")]


def _matches_without_fallback(case, flags):
    """The block of ``case`` against the eager reference, with the range flag left clear; the
    same bounds as f16proj (a rounding of the products to fp16 more does not change them)."""
    causal, mask, probs, s, norm = case
    spec = _w075_spec(causal, mask, probs)
    if norm != "none":      # the norm's roundings stay in float32 behind fp16 products
        spec = dataclasses.replace(spec, norm=norm, eps=1e-6)
    t = _inputs(spec, 2, s, 64, F32, mask_shape=(mask, None))
    t["x"][0, 1] = 0.0                              # a zero row: scale 1, exact zero products
    with torch.no_grad():
        ref, ref_p = attention_block_reference(**t, spec=spec)
    out, p = block.run_block(dict(t), spec)
    assert flags and flags[-1].item() == 0       # no fallback
    _close_high(out, ref, 1e-3 * ref.abs().max().item())
    if probs:
        _close_high(p, ref_p, 2e-3)


@pytest.fixture
def fp16_products(monkeypatch, fp16_projections):
    """The f16proj16 plan (the Q/K/V GEMM writing fp16), taken by the plan choice. Yields the
    range flags and the fp16 products the block made, to check that the plan ran and whether
    it fell back."""
    monkeypatch.delenv("INDUCTOR_GQA_FP16_QKV_OUT", raising=False)     # offered by default
    made = {"flags": _force_plan(monkeypatch, "f16proj16"), "products": []}
    mm = fp16_plans._mm16_out16

    def spy_mm(a, b):
        made["products"].append(mm(a, b))
        return made["products"][-1]
    monkeypatch.setattr(fp16_plans, "_mm16_out16", spy_mm)
    yield made


@pytest.mark.parametrize("case", PLAN_CASES)
def test_f16_products_under_high(fp16_products, case):
    _matches_without_fallback(case, fp16_products["flags"])
    assert fp16_products["products"][-1].dtype == torch.float16


def _out_of_range_block(how):
    """(spec, inputs, reference out, reference probs) of a block whose fp16 copies leave fp16's
    range: "overflow" (k beyond it once the operand scales are undone; the reference is of the
    unscaled weights, the same products) or "tiny" (token 3 of batch 0 one-hot on feature 0 and
    column 0 of Wq 2^-20 of the rows' largest weights: that token's q products ~2^-19 after
    scaling and its q rows ~2^-23, below fp16's normal range)."""
    spec = BlockSpec(num_heads=4, num_kv_heads=2, head_dim=16, rope="half", rotary_dim=16,
                     core="explicit", scale=1.0, return_probs=True)
    t = _inputs(spec, 2, 13, 64, F32)
    if how == "overflow":
        with torch.no_grad():
            ref, ref_p = attention_block_reference(**t, spec=spec)
        t.update(wq=t["wq"] * 2.0 ** -18, wk=t["wk"] * 2.0 ** 18)
    else:
        t["x"][0, 3] = 0.0
        t["x"][0, 3, 0] = 1.0
        t["wq"][:, 0] = t["wq"].abs().amax(1) * 2.0 ** -20
        with torch.no_grad():
            ref, ref_p = attention_block_reference(**t, spec=spec)
    return spec, t, ref, ref_p


def _fell_back_and_matches(spec, t, ref, ref_p, flags):
    out, p = block.run_block(dict(t), spec)
    assert flags and flags[-1].item() == 1
    assert torch.isfinite(out).all() and torch.isfinite(p).all()
    _close_high(p, ref_p, 2e-3)
    _close_high(out, ref, 1e-3 * ref.abs().max().item())


@pytest.mark.parametrize("how", ["overflow", "tiny"])
def test_f16_products_fall_back(fp16_products, how):
    """The guarded float32 path of f16proj16 recomputes the products (a guarded GEMM on the
    scaled copies, float32 output) before finishing q, k, v: k beyond fp16's range after the
    scales are undone, or products too small for fp16's normal range (``_check_scaled16``)."""
    _fell_back_and_matches(*_out_of_range_block(how), fp16_products["flags"])
    assert fp16_products["products"]


def test_scaled_fp16_products_range_rule():
    """in16: a nonzero head row of scaled fp16 products whose largest true value is below
    2^-14 * token inverse scale * the row's largest feature inverse scale raises the flag;
    ordinary rows and zero rows do not. The inverse scales (2^10 per token, 2^4 per feature)
    keep every true value within fp16's normal range, so only this rule can raise it."""
    from inductor_gqa.kernels.qk_epilogue import qk_norm_rope_
    g = torch.Generator().manual_seed(0)
    n, h, hk, d = 4, 2, 1, 16
    for case, raised in (("normal", False), ("zero", False), ("tiny", True)):
        qkv = (torch.randn(n, (h + 2 * hk) * d, generator=g) * 2.0 ** -10).half()
        if case == "zero":
            qkv[1, :d] = 0.0
        elif case == "tiny":
            qkv[1, :d] = (torch.rand(d, generator=g) * 2.0 ** -16).half()   # subnormal
        q, k, v = qkv[:, :h * d], qkv[:, h * d:(h + hk) * d], qkv[:, (h + hk) * d:]
        scales = (torch.full((n,), 2.0 ** 10), torch.full((h * d,), 2.0 ** 4),
                  torch.full((hk * d,), 2.0 ** 4), torch.full((hk * d,), 2.0 ** 4))
        copies = tuple(torch.empty(a.shape, dtype=torch.float16) for a in (q, k, v))
        flag = torch.zeros(1, dtype=torch.int32)
        qk_norm_rope_(q, k, None, None, None, None, 1, n, h, hk, d, "none", 1e-6, "none", 0,
                      v=v, copies=copies, flag=flag, scales=scales, store32=False, in16=True)
        assert flag.item() == raised, case
        if not raised:      # the copies are the unscaled products (exact: powers of two)
            torch.testing.assert_close(copies[0].float(), q.float() * 2.0 ** 14, rtol=0, atol=0)
    with pytest.raises(ValueError, match="in16"):
        qk_norm_rope_(q, k, None, None, None, None, 1, n, h, hk, d, "none", 1e-6, "none", 0,
                      v=v, copies=copies, flag=flag, scales=None, store32=False, in16=True)


@pytest.mark.parametrize("s,bm,gp,rows,dtype,bn", [
    (37, 16, 1, 2, torch.float16, 16), (37, 16, 2, 3, torch.float16, 16),
    (64, 32, 2, 1, torch.float16, 32), (40, 16, 1, 4, torch.float32, 16),
    (48, 16, 1, 2, torch.float16, 16)])
def test_rolling_probabilities(s, bm, gp, rows, dtype, bn):
    """flash.py's MODE 6 (each row tile's statistics in the key loop of the tile before it,
    ``rows`` tiles per program, ragged and even S, packed query heads): the probabilities and
    P @ V of the eager softmax; with fp16 operands the fp16 output and its range flag."""
    from inductor_gqa.kernels import flash
    b, h, hk, d = 2, 4, 2, 16
    g = torch.Generator().manual_seed(s + rows)
    q, k, v = (torch.randn(b * s, n * d, generator=g).to(dtype) for n in (h, hk, hk))
    scale = 0.3
    f16 = dtype == torch.float16
    o = torch.full((b, s, h * d), float("nan"), dtype=dtype)
    p = torch.full((b, h, s, s), float("nan"))
    flag = torch.zeros(1, dtype=torch.int32)
    flash.launch((q, (s * h * d, d, h * d)), (k, (s * hk * d, d, hk * d)),
                 (v, (s * hk * d, d, hk * d, 1)), o, p, None, None, b, s, h, h // hk, d, scale,
                 0.0, False, 0, 6, "ieee", f16, bm, bn, 4, 1, flag=flag if f16 else None,
                 guard=1 if f16 else 0, gp=gp, rows=rows)
    q4 = q.float().view(b, s, h, d).transpose(1, 2)
    k4 = k.float().view(b, s, hk, d).transpose(1, 2).repeat_interleave(h // hk, 1)
    v4 = v.float().view(b, s, hk, d).transpose(1, 2).repeat_interleave(h // hk, 1)
    ref_p = torch.softmax(q4 @ k4.transpose(-1, -2) * scale, -1)
    ref_o = (ref_p @ v4).transpose(1, 2).reshape(b, s, h * d)
    torch.testing.assert_close(p, ref_p, atol=2e-6, rtol=1e-4)
    tol = 2e-3 if f16 else 1e-5
    torch.testing.assert_close(o.float(), ref_o, atol=tol, rtol=tol)
    assert flag.item() == 0


def test_rolling_refuses_masks():
    """MODE 6 has no mask or causal path: asked for one, the launch refuses instead of
    ignoring it."""
    from inductor_gqa.kernels import flash
    x = torch.zeros(4, 16)
    with pytest.raises(ValueError, match="MODE 6"):
        flash.launch((x, (64, 16, 16)), (x, (64, 16, 16)), (x, (64, 16, 16, 1)),
                     torch.zeros(1, 4, 16), torch.zeros(1, 1, 4, 4), None, None, 1, 4, 1, 1,
                     16, 1.0, 0.0, True, 0, 6, "ieee", False, 16, 16, 4, 1, rows=2)


@pytest.mark.parametrize("proj", [False, True])
def test_rolling_in_the_block(tf32_allowed, monkeypatch, proj):
    """The whole W075-like block with the probabilities path taken by MODE 6 (the tuner's
    choice forced), in both fp16-copies plans: the pair's results (the plan's own rounding, at
    these inputs up to ~1e-2 from the float64 reference under f16proj, is the pair's too)."""
    monkeypatch.setenv("INDUCTOR_GQA_FP16_PROJECTIONS", "1" if proj else "0")
    monkeypatch.setattr(attn, "_single_pass_candidates", lambda *a, **k: [])
    orig = tuning.pick
    chosen = []
    path = ["rolling"]

    def pick(key, cands, run):
        if key[-1] == 3:
            c = cands[-1] if path[0] == "rolling" else "two-pass"
            chosen.append(c)
            return c
        return orig(key, cands, run)
    monkeypatch.setattr(tuning, "pick", pick)
    spec = _w075_spec()
    t = _inputs(spec, 1, 300, 64, F32)
    out, p = block.run_block(dict(t), spec)
    assert attn.rolling_rows(chosen[-1]) == 2, chosen
    path[0] = "pair"
    out2, p2 = block.run_block(dict(t), spec)
    assert chosen[-1] == "two-pass"
    torch.testing.assert_close(p, p2, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(out, out2, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        ref, ref_p = attention_block_reference(**t, spec=spec)
    _close_high(p, ref_p, 2e-3)
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=0)


@pytest.fixture(params=["angles", "tables"])
def fused_projection(request, monkeypatch, fp16_projections):
    """The f16tma plan (the Q/K/V GEMM and the norm/RoPE epilogue in one launch,
    kernels/proj_rope.py), taken by the plan choice, with cos/sin from the angles (the default)
    or loaded from the tables. Yields the range flags the block made and the fused launches
    it ran."""
    from inductor_gqa.kernels import proj_rope
    monkeypatch.delenv("INDUCTOR_GQA_FUSED_PROJECTION", raising=False)
    monkeypatch.setenv("INDUCTOR_GQA_FUSED_ANGLES", "1" if request.param == "angles" else "0")
    made = {"flags": _force_plan(monkeypatch, "f16tma"), "launches": 0, "angles": 0,
            "cos_sin": request.param}
    launch = proj_rope.launch

    def spy_launch(*args, **kw):
        made["launches"] += 1
        made["angles"] += kw.get("angles") is not None
        return launch(*args, **kw)
    monkeypatch.setattr(proj_rope, "launch", spy_launch)
    yield made


@pytest.mark.parametrize("case", PLAN_CASES)
def test_f16_fused_projection_under_high(fused_projection, case):
    _matches_without_fallback(case, fused_projection["flags"])
    made = fused_projection
    assert made["launches"] >= 1
    assert made["angles"] == (made["launches"] if made["cos_sin"] == "angles" else 0)


@pytest.mark.parametrize("how", ["overflow", "tiny"])
def test_f16_fused_projection_falls_back(fused_projection, how):
    """The fused launch raises the range flag (k beyond fp16's range once the scales are undone,
    or a head row whose largest value is below fp16's normal range) and the guarded float32
    path redoes the block from products of its own (a guarded GEMM on the scaled copies)."""
    _fell_back_and_matches(*_out_of_range_block(how), fused_projection["flags"])
    assert fused_projection["launches"] >= 1


def test_f16_fused_projection_offered_where_it_covers(fused_projection):
    x = torch.zeros(1, 4, 64)
    spec = _w075_spec()
    assert fp16_plans.f16_fused_offered(spec, x)
    for other in (dataclasses.replace(spec, head_dim=24, rotary_dim=24),     # not a power of 2
                  dataclasses.replace(spec, rope="interleaved"),
                  dataclasses.replace(spec, rotary_dim=8)):                   # partial RoPE
        assert not fp16_plans.f16_fused_offered(other, x)
