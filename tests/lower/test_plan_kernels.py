"""Whole kernel plans against the eager reference, on CPU through the Triton interpreter."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from blocks import BF16, F32, assert_matches, inputs, plan_for, reference, run_plan

from inductor_gqa.plan.configs import AttentionConfig
from inductor_gqa.plan.plans import Fp16CopiesPlan, NativePlan
from inductor_gqa.plan.spec import BlockSpec


@pytest.fixture
def precision(request):
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(request.param)
    yield request.param
    torch.set_float32_matmul_precision(before)


def w075_like(causal=False, mask="none", probs=True, d=16):
    return BlockSpec(num_heads=4, num_kv_heads=2, head_dim=d, rope="half", rotary_dim=d,
                     core="explicit", scale=1.0, causal=causal, mask=mask,
                     return_probs=probs)


# S = 20: the probabilities' row stride a multiple of 4 but not of 16 (ROW4)
@pytest.mark.parametrize("precision", ["high", "highest"], indirect=True)
@pytest.mark.parametrize("s", [5, 20, 33])
@pytest.mark.parametrize("causal", [False, True])
def test_w075_like(precision, s, causal):
    spec = w075_like(causal)
    t = inputs(spec, 2, s, 64, F32)
    out, probs, plan = run_plan(spec, t)
    assert isinstance(plan, Fp16CopiesPlan if precision == "high" else NativePlan)
    assert_matches(spec, t, out, probs, fp16_operands=precision == "high")


@pytest.mark.parametrize("precision", ["high"], indirect=True)
def test_fp32_native_tf32(precision):
    """float32 "high" without the copies (a bias, or the option off): TF32 dots, K-major V."""
    spec = w075_like(causal=True)
    t = inputs(spec, 2, 17, 64, F32, bias=True)
    out, probs, plan = run_plan(spec, t)
    assert isinstance(plan, NativePlan) and plan.prec == "tf32" and plan.v_kmajor
    assert_matches(spec, t, out, probs)
    t = inputs(spec, 1, 9, 64, F32)
    out, probs, plan = run_plan(spec, t, fp16_operands=False)
    assert isinstance(plan, NativePlan)
    assert_matches(spec, t, out, probs)


@pytest.mark.parametrize("s", [9, 33])
def test_w092_like(s):
    spec = BlockSpec(num_heads=6, num_kv_heads=2, head_dim=32, norm="fp32_weight", eps=1e-5,
                     rope="half", rotary_dim=32, core="explicit", scale=32 ** -0.5, causal=True)
    t = inputs(spec, 2, s, 64, BF16, bias=True, cos_mode="tables")
    out, probs, plan = run_plan(spec, t)
    assert isinstance(plan, NativePlan) and plan.attention.kind == "online"
    assert_matches(spec, t, out, probs)


@pytest.mark.parametrize("norm", ["fp32_weight", "cast_weight", "fp32_one_plus_weight"])
@pytest.mark.parametrize("rope,rdim", [("half", 16), ("interleaved", 16), ("half", 8)])
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_norm_rope_variants(norm, rope, rdim, dtype):
    spec = BlockSpec(num_heads=4, num_kv_heads=2, head_dim=16, norm=norm, eps=1e-6, rope=rope,
                     rotary_dim=rdim, core="sdpa", scale=0.25, causal=True)
    t = inputs(spec, 2, 11, 32, dtype, cos_mode="tables" if dtype == BF16 else "freq")
    out, probs, _ = run_plan(spec, t, fp16_operands=False)
    assert_matches(spec, t, out, probs)


@pytest.mark.parametrize("cos_shape", ["bsr", "1sr", "sr", "b1sr"])
def test_cos_broadcast(cos_shape):
    spec = w075_like(causal=True, probs=False)
    t = inputs(spec, 2, 7, 32, BF16, cos_mode="tables", cos_shape=cos_shape)
    out, probs, _ = run_plan(spec, t)
    assert_matches(spec, t, out, probs)


@pytest.mark.parametrize("core,mask,fill", [("sdpa", "bool_keep", float("-inf")),
                                            ("sdpa", "additive", 0.0),
                                            ("explicit", "bool_fill", float("-inf")),
                                            ("explicit", "bool_fill", -1e9),
                                            ("explicit", "additive", 0.0)])
@pytest.mark.parametrize("shape", [(2, 4, 13, 13), (2, 1, 13, 13), (13, 13)])
@pytest.mark.parametrize("causal", [False, True])
def test_masks(core, mask, fill, shape, causal):
    probs = core == "explicit"
    spec = BlockSpec(num_heads=4, num_kv_heads=2, head_dim=16, core=core, scale=0.25,
                     causal=causal, mask=mask, mask_fill=fill, return_probs=probs)
    t = inputs(spec, 2, 13, 32, F32, mask_shape=shape)
    out, p, _ = run_plan(spec, t, fp16_operands=False)
    assert_matches(spec, t, out, p)


@pytest.mark.parametrize("mask", ["additive", "bool_fill"])
def test_finfo_min_fills_wholly_masked_rows(mask):
    """A finite (finfo.min) fill over a whole row gives eager's uniform row, not NaN."""
    spec = BlockSpec(num_heads=4, num_kv_heads=2, head_dim=16, core="explicit", scale=0.25,
                     mask=mask, mask_fill=torch.finfo(F32).min, return_probs=True)
    t = inputs(spec, 2, 13, 32, F32, mask_shape=(2, 1, 13, 13))
    m = t["attn_mask"]
    if mask == "additive":
        m[:, :, 3:5] = torch.finfo(F32).min
    else:
        m[:, :, 3:5] = True
    out, p, _ = run_plan(spec, t, fp16_operands=False)
    assert_matches(spec, t, out, p)
    torch.testing.assert_close(p[:, :, 3], torch.full_like(p[:, :, 3], 1 / 13))


def test_wholly_masked_rows_follow_eager():
    """Left padding masks whole query rows: SDPA gives zeros there, an explicit softmax over
    -inf gives NaN (as eager does); every other row is unaffected."""
    for core in ("sdpa", "explicit"):
        mask = "bool_keep" if core == "sdpa" else "bool_fill"
        spec = BlockSpec(num_heads=4, num_kv_heads=2, head_dim=16, core=core, scale=0.25,
                         causal=True, mask=mask, return_probs=core == "explicit")
        t = inputs(spec, 2, 9, 32, F32, mask_shape=(2, 1, 9, 9))
        keep = torch.ones(2, 1, 9, 9, dtype=torch.bool)
        keep[0, :, :, :3] = False                   # batch 0: three left-padding keys
        t["attn_mask"] = keep if core == "sdpa" else ~keep
        out, p, _ = run_plan(spec, t, fp16_operands=False, )
        ref, _ = reference(spec, t)
        torch.testing.assert_close(out, ref, atol=2e-4, rtol=2e-4, equal_nan=True)
        assert torch.isfinite(out[1]).all()


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("wo,bo", [(True, True), (False, False)])
def test_sdpa_core(dtype, wo, bo):
    spec = BlockSpec(num_heads=4, num_kv_heads=2, head_dim=32, core="sdpa", scale=0.2,
                     causal=True)
    t = inputs(spec, 2, 33, 64, dtype, wo=wo, bo=bo)
    out, probs, _ = run_plan(spec, t, fp16_operands=False)
    assert_matches(spec, t, out, probs)


def test_explicit_div_scale_and_mha():
    spec = BlockSpec(num_heads=4, num_kv_heads=4, head_dim=32, core="explicit", scale=4.0,
                     scale_op="div", causal=True, return_probs=True)
    t = inputs(spec, 1, 17, 64, BF16, bias=True)
    out, probs, _ = run_plan(spec, t)
    assert_matches(spec, t, out, probs)


def test_head_dim_not_power_of_two():
    """d = 24: the fused projection needs whole power-of-two heads, so the native plan runs."""
    spec = w075_like(d=24)
    t = inputs(spec, 2, 11, 48, F32)
    out, probs, plan = run_plan(spec, t)
    assert isinstance(plan, NativePlan)
    assert_matches(spec, t, out, probs)


# ------------------------------------------------------------------ the fp16 copies' fallback
def out_of_range(how):
    """A W075-like block whose fp16 copies leave fp16's range: "overflow" (k beyond it once
    the operand scales are undone; the reference is of the unscaled weights: the same products),
    "tiny" (one token's q rows below fp16's normal range), "nan" (a NaN in batch 1's x)."""
    spec = w075_like()
    t = inputs(spec, 2, 13, 64, F32)
    ref = reference(spec, t)
    if how == "overflow":
        t.update(wq=t["wq"] * 2.0 ** -18, wk=t["wk"] * 2.0 ** 18)
    elif how == "tiny":
        t["x"][0, 3] = 0.0
        t["x"][0, 3, 0] = 1.0
        t["wq"][:, 0] = t["wq"].abs().amax(1) * 2.0 ** -20
        ref = reference(spec, t)
    else:
        t["x"][1, 5, 7] = float("nan")
        ref = reference(spec, t)
    return spec, t, ref


@pytest.mark.parametrize("precision", ["high"], indirect=True)
@pytest.mark.parametrize("how", ["overflow", "tiny"])
def test_fp16_copies_fall_back(precision, how):
    spec, t, (ref, ref_p) = out_of_range(how)
    out, p, plan = run_plan(spec, t)
    assert isinstance(plan, Fp16CopiesPlan)
    assert torch.isfinite(out).all() and torch.isfinite(p).all()
    torch.testing.assert_close(p, ref_p, atol=2e-3, rtol=1e-2)
    torch.testing.assert_close(out, ref, atol=1e-3 * ref.abs().max().item(), rtol=1e-2)


@pytest.mark.parametrize("precision", ["high"], indirect=True)
def test_nan_in_one_batch_stays_there(precision):
    spec, t, (ref, ref_p) = out_of_range("nan")
    out, p, _ = run_plan(spec, t)
    assert torch.isfinite(out[0]).all() and torch.isfinite(p[0]).all()
    torch.testing.assert_close(out[0], ref[0], atol=2e-3, rtol=1e-2)


@pytest.mark.parametrize("precision", ["high"], indirect=True)
def test_fp16_o_proj_tiny_weight_falls_back(precision):
    """Wo's copy range-checked too: a head-wide row of Wo below fp16's normal range falls back."""
    spec = w075_like()
    t = inputs(spec, 2, 13, 64, F32)
    t["wo"][5, 16:32] = 2.0 ** -20
    out, p, plan = run_plan(spec, t)
    assert plan.o16
    assert_matches(spec, t, out, p, fp16_operands=True)


# ------------------------------------------------------------------ kernel switches, forced
@pytest.mark.parametrize("precision", ["high"], indirect=True)
@pytest.mark.parametrize("cfg", [AttentionConfig(32, 32, 4, 1, gp=2),
                                 AttentionConfig(32, 16, 4, 1, pipeline=True),
                                 AttentionConfig(32, 32, 4, 1, align4=True)])
@pytest.mark.parametrize("s", [37, 40])
def test_attention_switches(precision, cfg, s):
    """Packed query heads (GP), the pipelined key loop and aligned ragged stores (ALIGN4, S % 4
    != 0 only) give the default's results."""
    spec = w075_like()
    t = inputs(spec, 1, s, 64, F32)
    plan = plan_for(spec, t)
    forced = dataclasses.replace(plan, attention=dataclasses.replace(
        plan.attention, kind="pair", main=cfg, stats=AttentionConfig(32, 32, 4, 1)))
    out, probs, _ = run_plan(spec, t, plan=forced)
    assert_matches(spec, t, out, probs, fp16_operands=True)


@pytest.mark.parametrize("precision", ["high"], indirect=True)
def test_projection_pointer_loads(precision):
    """The fused projection without tensor descriptors (Inductor's C++ wrapper) gives the
    same copies as with them."""
    spec = w075_like(causal=True)
    t = inputs(spec, 2, 19, 64, F32)
    plan = plan_for(spec, t)
    a = run_plan(spec, t, plan=plan)
    b = run_plan(spec, t, plan=dataclasses.replace(
        plan, projection=dataclasses.replace(plan.projection, tma=False)))
    torch.testing.assert_close(a[0], b[0], atol=0, rtol=0)
    torch.testing.assert_close(a[1], b[1], atol=0, rtol=0)
