"""The attention core: SDPA calls, or the explicit chain matmul -> scale -> mask -> softmax -> @ v.

Anchors are softmax nodes and SDPA nodes. ``match_core`` returns a Core describing q/k/v (in
[B, H or Hkv, S, D] form, before any matmul reshapes), the attention output node [B, H, S, D], and
the static facts (scale, causal, mask kind) for the BlockSpec.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch
from torch.fx import Node

from .graph import (CASTS, VIEWS, NotAttention, Reject, arg, dtype, is_op, is_permute,
                     runtime_scalar, same, scalar, shape, through_noop_expand, through_views,
                     val)

from .masks import Pattern, constant_pattern, is_constant_mask, split_keep_mask

aten, prims = torch.ops.aten, torch.ops.prims

SDPA_OPS = tuple(
    getattr(aten, name).default for name in (
        "scaled_dot_product_attention", "_scaled_dot_product_attention_math",
        "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention")
    if hasattr(aten, name))
_DROPOUT = (aten.native_dropout.default, aten.bernoulli.default, aten.bernoulli.p, aten.rand.default,
            aten.rand_like.default)


@dataclasses.dataclass
class Core:
    kind: str                 # "sdpa" | "explicit"
    q: Node                   # [B, H, S, D]
    k: Node                   # [B, H or Hkv, S, D]
    v: Node
    out: Node                 # [B, H, S, D] attention output
    scale: float = 1.0
    scale_op: str = "mul"
    causal: bool = False
    window: int = 0
    softcap: float = 0.0
    mask: str = "none"
    mask_node: Optional[Node] = None
    mask_fill: float = float("-inf")
    scale_node: Optional[Node] = None  # a runtime scale (0-d tensor); ``scale`` is then unused
    probs: Optional[Node] = None     # node holding the probabilities multiplied with v
    anchor: Optional[Node] = None


def anchors(graph) -> list[Node]:
    """Softmax and SDPA nodes, in graph order."""
    return [n for n in graph.nodes if is_op(n, *SDPA_OPS) or is_softmax(n) is not None]


def is_softmax(node: Node) -> Optional[Node]:
    """The softmax input if ``node`` is a softmax over the last dim (decomposed or not)."""
    if is_op(node, aten._softmax.default, aten._safe_softmax.default):
        x = node.args[0]
        return x if node.args[1] in (-1, len(shape(x)) - 1) else None
    if not is_op(node, aten.div.Tensor):
        return None
    e, s = node.args
    if not (is_op(e, aten.exp.default) and is_op(s, aten.sum.dim_IntList) and s.args[0] is e):
        return None
    last = len(shape(node)) - 1
    if list(s.args[1]) not in ([-1], [last]) or not (len(s.args) > 2 and s.args[2]):
        return None
    sub = e.args[0]
    if not is_op(sub, aten.sub.Tensor):
        return None
    x, mx = sub.args
    if not (is_op(mx, aten.amax.default) and mx.args[0] is x and list(mx.args[1]) in ([-1], [last])):
        return None
    return x


# ----------------------------------------------------------------------------------- matmul pieces
def _bmm_operand_4d(node: Node) -> Node:
    """Undo a matmul decomposition's flattening: [B*H, S, D] operand -> the [B, H, S, D] tensor."""
    n = through_noop_expand(node)
    if is_op(n, *VIEWS):
        src = through_noop_expand(n.args[0])
        if len(shape(src)) == 4 and len(shape(n)) == 3:
            b, h, s, d = shape(src)
            if same(shape(n)[0], b * h) and same(shape(n)[1], s) and same(shape(n)[2], d):
                return src
    if len(shape(n)) == 4:
        return n
    raise Reject("attention matmul not recognized", f"operand {n}")


def _matmul_4d(node: Node) -> Optional[tuple[Node, Node]]:
    """(a, b) for a node computing a 4-D matmul a @ b (as view(bmm(...)) or a plain matmul)."""
    n = node
    if is_op(n, *VIEWS):
        n = n.args[0]
    if is_op(n, aten.bmm.default):
        return _bmm_operand_4d(n.args[0]), _bmm_operand_4d(n.args[1])
    if is_op(n, aten.matmul.default):
        return n.args[0], n.args[1]
    return None


def _strip_cast(n: Node) -> Node:
    return n.args[0] if is_op(n, *CASTS) else n


# ----------------------------------------------------------------------------------------- explicit
def _match_explicit(softmax: Node, x: Node) -> Core:
    probs = softmax
    users = list(probs.users)
    if len(users) == 1 and is_op(users[0], *CASTS):
        probs = users[0]
    # a no-op dropout's copy that is also returned (canonicalization keeps returned tensors)
    while len(probs.users) == 1 and is_op(next(iter(probs.users)), aten.clone.default):
        probs = next(iter(probs.users))
    pv = None
    for u in probs.users:
        if is_op(u, *_DROPOUT) or any(is_op(w, *_DROPOUT) for w in u.users):
            raise Reject("dropout is active")
        cand = u
        while is_op(cand, aten.expand.default, *VIEWS) and len(cand.users) == 1:
            cand = next(iter(cand.users))
        if is_op(cand, aten.bmm.default) and _bmm_operand_4d(cand.args[0]) in (
                probs, through_noop_expand(probs)):
            pv = cand
        elif is_op(cand, aten.mul.Tensor, aten.div.Tensor) and cand is u:
            raise Reject("dropout is active", "probabilities scaled before @ v")
    if pv is None:
        if _reaches_dropout(softmax):
            raise Reject("dropout is active")
        if not _reaches_matmul(probs):
            raise NotAttention("softmax not followed by @ v", "no matmul reads the softmax")
        raise Reject("softmax not followed by @ v")
    out = next(iter(pv.users)) if len(pv.users) == 1 else pv
    if not (is_op(out, *VIEWS) and len(shape(out)) == 4):
        raise Reject("attention output not recognized")
    v = _bmm_operand_4d(pv.args[1])

    # Walk back from the softmax input: cast, masks, softcap, scale, the scores matmul.
    n = _strip_cast(x) if dtype(x) == torch.float32 else x
    scores_dtype = dtype(n)
    seq = shape(n)[-1]
    terms = []                          # mask terms as met walking back from the softmax
    softcap = 0.0
    for _ in range(8):
        term = _mask_term(n, seq)
        if term is not None:
            if softcap:
                raise Reject("softcapping", "a mask applied before the softcapping")
            terms.append(term)
            n = term.rest
        else:
            cap = _softcap(n)
            if cap is None:
                break
            if softcap:
                raise Reject("softcapping", "applied twice")
            softcap, n = cap
        n = _skip_cast_to(n, scores_dtype)

    causal, window, mask_kind, mask_node, mask_fill = _combine_masks(terms)
    scale, scale_op, scale_node = 1.0, "mul", None
    n = _skip_cast_to(n, scores_dtype)
    if is_op(n, aten.mul.Tensor, aten.div.Tensor):
        s_side, c_side = n.args[:2]
        if is_op(n, aten.mul.Tensor) and not _reaches_bmm(s_side) and _reaches_bmm(c_side):
            s_side, c_side = c_side, s_side          # scale * scores
        c = scalar(c_side)
        if c is None:
            scale_node = runtime_scalar(c_side)
            if scale_node is None:
                raise Reject("scale not recognized", "scale is not a scalar")
            c = 0.0                      # placeholder: the op reads scale_node
        if is_op(s_side, aten.tanh.default):
            raise Reject("softcapping", "not of the form tanh(s / c) * c")
        scale, scale_op = c, ("mul" if is_op(n, aten.mul.Tensor) else "div")
        n = s_side
    mm = _matmul_4d(n)
    if mm is None:
        if is_op(n, aten.tanh.default):
            raise Reject("softcapping", "not of the form tanh(s / c) * c")
        raise Reject("scores matmul not recognized", str(n.target))
    q, kt = mm
    if not is_permute(kt, (0, 1, 3, 2)):
        raise Reject("scores matmul not recognized", "k is not transposed")
    return Core("explicit", q, kt.args[0], v, out, scale=scale, scale_op=scale_op, causal=causal,
                window=window, softcap=softcap, mask=mask_kind, mask_node=mask_node,
                mask_fill=mask_fill, scale_node=scale_node, probs=probs, anchor=softmax)


@dataclasses.dataclass
class _Term:
    """One masking step of the explicit chain. kind: 'fill' (cond True -> fill), 'keep' (cond
    True -> score kept, else fill), 'additive'. pattern: what it does when it is constant and
    structured; else None and ``mask`` goes to the op as a tensor."""
    kind: str
    mask: Node
    fill: Optional[float]
    rest: Node
    pattern: Optional[Pattern]


def _fill_value(a) -> Optional[float]:
    """A constant fill value: a number or a 0-d constant tensor."""
    if isinstance(a, Node) and isinstance(val(a), torch.Tensor) and val(a).dim() > 0:
        return None
    return scalar(a)


def _mask_term(n: Node, seq) -> Optional[_Term]:
    if is_op(n, aten.where.self):
        cond, a, b = n.args
        fa, fb = _fill_value(a), _fill_value(b)
        if fa is not None and fb is None:            # masked_fill: where(cond, fill, scores)
            kind, fill, rest = "fill", fa, b
        elif fb is not None and fa is None:          # where(keep, scores, fill)
            kind, fill, rest = "keep", fb, a
        elif fa is not None and fb is not None:
            raise Reject("mask not recognized", "where between two constants")
        else:
            raise Reject("mask not recognized", "fill value is not a constant")
        return _term(kind, cond, fill, rest, seq)
    if is_op(n, aten.masked_fill.Scalar, aten.masked_fill.Tensor):
        rest, cond, fill = n.args
        fill_v = _fill_value(fill)
        if fill_v is None:
            raise Reject("mask not recognized", "fill value is not a constant")
        return _term("fill", cond, fill_v, rest, seq)
    if is_op(n, aten.add.Tensor) and all(isinstance(a, Node) for a in n.args):
        a, b = n.args
        s_side, m_side = (a, b) if _looks_like_scores(a) else (b, a)
        return _term("additive", m_side, None, s_side, seq)
    return None


def _term(kind, mask, fill, rest, seq) -> _Term:
    if kind != "additive" and dtype(mask) != torch.bool:
        raise Reject("mask not recognized", f"condition of dtype {dtype(mask)}")
    if _depends_on(mask, rest):
        raise Reject("mask not recognized", "the mask is computed from the scores")
    pattern = constant_pattern(kind, mask, fill, seq)
    return _Term(kind, mask, fill, rest, pattern)


def _depends_on(n: Node, target: Node) -> bool:
    """Whether ``target`` is among n's inputs, transitively."""
    seen, stack = set(), [n]
    while stack:
        m = stack.pop()
        if m is target:
            return True
        if m in seen:
            continue
        seen.add(m)
        stack.extend(m.all_input_nodes)
    return False


def _softcap(n: Node) -> Optional[tuple[float, Node]]:
    """(c, s) if n == tanh(s / c) * c (or s * (1/c) inside), else None."""
    if not is_op(n, aten.mul.Tensor):
        return None
    for t, c in (n.args[:2], n.args[1::-1]):
        if not is_op(t, aten.tanh.default):
            continue
        cv = scalar(c)
        if cv is None:
            raise Reject("softcapping", "the cap is a runtime value")
        inner = t.args[0]
        if is_op(inner, aten.div.Tensor) and scalar(inner.args[1]) == cv:
            return cv, inner.args[0]
        if is_op(inner, aten.mul.Tensor):
            for s_side, r in (inner.args[:2], inner.args[1::-1]):
                rv = scalar(r)
                if rv is not None and isinstance(s_side, Node) and cv > 0 and math.isclose(
                        rv, 1.0 / cv, rel_tol=1e-6):
                    return cv, s_side
        raise Reject("softcapping", "not of the form tanh(s / c) * c")
    return None


def _combine_masks(terms: list) -> tuple:
    """(causal, window, mask kind, mask node, mask fill) for the op, which applies causal and the
    window (-inf) first, then the one mask tensor. That equals the graph unless a finite value is
    involved where a row can become fully masked, or a finite fill lands on positions that the
    structured part had already set."""
    causal, window, finite = False, 0, False
    tensor = None
    for t in terms:
        if t.pattern is not None:
            causal = causal or t.pattern.causal
            if t.pattern.window:
                window = min(window, t.pattern.window) if window else t.pattern.window
            finite = finite or t.pattern.finite
            continue
        if tensor is not None:
            raise Reject("mask not recognized", "several mask tensors")
        tensor = t
    if tensor is None:
        return causal, window, "none", None, float("-inf")
    if tensor.kind == "fill":
        kind, fill = "bool_fill", tensor.fill
    elif tensor.kind == "keep":
        if tensor.fill != float("-inf"):
            raise Reject("mask not recognized", "keep-mask where() with a finite fill")
        kind, fill = "bool_keep", float("-inf")
    else:
        kind, fill = "additive", float("-inf")
    if causal or window:
        if finite:
            raise Reject("mask not recognized",
                         "causal mask with a finite value next to a mask input")
        # walked backwards: the last term met was applied first
        if kind == "bool_fill" and fill != float("-inf") and terms[-1] is tensor:
            raise Reject("mask not recognized", "finite masked_fill applied before the causal mask")
    return causal, window, kind, tensor.mask, fill


def _found_within(starts, step, pred, depth: int) -> bool:
    """Breadth-first over ``step`` (users or inputs) for at most ``depth`` levels."""
    frontier, seen = list(starts), set()
    for _ in range(depth):
        nxt = []
        for m in frontier:
            if m in seen:
                continue
            seen.add(m)
            if pred(m):
                return True
            nxt.extend(step(m))
        frontier = nxt
    return False


def _is_random(n: Node) -> bool:
    return is_op(n, *_DROPOUT)


def _reaches_dropout(n: Node, depth: int = 4) -> bool:
    """Random ops a few steps after the softmax (F.dropout with training=True, SDPA's math path);
    the keep-mask (rand > p) sits one step away from the op that applies it."""
    def applies_random(u: Node) -> bool:
        return _is_random(u) or any(
            _is_random(a) or any(_is_random(b) for b in a.all_input_nodes)
            for a in u.all_input_nodes)
    return _found_within(n.users, lambda u: u.users, applies_random, depth)


def _skip_cast_to(n: Node, dt: torch.dtype) -> Node:
    """Skip a cast whose result has the scores' dtype: eager computes that step in opmath and
    rounds to the same dtype, so the cast is part of the step, not a change of precision."""
    while is_op(n, *CASTS) and dtype(n) == dt:
        n = n.args[0]
    return n


def _looks_like_scores(n: Node) -> bool:
    """The scores side of ``scores + mask`` (not a constant mask nor a plain input)."""
    return not is_constant_mask(n) and n.op == "call_function" and not is_op(
        through_views(n), aten.expand.default) and _reaches_bmm(n)


def _reaches_bmm(n: Node, depth: int = 8) -> bool:
    """Whether a matmul is among n's inputs within a few steps (any argument, not just the first:
    ``where(causal, -inf, scores)`` keeps the scores in its last argument)."""
    return _found_within([n], lambda m: m.all_input_nodes,
                         lambda m: is_op(m, aten.bmm.default, aten.matmul.default), depth)


# --------------------------------------------------------------------------------------------- sdpa
def _match_sdpa(node: Node) -> Core:
    q, k, v = node.args[:3]
    dropout = arg(node, "dropout_p", 0.0)
    if dropout:
        raise Reject("dropout is active")
    causal = bool(arg(node, "is_causal", False))
    scale = arg(node, "scale", None)
    d = shape(q)[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scalar(scale)
    if scale is None:
        raise Reject("scale not recognized")
    mask = arg(node, "attn_mask", None)
    if mask is None:
        mask = arg(node, "attn_bias", None)
    window, mask_kind, mask_node = 0, "none", None
    if mask is not None:
        seq = shape(q)[-2]
        kept, fill = _bool_keep_of(mask)
        if kept is None and dtype(mask) == torch.bool:
            kept, fill = mask, -math.inf
        if kept is not None:
            pattern, mask_node = split_keep_mask(kept, seq)
            if math.isfinite(fill) and (pattern is None or mask_node is not None):
                # a finite fill differs from -inf where a row keeps no key; only the structure
                # alone (causal, window: every row keeps its own key) is exact as a keep-mask
                kept = None
        if kept is None:
            pattern = constant_pattern("additive", mask, None, seq)
            mask_node = None if pattern is not None else mask
        if pattern is not None:
            if causal and pattern.masks_anything:
                raise Reject("mask not recognized", "is_causal and a mask")
            causal, window = causal or pattern.causal, pattern.window
        if mask_node is not None:
            mask_kind = "bool_keep" if dtype(mask_node) == torch.bool else "additive"
    out = node
    if node.target is not aten.scaled_dot_product_attention.default:
        outs = [u for u in node.users if u.target.__name__ == "getitem" and u.args[1] == 0]
        if len(outs) != 1:
            raise Reject("sdpa output not recognized")
        out = outs[0]
    return Core("sdpa", q, k, v, out, scale=scale, causal=causal, window=window, mask=mask_kind,
                mask_node=mask_node, anchor=node)


# the masked value of a converted keep-mask: -inf, or a finite value this low, whose exp() is
# exactly 0 in float32 beside any kept score (torch's cuDNN path writes -65504)
_FINITE_FILL_MAX = -1e4


def _bool_keep_of(mask: Node) -> tuple[Optional[Node], float]:
    """(m, fill) if ``mask`` is SDPA's conversion of a bool keep-mask m to an additive one:
    where(m, 0, fill) or where(~m, fill, 0), fill -inf (the generic path) or a huge finite value
    (the cuDNN path's -65504); (None, 0.0) otherwise."""
    if not is_op(mask, aten.where):
        return None, 0.0
    cond, a, b = mask.args
    if not isinstance(cond, Node) or dtype(cond) != torch.bool:
        return None, 0.0
    a, b = _fill_value(a), _fill_value(b)
    if a == 0.0 and b is not None and b <= _FINITE_FILL_MAX:
        return cond, b
    if b == 0.0 and a is not None and a <= _FINITE_FILL_MAX and is_op(
            cond, aten.logical_not.default, aten.bitwise_not.default):
        return cond.args[0], a
    return None, 0.0


_MATMULS = (aten.bmm.default, aten.matmul.default, aten.mm.default, aten.baddbmm.default,
            aten.addmm.default)


def _reaches_matmul(probs: Node, depth: int = 6) -> bool:
    """Whether a matmul reads ``probs`` through views, expands, casts and clones: what makes a
    softmax an attention candidate (a MoE router's softmax goes to topk instead)."""
    for u in probs.users:
        if is_op(u, *_MATMULS):
            return True
        if depth and is_op(u, aten.expand.default, aten.clone.default, *VIEWS, *CASTS) and \
                _reaches_matmul(u, depth - 1):
            return True
    return False


def is_candidate(anchor: Node) -> bool:
    """Whether an anchor may be an attention block at all: an SDPA call, or a softmax whose
    probabilities a matmul reads."""
    return is_op(anchor, *SDPA_OPS) or _reaches_matmul(anchor)


def match_core(anchor: Node) -> Core:
    if is_op(anchor, *SDPA_OPS):
        return _match_sdpa(anchor)
    x = is_softmax(anchor)
    if x is None:
        raise Reject("not an attention anchor")
    return _match_explicit(anchor, x)
