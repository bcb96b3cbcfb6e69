"""Projections: ``F.linear(x, W, b)`` or ``x @ W.t()`` (+ b), from separate weights or one fused
QKV weight split afterwards, viewed to heads [B, S, H, D]; and the output end (merge heads, o_proj).
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Optional

import torch
from torch.fx import Node

from .graph import VIEWS, Reject, is_op, is_permute, same, shape, through_views

aten = torch.ops.aten


@dataclasses.dataclass
class Projection:
    x: Node                       # [B, S, E]
    weight: Node                  # [N, E]
    bias: Optional[Node]
    # Rows of a fused weight: (start, end) for rows start..end-1, or (start, end, groups,
    # stride) for rows g * stride + start .. g * stride + end - 1 of every group g (a QKV weight
    # laid out head by head, GPT-NeoX).
    rows: Optional[tuple] = None


def _linear(n: Node) -> Optional[tuple[Node, Node, Optional[Node]]]:
    """(x, W, b) if n ([B, S, N]) == x @ W^T (+ b)."""
    bias = None
    if is_op(n, aten.add.Tensor) and isinstance(n.args[1], Node) and len(shape(n.args[1])) == 1:
        n, bias = n.args
    if not is_op(n, *VIEWS):
        return None
    mm = n.args[0]
    if is_op(mm, aten.addmm.default):
        if bias is not None:
            return None
        bias, a, wt = mm.args
        if mm.kwargs.get("beta", 1) != 1 or mm.kwargs.get("alpha", 1) != 1:
            return None
    elif is_op(mm, aten.mm.default):
        a, wt = mm.args
    else:
        return None
    if not is_permute(wt, (1, 0)):
        return None
    x = through_views(a)
    if len(shape(x)) != 3:
        return None
    return x, wt.args[0], bias


def _int(x) -> Optional[int]:
    return x if isinstance(x, int) else None


def projection_of(src: Node) -> Projection:
    """``src`` is [B, S, N]: a projection output, or contiguous rows of a fused one."""
    rows = None
    if src.op == "call_function" and src.target is operator.getitem and is_op(
            src.args[0], aten.split_with_sizes.default, aten.split.Tensor):
        split = src.args[0]
        dim = split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0)
        if dim not in (-1, 2):
            raise Reject("projection not recognized", "split is not over the features")
        sizes = split.args[1]
        if isinstance(sizes, int):
            sizes = [sizes] * len(split.users)
        start = sum(sizes[: src.args[1]])
        rows = (start, start + sizes[src.args[1]])
        src = split.args[0]
    elif is_op(src, aten.slice.Tensor) and src.args[1] in (-1, 2):
        n = shape(src.args[0])[-1]
        start = _int(src.args[2]) if len(src.args) > 2 else 0
        end = _int(src.args[3]) if len(src.args) > 3 else n
        if start is None or end is None:
            raise Reject("projection not recognized", "fused projection split at runtime sizes")
        rows = (start, min(end, n))
        src = src.args[0]
    lin = _linear(src)
    if lin is None:
        raise Reject("projection not recognized", str(src.target))
    x, w, b = lin
    return Projection(x, w, b, rows)


def match_projection(heads: Node) -> Projection:
    """``heads`` is [B, S, H, D] taken from a projection output: a view of it (or of a slice of a
    fused one), one part of a fused [B, S, n, H, D] view (``.unbind(2)``), or the same last-dim
    slice of every head of a [B, S, H, n*D] view (a QKV weight laid out head by head)."""
    if is_op(heads, aten.select.int) and len(shape(heads.args[0])) == 5 and heads.args[1] in (
            2, -3):
        v5 = heads.args[0]
        if not is_op(v5, *VIEWS):
            raise Reject("projection not recognized", "parts of a fused projection")
        _, _, parts, h, d = shape(v5)
        i = heads.args[2] % parts
        p = projection_of(v5.args[0])
        return _sub_rows(p, (i * h * d, (i + 1) * h * d))
    if is_op(heads, aten.slice.Tensor) and heads.args[1] in (-1, 3) and len(shape(heads)) == 4:
        v4 = heads.args[0]
        if not (is_op(v4, *VIEWS) and len(shape(v4)) == 4):
            raise Reject("projection not recognized", "slice of the head features")
        _, _, h, width = shape(v4)
        start = _int(heads.args[2]) if len(heads.args) > 2 else 0
        end = _int(heads.args[3]) if len(heads.args) > 3 else width
        if start is None or end is None or not isinstance(width, int):
            raise Reject("projection not recognized", "head slices of runtime sizes")
        p = projection_of(v4.args[0])
        if p.rows is not None:
            raise Reject("projection not recognized", "head slices of a sliced projection")
        return Projection(p.x, p.weight, p.bias, (start, min(end, width), h, width))
    if not is_op(heads, *VIEWS) or len(shape(heads)) != 4:
        raise Reject("projection not recognized", f"{heads.target} instead of a view to heads")
    return projection_of(heads.args[0])


def _sub_rows(p: Projection, rows: tuple) -> Projection:
    if p.rows is not None:
        start = p.rows[0]
        rows = (start + rows[0], start + rows[1])
    return Projection(p.x, p.weight, p.bias, rows)


@dataclasses.dataclass
class OutputEnd:
    last: Node                    # node whose value the op's output replaces
    merged: bool                  # True: op output is [B, S, H*D] / o_proj result
    wo: Optional[Node] = None
    bo: Optional[Node] = None


def match_output(attn_out: Node) -> OutputEnd:
    """From the attention output [B, H, S, D]: transpose, merge heads, optional o_proj."""
    users = list(attn_out.users)
    if len(users) != 1 or not is_permute(users[0], (0, 2, 1, 3)):
        return OutputEnd(attn_out, merged=False)
    t = users[0]
    n = t
    while len(n.users) == 1:
        u = next(iter(n.users))
        if is_op(u, aten.clone.default) or (is_op(u, *VIEWS) and len(shape(u)) == 4):
            n = u
            continue
        break
    merged = next(iter(n.users)) if len(n.users) == 1 else None
    if merged is None or not is_op(merged, *VIEWS) or len(shape(merged)) != 3:
        return OutputEnd(attn_out, merged=False)
    b, h, s, d = shape(attn_out)
    if not same(shape(merged)[2], h * d):
        raise Reject("output not recognized", "heads are not merged into the last dim")
    # o_proj: view -> mm/addmm with W^T -> view (+ bias add)
    end = OutputEnd(merged, merged=True)
    users = list(merged.users)
    if len(users) == 1:
        flat = users[0]
        if is_op(flat, *VIEWS) and len(flat.users) == 1:
            mm = next(iter(flat.users))
            if is_op(mm, aten.mm.default, aten.addmm.default) and len(mm.users) == 1:
                args = mm.args if is_op(mm, aten.mm.default) else mm.args[1:]
                bias = None if is_op(mm, aten.mm.default) else mm.args[0]
                a, wt = args
                back = next(iter(mm.users))
                if a is flat and is_permute(wt, (1, 0)) and is_op(back, *VIEWS) and len(
                        shape(back)) == 3:
                    end = OutputEnd(back, True, wt.args[0], bias)
                    bu = list(back.users)
                    if bias is None and len(bu) == 1 and is_op(bu[0], aten.add.Tensor) and len(
                            shape(bu[0].args[1])) == 1 and bu[0].args[0] is back:
                        end = OutputEnd(bu[0], True, wt.args[0], bu[0].args[1])
    return end
