"""The two reference workloads (W075, W092): eager code as users write it, inputs, tolerance, SOL.

Both come in two forms: a plain function (benchmark style) and an ``nn.Module`` in the style of
Hugging Face attention classes. The perf job, the demo and the tests all use these definitions.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn


# --------------------------------------------------------------------------------------------- W075
def w075_attention(hidden_states, position_ids, q_proj_weight, k_proj_weight, v_proj_weight,
                   o_proj_weight, inv_freq, is_causal: bool = False,
                   num_heads: int = 16, num_kv_heads: int = 4, head_dim: int = 64):
    """GQA self-attention with RoPE from inv_freq/position_ids, scaling 1.0, returns the weights.
    Written statement by statement as the benchmark describes it (/work/shared/workloads.md)."""
    bsz, seq, _ = hidden_states.shape
    q = torch.matmul(hidden_states, q_proj_weight.t())
    k = torch.matmul(hidden_states, k_proj_weight.t())
    v = torch.matmul(hidden_states, v_proj_weight.t())
    q = q.view(bsz, seq, num_heads, head_dim).transpose(1, 2)
    k = k.view(bsz, seq, num_kv_heads, head_dim).transpose(1, 2)
    v = v.view(bsz, seq, num_kv_heads, head_dim).transpose(1, 2)
    freqs = (inv_freq[None, :, None].expand(bsz, -1, 1)
             @ position_ids[:, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = emb.cos().unsqueeze(1)
    sin = emb.sin().unsqueeze(1)
    half = head_dim // 2
    q = q * cos + torch.cat((-q[..., half:], q[..., :half]), dim=-1) * sin
    k = k * cos + torch.cat((-k[..., half:], k[..., :half]), dim=-1) * sin
    groups = num_heads // num_kv_heads
    k = k[:, :, None].expand(bsz, num_kv_heads, groups, seq, head_dim).reshape(
        bsz, num_heads, seq, head_dim)
    v = v[:, :, None].expand(bsz, num_kv_heads, groups, seq, head_dim).reshape(
        bsz, num_heads, seq, head_dim)
    scaling = 1.0
    attn = torch.matmul(q, k.transpose(2, 3)) * scaling
    if is_causal:
        mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool, device=attn.device), diagonal=1)
        attn = attn.masked_fill(mask, float("-inf"))
    attn_weights = F.softmax(attn, dim=-1, dtype=torch.float32)
    out = torch.matmul(attn_weights, v)
    out = out.transpose(1, 2).contiguous().view(bsz, seq, num_heads * head_dim)
    out = torch.matmul(out, o_proj_weight.t())
    return out, attn_weights


def w075_attention_hf(hidden_states, position_ids, q_proj_weight, k_proj_weight, v_proj_weight,
                      o_proj_weight, inv_freq, is_causal: bool = False,
                      num_heads: int = 16, num_kv_heads: int = 4, head_dim: int = 64):
    """An older form of W075 (a variant): Hugging Face's helpers (``rotate_half`` by
    ``x.shape[-1] // 2``, ``inv_freq.float()``, ``[:, :, None, :, :]``)."""
    bsz, seq, _ = hidden_states.shape
    q = torch.matmul(hidden_states, q_proj_weight.t())
    k = torch.matmul(hidden_states, k_proj_weight.t())
    v = torch.matmul(hidden_states, v_proj_weight.t())
    q = q.view(bsz, seq, num_heads, head_dim).transpose(1, 2)
    k = k.view(bsz, seq, num_kv_heads, head_dim).transpose(1, 2)
    v = v.view(bsz, seq, num_kv_heads, head_dim).transpose(1, 2)
    inv_freq_expanded = inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
    freqs = (inv_freq_expanded @ position_ids[:, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = emb.cos().unsqueeze(1)
    sin = emb.sin().unsqueeze(1)
    q = q * cos + _rotate_half(q) * sin
    k = k * cos + _rotate_half(k) * sin
    groups = num_heads // num_kv_heads
    k = k[:, :, None, :, :].expand(bsz, num_kv_heads, groups, seq, head_dim).reshape(
        bsz, num_heads, seq, head_dim)
    v = v[:, :, None, :, :].expand(bsz, num_kv_heads, groups, seq, head_dim).reshape(
        bsz, num_heads, seq, head_dim)
    attn = torch.matmul(q, k.transpose(2, 3)) * 1.0
    if is_causal:
        mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool, device=attn.device), diagonal=1)
        attn = attn.masked_fill(mask, float("-inf"))
    attn_weights = F.softmax(attn, dim=-1, dtype=torch.float32)
    out = torch.matmul(attn_weights, v)
    out = out.transpose(1, 2).contiguous().view(bsz, seq, num_heads * head_dim)
    out = torch.matmul(out, o_proj_weight.t())
    return out, attn_weights


# --------------------------------------------------------------------------------------------- W092
def w092_attention(hidden_states, q_proj_weight, q_proj_bias, k_proj_weight, k_proj_bias,
                   v_proj_weight, v_proj_bias, o_proj_weight, q_norm_weight, k_norm_weight, cos,
                   sin, rms_norm_eps: float = 1e-5,
                   num_heads: int = 96, num_kv_heads: int = 8, head_dim: int = 128):
    """GQA attention with per-head QK RMSNorm, rotate-half RoPE from cos/sin, causal, bf16.
    Written statement by statement as the benchmark describes it: the norm ends in
    ``(weight * x).to(input_dtype)``, a bfloat16 weight times a float32 x by type promotion."""
    bsz, seq, _ = hidden_states.shape
    q = F.linear(hidden_states, q_proj_weight, q_proj_bias)
    k = F.linear(hidden_states, k_proj_weight, k_proj_bias)
    v = F.linear(hidden_states, v_proj_weight, v_proj_bias)
    q = q.view(bsz, seq, num_heads, head_dim)
    k = k.view(bsz, seq, num_kv_heads, head_dim)
    v = v.view(bsz, seq, num_kv_heads, head_dim)

    def rms_norm(x, weight):
        input_dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + rms_norm_eps)
        return (weight * x).to(input_dtype)

    q = rms_norm(q, q_norm_weight)
    k = rms_norm(k, k_norm_weight)
    q = q.transpose(1, 2)
    k = k.transpose(1, 2)
    v = v.transpose(1, 2)
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    half = head_dim // 2

    def rotate_half(x):
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((-x2, x1), dim=-1)

    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    groups = num_heads // num_kv_heads
    k = k[:, :, None].expand(bsz, num_kv_heads, groups, seq, head_dim).reshape(
        bsz, num_heads, seq, head_dim)
    v = v[:, :, None].expand(bsz, num_kv_heads, groups, seq, head_dim).reshape(
        bsz, num_heads, seq, head_dim)
    scores = torch.matmul(q, k.transpose(2, 3)) * head_dim ** -0.5
    mask = torch.triu(torch.full((seq, seq), float("-inf"), dtype=scores.dtype,
                                 device=scores.device), diagonal=1)
    scores = scores + mask
    probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(torch.bfloat16)
    out = torch.matmul(probs, v)
    out = out.transpose(1, 2).contiguous().reshape(bsz, seq, num_heads * head_dim)
    return F.linear(out, o_proj_weight)


def w092_attention_cast_weight(hidden_states, q_proj_weight, q_proj_bias, k_proj_weight,
                               k_proj_bias, v_proj_weight, v_proj_bias, o_proj_weight,
                               q_norm_weight, k_norm_weight, cos, sin, rms_norm_eps: float = 1e-5,
                               num_heads: int = 96, num_kv_heads: int = 8, head_dim: int = 128):
    """An older form of W092 (a variant): the norm casts its weight explicitly,
    ``(x * w.to(float32)).to(dtype)``, and RoPE slices inside ``cat``."""
    bsz, seq, _ = hidden_states.shape
    q = F.linear(hidden_states, q_proj_weight, q_proj_bias).view(bsz, seq, num_heads, head_dim)
    k = F.linear(hidden_states, k_proj_weight, k_proj_bias).view(bsz, seq, num_kv_heads, head_dim)
    v = F.linear(hidden_states, v_proj_weight, v_proj_bias).view(bsz, seq, num_kv_heads, head_dim)

    def rms(x, w):
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + rms_norm_eps)
        return (x * w.to(torch.float32)).to(dtype)

    q = rms(q, q_norm_weight).transpose(1, 2)
    k = rms(k, k_norm_weight).transpose(1, 2)
    v = v.transpose(1, 2)
    c, s_ = cos.unsqueeze(1), sin.unsqueeze(1)
    half = head_dim // 2

    def rotate_half(x):
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    q = q * c + rotate_half(q) * s_
    k = k * c + rotate_half(k) * s_
    groups = num_heads // num_kv_heads
    k = k[:, :, None].expand(bsz, num_kv_heads, groups, seq, head_dim).reshape(
        bsz, num_heads, seq, head_dim)
    v = v[:, :, None].expand(bsz, num_kv_heads, groups, seq, head_dim).reshape(
        bsz, num_heads, seq, head_dim)
    scores = torch.matmul(q, k.transpose(2, 3)) * head_dim ** -0.5
    mask = torch.triu(torch.full((seq, seq), float("-inf"), dtype=scores.dtype,
                                 device=scores.device), diagonal=1)
    scores = scores + mask
    probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    out = torch.matmul(probs, v).transpose(1, 2).contiguous().reshape(bsz, seq,
                                                                    num_heads * head_dim)
    return F.linear(out, o_proj_weight)


# ------------------------------------------------------------------- Hugging Face style module forms
def _rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def _repeat_kv(hidden, n_rep):
    b, h, s, d = hidden.shape
    if n_rep == 1:
        return hidden
    return hidden[:, :, None, :, :].expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, base: float = 10000.0):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x, position_ids):
        inv = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        freqs = (inv @ position_ids[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


class W075Attention(nn.Module):
    """Parakeet-style encoder attention, written the Hugging Face way (returns the weights)."""

    def __init__(self, hidden=1024, num_heads=16, num_kv_heads=4, head_dim=64, is_causal=False):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.groups = num_heads // num_kv_heads
        self.is_causal = is_causal
        self.scaling = 1.0
        self.q_proj = nn.Linear(hidden, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden, bias=False)
        self.rotary_emb = RotaryEmbedding(head_dim)

    def forward(self, hidden_states, position_ids):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        q = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        k = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        v = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        cos, sin = self.rotary_emb(hidden_states, position_ids)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        k = _repeat_kv(k, self.groups)
        v = _repeat_kv(v, self.groups)
        attn_weights = torch.matmul(q, k.transpose(2, 3)) * self.scaling
        if self.is_causal:
            s = q.shape[-2]
            causal = torch.triu(torch.ones(s, s, dtype=torch.bool, device=q.device), diagonal=1)
            attn_weights = attn_weights.masked_fill(causal, float("-inf"))
        attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(q.dtype)
        attn_output = torch.matmul(attn_weights, v).transpose(1, 2).contiguous()
        attn_output = attn_output.reshape(*input_shape, -1)
        return self.o_proj(attn_output), attn_weights


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        input_dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * x).to(input_dtype)       # as the benchmark: promotion, then cast


class W092Attention(nn.Module):
    """GLM-4.5-Air style attention (QK norm before the transpose), written the Hugging Face way."""

    def __init__(self, hidden=4096, num_heads=96, num_kv_heads=8, head_dim=128, eps=1e-5):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.groups = num_heads // num_kv_heads
        self.scaling = head_dim ** -0.5
        self.q_proj = nn.Linear(hidden, num_heads * head_dim, bias=True)
        self.k_proj = nn.Linear(hidden, num_kv_heads * head_dim, bias=True)
        self.v_proj = nn.Linear(hidden, num_kv_heads * head_dim, bias=True)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden, bias=False)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)

    def forward(self, hidden_states, cos, sin):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        q = self.q_norm(self.q_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
        k = self.k_norm(self.k_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
        v = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        k = _repeat_kv(k, self.groups)
        v = _repeat_kv(v, self.groups)
        s = q.shape[-2]
        scores = torch.matmul(q, k.transpose(2, 3)) * self.scaling
        mask = torch.triu(torch.full((s, s), float("-inf"), dtype=scores.dtype,
                                     device=scores.device), diagonal=1)
        probs = F.softmax(scores + mask, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(probs, v).transpose(1, 2).contiguous().reshape(*input_shape, -1)
        return self.o_proj(out)


# ------------------------------------------------------------------------------ cases and inputs
@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    dtype: torch.dtype
    cases: tuple[tuple[int, int], ...]          # (S, B)
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    fn: Callable
    rtol: float

    def macs(self, seq: int, batch: int) -> int:
        h, d = self.num_heads, self.head_dim
        proj = batch * seq * self.hidden * (h + 2 * self.num_kv_heads) * d
        attn = 2 * batch * h * seq * seq * d
        out = batch * seq * h * d * self.hidden
        return proj + attn + out


W075 = Workload("W075", torch.float32,
                ((128, 4), (131, 1), (211, 2), (256, 1), (256, 4), (256, 8), (373, 8), (449, 16),
                 (512, 1), (512, 4), (512, 8), (512, 16), (541, 1), (1024, 2), (2048, 1),
                 (4096, 1)),
                1024, 16, 4, 64, w075_attention, 1e-5)
W092 = Workload("W092", torch.bfloat16,
                ((128, 1), (128, 4), (128, 16), (256, 2), (256, 16), (256, 32), (293, 4), (373, 8),
                 (512, 1), (512, 2), (512, 4), (512, 8), (1024, 1), (1024, 4), (2048, 1),
                 (2048, 2)),
                4096, 96, 8, 128, w092_attention, 0.05)
WORKLOADS = {"W075": W075, "W092": W092}
# Older ways of writing the same blocks, kept as variants (same inputs, same results).
VARIANTS = {"W075": {"hf": w075_attention_hf}, "W092": {"cast_weight": w092_attention_cast_weight}}

# atol for W075's loose cases; every other W075 case uses the tight bound.
_W075_LOOSE = {(449, 16), (1024, 2), (373, 8), (512, 4), (512, 8), (512, 16)}


def atol(workload: Workload, seq: int, batch: int) -> float:
    """Absolute tolerance per case (lower end of the published ranges, so we never pass loosely)."""
    if workload.name == "W075":
        return 0.06 if (seq, batch) in _W075_LOOSE else 0.0022
    return 0.0025


def make_inputs(workload: Workload, seq: int, batch: int, device="cpu", seed=None,
                hidden=None, num_heads=None, num_kv_heads=None, head_dim=None) -> dict:
    """Fresh random inputs for the function form, as the workload describes them, drawn on
    ``device`` (from a generator seeded with ``seed``, or the default one).

    The size overrides give reduced-size versions of the same block (for CPU runs and tests); bind
    the matching head counts into the function with ``workload_fn`` (hyperparameters stay Python
    constants, as in real model code, so dynamic shapes only make B and S symbolic).
    """
    e = hidden or workload.hidden
    h = num_heads or workload.num_heads
    hk = num_kv_heads or workload.num_kv_heads
    d = head_dim or workload.head_dim
    dev = device
    g = None
    if seed is not None:
        g = torch.Generator(device=dev)
        g.manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=dev)

    if workload.name == "W075":
        return dict(
            hidden_states=randn(batch, seq, e),
            position_ids=torch.arange(seq, device=dev)[None].expand(batch, seq).contiguous(),
            q_proj_weight=randn(h * d, e) * 0.02, k_proj_weight=randn(hk * d, e) * 0.02,
            v_proj_weight=randn(hk * d, e) * 0.02, o_proj_weight=randn(e, h * d) * 0.02,
            inv_freq=(1.0 / 10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d)).to(dev))
    bf = torch.bfloat16

    def angles():
        return randn(batch, seq, d).clamp(-math.pi, math.pi)

    return dict(
        hidden_states=randn(batch, seq, e).to(bf),
        q_proj_weight=(randn(h * d, e) / math.sqrt(e)).to(bf), q_proj_bias=randn(h * d).to(bf),
        k_proj_weight=(randn(hk * d, e) / math.sqrt(e)).to(bf), k_proj_bias=randn(hk * d).to(bf),
        v_proj_weight=(randn(hk * d, e) / math.sqrt(e)).to(bf), v_proj_bias=randn(hk * d).to(bf),
        o_proj_weight=(randn(e, h * d) / math.sqrt(h * d)).to(bf),
        q_norm_weight=torch.ones(d, dtype=bf, device=dev),
        k_norm_weight=torch.ones(d, dtype=bf, device=dev),
        cos=angles().cos().to(bf), sin=angles().sin().to(bf))


def workload_fn(workload: Workload, num_heads=None, num_kv_heads=None, head_dim=None,
                variant=None):
    """The workload's function (or one of its ``VARIANTS``) with (possibly reduced) head counts
    bound as constants."""
    h = num_heads or workload.num_heads
    hk = num_kv_heads or workload.num_kv_heads
    d = head_dim or workload.head_dim
    base = workload.fn if variant is None else VARIANTS[workload.name][variant]

    def fn(*args, **kwargs):   # a closure, so Dynamo treats the head counts as constants
        return base(*args, num_heads=h, num_kv_heads=hk, head_dim=d, **kwargs)

    fn.__name__ = base.__name__
    return fn


def check(out: torch.Tensor, ref: torch.Tensor, atol_: float, rtol: float,
          min_pass: float = 0.99) -> tuple[bool, float]:
    """The workloads' rule: |out-ref| <= atol + rtol*|ref| for >= 99% of elements, no NaN/Inf."""
    out, ref = out.float(), ref.float()
    if out.shape != ref.shape or not torch.isfinite(out).all():
        return False, 0.0
    ok = (out - ref).abs() <= atol_ + rtol * ref.abs()
    frac = ok.float().mean().item()
    return frac >= min_pass, frac


def sol_seconds(workload: Workload, seq: int, batch: int, mac_rate=989.4e12 / 2,
                bandwidth=4.8e12) -> float:
    """Speed of light: max(MACs at the dense bf16 rate, bytes of inputs+weights+final outputs)."""
    e, h, hk, d = workload.hidden, workload.num_heads, workload.num_kv_heads, workload.head_dim
    el = 4 if workload.dtype == torch.float32 else 2
    weights = (h * d * e + 2 * hk * d * e + e * h * d) * el
    x_bytes = batch * seq * e * el
    out_bytes = batch * seq * e * el
    if workload.name == "W075":
        extra = 32 * 4 + batch * seq * 8                      # inv_freq + position_ids
    else:
        extra = (h * d + 2 * hk * d + 2 * d) * el + 2 * batch * seq * d * el   # biases, norms, cos/sin
    nbytes = weights + x_bytes + out_bytes + extra
    return max(workload.macs(seq, batch) / mac_rate, nbytes / bandwidth)
