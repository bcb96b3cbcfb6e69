"""Acceptance: whole ``transformers`` models, every attention layer fused, logits equal to eager.

Ten families, attn_implementation "sdpa" and "eager", with and without a left-padded
attention_mask (whose first query rows see no key at all). Most cases compile with the light
backend (the same graph our pass sees under Inductor, run eagerly: the fused op runs its
reference); a few go through ``backend="inductor_gqa"`` end to end.
"""

import logging

import pytest
import torch
from torch._dynamo.utils import counters

import hf_models
from hf_models import FAMILIES, attention_paths, build, call_kwargs, inputs
from inductor_gqa.explain import explain
from tolerance import judge, judge_bf16

IMPLS = ("sdpa", "eager")


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


def _check_all_fused(result, model):
    paths = attention_paths(model)
    assert len(paths) == model.config.num_hidden_layers
    assert not result.left, result.table()
    assert sorted(r.block for r in result.rows) == sorted(paths), result.table()


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_whole_model_every_layer_fused(family, impl, padded):
    try:
        model = build(family, impl)
    except hf_models.Unsupported as e:
        pytest.skip(str(e))
    ids, mask = inputs(padded)
    with torch.no_grad():
        ref = model(ids, **call_kwargs(mask)).logits
    result = explain(model, ids, **call_kwargs(mask))
    _check_all_fused(result, model)
    out = result.output.logits
    assert torch.isfinite(ref).all()
    assert _rel_err(out, ref) <= 1e-5


@pytest.mark.parametrize("family", ["mixtral", "glm4_moe"])
def test_router_softmax_is_not_a_block(family, caplog):
    """A mixture of experts' router (Mixtral's softmax over the experts, not followed by @ v)
    is no attention block: not seen, not left, logged at DEBUG as "not attention"; the summary
    reads every attention layer fused."""
    model = build(family, "sdpa")
    ids, mask = inputs(padded=True)
    with caplog.at_level(logging.DEBUG, logger="inductor_gqa"):
        result = explain(model, ids, **call_kwargs(mask))
    _check_all_fused(result, model)
    n = model.config.num_hidden_layers
    assert counters["inductor_gqa"]["blocks_seen"] == counters["inductor_gqa"]["blocks_fused"] == n
    assert not counters["inductor_gqa_left"]
    assert result.table().endswith(f"fused {n} of {n} attention blocks; 0 left")
    if family == "mixtral":
        assert "not attention: model.layers.0.mlp" in caplog.text


def test_eager_attentions_returned():
    """output_attentions=True: the probabilities leave the block (through the no-op dropout's
    copy); the op returns them too."""
    model = build("qwen3", "eager")
    ids, mask = inputs(padded=True)
    with torch.no_grad():
        ref = model(ids, output_attentions=True, **call_kwargs(mask))
    result = explain(model, ids, output_attentions=True, **call_kwargs(mask))
    _check_all_fused(result, model)
    assert all(r.spec.return_probs for r in result.rows)
    for got, want in zip(result.output.attentions, ref.attentions):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert _rel_err(result.output.logits, ref.logits) <= 1e-5


@pytest.mark.parametrize("family,impl", [("llama", "sdpa"), ("gemma2", "eager"),
                                         ("gemma3", "eager"), ("olmo2", "eager"),
                                         ("glm4_moe", "sdpa")])
def test_bf16_models(family, impl):
    """bf16 logits judged against a float32 run of the same model: ours stray from it no more
    than a few times as far as bf16 eager does (tests/tolerance.py)."""
    model = build(family, impl, dtype=torch.bfloat16)
    ids, mask = inputs(padded=True)
    with torch.no_grad():
        ref = model(ids, **call_kwargs(mask)).logits
        ref32 = model.float()(ids, **call_kwargs(mask)).logits    # the same (bf16) weights
    model.bfloat16()
    result = explain(model, ids, **call_kwargs(mask))
    _check_all_fused(result, model)
    judge_bf16(result.output.logits, ref, ref32)


@pytest.mark.parametrize("family,impl,padded", [
    ("llama", "sdpa", True),        # causal + padding factor
    ("gemma2", "eager", True),      # softcap, window, finfo.min additive mask
    ("gpt_neox", "eager", False),   # QKV rows gathered head by head, partial rotary
    ("olmo2", "sdpa", False),       # norm over the projection
])
def test_whole_model_through_inductor(family, impl, padded):
    """Logits within 1e-5 of eager's, or else within stock Inductor's own deviation."""
    model = build(family, impl)
    ids, mask = inputs(padded)
    with torch.no_grad():
        ref = model(ids, **call_kwargs(mask)).logits
        out = torch.compile(model, backend="inductor_gqa")(ids, **call_kwargs(mask)).logits
    assert dict(counters["inductor_gqa_fused"]) == {p: 1 for p in attention_paths(model)}

    def stock():
        with torch.no_grad():
            got = torch.compile(model, backend="inductor")(ids, **call_kwargs(mask)).logits
        return {"logits": _rel_err(got, ref)}

    judge({"logits": _rel_err(out, ref)}, {"logits": 1e-5}, stock)


def test_dynamic_shapes_window_stays_a_tensor():
    """Under dynamic=True a sliding window could only show beyond the lengths tried: the mask
    goes to the op as a tensor, never as causal; one graph serves every length."""
    model = build("mistral", "sdpa")
    compiled = torch.compile(model, backend=hf_models_light(), dynamic=True)
    for seq in (9, 13, 6):
        ids, _ = inputs(padded=False, seq=seq)
        with torch.no_grad():
            out, ref = compiled(ids, use_cache=False).logits, model(ids, use_cache=False).logits
        assert _rel_err(out, ref) <= 1e-5
    specs = [r.spec for r in _history() if r.fused]
    assert specs and all(not s.causal and not s.window and s.mask == "bool_keep" for s in specs)


def test_dynamic_shapes_causal_is_recognized():
    """transformers' causal mask (with its packed-sequence check) under dynamic=True: evaluated at
    several lengths, its constants are -1, 0, 1 only, so it is causal (no mask tensor)."""
    model = build("llama", "eager")
    compiled = torch.compile(model, backend=hf_models_light(), dynamic=True)
    for seq in (9, 12):
        ids, _ = inputs(padded=False, seq=seq)
        with torch.no_grad():
            out, ref = compiled(ids, use_cache=False).logits, model(ids, use_cache=False).logits
        assert _rel_err(out, ref) <= 1e-5
    specs = [r.spec for r in _history() if r.fused]
    assert len(specs) == 2 and all(s.causal and s.mask == "none" for s in specs)


def test_dynamic_shapes_padded_eager():
    model = build("llama", "eager")
    compiled = torch.compile(model, backend=hf_models_light(), dynamic=True)
    for seq in (9, 12):
        ids, mask = inputs(padded=True, seq=seq)
        with torch.no_grad():
            out = compiled(ids, **call_kwargs(mask)).logits
            ref = model(ids, **call_kwargs(mask)).logits
        assert _rel_err(out, ref) <= 1e-5
    assert counters["inductor_gqa"]["blocks_fused"] == 2
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.parametrize("family,dynamic", [(f, False) for f in FAMILIES] + [
    ("llama", True), ("phi3", True), ("gpt_neox", True)])
def test_model_returning_its_cache(family, dynamic):
    """A plain ``model(ids)`` (use_cache on, the default): the graph also returns the K/V cache,
    through clones of k and v (a fused QKV projection's slices too); every layer is fused and
    the returned cache equals eager's."""
    impl = "sdpa" if family != "gemma2" else "eager"
    model = build(family, impl)
    ids, _ = inputs(padded=False)
    compiled = torch.compile(model, backend=hf_models_light(), dynamic=dynamic)
    with torch.no_grad():
        out, ref = compiled(ids), model(ids)
    assert {r.block for r in _history() if r.fused} == attention_paths(model)
    assert _rel_err(out.logits, ref.logits) <= 1e-5
    for layer, ref_layer in zip(out.past_key_values.layers, ref.past_key_values.layers):
        torch.testing.assert_close(layer.keys, ref_layer.keys, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(layer.values, ref_layer.values, rtol=1e-5, atol=1e-6)


def hf_models_light():
    from inductor_gqa.find import report
    from inductor_gqa.explain import light_backend
    report.history.clear()
    return light_backend()


def _history():
    from inductor_gqa.find import report
    return list(report.history)


# --------------------------------------------------------------------------------------- reporting
def test_one_summary_per_compile_by_module_path(caplog):
    model = build("gpt_neox", "sdpa")
    ids, _ = inputs(padded=False)
    with caplog.at_level(logging.INFO, logger="inductor_gqa"):
        explain(model, ids, use_cache=False)
    assert "fused attention block gpt_neox.layers.1.attention" in caplog.text
    summaries = [r.getMessage() for r in caplog.records
                 if r.getMessage().startswith("fused 2 of 2 attention blocks")]
    assert summaries == ["fused 2 of 2 attention blocks; 0 left"]
    assert dict(counters["inductor_gqa_fused"]) == {
        "gpt_neox.layers.0.attention": 1, "gpt_neox.layers.1.attention": 1}


def test_blocks_left_are_listed_with_their_reason():
    model = build("qwen3", "eager")
    ids, mask = inputs(padded=True)
    result = explain(model, ids, options={"head_dims": (64,)}, **call_kwargs(mask))
    assert result.fused == 0 and len(result.left) == 2
    table = result.table()
    assert "model.layers.0.self_attn  left    unsupported head_dim (head_dim 16 not in (64,))" \
        in table
    assert table.endswith("fused 0 of 2 attention blocks; 2 left")
    assert counters["inductor_gqa_left"]["model.layers.1.self_attn: unsupported head_dim"] == 1


def test_explain_command_line(capsys):
    from inductor_gqa.__main__ import main

    assert main(["explain", "hf_models:tiny_llama_padded"]) == 0
    out = capsys.readouterr().out
    assert "model.layers.0.self_attn  fused   sdpa, 4/2 heads x 16, rope half/16, causal, " \
        "mask bool_keep" in out
    assert out.strip().endswith("fused 2 of 2 attention blocks; 0 left")
    assert hf_models.tiny_llama_padded  # the factory the command names
