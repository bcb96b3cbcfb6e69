"""PyTorch reference for the fused attention block: eager numerics, same casts, same order.

This is the op's implementation wherever no kernel applies, and the oracle the kernels are tested
against. It must stay a literal transcription of the eager code the matcher accepts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..plan.spec import BlockSpec


def rms_norm(x: torch.Tensor, w: torch.Tensor, spec: BlockSpec, eps=None) -> torch.Tensor:
    """``eps``: a 0-d tensor when it is a runtime value, else spec.eps."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + (spec.eps if eps is None else eps))
    if spec.norm == "fp32_weight":
        return (h * w.to(torch.float32)).to(dtype)
    if spec.norm == "fp32_one_plus_weight":
        return (h * (1.0 + w.to(torch.float32))).to(dtype)
    if spec.norm == "cast_weight":
        return w * h.to(dtype)
    raise AssertionError(spec.norm)


def rope_cos_sin(inv_freq: torch.Tensor, position_ids: torch.Tensor, dtype: torch.dtype,
                 style: str):
    """cos/sin [B, S, rotary_dim] from inv_freq [rotary_dim/2] and position_ids [B, S]."""
    freqs = (inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
             @ position_ids[:, None, :].float()).transpose(1, 2)
    if style == "half":
        emb = torch.cat((freqs, freqs), dim=-1)
    else:
        emb = torch.repeat_interleave(freqs, 2, dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate(x: torch.Tensor, style: str) -> torch.Tensor:
    if style == "half":
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, spec: BlockSpec):
    """x [B, H, S, D]; cos/sin broadcastable to [B, S, rotary_dim]."""
    r = spec.rotary_dim
    cos = _as_bsd(cos).unsqueeze(1)
    sin = _as_bsd(sin).unsqueeze(1)
    if spec.rope_fp32 and x.dtype != torch.float32:
        xf = x[..., :r].to(torch.float32)
        rot = (xf * cos.to(torch.float32) + _rotate(xf, spec.rope) * sin.to(torch.float32)).to(
            x.dtype)
        return rot if r == x.shape[-1] else torch.cat((rot, x[..., r:]), dim=-1)
    if r == x.shape[-1]:
        return x * cos + _rotate(x, spec.rope) * sin
    x_rot, x_pass = x[..., :r], x[..., r:]
    return torch.cat((x_rot * cos + _rotate(x_rot, spec.rope) * sin, x_pass), dim=-1)


def _as_bsd(t: torch.Tensor) -> torch.Tensor:
    return t if t.dim() == 3 else t.reshape(-1, t.shape[-2], t.shape[-1])


def _repeat_kv(t: torch.Tensor, groups: int) -> torch.Tensor:
    if groups == 1:
        return t
    b, h, s, d = t.shape
    return t[:, :, None].expand(b, h, groups, s, d).reshape(b, h * groups, s, d)


def attention_core(q, k, v, attn_mask, spec: BlockSpec, runtime_scale=None):
    """q [B, H, S, D], k/v [B, Hkv, S, D] -> (o [B, H, S, D], probs or None).

    Rows that every mask empties give what the eager form gives: SDPA's own answer for the sdpa
    core (zeros in current torch); NaN for an explicit chain over -inf only; for an additive mask
    of finfo.min, a uniform row (the min added to every score leaves them all equal)."""
    k = _repeat_kv(k, spec.groups)
    v = _repeat_kv(v, spec.groups)
    structure = spec.causal or spec.window > 0
    if spec.core == "sdpa":
        mask = attn_mask
        if spec.causal and not spec.window and mask is None and q.shape[-2] == k.shape[-2]:
            return F.scaled_dot_product_attention(
                q, k, v, is_causal=True, scale=spec.scale), None
        if structure:
            # SDPA forbids is_causal with a mask: fold causal/window into the mask, exactly.
            keep = _structure_keep(q.shape[-2], k.shape[-2], spec, q.device)
            if mask is None:
                mask = keep
            elif mask.dtype == torch.bool:
                mask = mask & keep
            else:
                mask = mask.masked_fill(~keep, float("-inf"))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=spec.scale), None
    s = torch.matmul(q, k.transpose(2, 3))
    scale = spec.scale if runtime_scale is None else runtime_scale
    s = s * scale if spec.scale_op == "mul" else s / scale
    if spec.softcap:
        s = torch.tanh(s / spec.softcap) * spec.softcap
    if structure:
        s = s.masked_fill(~_structure_keep(q.shape[-2], k.shape[-2], spec, q.device),
                          float("-inf"))
    if spec.mask == "bool_fill":
        s = s.masked_fill(attn_mask, spec.mask_fill)
    elif spec.mask == "bool_keep":
        s = s.masked_fill(~attn_mask, float("-inf"))
    elif spec.mask == "additive":
        s = s + attn_mask
    p = F.softmax(s, dim=-1, dtype=torch.float32).to(v.dtype)
    return torch.matmul(p, v), p


def cached_attention_mask(spec: BlockSpec, attn_mask, sq: int, sk: int, device):
    """The sdpa core's mask as one tensor (or None): causal/window folded into the mask tensor,
    exactly as ``attention_core`` folds them (queries aligned at the end of the keys)."""
    if not (spec.causal or spec.window):
        return attn_mask
    keep = _structure_keep(sq, sk, spec, device)
    if attn_mask is None:
        return keep
    if attn_mask.dtype == torch.bool:
        return attn_mask & keep
    return attn_mask.masked_fill(~keep, float("-inf"))


def _structure_keep(sq: int, sk: int, spec: BlockSpec, device) -> torch.Tensor:
    """[sq, sk] bool, True = visible: causal (key j at most query i) and the sliding window
    (i - j < window), with query positions aligned to the end of the keys."""
    i = torch.arange(sq, device=device)[:, None] + (sk - sq)
    j = torch.arange(sk, device=device)[None, :]
    keep = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if spec.causal:
        keep = keep & (j <= i)
    if spec.window:
        keep = keep & (i - j < spec.window)
    return keep


def project_qkv(x, wq, wk, wv, bq, bk, bv, q_norm_weight, k_norm_weight, cos, sin, inv_freq,
                position_ids, spec: BlockSpec, runtime_eps=None, runtime_k_eps=None):
    """x [B, S, E] -> q [B, H, S, D], k/v [B, Hkv, S, D] after bias, norm and RoPE."""
    b, s, _ = x.shape
    d = spec.head_dim
    q, k = F.linear(x, wq, bq), F.linear(x, wk, bk)
    if spec.norm != "none" and spec.norm_scope == "proj":
        q = rms_norm(q, q_norm_weight, spec, runtime_eps)
        k = rms_norm(k, k_norm_weight, spec,
                     runtime_eps if runtime_k_eps is None else runtime_k_eps)
    q = q.view(b, s, spec.num_heads, d)
    k = k.view(b, s, spec.num_kv_heads, d)
    v = F.linear(x, wv, bv).view(b, s, spec.num_kv_heads, d)
    if spec.norm != "none" and spec.norm_scope == "head":
        q = rms_norm(q, q_norm_weight, spec, runtime_eps)
        k = rms_norm(k, k_norm_weight, spec,
                     runtime_eps if runtime_k_eps is None else runtime_k_eps)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if spec.rope != "none":
        if cos is None:
            cos, sin = rope_cos_sin(inv_freq, position_ids,
                                    torch.float32 if spec.rope_fp32 else x.dtype, spec.rope)
        q = apply_rope(q, cos, sin, spec)
        k = apply_rope(k, cos, sin, spec)
    return q, k, v


def with_cache(new: torch.Tensor, past: torch.Tensor, cache_position, spec: BlockSpec,
               write: bool = False):
    """The keys (or values) the block attends over: its ``new`` ones [B, Hkv, S, D] joined to the
    cache ``past`` as the model joins them (``spec.cache``). ``write``: a static cache's buffer
    is written in place (else a copy is)."""
    if spec.cache == "none":
        return new
    if spec.cache == "concat":
        return torch.cat((past, new), dim=2)
    if spec.cache in ("index_put", "index_put_prefix"):
        check_cache_positions(cache_position, past.shape[2])
        if write:
            keys = torch.ops.aten.index_put_(past, [None, None, cache_position], new)
        else:
            keys = torch.ops.aten.index_put(past, [None, None, cache_position], new)
        return keys[:, :, :new.shape[2]] if spec.cache == "index_put_prefix" else keys
    raise AssertionError(spec.cache)


def check_cache_positions(cache_position: torch.Tensor, length: int) -> None:
    """A clear error for a position outside the cache (never a write out of bounds)."""
    if cache_position.numel() and not bool(
            ((cache_position >= -length) & (cache_position < length)).all()):
        raise IndexError(f"inductor_gqa: cache_position {cache_position.tolist()} outside the "
                         f"K/V cache of {length} positions")


def attention_block_reference(x, wq, wk, wv, bq, bk, bv, q_norm_weight, k_norm_weight, cos, sin,
                              inv_freq, position_ids, attn_mask, wo, bo, spec: BlockSpec,
                              runtime_scale=None, runtime_eps=None, runtime_k_eps=None,
                              past_key=None, past_value=None, cache_position=None,
                              write_cache=False):
    q, k, v = project_qkv(x, wq, wk, wv, bq, bk, bv, q_norm_weight, k_norm_weight, cos, sin,
                          inv_freq, position_ids, spec, runtime_eps, runtime_k_eps)
    k = with_cache(k, past_key, cache_position, spec, write_cache)
    v = with_cache(v, past_value, cache_position, spec, write_cache)
    o, probs = attention_core(q, k, v, attn_mask, spec, runtime_scale)
    b, _, s, _ = q.shape
    o = o.transpose(1, 2).contiguous().view(b, s, spec.num_heads * spec.head_dim)
    if wo is not None:
        o = F.linear(o, wo, bo)
    return o, probs
