"""Generation with a K/V cache: every block of prefill and of every decode step fused, tokens
equal to eager's.

Greedy ``model.generate()`` of tiny random models (tests/hf_models.py) with the model's forward
compiled, the default DynamicCache and ``cache_implementation="static"``, a left-padded batch of
2 (per-row positions, padding masks) and an unpadded one; and a hand-written decode loop over a
StaticCache (gpt-fast style). Most cases compile with the light backend (the graph our pass sees
under Inductor, run eagerly); one goes through ``backend="inductor_gqa"`` end to end. Each call
of the fused op is counted: every forward (prefill and each step) must run it once per layer.
"""

import contextlib
import dataclasses
import importlib
import inspect

import pytest
import torch
import transformers as tf
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters

import hf_models
from hf_models import build, inputs
from inductor_gqa.explain import light_backend
from inductor_gqa.options import Options
from inductor_gqa.plan.plans import Problem, Unsupported, choose
from inductor_gqa.plan.spec import BlockSpec

op_module = importlib.import_module("inductor_gqa.op.attention_block")

NEW_TOKENS = 3
# (family, attention implementation): Gemma 2 has no sdpa attention in transformers 5.2x
FAMILIES = [("llama", "sdpa"), ("qwen3", "sdpa"), ("mistral", "sdpa"), ("gemma2", "eager"),
            ("glm4_moe", "sdpa")]


@contextlib.contextmanager
def op_calls():
    """Counts the fused op's calls (its reference runs once per call on the CPU)."""
    calls = []
    real = op_module.attention_block_reference

    def counted(*args, **kwargs):
        calls.append(kwargs["spec"])
        return real(*args, **kwargs)

    op_module.attention_block_reference = counted
    try:
        yield calls
    finally:
        op_module.attention_block_reference = real


def _build(family, impl):
    try:
        return build(family, impl)
    except hf_models.Unsupported as e:
        pytest.skip(str(e))


def _generate(model, ids, mask, cache):
    kw = dict(max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0,
              attention_mask=mask if mask is not None else torch.ones_like(ids))
    if cache == "static":
        kw["cache_implementation"] = "static"
    with torch.no_grad():
        return model.generate(ids, **kw)


def _compiled_generate(model, ids, mask, cache, backend):
    """(tokens, Dynamo frames compiled) of ``generate`` with the model's forward compiled."""
    counter = CompileCounterWithBackend(backend)
    eager_forward = model.forward
    model.forward = torch.compile(eager_forward, backend=counter)
    try:
        return _generate(model, ids, mask, cache), counter.frame_count
    finally:
        model.forward = eager_forward


def _check_generation(model, ids, mask, cache, backend):
    want = _generate(model, ids, mask, cache)
    with op_calls() as calls:
        got, frames = _compiled_generate(model, ids, mask, cache, backend)
    layers = model.config.num_hidden_layers
    c = counters["inductor_gqa"]
    assert c["blocks_seen"] == c["blocks_fused"] > 0, dict(c)
    # every forward (prefill, then one per new token but the last) ran every layer fused
    assert len(calls) == layers * NEW_TOKENS, (len(calls), dict(c))
    assert got.tolist() == want.tolist()
    return calls, frames


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("family,impl", FAMILIES, ids=[f for f, _ in FAMILIES])
def test_generate_every_step_fused(family, impl, cache, padded):
    if not padded and family != "llama":
        pytest.skip("unpadded: Llama's suffice (no mask in decode, the static prefill over the "
                    "prompt's slots); the padded batch covers the rest")
    model = _build(family, impl)
    ids, mask = inputs(padded)
    calls, frames = _check_generation(model, ids, mask, cache, light_backend())
    kinds = {s.cache for s in calls[model.config.num_hidden_layers:]}     # the decode steps
    assert kinds <= ({"concat"} if cache == "dynamic" else {"index_put"}), kinds
    if family == "llama":
        # no recompilation beyond stock's: as many Dynamo frames as with Dynamo alone
        torch._dynamo.reset()
        assert frames == _compiled_generate(model, ids, mask, cache, "eager")[1]


def test_generate_through_inductor():
    """``backend="inductor_gqa"`` end to end: the op node stays in Inductor's CPU code."""
    model = _build("qwen3", "sdpa")
    ids, mask = inputs(padded=True)
    _check_generation(model, ids, mask, "static", "inductor_gqa")


def _cache_kwargs(model, cache, positions):
    """The cache arguments of the model's forward in this transformers version (5.2x: ``cache``;
    earlier: ``past_key_values`` and ``cache_position``)."""
    params = inspect.signature(model.forward).parameters
    kw = {"cache" if "cache" in params else "past_key_values": cache, "use_cache": True}
    if "cache_position" in params:
        kw["cache_position"] = positions
    return kw


def _decode_loop(model, forward, ids, steps, max_len):
    """Greedy tokens of a hand-written loop: one prefill call, then one call per token, over a
    StaticCache at explicit positions."""
    cache = tf.StaticCache(config=model.config, max_cache_len=max_len)
    b, s = ids.shape
    pos = torch.arange(s)
    tokens = []
    with torch.no_grad():
        out = forward(ids, position_ids=pos[None].expand(b, -1),
                      **_cache_kwargs(model, cache, pos))
        for _ in range(steps):
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            tokens.append(nxt)
            pos = pos[-1:] + 1
            out = forward(nxt, position_ids=pos[None].expand(b, -1),
                          **_cache_kwargs(model, cache, pos))
    return torch.cat(tokens, 1)


def test_decode_loop_static_cache():
    """gpt-fast style: ``torch.compile(model.forward)`` called with a StaticCache."""
    model = _build("llama", "sdpa")
    ids, _ = inputs(padded=False)
    steps, max_len = 4, 16
    want = _decode_loop(model, model.forward, ids, steps, max_len)
    compiled = torch.compile(model.forward, backend=light_backend())
    with op_calls() as calls:
        got = _decode_loop(model, compiled, ids, steps, max_len)
    assert got.tolist() == want.tolist()
    c = counters["inductor_gqa"]
    assert c["blocks_seen"] == c["blocks_fused"] > 0, dict(c)
    assert len(calls) == model.config.num_hidden_layers * (steps + 1)
    # each step attends over the whole buffer; prefill too, or (transformers 5.2x, no mask)
    # over the prompt's slots
    layers = model.config.num_hidden_layers
    assert {s.cache for s in calls[layers:]} == {"index_put"}
    assert {s.cache for s in calls[:layers]} <= {"index_put", "index_put_prefix"}


def _op_inputs(cache_len=8, s=2, b=2, seed=0):
    """Random tensors of a cached block (4 query heads over 2 KV heads of 16, RoPE from
    positions, a static cache of ``cache_len`` slots)."""
    g = torch.Generator().manual_seed(seed)
    e, h, hk, d = 32, 4, 2, 16
    t = dict.fromkeys(op_module.TENSOR_ARGS)
    t.update(x=torch.randn(b, s, e, generator=g), wq=torch.randn(h * d, e, generator=g) * 0.2,
             wk=torch.randn(hk * d, e, generator=g) * 0.2,
             wv=torch.randn(hk * d, e, generator=g) * 0.2,
             inv_freq=1.0 / 10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d),
             position_ids=torch.arange(3, 3 + s)[None].expand(b, -1),
             past_key=torch.randn(b, hk, cache_len, d, generator=g),
             past_value=torch.randn(b, hk, cache_len, d, generator=g),
             cache_position=torch.arange(3, 3 + s))
    spec = BlockSpec(num_heads=h, num_kv_heads=hk, head_dim=d, rope="half", rotary_dim=d,
                     core="sdpa", scale=d ** -0.5, cache="index_put")
    return spec, t


def test_write_cache_op_writes_the_buffers():
    """The writing op: the buffers hold the new k/v at the positions afterwards, and its output
    is the functional op's."""
    spec, t = _op_inputs()
    want, _ = op_module.call_attention_block(spec, **t)
    k0, v0 = t["past_key"].clone(), t["past_value"].clone()
    args = [t[name] for name in op_module.TENSOR_ARGS]
    got, _ = torch.ops.inductor_gqa.attention_block_write_cache(*args, **spec.op_kwargs())
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    pos = t["cache_position"]
    keep = torch.ones(k0.shape[2], dtype=torch.bool)
    keep[pos] = False
    assert torch.equal(t["past_key"][:, :, keep], k0[:, :, keep])
    assert torch.equal(t["past_value"][:, :, keep], v0[:, :, keep])
    assert not torch.equal(t["past_key"][:, :, pos], k0[:, :, pos])


@pytest.mark.parametrize("op", ["attention_block", "attention_block_write_cache"])
def test_positions_outside_the_cache_raise(op):
    spec, t = _op_inputs(cache_len=4)
    t["cache_position"] = torch.tensor([3, 4])
    k0 = t["past_key"].clone()
    args = [t[name] for name in op_module.TENSOR_ARGS]
    with pytest.raises(IndexError, match="outside the K/V cache of 4 positions"):
        getattr(torch.ops.inductor_gqa, op)(*args, **spec.op_kwargs())
    assert torch.equal(t["past_key"], k0)


@pytest.mark.parametrize("cache", ["index_put", "index_put_prefix"])
def test_gpu_plans_refuse_static_caches(cache):
    """No kernel plan writes a static cache yet: the block is left as written on a GPU."""
    spec, t = _op_inputs()
    spec = dataclasses.replace(spec, cache=cache)
    with pytest.raises(Unsupported, match="no kernel for a K/V cache"):
        choose(spec, Problem.of(spec, t), Options(cpu_kernels=True))


@pytest.mark.parametrize("case", ["decode_mask", "prefill_causal_norm"])
def test_cached_sdpa_plan_matches_the_reference(case):
    """The DynamicCache plan (our norm/RoPE kernel in the interpreter, the library's SDPA over
    the joined cache) against the reference: one token per row with a padding mask, and three
    queries after five cached keys, causal, with QK norm."""
    from inductor_gqa.kernels.launch import direct_launches
    from inductor_gqa.lower.emit import emit

    s = 1 if case == "decode_mask" else 3
    spec, t = _op_inputs(s=s)
    g = torch.Generator().manual_seed(1)
    past = 5
    t["past_key"] = torch.randn(2, 2, past, 16, generator=g)
    t["past_value"] = torch.randn(2, 2, past, 16, generator=g)
    t["cache_position"] = None
    t["position_ids"] = torch.tensor([[past + i for i in range(s)], [2 + i for i in range(s)]])
    if case == "decode_mask":
        spec = dataclasses.replace(spec, cache="concat", mask="bool_keep")
        keep = torch.ones(2, 1, s, past + s, dtype=torch.bool)
        keep[1, :, :, :3] = False                   # row 1 left-padded by 3
        t["attn_mask"] = keep
    else:
        spec = dataclasses.replace(spec, cache="concat", causal=True, norm="fp32_weight")
        t["q_norm_weight"] = 1.0 + 0.3 * torch.randn(16, generator=g)
        t["k_norm_weight"] = 1.0 + 0.3 * torch.randn(16, generator=g)
    plan = choose(spec, Problem.of(spec, t), Options(cpu_kernels=True))
    assert plan.name == "cached_sdpa"
    with direct_launches():
        out, probs = emit(plan, spec, dict(t))
    with torch.no_grad():
        ref, _ = op_module.attention_block_reference(**t, spec=spec)
    torch.testing.assert_close(out, ref, rtol=2e-5, atol=2e-5)
    assert probs.numel() == 0


def test_generate_with_kernel_plans():
    """``Options(cpu_kernels=True)`` (the GPU path, kernels in the interpreter): the decode steps
    of a DynamicCache take the cached plan, tokens equal to eager's."""
    model = _build("llama", "sdpa")
    ids, mask = inputs(padded=True)
    want = _generate(model, ids, mask, "dynamic")
    got, _ = _compiled_generate(model, ids, mask, "dynamic",
                                light_backend(Options(cpu_kernels=True)))
    c = counters["inductor_gqa"]
    assert c["blocks_seen"] == c["blocks_fused"] > 0, dict(c)
    assert c["plan: cached_sdpa"] == 2 * model.config.num_hidden_layers, dict(c)
    assert got.tolist() == want.tolist()
