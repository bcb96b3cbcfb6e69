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
    proj: str = "linear"          # linear | matmul_t | fused_split | fused_slice | fused_chunk
                                  # | fused_unbind (GPT-J) | fused_heads (GPT-NeoX, MHA only)
    bias: bool = False
    norm: str = "none"            # none | fp32_weight | cast_weight | one_plus | fp32_weight_after_t
                                  # | promoted (bf16 w * f32 x) | recip_sqrt | sum_div
                                  # | over_proj (OLMo-2) | no_upcast
    rope: str = "none"            # none | half | inv_freq | interleaved | partial
                                  # | half_fp32 (OLMo: float32 cos/sin, q/k promoted, cast back)
    repeat: str = "expand"        # expand | interleave | none (SDPA enable_gqa) | mha
    core: str = "explicit"        # explicit | sdpa
    scale: str = "mul"            # mul | div | none | default (sdpa)
    mask: str = "none"            # none | causal_fill | causal_add | causal_sdpa | bool_in | add_in
                                  # | causal_fill_min | window | bool_keep_sdpa | causal_and_add_in
                                  # | keep_where | pad_rows_inf | pad_rows_min | pad_rows_sdpa
                                  # | cudnn_causal | cudnn_pad
                                  # | window_and_pad | chunked (constant, not causal/window)
    probs: bool = False           # return the probabilities
    end: str = "o_proj"           # o_proj | o_proj_bias | merged | heads
    softcap: float = 0.0
    softcap_form: str = "div"     # div | recip_mul | mismatched | after_mask
    dropout: float = 0.0
    dropout_training: bool = True
    scale_first: bool = False     # scale * scores instead of scores * scale
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
        nq, nk = (H * D, HK * D) if v.norm == "over_proj" else (D, D)
        inp["qn"] = (1 + 0.1 * torch.randn(nq, generator=g)).to(dt)
        inp["kn"] = (1 + 0.1 * torch.randn(nk, generator=g)).to(dt)
    rot = D // 2 if v.rope == "partial" else D
    if v.rope in ("half", "interleaved", "partial", "half_fp32"):
        ang = torch.randn(B, S, rot, generator=g)
        cs_dt = torch.float32 if v.rope == "half_fp32" else dt
        inp["cos"], inp["sin"] = ang.cos().to(cs_dt), ang.sin().to(cs_dt)
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
    if v.mask in ("pad_rows_inf", "pad_rows_sdpa", "keep_where", "window_and_pad", "cudnn_pad"):
        # left padding: batch row 1 starts after 2 pad tokens; with causal, its first two query
        # rows see no key at all (fully masked)
        keep = torch.ones(B, 1, 1, S, dtype=torch.bool)
        keep[1, ..., :2] = False
        inp["mask"] = keep if v.mask != "pad_rows_inf" else ~keep
    if v.mask == "pad_rows_min":
        keep = torch.ones(S, S, dtype=torch.bool).tril()[None, None] & torch.ones(
            B, 1, 1, S, dtype=torch.bool)
        keep[1, ..., :2] = False
        inp["mask"] = torch.zeros(B, 1, S, S).masked_fill(
            ~keep, torch.finfo(torch.float32).min).to(dt)
    if v.mask in ("causal_and_add_in", "causal_min_and_add_in"):
        # padding: the last two keys of batch row 1 are absent
        pad = torch.zeros(B, 1, 1, S)
        pad[1, ..., S - 2:] = torch.finfo(torch.float32).min
        inp["mask"] = pad.to(dt)

    def rms(t, w):
        dtype = t.dtype
        if v.norm == "no_upcast":           # the norm in bf16: not what the op computes
            return w * (t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6))
        tf = t.to(torch.float32)
        if v.norm == "recip_sqrt":
            tf = tf * (1 / torch.sqrt(tf.pow(2).mean(-1, keepdim=True) + 1e-6))
        elif v.norm == "sum_div":
            tf = tf * torch.rsqrt((tf * tf).sum(-1, keepdim=True) / t.shape[-1] + 1e-6)
        else:
            tf = tf * torch.rsqrt(tf.pow(2).mean(-1, keepdim=True) + 1e-6)
        if v.norm == "cast_weight":
            return w * tf.to(dtype)
        if v.norm == "one_plus":
            return (tf * (1.0 + w.float())).to(dtype)
        if v.norm in ("promoted", "over_proj"):
            return (w * tf).to(dtype)       # type promotion: w of x's dtype times float32
        return (tf * w.to(torch.float32)).to(dtype)

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
        elif v.proj == "fused_chunk":
            q, k, vv = F.linear(x, w_qkv, b_qkv).chunk(3, dim=-1)
        elif v.proj == "fused_unbind":
            q, k, vv = F.linear(x, w_qkv, b_qkv).view(b, s, 3, H, D).unbind(2)
        elif v.proj == "fused_heads":
            qkv = F.linear(x, w_qkv, b_qkv).view(b, s, H, 3 * D)
            q, k, vv = qkv.chunk(3, dim=-1)
        else:
            qkv = F.linear(x, w_qkv, b_qkv)
            q, k, vv = qkv[..., :H * D], qkv[..., H * D:(H + HK) * D], qkv[..., (H + HK) * D:]
        if v.norm == "over_proj":
            q, k = rms(q, qn), rms(k, kn)
        q, k, vv = q.reshape(b, s, H, D), k.reshape(b, s, HK, D), vv.reshape(b, s, HK, D)

        if v.norm in ("fp32_weight", "cast_weight", "one_plus", "promoted", "recip_sqrt",
                      "sum_div", "no_upcast"):
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
        elif v.rope == "half_fp32":
            c, sn = cos.unsqueeze(1), sin.unsqueeze(1)
            q = ((q * c) + (_rotate_half(q) * sn)).to(q.dtype)
            k = ((k * c) + (_rotate_half(k) * sn)).to(k.dtype)
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
            if v.mask in ("pad_rows_sdpa", "cudnn_causal", "cudnn_pad"):
                # transformers' form: causal AND padding, as bool
                i = torch.arange(s, device=x.device)
                am = (i[None, :] <= i[:, None])[None, None]
                am = am if v.mask == "cudnn_causal" else am & mask
                if v.mask != "pad_rows_sdpa":  # as torch's cuDNN path converts a keep-mask
                    am = torch.where(~am, -65504.0, torch.zeros((), dtype=q.dtype))
            o = F.scaled_dot_product_attention(q, k, vv, attn_mask=am, dropout_p=v.dropout,
                                               is_causal=v.mask == "causal_sdpa", **kw)
        else:
            sc = torch.matmul(q, k.transpose(2, 3))
            if v.scale == "mul":
                sc = D ** -0.5 * sc if v.scale_first else sc * D ** -0.5
            elif v.scale == "div":
                sc = sc / math.sqrt(D)
            if v.softcap and v.softcap_form == "after_mask":
                sc = sc.masked_fill(torch.triu(torch.ones(s, s, dtype=torch.bool), 1),
                                    float("-inf"))
                sc = torch.tanh(sc / v.softcap) * v.softcap
            elif v.softcap:
                inner = sc * (1.0 / v.softcap) if v.softcap_form == "recip_mul" else sc / v.softcap
                cap = 2 * v.softcap if v.softcap_form == "mismatched" else v.softcap
                sc = torch.tanh(inner) * cap
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
            elif v.mask == "chunked":         # causal within chunks of 3: a constant mask that
                i = torch.arange(s, device=x.device)   # is neither causal nor a window
                sc = sc.masked_fill((i[None, :] > i[:, None]) | (i[None, :] // 3 != i[:, None] // 3),
                                    float("-inf"))
            elif v.mask == "keep_where":      # where(keep, scores, -inf)
                sc = torch.where(mask, sc, float("-inf"))
            elif v.mask == "window_and_pad":  # a window built in the graph, then padding
                i = torch.arange(s, device=x.device)
                band = (i[None, :] > i[:, None]) | (i[:, None] - i[None, :] >= 3)
                sc = sc.masked_fill(band, float("-inf")).masked_fill(~mask, float("-inf"))
            elif v.mask == "pad_rows_inf":    # causal and padding with -inf: NaN rows in eager
                tri = torch.triu(torch.ones(s, s, dtype=torch.bool, device=x.device), 1)
                sc = sc.masked_fill(tri, float("-inf")).masked_fill(mask, float("-inf"))
            if v.mask in ("add_in", "causal_and_add_in", "causal_min_and_add_in", "pad_rows_min"):
                sc = sc + mask
            probs = F.softmax(sc, dim=-1, dtype=torch.float32).to(q.dtype)
            if v.dropout or not v.dropout_training:
                probs = F.dropout(probs, p=v.dropout, training=v.dropout_training)
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
    # canonical forms: each is written another way than the op computes it, same values
    Variant("fused_qkv_chunk", proj="fused_chunk", repeat="mha", rope="half", mask="causal_fill"),
    Variant("gptj_unbind", proj="fused_unbind", bias=True, repeat="mha", rope="interleaved",
            mask="causal_fill"),
    Variant("neox_heads_layout", proj="fused_heads", bias=True, repeat="mha", rope="partial",
            mask="causal_add"),
    Variant("norm_promoted_bf16", dtype=torch.bfloat16, norm="promoted", rope="half",
            mask="causal_add"),
    Variant("rope_fp32_bf16", dtype=torch.bfloat16, norm="over_proj", rope="half_fp32",
            mask="causal_fill"),
    Variant("norm_recip_sqrt", norm="recip_sqrt", rope="half", mask="causal_fill"),
    Variant("norm_sum_div", norm="sum_div", rope="half", mask="causal_fill"),
    Variant("norm_over_projection", norm="over_proj", rope="half", mask="causal_fill"),
    Variant("scale_first", scale_first=True, mask="causal_fill"),
    Variant("dropout_eval", dropout=0.5, dropout_training=False, mask="causal_add"),
    Variant("dropout_p0", dropout=0.0, mask="causal_add"),
    Variant("keep_where_mask", mask="keep_where", probs=True),
    # sliding windows and softcapping are op features
    Variant("sliding_window", mask="window"),
    Variant("chunked_mask_as_tensor", mask="chunked", rope="half"),
    Variant("window_and_padding", mask="window_and_pad", rope="half"),
    Variant("softcap", softcap=30.0, mask="causal_fill"),
    Variant("softcap_recip", softcap=30.0, softcap_form="recip_mul", mask="add_in"),
    # fully masked rows (left padding): NaN, uniform, zeros, exactly as eager
    Variant("padded_rows_inf", mask="pad_rows_inf", probs=True),
    Variant("padded_rows_min", mask="pad_rows_min", probs=True),
    Variant("padded_rows_sdpa", core="sdpa", scale="default", mask="pad_rows_sdpa"),
    Variant("cudnn_converted_causal", core="sdpa", mask="cudnn_causal"),
    Variant("cudnn_converted_padding", core="sdpa", mask="cudnn_pad"),
]

# Variants that must be left alone, with the reason reported.
REJECTED = [
    (Variant("dropout_active_sdpa", core="sdpa", dropout=0.5), "dropout is active"),
    (Variant("softcap_mismatched", softcap=30.0, softcap_form="mismatched"), "softcapping"),
    (Variant("softcap_after_mask", softcap=30.0, softcap_form="after_mask"), "softcapping"),
    (Variant("head_dim_24", head_dim=24), "unsupported head_dim"),
    # finfo.min causal fill plus a padding mask: a fully masked row stays finite in eager; the op's
    # causal is -inf, so this is not reproduced exactly
    (Variant("finite_causal_and_padding", mask="causal_min_and_add_in"), "mask not recognized"),
]
