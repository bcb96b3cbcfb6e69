"""Gradients through the fused block: training steps and grad-enabled forwards of real
``transformers`` models, every layer fused before autograd, losses and gradients equal to eager.

Most cases use the light backend (AOTAutograd, the graphs run eagerly: the fused op's forward
runs its reference, its backward recomputes it); a few go through ``backend="inductor_gqa"``,
and one runs the forward's kernels in Triton's interpreter."""

import logging

import pytest
import torch
from torch._dynamo.utils import counters

import hf_models
from hf_models import FAMILIES, attention_paths, build, call_kwargs, inputs
from inductor_gqa import Options, workloads as wl
from inductor_gqa.find.explain import light_backend

KERNEL_NODE = torch.ops.higher_order.triton_kernel_wrapper_functional
GRAD = Options(fuse_with_grad=True)


def _step(model, ids, mask, compiled=None):
    """Loss and parameter gradients of one step (the model's own LM loss)."""
    model.zero_grad(set_to_none=True)
    out = (model if compiled is None else compiled)(ids, labels=ids, **call_kwargs(mask))
    out.loss.backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    return out.loss.detach(), grads


def _assert_grads_equal(grads, ref, rtol=1e-4):
    assert grads.keys() == ref.keys()
    for k in ref:
        scale = ref[k].abs().max().clamp_min(1e-12)
        err = ((grads[k] - ref[k]).abs().max() / scale).item()
        assert err <= rtol, f"d{k}: {err:.2e} of its scale"


# left-padded: the in-graph masks and fully masked query rows; the unpadded forms are in
# test_gradients.py and the Inductor cases below
@pytest.mark.parametrize("impl", ("sdpa", "eager"))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_training_step_every_layer_fused(family, impl, padded=True):
    try:
        model = build(family, impl)
    except hf_models.Unsupported as e:
        pytest.skip(str(e))
    ids, mask = inputs(padded)
    ref_loss, ref_grads = _step(model, ids, mask)
    loss, grads = _step(model, ids, mask, torch.compile(model, backend=light_backend(GRAD),
                                                        dynamic=False))
    assert dict(counters["inductor_gqa_fused"]) == {p: 1 for p in attention_paths(model)}
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=0)
    _assert_grads_equal(grads, ref_grads)


def test_grad_enabled_forward_is_fused():
    """model.eval(); model(x) without torch.no_grad(): the parameters require grad."""
    model = build("qwen3", "sdpa")
    ids, mask = inputs(padded=True)
    with torch.no_grad():
        ref = model(ids, **call_kwargs(mask)).logits
    out = torch.compile(model, backend=light_backend(GRAD), dynamic=False)(ids, **call_kwargs(mask))
    assert out.logits.requires_grad
    assert dict(counters["inductor_gqa_fused"]) == {p: 1 for p in attention_paths(model)}
    torch.testing.assert_close(out.logits.detach(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family,impl,padded", [
    ("llama", "sdpa", True),        # causal + padding, in-graph masks
    ("gemma2", "eager", True),      # softcap, window, finfo.min additive mask
    ("glm4_moe", "sdpa", False),    # bias, QK norm, partial rotary, MoE
])
def test_training_step_through_inductor(family, impl, padded):
    model = build(family, impl)
    ids, mask = inputs(padded)
    ref_loss, ref_grads = _step(model, ids, mask)
    loss, grads = _step(model, ids, mask, torch.compile(model, backend="inductor_gqa",
                                                        dynamic=False,
                                                        options={"fuse_with_grad": True}))
    assert dict(counters["inductor_gqa_fused"]) == {p: 1 for p in attention_paths(model)}
    assert not any(k.startswith("rejected") for k in counters["inductor_gqa"])
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=0)
    _assert_grads_equal(grads, ref_grads)


def test_dynamic_shapes_with_grad_are_left_to_inductor(caplog):
    model = build("llama", "sdpa")
    ids, mask = inputs(padded=False)
    ref_loss, ref_grads = _step(model, ids, mask)
    with caplog.at_level(logging.INFO, logger="inductor_gqa"):
        loss, grads = _step(model, ids, mask, torch.compile(model, backend=light_backend(GRAD),
                                                            dynamic=True))
    assert "shapes are dynamic" in caplog.text
    assert not counters["inductor_gqa_fused"]
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=0)
    _assert_grads_equal(grads, ref_grads)


def test_kernels_forward_and_recomputed_backward(monkeypatch):
    """W075's block with weights that require grad: the forward graph holds the plan's kernels
    (Triton's interpreter), the backward recomputes; gradients equal eager's."""
    import inductor_gqa.graph_pass as graph_pass
    lowered = []
    real_expand = graph_pass.expand
    monkeypatch.setattr(graph_pass, "expand",
                        lambda graph, call, *a: (lowered.append(graph), real_expand(graph, call, *a)))
    graphs = []
    fn = wl.workload_fn(wl.W075, 4, 2, 16)
    inp = wl.make_inputs(wl.W075, 19, 2, hidden=64, num_heads=4, num_kv_heads=2, head_dim=16,
                         seed=3)
    weights = [k for k in inp if k.endswith("proj_weight")]
    base = light_backend(Options(cpu_kernels=True, fuse_with_grad=True))

    def recording(gm, example_inputs):
        graphs.append(gm)
        return base(gm, example_inputs)

    def grads(call):
        args = {k: (v.detach().clone().requires_grad_(k in weights)) for k, v in inp.items()}
        out, probs = call(**args)
        (out * torch.linspace(-1, 1, out.shape[-1])).sum().backward()
        return {k: args[k].grad for k in weights}

    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        ref = grads(fn)
        compiled = torch.compile(fn, backend=recording, dynamic=False)
        ours = grads(compiled)
    finally:
        torch.set_float32_matmul_precision(before)
    assert counters["inductor_gqa"]["blocks_fused"] == 1
    assert len(lowered) == 1 and any(n.target is KERNEL_NODE for n in lowered[0].nodes)
    _assert_grads_equal(ours, ref, rtol=1e-4)


def test_block_left_unfused_with_grad_is_reported_once():
    """Opted in, a block the recognizers refuse is reported with its own reason, before autograd,
    and not again by the joint-graph pass."""
    from variants import REJECTED, build as build_variant

    v, reason = next((v, r) for v, r in REJECTED if v.name == "head_dim_24")
    fn, inp = build_variant(v)
    inp["wq"].requires_grad_(True)
    out = torch.compile(fn, backend="inductor_gqa", options={"fuse_with_grad": True})(**inp)
    out.sum().backward()
    c = counters["inductor_gqa"]
    assert c["blocks_seen"] == 1 and c["blocks_fused"] == 0
    assert c[f"rejected: {reason}"] == 1 and c["rejected: inputs require grad"] == 0
    assert inp["wq"].grad is not None
