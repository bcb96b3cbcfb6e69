"""Gradients through the fused block: training steps and grad-enabled forwards of real
``transformers`` models, every layer fused before autograd, losses and gradients equal to eager.

Most cases use the light backend (AOTAutograd, the graphs run eagerly: the fused op's forward
runs its reference, its backward recomputes it); a few go through ``backend="inductor_gqa"``,
and one runs the forward's kernels in Triton's interpreter."""


import copy

import pytest
import torch
from torch._dynamo.utils import counters

import hf_models
from hf_models import FAMILIES, attention_paths, build, call_kwargs, inputs
from inductor_gqa import Options, workloads as wl
from inductor_gqa.explain import light_backend

GRAD = Options()     # fuse_with_grad is the default


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


def test_dynamic_shapes_with_grad():
    """dynamic=True: the blocks are fused with their sizes symbolic, and one graph serves every
    length (the cache the model returns by default included)."""
    model = build("llama", "sdpa")
    compiled = torch.compile(model, backend=light_backend(GRAD), dynamic=True)
    for seq in (9, 6, 12):
        ids, mask = inputs(padded=False, seq=seq)
        ref_loss, ref_grads = _step(model, ids, mask)
        loss, grads = _step(model, ids, mask, compiled)
        torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=0)
        _assert_grads_equal(grads, ref_grads)
    assert set(counters["inductor_gqa_fused"]) == attention_paths(model)
    assert counters["stats"]["unique_graphs"] == 1


@pytest.fixture
def kernel_names(monkeypatch):
    """The names of the Triton kernels put into graphs while the test runs."""
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table
    names = set()
    add = kernel_side_table.add_kernel

    def recording(kernel):
        fn = getattr(kernel, "fn", kernel)
        names.add(getattr(fn, "__name__", None) or fn.fn.__name__)
        return add(kernel)

    monkeypatch.setattr(kernel_side_table, "add_kernel", recording)
    return names


@pytest.mark.parametrize("workload,lengths", [("W075", (19,)), ("W092", (19,)),
                                              ("W092", (19, 23, 29))],
                         ids=["W075", "W092", "W092-lengths"])
def test_kernels_forward_and_backward(workload, lengths, kernel_names):
    """A block with weights and hidden states that require grad, its core lowered to the GPU
    kernels (Triton's interpreter): the forward graph runs flash.py storing its statistics, the
    backward graph flash_bwd.py (W075: with a gradient into the returned probabilities);
    gradients equal eager's (W092 in bf16: the W092 rule's scale). Several lengths: Dynamo's
    automatic dynamic shapes recompile once with the length symbolic, then reuse that graph."""
    w = wl.WORKLOADS[workload]
    fn = wl.workload_fn(w, 4, 2, 16)
    backend = light_backend(Options(cpu_kernels=True, fuse_with_grad=True))
    compiled = torch.compile(fn, backend=backend, dynamic=None if len(lengths) > 1 else False)

    def grads(call, inp, train):
        args = {k: (v.detach().clone().requires_grad_(k in train)) for k, v in inp.items()}
        out = call(**args)
        out, probs = out if isinstance(out, tuple) else (out, None)
        loss = (out.float() * torch.linspace(-1, 1, out.shape[-1])).sum()
        if probs is not None:
            loss = loss + (probs * probs).sum()
        loss.backward()
        return {k: args[k].grad for k in train}

    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        for seq in lengths:
            inp = wl.make_inputs(w, seq, 2, hidden=64, num_heads=4, num_kv_heads=2, head_dim=16,
                                 seed=3)
            train = [k for k, v in inp.items() if v.is_floating_point()
                     and k not in ("cos", "sin", "inv_freq")]
            ref, ours = grads(fn, inp, train), grads(compiled, inp, train)
            _assert_grads_equal(ours, ref, rtol=1e-4 if workload == "W075" else 0.05)
    finally:
        torch.set_float32_matmul_precision(before)
    assert counters["inductor_gqa"]["blocks_fused"] == min(len(lengths), 2)
    assert counters["stats"]["unique_graphs"] == min(len(lengths), 2)
    assert {"gqa_attention_kernel", "bwd_preprocess_kernel", "bwd_dkdv_kernel",
            "bwd_dq_kernel"} <= kernel_names, kernel_names


def test_block_without_an_inference_plan_trains_on_the_core_kernels(kernel_names):
    """OLMo-2's norm over the whole projection has no inference plan, but a block with
    gradients only needs kernels for its core: fused, the core's kernels run (interpreter)."""
    model = build("olmo2", "sdpa")
    ids, mask = inputs(padded=False)
    ref_loss, ref_grads = _step(model, ids, mask)
    backend = light_backend(Options(fuse_with_grad=True, cpu_kernels=True))
    loss, grads = _step(model, ids, mask, torch.compile(model, backend=backend, dynamic=False))
    assert set(counters["inductor_gqa_fused"]) == attention_paths(model)
    assert {"gqa_attention_kernel", "bwd_dkdv_kernel"} <= kernel_names, kernel_names
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=0)
    _assert_grads_equal(grads, ref_grads)


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


def test_a_failed_retrace_leaves_the_graph_to_stock(monkeypatch, caplog):
    """Gradients are fused by default, so a model whose graph the retrace before autograd
    cannot take must still train: its graph is left to stock, counted and warned about."""
    from inductor_gqa.lower import training

    def planted(*args, **kwargs):
        raise RuntimeError("planted retrace failure")

    monkeypatch.setattr(training, "expand_for_training", planted)
    model = build("llama", "sdpa")
    ids, mask = inputs(padded=True)
    ref_loss, ref_grads = _step(model, ids, mask)
    with caplog.at_level("WARNING", logger="inductor_gqa"):
        loss, grads = _step(model, ids, mask, torch.compile(model, backend=light_backend(GRAD),
                                                            dynamic=False))
    assert counters["inductor_gqa"]["graphs left: retrace before autograd failed"] >= 1
    assert not counters["inductor_gqa_fused"]
    assert "planted retrace failure" in caplog.text
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=0)
    _assert_grads_equal(grads, ref_grads)


@pytest.mark.parametrize("family,impl", [("llama", "sdpa"), ("gemma2", "eager")])
def test_a_few_optimizer_steps_follow_eager(family, impl):
    """Three AdamW steps through ``backend="inductor_gqa"`` (defaults), each on a new left-padded
    batch, against an eager copy: every step's loss and gradients, and the weights after them."""
    ref_model = build(family, impl).train()
    model = copy.deepcopy(ref_model)
    compiled = torch.compile(model, backend="inductor_gqa", dynamic=False)
    lr = 1e-3
    ref_opt = torch.optim.AdamW(ref_model.parameters(), lr=lr)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    for step in range(3):
        ids, mask = inputs(padded=True, seed=step)
        ref_loss, ref_grads = _step(ref_model, ids, mask)
        loss, grads = _step(model, ids, mask, compiled)
        ref_opt.step()
        opt.step()
        torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=0)
        # from the second step on, the weights differ by float rounding through Adam
        _assert_grads_equal(grads, ref_grads, rtol=1e-4 if step == 0 else 1e-3)
    assert set(counters["inductor_gqa_fused"]) == attention_paths(model)
    # Adam divides by the gradient's running size: an element whose gradient is about 0 may
    # move by a fraction of lr differently; a tenth of a step is the bound
    for (name, p), r in zip(model.named_parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, r, rtol=0, atol=lr / 10, msg=lambda m: f"{name}: {m}")
