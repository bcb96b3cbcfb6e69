"""Fully masked query rows (left padding) through the op's GPU path, run on the CPU by the Triton
interpreter: it must give what the eager form gives, as the reference does."""

import pytest
import torch

from inductor_gqa.op.reference import attention_block_reference
from inductor_gqa.plan.spec import BlockSpec

B, S, E, H, HK, D = 2, 9, 64, 4, 2, 16


def _tensors(mask):
    g = torch.Generator().manual_seed(0)

    def r(*shape, scale=0.1):
        return torch.randn(*shape, generator=g) * scale

    return dict(x=r(B, S, E, scale=1.0), wq=r(H * D, E), wk=r(HK * D, E), wv=r(HK * D, E),
                bq=None, bk=None, bv=None, q_norm_weight=None, k_norm_weight=None, cos=None,
                sin=None, inv_freq=None, position_ids=None, attn_mask=mask, wo=r(E, H * D),
                bo=None, runtime_scale=None, runtime_eps=None, runtime_k_eps=None)


def _keep():
    keep = torch.ones(B, 1, 1, S, dtype=torch.bool)
    keep[1, ..., :3] = False          # batch row 1: its first 3 queries see no key (with causal)
    return keep


def _min_mask():
    keep = _keep() & torch.ones(S, S, dtype=torch.bool).tril()
    return torch.zeros(B, 1, S, S).masked_fill(~keep, torch.finfo(torch.float32).min)


CASES = {
    "sdpa_bool_keep": (dict(core="sdpa", causal=True, mask="bool_keep"), _keep),
    "explicit_bool_fill_inf": (dict(core="explicit", causal=True, mask="bool_fill"),
                               lambda: ~_keep()),
    "explicit_additive_finfo_min": (dict(core="explicit", mask="additive"), _min_mask),
}


def _run(spec, t, kind=None):
    """The block's GPU plan run eagerly through the interpreter; ``kind`` forces the attention
    kind ("pair": the two-pass probabilities path, whatever S)."""
    import dataclasses

    from inductor_gqa.kernels.launch import direct_launches
    from inductor_gqa.lower.emit import emit
    from inductor_gqa.options import Options
    from inductor_gqa.plan.configs import AttentionConfig
    from inductor_gqa.plan.plans import Problem, choose

    plan = choose(spec, Problem.of(spec, t), Options(cpu_kernels=True, fp16_operands=False))
    if kind == "pair":
        small = AttentionConfig(16, 16, 4, 1)
        plan = dataclasses.replace(plan, attention=dataclasses.replace(
            plan.attention, kind="pair", main=small, stats=small))
    with direct_launches():
        return emit(plan, spec, dict(t))


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("probs", [False, True])
def test_gpu_path_fully_masked_rows(case, probs):
    fields, make_mask = CASES[case]
    if probs and fields["core"] == "sdpa":
        pytest.skip("the sdpa core returns no probabilities")
    spec = BlockSpec(num_heads=H, num_kv_heads=HK, head_dim=D, scale=0.25,
                     return_probs=probs, **fields)
    t = _tensors(make_mask())
    ref, ref_p = attention_block_reference(**t, spec=spec)
    for kind in (None, "pair") if probs else (None,):
        out, p = _run(spec, t, kind)
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5, equal_nan=True)
        if probs:
            torch.testing.assert_close(p, ref_p, rtol=1e-4, atol=1e-6, equal_nan=True)
