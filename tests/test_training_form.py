"""The training form's choices and the differentiable core op's contract (CPU).

Which core a block with gradients gets (the library's SDPA or our op) is decided while tracing,
from the traced tensors' device and dtype (``plans.library_core``, asked here with fake CUDA
tensors). The core op's own rules: its reference statistics are flash.py's, a mask that needs a gradient gets eager's, and
gradients of the returned probabilities flow."""

import dataclasses
import math

import pytest
import torch
from torch._subclasses import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from inductor_gqa import Options
from inductor_gqa.kernels import flash
from inductor_gqa.kernels.launch import direct_launches
from inductor_gqa.lower.training import training_form
from inductor_gqa.op.attention_block import TENSOR_ARGS
from inductor_gqa.op.attention_core import call_attention_core, core_kwargs, row_stats
from inductor_gqa.plan.configs import AttentionConfig
from inductor_gqa.plan.plans import (SDPA_MIN_ROWS, SHORT_SEQ, choose_core, core_problem,
                                       library_core)
from inductor_gqa.plan.spec import BlockSpec

W092_LIKE = BlockSpec(num_heads=4, num_kv_heads=2, head_dim=64, norm="fp32_weight", eps=1e-5,
                      rope="half", rotary_dim=64, core="explicit", scale=0.125, causal=True)


def _targets(spec, dtype=torch.float32, options=Options(), mask=False):
    """The ops of the training form of ``spec``'s block, traced on the CPU."""
    b, s, e = 2, 8, 32
    h, hk, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
    t = dict.fromkeys(TENSOR_ARGS)
    t.update(x=torch.randn(b, s, e, dtype=dtype), wq=torch.randn(h * d, e, dtype=dtype),
             wk=torch.randn(hk * d, e, dtype=dtype), wv=torch.randn(hk * d, e, dtype=dtype),
             wo=torch.randn(e, h * d, dtype=dtype), q_norm_weight=torch.ones(d, dtype=dtype),
             k_norm_weight=torch.ones(d, dtype=dtype), cos=torch.randn(b, s, d, dtype=dtype),
             sin=torch.randn(b, s, d, dtype=dtype))
    if mask:
        t["attn_mask"] = torch.zeros(b, 1, s, s, dtype=dtype)
    names = [k for k, v in t.items() if v is not None]
    gm = make_fx(lambda *a: training_form(spec, dict(t, **dict(zip(names, a))), options))(
        *[t[k] for k in names])
    return {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}


def _q(dtype=torch.bfloat16, device="cuda"):
    with FakeTensorMode():
        return torch.empty(2, 4, 8, 64, dtype=dtype, device=device)


def test_library_core_where_it_computes_the_same():
    s = 512
    assert library_core(W092_LIKE, _q(), Options(), s)
    # a window at least as long as the sequence hides nothing (Gemma 2: 4096 at 2048 tokens)
    assert library_core(dataclasses.replace(W092_LIKE, window=s), _q(), Options(), s)
    why_not = {
        "float32": (W092_LIKE, _q(torch.float32), Options(), s),
        "cpu": (W092_LIKE, _q(device="cpu"), Options(), s),
        "kernels option": (W092_LIKE, _q(), Options(training_core="kernels"), s),
        "mask": (dataclasses.replace(W092_LIKE, mask="additive"), _q(), Options(), s),
        "probabilities": (dataclasses.replace(W092_LIKE, return_probs=True), _q(), Options(), s),
        "softcap": (dataclasses.replace(W092_LIKE, softcap=30.0), _q(), Options(), s),
        "window": (dataclasses.replace(W092_LIKE, window=s // 2), _q(), Options(), s),
        "head_dim": (dataclasses.replace(W092_LIKE, head_dim=32, rotary_dim=32), _q(),
                     Options(), s),
        "short sequence": (W092_LIKE, _q(), Options(), SHORT_SEQ),
    }
    for why, (spec, q, options, seq) in why_not.items():
        assert not library_core(spec, q, options, seq), why


def test_library_core_at_a_symbolic_length():
    """Under dynamic shapes the length is unknown while tracing: the library's core, no guard
    on the length (a window is then not known to be inert)."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    seq = ShapeEnv().create_unbacked_symint()
    assert library_core(W092_LIKE, _q(), Options(), seq)
    assert not library_core(dataclasses.replace(W092_LIKE, window=4096), _q(), Options(), seq)


def _core_plan(spec, b, s, dtype=torch.bfloat16, options=Options(), capability=(9, 0)):
    """``choose_core``'s plan for a core of ``spec`` at (B, S) on an H200 (fake tensors)."""
    with FakeTensorMode():
        q = torch.empty(b, s, spec.num_heads * spec.head_dim, dtype=dtype)
    p = dataclasses.replace(core_problem(q, None), device=torch.device("cuda"),
                            gpu="NVIDIA H200", capability=capability, num_sms=132)
    return choose_core(spec, p, options)


def test_short_sequences_take_the_library_forward_where_inference_does():
    """At SHORT_SEQ tokens or fewer our op runs; its forward is the library's where inference
    plans the library's attention (B*H*S >= SDPA_MIN_ROWS; W092 128x16), ours below."""
    w092 = dataclasses.replace(W092_LIKE, num_heads=96, num_kv_heads=8, head_dim=128,
                               rotary_dim=128)
    big = -(-SDPA_MIN_ROWS // (96 * SHORT_SEQ))     # the fewest batch rows that reach it
    assert _core_plan(w092, big, SHORT_SEQ).attention.kind == "sdpa"
    assert _core_plan(w092, big // 2, SHORT_SEQ).attention.kind == "online"
    assert _core_plan(w092, big, SHORT_SEQ, options=Options(training_core="kernels")
                      ).attention.kind == "online"
    assert _core_plan(w092, big, SHORT_SEQ, dtype=torch.float32).attention.kind == "online"
    masked = dataclasses.replace(w092, mask="additive")
    assert _core_plan(masked, big, SHORT_SEQ).attention.kind == "online"
    # the library's FlashAttention-2 forward needs sm_80
    assert _core_plan(w092, big, SHORT_SEQ, dtype=torch.float16,
                      capability=(7, 5)).attention.kind == "online"


def test_library_forward_gives_the_ops_outputs():
    """The library's forward (traced with fake CUDA tensors) returns what the core op
    declares: o as [B, S, H*D] rows and 8 bytes of statistics per query row and head."""
    from inductor_gqa.lower.emit import emit_core
    spec = dataclasses.replace(W092_LIKE, num_heads=96, num_kv_heads=8, head_dim=128,
                               rotary_dim=128)
    b, s = 16, SHORT_SEQ
    plan = _core_plan(spec, b, s)
    assert plan.attention.kind == "sdpa"
    with FakeTensorMode():
        q = torch.empty(b, s, 96 * 128, dtype=torch.bfloat16, device="cuda")
        k, v = (torch.empty(b, s, 8 * 128, dtype=torch.bfloat16, device="cuda") for _ in "kv")
        o, probs, stats = emit_core(plan, spec, dict(q=q, k=k, v=v, attn_mask=None,
                                                     runtime_scale=None))
        want = torch.ops.inductor_gqa.attention_core(q, k, v, None, None,
                                                     **core_kwargs(spec))
    for got, ref in zip((o, probs, stats), want):
        assert (got.shape, got.dtype) == (ref.shape, ref.dtype)
    assert o.is_contiguous()


def test_training_form_takes_the_chosen_core(monkeypatch):
    import inductor_gqa.lower.training as training
    targets = _targets(W092_LIKE, mask=False)
    assert any("attention_core" in t for t in targets), targets
    assert not any("scaled_dot_product" in t for t in targets)
    monkeypatch.setattr(training, "library_core", lambda *a: True)
    targets = _targets(W092_LIKE)
    assert any("scaled_dot_product" in t for t in targets), targets
    assert not any("attention_core" in t for t in targets)


def test_training_core_option_is_checked():
    with pytest.raises(ValueError, match="training_core"):
        Options(training_core="library")


def _rows(b, s, n, d, g, dtype=torch.float32):
    return torch.randn(b, s, n * d, generator=g).to(dtype)


@pytest.mark.parametrize("causal,mask", [(True, "none"), (False, "additive"),
                                         (True, "bool_keep")])
def test_reference_statistics_are_flash_ml(causal, mask):
    """The reference's stats output is flash.py's ``ml`` (MODE 1, Triton's interpreter)."""
    b, s, h, hk, d = 2, 21, 4, 2, 16
    g = torch.Generator().manual_seed(0)
    q, k, v = _rows(b, s, h, d, g), _rows(b, s, hk, d, g), _rows(b, s, hk, d, g)
    m = None
    if mask == "additive":
        m = torch.randn(b, 1, s, s, generator=g)
    elif mask == "bool_keep":
        m = torch.rand(b, 1, s, s, generator=g) > 0.3
        m[..., 0] = True
    spec = BlockSpec(num_heads=h, num_kv_heads=hk, head_dim=d, core="sdpa",
                     scale=1 / math.sqrt(d), causal=causal, mask=mask)
    want = row_stats(q, k, m, None, spec)
    mk = None if m is None else torch.broadcast_to(
        m.view(torch.uint8) if m.dtype == torch.bool else m, (b, h, s, s))
    ml = torch.empty(b * h * s * 2)
    view = lambda t: (t, (s * t.shape[-1], d, t.shape[-1]))  # noqa: E731
    with direct_launches():
        (ml,) = flash.launch(view(q), view(k), (v, (s * hk * d, d, hk * d, 1)), None,
                             batch=b, seq=s, num_heads=h, groups=h // hk, head_dim=d,
                             scale=spec.scale, causal=causal, mode=1, prec="ieee",
                             cfg=AttentionConfig(16, 16, 4, 1), ml=ml, mask=mk,
                             mask_kind=flash.MASK_CODES[mask])
    torch.testing.assert_close(ml, want, rtol=1e-5, atol=1e-5)


def _eager_core(q, k, v, m, spec):
    from inductor_gqa.op.attention_core import _forward
    return _forward(q, k, v, m, None, spec)


def test_mask_that_needs_a_gradient_and_probability_gradients():
    """An additive mask that requires grad gets eager's gradient (the reference is
    differentiated whole); the probabilities' gradient flows into q, k, v."""
    b, s, h, hk, d = 1, 9, 4, 2, 8
    g = torch.Generator().manual_seed(1)
    spec = BlockSpec(num_heads=h, num_kv_heads=hk, head_dim=d, core="explicit", scale=0.5,
                     mask="additive", return_probs=True)
    base = [_rows(b, s, h, d, g), _rows(b, s, hk, d, g), _rows(b, s, hk, d, g),
            torch.randn(b, 1, s, s, generator=g)]
    w_o, w_p = torch.randn(b, s, h * d, generator=g), torch.randn(b, h, s, s, generator=g)

    def grads(core):
        leaves = [t.clone().requires_grad_() for t in base]
        o, p = core(*leaves)[:2]
        ((o * w_o).sum() + (p * w_p).sum()).backward()
        return [t.grad for t in leaves]

    ours = grads(lambda q, k, v, m: call_attention_core(q, k, v, m, None, spec))
    ref = grads(lambda q, k, v, m: _eager_core(q, k, v, m, spec))
    for a, r in zip(ours, ref):
        torch.testing.assert_close(a, r, rtol=1e-5, atol=1e-6)
