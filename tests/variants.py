"""Eager attention blocks written the many ways users write them, at reduced size.

``Variant`` flags pick how each piece is written; ``build(v)`` returns (fn, inputs). The function is
plain eager code: the tests compile it and check that the block is found (or rejected, for guards)
and that results match eager.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    dtype: torch.dtype = torch.float32
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    hidden: int = 64
    proj: str = "linear"          # linear | matmul_t | fused_split | fused_slice
    bias: bool = False
    norm: str = "none"            # none | fp32_weight | cast_weight | one_plus | fp32_weight_after_t
    rope: str = "none"            # none | half | inv_freq | interleaved | partial
    repeat: str = "expand"        # expand | interleave | none (SDPA enable_gqa) | mha
    core: str = "explicit"        # explicit | sdpa
    scale: str = "mul"            # mul | div | none | default (sdpa)
    mask: str = "none"            # none | causal_fill | causal_add | causal_sdpa | bool_in | add_in
                                  # | causal_fill_min | window | bool_keep_sdpa | causal_and_add_in
    probs: bool = False           # return the probabilities
    end: str = "o_proj"           # o_proj | o_proj_bias | merged | heads
    softcap: float = 0.0
    dropout: float = 0.0
    seq: int = 7
    batch: int = 2


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _rotate_interleaved(x):
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def build(v: Variant, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    H, HK, D, E, S, B = v.heads, v.kv_heads, v.head_dim, v.hidden, v.seq, v.batch
    if v.repeat == "mha":
        HK = H
    dt = v.dtype

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dt)

    inp = dict(x=rnd(B, S, E))
    if v.proj.startswith("fused"):
        inp["w_qkv"] = rnd((H + 2 * HK) * D, E, scale=E ** -0.5)
        if v.bias:
            inp["b_qkv"] = rnd((H + 2 * HK) * D)
    else:
        inp.update(wq=rnd(H * D, E, scale=E ** -0.5), wk=rnd(HK * D, E, scale=E ** -0.5),
                   wv=rnd(HK * D, E, scale=E ** -0.5))
        if v.bias:
            inp.update(bq=rnd(H * D), bk=rnd(HK * D), bv=rnd(HK * D))
    if v.end.startswith("o_proj"):
        inp["wo"] = rnd(E, H * D, scale=(H * D) ** -0.5)
        if v.end == "o_proj_bias":
            inp["bo"] = rnd(E)
    if v.norm != "none":
        inp["qn"] = (1 + 0.1 * torch.randn(D, generator=g)).to(dt)
        inp["kn"] = (1 + 0.1 * torch.randn(D, generator=g)).to(dt)
    rot = D // 2 if v.rope == "partial" else D
    if v.rope in ("half", "interleaved", "partial"):
        ang = torch.randn(B, S, rot, generator=g)
        inp["cos"], inp["sin"] = ang.cos().to(dt), ang.sin().to(dt)
    if v.rope == "inv_freq":
        inp["inv_freq"] = 1.0 / (10000 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
        inp["position_ids"] = torch.arange(S)[None].expand(B, S).contiguous()
    if v.mask in ("bool_in", "bool_keep_sdpa"):
        m = torch.rand(B, 1, S, S, generator=g) > 0.3
        m[..., 0] = True   # every row keeps a key
        inp["mask"] = ~m if v.mask == "bool_in" else m
    if v.mask == "add_in":
        keep = torch.ones(S, S, dtype=torch.bool).tril()
        inp["mask"] = torch.zeros(B, 1, S, S).masked_fill(~keep, torch.finfo(torch.float32).min).to(dt)
    if v.mask in ("causal_and_add_in", "causal_min_and_add_in"):
        # padding: the last two keys of batch row 1 are absent
        pad = torch.zeros(B, 1, 1, S)
        pad[1, ..., S - 2:] = torch.finfo(torch.float32).min
        inp["mask"] = pad.to(dt)

    def fn(x, wq=None, wk=None, wv=None, bq=None, bk=None, bv=None, w_qkv=None, b_qkv=None,
           wo=None, bo=None, qn=None, kn=None, cos=None, sin=None, inv_freq=None,
           position_ids=None, mask=None):
        b, s, _ = x.shape
        if v.proj == "linear":
            q, k, vv = F.linear(x, wq, bq), F.linear(x, wk, bk), F.linear(x, wv, bv)
        elif v.proj == "matmul_t":
            q, k, vv = x @ wq.t(), x @ wk.t(), x @ wv.t()
            if v.bias:
                q, k, vv = q + bq, k + bk, vv + bv
        elif v.proj == "fused_split":
            q, k, vv = F.linear(x, w_qkv, b_qkv).split([H * D, HK * D, HK * D], dim=-1)
        else:
            qkv = F.linear(x, w_qkv, b_qkv)
            q, k, vv = qkv[..., :H * D], qkv[..., H * D:(H + HK) * D], qkv[..., (H + HK) * D:]
        q, k, vv = q.view(b, s, H, D), k.view(b, s, HK, D), vv.view(b, s, HK, D)

        def rms(t, w):
            dtype = t.dtype
            tf = t.to(torch.float32)
            tf = tf * torch.rsqrt(tf.pow(2).mean(-1, keepdim=True) + 1e-6)
            if v.norm == "cast_weight":
                return w * tf.to(dtype)
            if v.norm == "one_plus":
                return (tf * (1.0 + w.float())).to(dtype)
            return (tf * w.to(torch.float32)).to(dtype)

        if v.norm in ("fp32_weight", "cast_weight", "one_plus"):
            q, k = rms(q, qn), rms(k, kn)
        q, k, vv = q.transpose(1, 2), k.transpose(1, 2), vv.transpose(1, 2)
        if v.norm == "fp32_weight_after_t":
            q, k = rms(q, qn), rms(k, kn)
        if v.rope == "inv_freq":
            f = (inv_freq[None, :, None].float().expand(b, -1, 1)
                 @ position_ids[:, None, :].float()).transpose(1, 2)
            emb = torch.cat((f, f), dim=-1)
            c, sn = emb.cos().to(x.dtype).unsqueeze(1), emb.sin().to(x.dtype).unsqueeze(1)
            q, k = q * c + _rotate_half(q) * sn, k * c + _rotate_half(k) * sn
        elif v.rope in ("half", "interleaved"):
            c, sn = cos.unsqueeze(1), sin.unsqueeze(1)
            r = _rotate_half if v.rope == "half" else _rotate_interleaved
            q, k = q * c + r(q) * sn, k * c + r(k) * sn
        elif v.rope == "partial":
            c, sn = cos.unsqueeze(1), sin.unsqueeze(1)
            q = torch.cat((q[..., :rot] * c + _rotate_half(q[..., :rot]) * sn, q[..., rot:]), -1)
            k = torch.cat((k[..., :rot] * c + _rotate_half(k[..., :rot]) * sn, k[..., rot:]), -1)
        n_rep = H // HK
        if v.repeat == "expand" and n_rep > 1:
            k = k[:, :, None].expand(b, HK, n_rep, s, D).reshape(b, H, s, D)
            vv = vv[:, :, None].expand(b, HK, n_rep, s, D).reshape(b, H, s, D)
        elif v.repeat == "interleave" and n_rep > 1:
            k, vv = k.repeat_interleave(n_rep, dim=1), vv.repeat_interleave(n_rep, dim=1)
        probs = None
        if v.core == "sdpa":
            kw = {}
            if v.scale != "default":
                kw["scale"] = 0.3
            if v.repeat == "none":
                kw["enable_gqa"] = True
            am = mask if v.mask in ("bool_keep_sdpa", "add_in") else None
            o = F.scaled_dot_product_attention(q, k, vv, attn_mask=am, dropout_p=v.dropout,
                                               is_causal=v.mask == "causal_sdpa", **kw)
        else:
            sc = torch.matmul(q, k.transpose(2, 3))
            if v.scale == "mul":
                sc = sc * D ** -0.5
            elif v.scale == "div":
                sc = sc / math.sqrt(D)
            if v.softcap:
                sc = torch.tanh(sc / v.softcap) * v.softcap
            if v.mask in ("causal_fill", "causal_fill_min", "causal_and_add_in",
                          "causal_min_and_add_in"):
                tri = torch.triu(torch.ones(s, s, dtype=torch.bool, device=x.device), diagonal=1)
                fill = (float("-inf") if v.mask in ("causal_fill", "causal_and_add_in")
                        else torch.finfo(sc.dtype).min)
                sc = sc.masked_fill(tri, fill)
            elif v.mask == "causal_add":
                sc = sc + torch.triu(torch.full((s, s), float("-inf"), dtype=sc.dtype,
                                                device=x.device), diagonal=1)
            elif v.mask == "window":
                i = torch.arange(s, device=x.device)
                band = (i[None, :] > i[:, None]) | (i[:, None] - i[None, :] >= 3)
                sc = sc.masked_fill(band, float("-inf"))
            elif v.mask == "bool_in":
                sc = sc.masked_fill(mask, float("-inf"))
            if v.mask in ("add_in", "causal_and_add_in", "causal_min_and_add_in"):
                sc = sc + mask
            probs = F.softmax(sc, dim=-1, dtype=torch.float32).to(q.dtype)
            if v.dropout:
                probs = F.dropout(probs, p=v.dropout, training=True)
            o = torch.matmul(probs, vv)
        if v.end == "heads":
            return (o, probs) if v.probs else o
        o = o.transpose(1, 2).contiguous().reshape(b, s, H * D)
        if v.end.startswith("o_proj"):
            o = F.linear(o, wo, bo)
        return (o, probs) if v.probs else o

    return fn, inp


# Variants the matcher must fuse (each differs from W075/W092 in one or two ways).
FUSED = [
    Variant("linear_bias_sdpa_causal", bias=True, core="sdpa", scale="default",
            mask="causal_sdpa"),
    Variant("sdpa_enable_gqa_bool_mask", core="sdpa", repeat="none", mask="bool_keep_sdpa"),
    Variant("sdpa_additive_mask_input", core="sdpa", mask="add_in", rope="half"),
    Variant("sdpa_repeat_interleave", core="sdpa", repeat="interleave", mask="causal_sdpa"),
    Variant("mha_explicit", repeat="mha", mask="causal_fill"),
    Variant("matmul_t_bias", proj="matmul_t", bias=True, mask="causal_add"),
    Variant("fused_qkv_split", proj="fused_split", bias=True, rope="half", mask="causal_fill"),
    Variant("fused_qkv_slice", proj="fused_slice", rope="half", mask="causal_fill"),
    Variant("norm_after_transpose", norm="fp32_weight_after_t", rope="half", mask="causal_add"),
    Variant("norm_cast_weight_bf16", dtype=torch.bfloat16, norm="cast_weight", rope="half",
            mask="causal_add"),
    Variant("norm_one_plus_weight", norm="one_plus", rope="half"),
    Variant("rope_inv_freq_probs", rope="inv_freq", scale="none", probs=True),
    Variant("rope_interleaved", rope="interleaved", mask="causal_fill"),
    Variant("rope_partial", rope="partial", mask="causal_fill"),
    Variant("scale_div", scale="div", mask="causal_fill_min"),
    Variant("bool_mask_input", mask="bool_in", probs=True),
    Variant("additive_mask_input", mask="add_in"),
    Variant("causal_and_padding", mask="causal_and_add_in", norm="fp32_weight", rope="half"),
    Variant("no_o_proj", end="merged", rope="half", mask="causal_fill"),
    Variant("o_proj_bias", end="o_proj_bias", rope="half"),
    Variant("ends_at_heads", end="heads", mask="causal_fill"),
    Variant("fp16_sdpa", dtype=torch.float16, core="sdpa", mask="causal_sdpa", norm="fp32_weight",
            rope="half"),
]

# Variants that must be left alone, with the reason reported.
REJECTED = [
    (Variant("dropout_active_sdpa", core="sdpa", dropout=0.5), "dropout is active"),
    (Variant("sliding_window", mask="window"), "in-graph mask not recognized"),
    (Variant("softcap", softcap=30.0), "softcapping"),
    (Variant("head_dim_24", head_dim=24), "unsupported head_dim"),
    # finfo.min causal fill plus a padding mask: a fully masked row stays finite in eager; the op's
    # causal is -inf, so this is not reproduced exactly
    (Variant("finite_causal_and_padding", mask="causal_min_and_add_in"), "mask not recognized"),
]
