"""Block inputs and checks shared by the plan tests (CPU, Triton interpreter)."""

from __future__ import annotations

import math

import torch

from inductor_gqa.kernels.launch import direct_launches
from inductor_gqa.lower.emit import emit
from inductor_gqa.op.attention_block import TENSOR_ARGS
from inductor_gqa.op.reference import attention_block_reference
from inductor_gqa.options import Options
from inductor_gqa.plan.plans import Problem, choose
from inductor_gqa.plan.spec import BlockSpec
from inductor_gqa.workloads import check

F32, BF16 = torch.float32, torch.bfloat16


def inputs(spec: BlockSpec, b, s, e, dtype, *, bias=False, wo=True, bo=False, cos_mode="freq",
           cos_shape="bsr", mask_shape=None, seed=0) -> dict:
    """Random inputs of the fused op (every tensor argument by name, None where absent)."""
    g = torch.Generator().manual_seed(seed)
    h, hk, d = spec.num_heads, spec.num_kv_heads, spec.head_dim

    def rn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dtype)

    t = dict.fromkeys(TENSOR_ARGS)
    t.update(x=rn(b, s, e), wq=rn(h * d, e, scale=e ** -0.5), wk=rn(hk * d, e, scale=e ** -0.5),
             wv=rn(hk * d, e, scale=e ** -0.5))
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
    if spec.mask != "none":
        shape = mask_shape or (b, h, s, s)
        if spec.mask in ("bool_keep", "bool_fill"):
            m = torch.rand(b, h, s, s, generator=g) > 0.3
            eye = torch.eye(s, dtype=torch.bool)
            m = (m | eye) if spec.mask == "bool_keep" else (m & ~eye)
        else:
            m = (torch.randn(b, h, s, s, generator=g) * 2).to(dtype)
        idx = tuple(slice(None) if n > 1 else slice(0, 1) for n in shape[-4:])
        m = m[(slice(None),) * (4 - len(shape)) + idx] if len(shape) == 4 else m[0, 0]
        t["attn_mask"] = m.reshape(shape).contiguous()
    return t


def plan_for(spec, t, **options):
    return choose(spec, Problem.of(spec, t), Options(cpu_kernels=True, **options))


def run_plan(spec, t, plan=None, **options):
    """(out, probs) of the block's plan run eagerly (kernels in place), and the plan."""
    plan = plan or plan_for(spec, t, **options)
    with direct_launches():
        out, probs = emit(plan, spec, dict(t))
    return out, probs, plan


def reference(spec, t):
    with torch.no_grad():
        return attention_block_reference(**t, spec=spec)


def assert_matches(spec, t, out, probs, *, fp16_operands=False):
    """Against the eager reference: float32 tight (fp16-level where the plan ran on fp16
    copies), 16-bit dtypes by the workloads' rule with loose bounds."""
    ref, ref_p = reference(spec, t)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    if out.dtype == F32:
        tol = 4e-3 if fp16_operands else 2e-4
        torch.testing.assert_close(out, ref, atol=tol * max(1.0, ref.abs().max().item()),
                                   rtol=tol)
    else:
        ok, frac = check(out, ref, 3e-2, 5e-2)
        assert ok, frac
    if spec.return_probs:
        assert probs.shape == ref_p.shape and probs.dtype == ref_p.dtype
        if probs.dtype == F32:
            torch.testing.assert_close(probs, ref_p, atol=2e-3 if fp16_operands else 2e-5,
                                       rtol=1e-2 if fp16_operands else 1e-4, equal_nan=True)
        else:
            ok, frac = check(probs, ref_p, 1e-2, 5e-2)
            assert ok, frac
    else:
        assert probs.numel() == 0
