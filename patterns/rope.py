"""Rotary position embedding on q or k ([B, H, S, D]).

Recognized: ``x * cos + rotate(x) * sin`` with rotate-half (``cat(-x2, x1)``) or interleaved
(GPT-J: ``stack(-x[1::2], x[::2]).flatten(-2)``), on the whole head or on the first r features
(``cat(rope(x[..., :r]), x[..., r:])``). cos/sin are whatever the graph computed (inputs, or built
from inv_freq and position_ids); they must broadcast over heads.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch
from torch.fx import Node

from .graph import CASTS, VIEWS, Reject, dtype, is_op, is_permute, same, shape, val

aten = torch.ops.aten
_END = (None, 2 ** 63 - 1)


@dataclasses.dataclass
class Rope:
    x: Node            # the input [B, H, S, D]
    cos: Node
    sin: Node
    style: str         # "half" | "interleaved"
    rotary_dim: int
    fp32: bool = False  # computed in float32 from a low-precision q/k, rounded once


def _size(a):
    """A slice bound: an int, or the SymInt a size-expression node computes."""
    return val(a) if isinstance(a, Node) else a


def _slice(n: Node):
    """(src, start, end, step) for a last-dim slice, else None."""
    if not is_op(n, aten.slice.Tensor):
        return None
    src = n.args[0]
    dim = n.args[1] if len(n.args) > 1 else 0
    if dim not in (-1, len(shape(src)) - 1):
        return None
    start = _size(n.args[2]) if len(n.args) > 2 else 0
    end = _size(n.args[3]) if len(n.args) > 3 else None
    step = n.args[4] if len(n.args) > 4 else 1
    if end in _END:
        end = shape(src)[-1]
    return src, start, end, step


def _same(a: Node, b: Node) -> bool:
    """Same value: one node, or two identical slices of one tensor (no CSE has run yet)."""
    return a is b or (is_op(a, aten.slice.Tensor) and is_op(b, aten.slice.Tensor)
                      and a.args == b.args)


def _rotated(n: Node) -> Optional[tuple[Node, str]]:
    """(x, style) if n == rotate(x)."""
    if is_op(n, aten.cat.default) and len(n.args[0]) == 2:
        a, b = n.args[0]
        if is_op(a, aten.neg.default):
            s2, s1 = _slice(a.args[0]), _slice(b)
            if s1 and s2 and _same(s1[0], s2[0]) and s1[3] == 1 and s2[3] == 1:
                x, d = s1[0], shape(s1[0])[-1]
                if same(s1[1], 0) and same(s1[2], d // 2) and same(s2[1], d // 2) and same(
                        s2[2], d):
                    return x, "half"
        # interleaved: cat([unsqueeze(neg(x[1::2]), -1), unsqueeze(x[::2], -1)], -1) then view
    if is_op(n, *VIEWS):
        c = n.args[0]
        if is_op(c, aten.cat.default) and len(c.args[0]) == 2:
            ua, ub = c.args[0]
            if is_op(ua, aten.unsqueeze.default) and is_op(ub, aten.unsqueeze.default):
                a, b = ua.args[0], ub.args[0]
                if is_op(a, aten.neg.default):
                    s2, s1 = _slice(a.args[0]), _slice(b)
                    if s1 and s2 and _same(s1[0], s2[0]) and s1[3] == 2 and s2[3] == 2 and same(
                            s1[1], 0) and same(s2[1], 1):
                        return s1[0], "interleaved"
    return None


def _mul_parts(n: Node):
    if is_op(n, aten.mul.Tensor) and all(isinstance(a, Node) for a in n.args):
        return n.args
    return None


def _upcast_of(n: Node) -> Optional[Node]:
    """x if n == x.to(float32) for a lower-precision x (an upcast, exact)."""
    if is_op(n, *CASTS) and dtype(n) == torch.float32 and dtype(n.args[0]) in (
            torch.bfloat16, torch.float16):
        return n.args[0]
    return None


def match_rope(node: Node) -> Optional[Rope]:
    """Rope if ``node`` is the RoPE output; None if it is not a RoPE at all.

    Also the float32 form of a low-precision q/k (OLMo): ``(x.float() * cos + rotate(x).float()
    * sin).to(x.dtype)`` with float32 cos/sin, which rounds once instead of after each step."""
    fp32 = False
    if is_op(node, *CASTS) and dtype(node.args[0]) == torch.float32 and dtype(node) in (
            torch.bfloat16, torch.float16):
        inner = node.args[0]
        if is_op(inner, aten.add.Tensor):
            fp32, node = True, inner
        elif is_op(inner, aten.cat.default):
            raise Reject("rope not recognized", "partial rotary computed in float32")
    partial = None
    if is_op(node, aten.cat.default) and len(node.args[0]) == 2:
        rot_part, pass_part = node.args[0]
        sp = _slice(pass_part)
        if sp is not None and is_op(rot_part, aten.add.Tensor):
            partial = sp
            node = rot_part
    if not is_op(node, aten.add.Tensor):
        return None
    for first, second in (node.args, node.args[::-1]):
        m1, m2 = _mul_parts(first), _mul_parts(second)
        if not (m1 and m2):
            continue
        for x, cos in (m1, m1[::-1]):
            for rx, sin in (m2, m2[::-1]):
                if fp32:
                    x, rx = _upcast_of(x), _upcast_of(rx)
                    if x is None or rx is None:
                        continue
                rot = _rotated(rx)
                if rot is None or not _same(rot[0], x):
                    continue
                src, style = rot
                r = shape(src)[-1]
                if partial is not None:
                    psrc, pstart, pend, _ = partial
                    xs = _slice(src)
                    if not (xs and xs[0] is psrc and same(xs[1], 0) and same(xs[2], pstart)):
                        raise Reject("rope not recognized", "partial rotary slices disagree")
                    src = psrc
                want = torch.float32 if fp32 else dtype(src)
                for t in (cos, sin):
                    ts = shape(t)
                    if len(ts) == 4 and not same(ts[1], 1):
                        raise Reject("rope not recognized", "cos/sin vary over heads")
                    if dtype(t) != want:
                        raise Reject("mixed dtypes", "cos/sin dtype differs from q/k")
                return Rope(src, cos, sin, style, int(r), fp32)
    return None


def cos_sin_operand(t: Node) -> Node:
    """The cos/sin tensor without the head-broadcast unsqueeze: [B, S, r], [S, r] or [B,1,S,r]."""
    if is_op(t, aten.unsqueeze.default) and t.args[1] == 1 and len(shape(t)) == 4:
        return t.args[0]
    return t


def _through(n: Node, ops) -> Node:
    while is_op(n, *ops):
        n = n.args[0]
    return n


_LAYOUT = (aten.clone.default, aten.expand.default, aten.unsqueeze.default, aten.slice.Tensor,
           aten.alias.default, *VIEWS)


def _down_to_rank(n: Node, rank: int) -> Node:
    """Through layout ops and casts while the tensor has more than ``rank`` dims, then through
    casts (position_ids[:, None, :].float() -> position_ids; never below the tensor the model
    holds, say the arange that built its position ids)."""
    while len(shape(n)) > rank and is_op(n, *_LAYOUT, *CASTS):
        n = n.args[0]
    return _through(n, CASTS)


def freq_source(cos: Node, sin: Node, style: str, rotary_dim: int):
    """(inv_freq, position_ids) when cos/sin are computed in the graph the Hugging Face way:

        freqs = (inv_freq[None, :, None].expand(B, -1, 1) @ position_ids[:, None, :].float())
        emb = cat((freqs.transpose(1, 2),) * 2, -1); cos, sin = emb.cos(), emb.sin()  [.to(dtype)]

    so the kernels can compute the angles themselves. None for anything else (cos/sin then stay
    op inputs, which is always exact).
    """
    if style != "half":
        return None
    c, s = _through(cos, CASTS), _through(sin, CASTS)
    if not (is_op(c, aten.cos.default) and is_op(s, aten.sin.default)):
        return None
    emb_c, emb_s = c.args[0], s.args[0]
    emb = _through(emb_c, (aten.clone.default,))
    if _through(emb_s, (aten.clone.default,)) is not emb or dtype(emb) != torch.float32:
        return None
    # cat((f, f), -1) traces to unsqueeze(f, -2).expand(..., 2, r/2).reshape(..., r)
    n = _through(emb, (aten.clone.default, *VIEWS))
    if is_op(n, aten.cat.default) and len(n.args[0]) == 2 and n.args[0][0] is n.args[0][1]:
        f = n.args[0][0]
    elif is_op(n, aten.expand.default) and len(shape(n)) == 4 and same(shape(n)[2], 2):
        un = n.args[0]
        if not (is_op(un, aten.unsqueeze.default) and un.args[1] in (2, -2)):
            return None
        f = un.args[0]
    else:
        return None
    if len(shape(f)) != 3 or not same(shape(f)[2], rotary_dim // 2):
        return None
    if not is_permute(f, (0, 2, 1)):
        return None
    prod = _through(f.args[0], VIEWS)            # [B, r/2, S]
    if is_op(prod, aten.bmm.default):
        a, b = (_through(x, VIEWS) for x in prod.args)
    elif is_op(prod, aten.mul.Tensor) and all(isinstance(x, Node) for x in prod.args):
        a, b = (_through(x, VIEWS) for x in prod.args)
    else:
        return None
    # a: inv_freq broadcast to [B, r/2, 1]; b: position_ids.float() broadcast to [B, 1, S]
    if not (len(shape(a)) == 3 and same(shape(a)[2], 1) and len(shape(b)) == 3 and same(
            shape(b)[1], 1)):
        return None
    inv, pos = _down_to_rank(a, 1), _down_to_rank(b, 2)
    if len(shape(inv)) != 1 or not same(shape(inv)[0], rotary_dim // 2):
        return None
    if dtype(inv) != torch.float32 or len(shape(pos)) != 2:
        return None
    if not same(shape(pos)[0], shape(a)[0]):
        return None
    return inv, pos
