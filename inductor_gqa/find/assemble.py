"""Assemble a whole attention block around one anchor (a softmax or an SDPA call).

The pieces come from ``patterns/``; this module walks from the core outward (repeat_kv, RoPE,
RMSNorm, head transpose, projections, output end), checks that the pieces agree with each other,
and produces a BlockMatch: the BlockSpec plus the graph nodes that feed the fused op.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch
from torch.fx import Node

from inductor_gqa.patterns.attention_core import Core, match_core
from inductor_gqa.patterns.kv_cache import Cache, match_cache
from inductor_gqa.patterns.projection import (OutputEnd, Projection, match_output,
                                               match_projection, projection_of)
from inductor_gqa.patterns.repeat_kv import strip_repeat_kv
from inductor_gqa.patterns.rms_norm import Norm, match_rms_norm
from inductor_gqa.patterns.rope import cos_sin_operand, freq_source, match_rope

from ..options import Options
from ..plan.spec import BlockSpec
from ..patterns.graph import (VIEWS, Reject, arg, concrete_int, dtype, is_op, is_permute,
                              same, shape, through_clones)

aten = torch.ops.aten


@dataclasses.dataclass
class BlockMatch:
    spec: BlockSpec
    tensors: dict                      # op tensor argument name -> Node | (Node, start, end) | None
    end: OutputEnd
    core: Core
    heads_shape: tuple                 # (B, H, S, D) of the attention output
    cache: Optional[tuple] = None      # (Cache of k, Cache of v) with a K/V cache


def _strip_norm_and_transpose(n: Node, what: str) -> tuple[Node, Optional[Norm]]:
    """[B, H, S, D] after RoPE -> ([B, S, H, D] projection view, norm or None)."""
    norm = match_rms_norm(n)
    if norm is not None:
        n = norm.x
    if not is_permute(n, (0, 2, 1, 3)):
        raise Reject("head layout not recognized", f"{what} is not a [B, S, H, D] transpose")
    n = n.args[0]
    if norm is None:
        norm = match_rms_norm(n)
        if norm is not None:
            n = norm.x
    return n, norm


def _norm_over_projection(heads: Node) -> Optional[tuple[Norm, Projection]]:
    """(norm, projection) when ``heads`` views a norm taken over a whole projection (OLMo-2:
    ``q_norm(q_proj(x)).view(B, S, H, D)``)."""
    if not (is_op(heads, *VIEWS) and len(shape(heads)) == 4):
        return None
    norm = match_rms_norm(heads.args[0])
    if norm is None or len(shape(norm.x)) != 3:
        return None
    if not same(shape(norm.weight)[0], shape(norm.x)[-1]):
        raise Reject("rms_norm not recognized", "weight does not cover the projection")
    return norm, projection_of(norm.x)


def _same_node(a: Node, b: Node) -> bool:
    return cos_sin_operand(a) is cos_sin_operand(b)


def assemble(anchor: Node, options: Options) -> BlockMatch:
    core = match_core(anchor)
    if core.kind == "sdpa" and not options.fuse_sdpa:
        raise Reject("disabled by options", "fuse_sdpa=False")
    if core.kind == "explicit" and not options.fuse_explicit:
        raise Reject("disabled by options", "fuse_explicit=False")

    # clones of q, k, v (a model returning its K/V cache clones what it also attends with)
    q4 = through_clones(core.q)
    k4, rep_k = strip_repeat_kv(through_clones(core.k))
    v4, rep_v = strip_repeat_kv(through_clones(core.v))
    k4, v4 = through_clones(k4), through_clones(v4)
    if rep_k != rep_v:
        raise Reject("repeat_kv not recognized", "k and v repeated differently")
    cache = _cache(k4, v4, core)
    if cache is not None:
        k4, v4 = through_clones(cache[0].new), through_clones(cache[1].new)
    b, h, s, d = shape(core.q)
    hkv = shape(k4)[1]
    if not same(shape(v4)[1], hkv):
        raise Reject("repeat_kv not recognized", "k and v have different head counts")
    h, hkv, d = concrete_int(h), concrete_int(hkv), concrete_int(d)
    if h % hkv:
        raise Reject("repeat_kv not recognized", f"{h} query heads over {hkv} kv heads")
    if core.kind == "sdpa" and hkv != h and not arg(core.anchor, "enable_gqa", True):
        raise Reject("repeat_kv not recognized", "grouped heads without enable_gqa")
    if d not in options.head_dims:
        raise Reject("unsupported head_dim", f"head_dim {d} not in {options.head_dims}")

    # RoPE (same cos/sin for q and k)
    rope_q, rope_k = match_rope(q4), match_rope(k4)
    if (rope_q is None) != (rope_k is None):
        raise Reject("rope not recognized", "RoPE on only one of q/k")
    q_pre, k_pre = q4, k4
    if rope_q is not None:
        if not (_same_node(rope_q.cos, rope_k.cos) and _same_node(rope_q.sin, rope_k.sin)):
            raise Reject("rope not recognized", "q and k use different cos/sin")
        if (rope_q.style, rope_q.rotary_dim, rope_q.fp32) != (rope_k.style, rope_k.rotary_dim,
                                                              rope_k.fp32):
            raise Reject("rope not recognized", "q and k rotate differently")
        q_pre, k_pre = rope_q.x, rope_k.x

    q_heads, norm_q = _strip_norm_and_transpose(q_pre, "q")
    k_heads, norm_k = _strip_norm_and_transpose(k_pre, "k")
    scope = "head"
    proj_q, proj_k = _norm_over_projection(q_heads), _norm_over_projection(k_heads)
    if (proj_q or proj_k) and not (norm_q or norm_k):
        if not (proj_q and proj_k):
            raise Reject("rms_norm not recognized", "norm on only one of q/k")
        (norm_q, pq), (norm_k, pk) = proj_q, proj_k
        scope = "proj"
    else:
        pq, pk = match_projection(q_heads), match_projection(k_heads)
    if (norm_q is None) != (norm_k is None):
        raise Reject("rms_norm not recognized", "norm on only one of q/k")
    if norm_q is not None:
        if norm_q.style != norm_k.style:
            raise Reject("rms_norm not recognized", "q and k norms differ")
        if (norm_q.eps_node is None) != (norm_k.eps_node is None) or (
                norm_q.eps_node is None and norm_q.eps != norm_k.eps):
            raise Reject("rms_norm not recognized", "q and k norms use different eps")
    if not is_permute(v4, (0, 2, 1, 3)):
        raise Reject("head layout not recognized", "v is not a [B, S, H, D] transpose")
    v_heads = v4.args[0]

    pv = match_projection(v_heads)
    if not (pq.x is pk.x is pv.x):
        raise Reject("projection not recognized", "q, k, v project different inputs")
    x = pq.x

    end = match_output(core.out)
    _check_dtypes(x, pq, pk, pv, end, core, rope_q)

    spec = BlockSpec(
        num_heads=h, num_kv_heads=hkv, head_dim=d,
        norm=norm_q.style if norm_q else "none", eps=norm_q.eps if norm_q else 1e-6,
        norm_scope=scope,
        rope=rope_q.style if rope_q else "none", rotary_dim=rope_q.rotary_dim if rope_q else 0,
        rope_fp32=bool(rope_q and rope_q.fp32),
        core=core.kind, scale=float(core.scale), scale_op=core.scale_op, causal=core.causal,
        window=int(core.window), softcap=float(core.softcap),
        mask=core.mask, mask_fill=float(core.mask_fill),
        return_probs=core.probs is not None and _probs_escape(core),
        cache=cache[0].kind if cache else "none")
    cos = cos_sin_operand(rope_q.cos) if rope_q else None
    sin = cos_sin_operand(rope_q.sin) if rope_q else None
    inv_freq = position_ids = None
    if rope_q is not None and options.rope_from_positions:
        src = freq_source(cos, sin, rope_q.style, rope_q.rotary_dim)
        # position ids of one row (transformers' default) serve the whole batch
        rows = shape(src[1])[0] if src is not None else None
        if src is not None and (isinstance(rows, int) and rows == 1 or same(rows, b)):
            inv_freq, position_ids = src
            cos = sin = None
    tensors = dict(
        x=x, wq=_weight(pq), wk=_weight(pk), wv=_weight(pv),
        bq=_bias(pq), bk=_bias(pk), bv=_bias(pv),
        q_norm_weight=norm_q.weight if norm_q else None,
        k_norm_weight=norm_k.weight if norm_k else None,
        cos=cos, sin=sin, inv_freq=inv_freq, position_ids=position_ids,
        attn_mask=core.mask_node, wo=end.wo, bo=end.bo, runtime_scale=core.scale_node,
        runtime_eps=norm_q.eps_node if norm_q else None,
        runtime_k_eps=(norm_k.eps_node if norm_k and norm_k.eps_node is not norm_q.eps_node
                       else None),
        past_key=cache[0].past if cache else None, past_value=cache[1].past if cache else None,
        cache_position=cache[0].positions if cache else None)
    return BlockMatch(spec, tensors, end, core, (b, h, s, d), cache)


def _cache(k: Node, v: Node, core: Core) -> Optional[tuple[Cache, Cache]]:
    """The K/V cache the block writes k and v into (the same form, the same positions), or
    None when it attends over its own k/v only."""
    s = shape(core.q)[2]
    ck, cv = match_cache(k, s), match_cache(v, s)
    if ck is None and cv is None:
        return None
    if ck is None or cv is None or ck.kind != cv.kind or ck.positions is not cv.positions:
        raise Reject("kv cache not recognized", "k and v are cached differently")
    if core.causal or core.window:
        # SDPA's is_causal aligns queries at the start of the keys, a structured mask is square;
        # neither is the end-aligned causal of a query after its cache, nor a static buffer's
        if not same(s, shape(k)[2]):
            raise Reject("mask not recognized", "causal structure over a K/V cache longer than "
                         "the queries")
        if ck.kind == "index_put":
            raise Reject("mask not recognized", "causal structure over a static K/V cache")
    return ck, cv


def _weight(p: Projection):
    return p.weight if p.rows is None else (p.weight, *p.rows)


def _bias(p: Projection):
    if p.bias is None or p.rows is None:
        return p.bias
    return (p.bias, *p.rows)


def _probs_escape(core: Core) -> bool:
    """Whether the probabilities are used beyond the P @ V product (returned, say)."""
    def on_pv_path(u: Node) -> bool:
        while is_op(u, aten.expand.default, *VIEWS) and len(u.users) == 1:
            u = next(iter(u.users))
        return is_op(u, aten.bmm.default)
    return any(not on_pv_path(u) for u in core.probs.users)


def _check_dtypes(x, pq, pk, pv, end, core, rope) -> None:
    want = dtype(x)
    if want not in (torch.float32, torch.bfloat16, torch.float16):
        raise Reject("unsupported dtype", str(want))
    named = [("wq", pq.weight), ("wk", pk.weight), ("wv", pv.weight), ("bq", pq.bias),
             ("bk", pk.bias), ("bv", pv.bias), ("wo", end.wo), ("bo", end.bo)]
    for name, node in named:
        if node is not None and dtype(node) != want:
            raise Reject("mixed dtypes", f"{name} is {dtype(node)}, x is {want}")
    if core.mask == "additive" and dtype(core.mask_node) != want:
        raise Reject("mixed dtypes", f"additive mask is {dtype(core.mask_node)}, x is {want}")
