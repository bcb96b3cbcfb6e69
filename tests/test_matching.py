"""The matcher finds whole attention blocks written many ways and rewrites them to one fused op,
without changing results; near misses are left alone with a reason."""

import dataclasses
import logging

import pytest
import torch
from torch._dynamo.utils import counters

import inductor_gqa
from inductor_gqa import workloads as wl

from variants import FUSED, REJECTED, Variant, build


def _as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


def _compile_and_run(fn, inputs, **compile_kw):
    with torch.no_grad():
        ref = _as_tuple(fn(**inputs))
        out = _as_tuple(torch.compile(fn, backend="inductor_gqa", **compile_kw)(**inputs))
    return out, ref


def _close(out, ref, dtype):
    for o, r in zip(out, ref):
        assert o.shape == r.shape and o.dtype == r.dtype
        if dtype == torch.float32:
            torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5, equal_nan=True)
        else:
            ok, frac = wl.check(o, r, atol_=5e-3, rtol=0.05)
            assert ok, f"only {frac:.4f} of elements within tolerance"


def _stat(key):
    return counters["inductor_gqa"].get(key, 0)


@pytest.mark.parametrize("variant", FUSED, ids=lambda v: v.name)
def test_variant_is_fused_once_and_matches_eager(variant):
    fn, inputs = build(variant)
    out, ref = _compile_and_run(fn, inputs)
    assert _stat("blocks_fused") == 1, dict(counters["inductor_gqa"])
    _close(out, ref, variant.dtype)


@pytest.mark.parametrize("variant,reason", REJECTED, ids=lambda x: getattr(x, "name", ""))
def test_near_miss_is_left_alone_with_reason(variant, reason, caplog):
    fn, inputs = build(variant)
    with caplog.at_level(logging.INFO, logger="inductor_gqa"):
        out, ref = _compile_and_run(fn, inputs)
    assert _stat("blocks_fused") == 0
    assert _stat(f"rejected: {reason}") == 1, dict(counters["inductor_gqa"])
    assert reason in caplog.text
    if not variant.dropout:
        _close(out, ref, variant.dtype)


def test_mixed_dtype_mask_is_rejected():
    v = Variant("mixed", dtype=torch.bfloat16, mask="add_in")
    fn, inputs = build(v)
    inputs["mask"] = inputs["mask"].float()          # promotes the bf16 scores to float32
    out, ref = _compile_and_run(fn, inputs)
    assert _stat("rejected: mixed dtypes") == 1
    torch.testing.assert_close(out[0], ref[0], rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_inputs_requiring_grad_are_fused_before_autograd(dynamic):
    fn, inputs = build(Variant("grad", mask="causal_fill"))
    ref_in = {k: v.detach().clone() for k, v in inputs.items()}
    ref_in["wq"].requires_grad_(True)
    fn(**ref_in).sum().backward()
    inputs["wq"].requires_grad_(True)
    out = torch.compile(fn, backend="inductor_gqa", dynamic=dynamic)(**inputs)   # the default
    out.sum().backward()
    # dynamic=True: the scale, head_dim ** -0.5 of a symbolic head_dim, is guarded like the
    # head sizes; that specialization restarts Dynamo's analysis once (the pass runs twice), but
    # the block is counted once, when its graph has compiled
    assert _stat("blocks_fused") == 1
    torch.testing.assert_close(inputs["wq"].grad, ref_in["wq"].grad, rtol=1e-4, atol=1e-5)


def test_inputs_requiring_grad_left_alone_when_opted_out():
    fn, inputs = build(Variant("grad", mask="causal_fill"))
    inputs["wq"].requires_grad_(True)
    out = torch.compile(fn, backend="inductor_gqa", options={"fuse_with_grad": False})(**inputs)
    out.sum().backward()
    assert _stat("blocks_fused") == 0
    assert _stat("rejected: inputs require grad") == 1
    assert inputs["wq"].grad is not None


def test_inputs_requiring_grad_through_install_are_reported():
    """install()'s joint-graph pass sees the backward already derived: the block stays stock's,
    reported with how to get it fused."""
    fn, inputs = build(Variant("grad", mask="causal_fill"))
    inputs["wq"].requires_grad_(True)
    with inductor_gqa.installed():
        out = torch.compile(fn)(**inputs)
    out.sum().backward()
    assert _stat("blocks_fused") == 0
    assert _stat("rejected: inputs require grad") == 1
    assert inputs["wq"].grad is not None


# ---------------------------------------------------------------- the reference workloads, reduced
SMALL = dict(num_heads=4, num_kv_heads=2, head_dim=32)


def _workload_case(workload, seq=9, batch=2):
    fn = wl.workload_fn(workload, **SMALL)
    inputs = wl.make_inputs(workload, seq, batch, hidden=128, **SMALL)
    return fn, inputs


@pytest.mark.parametrize("workload", [wl.W075, wl.W092], ids=lambda w: w.name)
def test_workload_function_form(workload):
    fn, inputs = _workload_case(workload)
    out, ref = _compile_and_run(fn, inputs)
    assert _stat("blocks_fused") == 1
    _close(out, ref, workload.dtype)


def test_backend_takes_options_dict(monkeypatch):
    import importlib
    inst = importlib.import_module("inductor_gqa.install")   # the package's install() shadows it
    seen = []

    class Recording(inst.AttentionBlockPass):
        def __init__(self, options=None, chain=None, **kw):
            seen.append(options)
            super().__init__(options, chain=chain, **kw)

    monkeypatch.setattr(inst, "AttentionBlockPass", Recording)
    fn, inputs = _workload_case(wl.W075)
    out, ref = _compile_and_run(fn, inputs, options={"rope_from_positions": False})
    assert seen and seen[0] == inductor_gqa.Options(rope_from_positions=False)
    assert _stat("blocks_fused") == 1
    _close(out, ref, torch.float32)


def test_backend_rejects_unknown_option():
    fn, inputs = _workload_case(wl.W075)
    with pytest.raises(Exception, match="unknown option"):
        _compile_and_run(fn, inputs, options={"rope_from_position": True})


def test_w075_causal_function_form():
    fn, inputs = _workload_case(wl.W075)
    inputs["is_causal"] = True
    out, ref = _compile_and_run(fn, inputs)
    assert _stat("blocks_fused") == 1
    _close(out, ref, torch.float32)


def _module_case(workload):
    torch.manual_seed(0)
    if workload.name == "W075":
        m = wl.W075Attention(hidden=128, **SMALL).eval()
        args = (torch.randn(2, 9, 128), torch.arange(9)[None].expand(2, 9))
    else:
        m = wl.W092Attention(hidden=128, **SMALL).to(torch.bfloat16).eval()
        args = (torch.randn(2, 9, 128).bfloat16(), torch.randn(2, 9, 32).cos().bfloat16(),
                torch.randn(2, 9, 32).sin().bfloat16())
    return m, args


@pytest.mark.parametrize("workload", [wl.W075, wl.W092], ids=lambda w: w.name)
def test_workload_module_form_through_install(workload):
    m, args = _module_case(workload)
    with torch.no_grad():
        ref = _as_tuple(m(*args))
        with inductor_gqa.installed():
            out = _as_tuple(torch.compile(m)(*args))
    assert _stat("blocks_fused") == 1
    assert not inductor_gqa.is_installed()
    _close(out, ref, workload.dtype)


# ------------------------------------------------------------------------------------ dynamic shapes
def _module_inputs(workload, seq, batch):
    if workload.name == "W075":
        return (torch.randn(batch, seq, 128), torch.arange(seq)[None].expand(batch, seq))
    return (torch.randn(batch, seq, 128).bfloat16(), torch.randn(batch, seq, 32).cos().bfloat16(),
            torch.randn(batch, seq, 32).sin().bfloat16())


@pytest.mark.parametrize("workload", [wl.W075, wl.W092], ids=lambda w: w.name)
def test_dynamic_shapes_compile_once(workload):
    # dynamic=True also turns float attributes (scaling, eps) into runtime 0-d tensors: the op
    # takes them as tensor inputs, so the block is still fused and serves every (B, S)
    m, _ = _module_case(workload)
    compiled = torch.compile(m, backend="inductor_gqa", dynamic=True)
    for seq, batch in ((5, 2), (9, 3), (17, 4)):   # sizes 0/1 are always specialized
        args = _module_inputs(workload, seq, batch)
        with torch.no_grad():
            _close(_as_tuple(compiled(*args)), _as_tuple(m(*args)), workload.dtype)
    assert _stat("blocks_seen") == 1 and _stat("blocks_fused") == 1
    assert counters["stats"]["unique_graphs"] == 1


def test_dynamic_function_form_with_int_arguments():
    """Head counts passed as ints become symbolic under dynamic=True; they are guarded."""
    fn = wl.workload_fn(wl.W075, **SMALL)
    compiled = torch.compile(fn, backend="inductor_gqa", dynamic=True)
    for seq, batch in ((5, 2), (9, 3), (17, 4)):
        inputs = wl.make_inputs(wl.W075, seq, batch, hidden=128, **SMALL)
        with torch.no_grad():
            _close(_as_tuple(compiled(**inputs)), _as_tuple(fn(**inputs)), torch.float32)
    assert _stat("blocks_fused") == 1
    assert counters["stats"]["unique_graphs"] == 1


def test_runtime_eps_argument_is_an_op_input():
    """A float argument is a runtime value under dynamic=True; a new value must not recompile
    and must be honoured."""
    fn = wl.workload_fn(wl.W092, **SMALL)
    compiled = torch.compile(fn, backend="inductor_gqa", dynamic=True)
    for eps in (1e-5, 0.5):
        inputs = wl.make_inputs(wl.W092, 5, 2, hidden=128, **SMALL)
        inputs["q_norm_weight"] = torch.rand(32).bfloat16() + 0.5
        with torch.no_grad():
            out = compiled(**inputs, rms_norm_eps=eps)
            ref = fn(**inputs, rms_norm_eps=eps)
        _close((out,), (ref,), torch.bfloat16)
    assert _stat("blocks_fused") == 1
    assert counters["stats"]["unique_graphs"] == 1


def test_automatic_dynamic_after_second_shape():
    m, _ = _module_case(wl.W092)
    compiled = torch.compile(m, backend="inductor_gqa")
    for seq, batch in ((5, 2), (9, 3), (17, 4), (33, 2)):
        args = _module_inputs(wl.W092, seq, batch)
        with torch.no_grad():
            _close(_as_tuple(compiled(*args)), _as_tuple(m(*args)), torch.bfloat16)
    # static first, then one dynamic graph that serves every later shape
    assert _stat("blocks_fused") == 2
    assert counters["stats"]["unique_graphs"] == 2


# ----------------------------------------------------------------------------- masks, never guessed
def _specs_of(fn, inputs, **compile_kw):
    from inductor_gqa.find import report
    from inductor_gqa.explain import light_backend

    report.history.clear()
    compiled = torch.compile(fn, backend=light_backend(), **compile_kw)
    return compiled, lambda: [r.spec for r in report.history if r.fused]


def test_window_never_passes_for_causal_under_dynamic_shapes():
    """At a symbolic length a window could only show beyond the lengths tried: the mask goes to
    the op as the tensor the graph computes, and results stay exact at every length."""
    v = Variant("window_dyn", mask="window")
    fn, _ = build(v)
    compiled, specs = _specs_of(fn, None, dynamic=True)
    for seq in (7, 12, 5):
        _, inputs = build(dataclasses.replace(v, seq=seq))
        with torch.no_grad():
            _close(_as_tuple(compiled(**inputs)), _as_tuple(fn(**inputs)), torch.float32)
    (spec,) = specs()
    assert not spec.causal and spec.window == 0 and spec.mask == "bool_fill"


def test_static_window_is_recognized_exactly():
    fn, inputs = build(Variant("window_static", mask="window", seq=11))
    compiled, specs = _specs_of(fn, inputs)
    with torch.no_grad():
        _close(_as_tuple(compiled(**inputs)), _as_tuple(fn(**inputs)), torch.float32)
    (spec,) = specs()
    assert spec.causal and spec.window == 3 and spec.mask == "none"


def test_fully_masked_rows_match_eager():
    """Left padding empties whole query rows: NaN under -inf, a uniform row under finfo.min,
    zeros from SDPA; the fused op gives each exactly."""
    expect = {"padded_rows_inf": "nan", "padded_rows_min": "uniform", "padded_rows_sdpa": "zero"}
    for v in [v for v in FUSED if v.name in expect]:
        torch._dynamo.reset()
        fn, inputs = build(v)
        out, ref = _compile_and_run(fn, inputs)
        _close(out, ref, v.dtype)
        if v.probs:
            rows = ref[1][1, :, :2]                       # batch row 1, its first two queries
            if expect[v.name] == "nan":
                assert torch.isnan(rows).all() and torch.isnan(out[1][1, :, :2]).all()
            else:
                assert torch.allclose(rows, torch.full_like(rows, 1.0 / v.seq))
        else:
            heads = _heads_output(v, inputs)
            assert torch.equal(heads[1, :, :2], torch.zeros_like(heads[1, :, :2]))


def _heads_output(v, inputs):
    """The SDPA output [B, H, S, D] of variant v (eager), for the fully masked rows check."""
    fn, _ = build(dataclasses.replace(v, end="heads"))
    with torch.no_grad():
        return fn(**{k: t for k, t in inputs.items() if k not in ("wo", "bo")})


def test_mask_computed_from_the_scores_is_left_alone():
    """where(scores > c, 0, scores) reads like a masked_fill but depends on the scores."""
    import torch.nn.functional as F

    def fn(x, wq, wk, wv):
        b, s, _ = x.shape
        q = F.linear(x, wq).view(b, s, 2, 16).transpose(1, 2)
        k = F.linear(x, wk).view(b, s, 2, 16).transpose(1, 2)
        v = F.linear(x, wv).view(b, s, 2, 16).transpose(1, 2)
        sc = q @ k.transpose(2, 3) * 0.25
        sc = torch.where(sc > 3.0, 0.0, sc)
        return (torch.softmax(sc, -1) @ v).transpose(1, 2).reshape(b, s, 32)

    args = dict(x=torch.randn(2, 5, 32), wq=torch.randn(32, 32), wk=torch.randn(32, 32),
                wv=torch.randn(32, 32))
    out, ref = _compile_and_run(fn, args)
    assert _stat("blocks_fused") == 0 and _stat("rejected: mask not recognized") == 1
    _close(out, ref, torch.float32)


@pytest.mark.parametrize("name,mask", [("cudnn_converted_causal", "none"),
                                       ("cudnn_converted_padding", "additive")])
def test_cudnn_converted_keep_mask(name, mask):
    """On the GPU, SDPA's cuDNN path turns a bool keep-mask into where(~keep, -65504, 0) before
    autograd sees it (transformers' in-graph causal mask, for one): the structure alone is
    causal exactly (every row keeps a key); with a padding factor a finite fill differs from
    -inf on emptied rows, so the mask stays an additive tensor."""
    v = next(v for v in FUSED if v.name == name)
    fn, inputs = build(v)
    compiled, specs = _specs_of(fn, inputs)
    with torch.no_grad():
        _close(_as_tuple(compiled(**inputs)), _as_tuple(fn(**inputs)), v.dtype)
    (spec,) = specs()
    assert spec.mask == mask and spec.causal == (mask == "none")
