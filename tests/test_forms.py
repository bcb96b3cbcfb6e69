"""Hand-written look-alikes of whole model code: the block must be found inside a larger
function, whatever surrounds it."""

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

from inductor_gqa import workloads as wl


def _rms(x, w, eps=1e-6):
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return w * x.to(dtype)


def decoder_layer(x, attn_norm_w, wq, wk, wv, wo, mlp_norm_w, w_gate, w_up, w_down,
                  rope_theta: float = 10000.0, heads: int = 4, kv_heads: int = 2):
    """One Llama-style decoder layer as a single function: RMSNorm, attention with RoPE whose
    inv_freq comes from rope_theta in the graph, residual, SwiGLU MLP, residual."""
    b, s, e = x.shape
    d = wq.shape[0] // heads
    h = _rms(x, attn_norm_w)
    q = F.linear(h, wq).view(b, s, heads, d).transpose(1, 2)
    k = F.linear(h, wk).view(b, s, kv_heads, d).transpose(1, 2)
    v = F.linear(h, wv).view(b, s, kv_heads, d).transpose(1, 2)
    inv_freq = 1.0 / (rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    pos = torch.arange(s, device=x.device)[None].expand(b, s)
    freqs = (inv_freq[None, :, None].expand(b, -1, 1) @ pos[:, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().unsqueeze(1), emb.sin().unsqueeze(1)

    def rot(t):
        t1, t2 = t[..., : d // 2], t[..., d // 2:]
        return torch.cat((-t2, t1), dim=-1)

    q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    x = x + F.linear(o.transpose(1, 2).reshape(b, s, heads * d), wo)
    h = _rms(x, mlp_norm_w)
    return x + F.linear(F.silu(F.linear(h, w_gate)) * F.linear(h, w_up), w_down)


def _layer_args(seed=0):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=0.1):
        return torch.randn(*shape, generator=g) * scale

    return [r(2, 9, 64, scale=1.0), 1 + r(64), r(64, 64), r(32, 64), r(32, 64), r(64, 64),
            1 + r(64), r(128, 64), r(128, 64), r(64, 128)]


@pytest.mark.parametrize("dynamic", [False, True])
def test_decoder_layer_as_one_function(dynamic):
    args = _layer_args()
    compiled = torch.compile(decoder_layer, backend="inductor_gqa", dynamic=dynamic)
    with torch.no_grad():
        torch.testing.assert_close(compiled(*args), decoder_layer(*args), rtol=1e-5, atol=1e-5)
    assert counters["inductor_gqa"]["blocks_fused"] == 1, dict(counters["inductor_gqa"])


SMALL = dict(num_heads=4, num_kv_heads=2, head_dim=32)


@pytest.mark.parametrize("workload,variant", [(wl.W075, None), (wl.W075, "hf"), (wl.W092, None),
                                              (wl.W092, "cast_weight")])
@pytest.mark.parametrize("causal", [False, True])
def test_workloads_as_the_benchmark_writes_them(workload, variant, causal):
    """W075 and W092 statement by statement (and their older forms), every case kind: W075
    causal and not, W092 with runtime-free constants."""
    if workload.name == "W092" and not causal:
        pytest.skip("W092 is always causal")
    fn = wl.workload_fn(workload, variant=variant, **SMALL)
    inputs = wl.make_inputs(workload, 13, 2, hidden=128, seed=1, **SMALL)
    if workload.name == "W075":
        inputs["is_causal"] = causal
    with torch.no_grad():
        out = torch.compile(fn, backend="inductor_gqa")(**inputs)
        ref = fn(**inputs)
    assert counters["inductor_gqa"]["blocks_fused"] == 1, dict(counters["inductor_gqa"])
    outs = out if isinstance(out, tuple) else (out,)
    refs = ref if isinstance(ref, tuple) else (ref,)
    for o, r in zip(outs, refs):
        ok, frac = wl.check(o, r, 5e-3 if workload.dtype == torch.bfloat16 else 1e-5,
                            workload.rtol)
        assert ok, f"{frac:.4f} within tolerance"


def test_w092_norm_is_promoted_not_cast():
    """The benchmark's W092 norm multiplies a bfloat16 weight into the float32 value: the fused
    op must read it as fp32_weight (multiply in float32, then round), not cast_weight."""
    from inductor_gqa.explain import explain

    fn = wl.workload_fn(wl.W092, **SMALL)
    inputs = wl.make_inputs(wl.W092, 5, 2, hidden=128, seed=2, **SMALL)
    inputs["q_norm_weight"] = (torch.rand(32) + 0.5).bfloat16()
    result = explain(fn, **inputs)
    assert result.fused == 1
    assert result.rows[0].spec.norm == "fp32_weight"
