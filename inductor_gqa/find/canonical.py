"""Canonicalize a graph before matching: one form for what authors write in several ways.

Every rewrite here keeps each value exactly (bit for bit) and keeps the graph runnable as it is,
so it is applied to the whole graph whether or not a block is fused afterwards:

  alias(x), x.clone() of a dense tensor (a no-op dropout in eval or with p=0 traces to one),
  x * 1, x / 1, a cast to x's own dtype, view/expand to x's own shape      ->  x
  a * b of two float dtypes (implicit type promotion)                      ->  a.to(dt) * b
  split/chunk of x then [i]                                                ->  x[..., a:b]
  split/chunk of x.permute(p) then [i]                                     ->  x[..a:b..].permute(p)
  unbind(x, d)[i]                                                          ->  x.select(d, i)

Forms that agree only up to rounding (rsqrt and 1/sqrt, mean and sum/n, s / c and s * (1/c)) are
not rewritten (the graph must keep computing what it computed); the recognizers accept each of
them and the fused op computes the first form.
"""

from __future__ import annotations

import operator

import torch
from torch.fx import Graph, Node

from torch.fx.experimental.symbolic_shapes import statically_known_true

from ..patterns.graph import CASTS, is_op, val

aten, prims = torch.ops.aten, torch.ops.prims

_BINARY = (aten.mul.Tensor, aten.add.Tensor, aten.sub.Tensor, aten.div.Tensor)


def canonicalize(graph: Graph) -> int:
    """Rewrite ``graph`` in place; returns the number of rewrites."""
    count = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or not node.users:
            continue
        try:
            count += _rewrite(graph, node)
        except _Skip:
            continue
    if count:
        graph.eliminate_dead_code()
    return count


class _Skip(Exception):
    pass


def _tensor(n) -> torch.Tensor:
    v = val(n)
    if not isinstance(v, torch.Tensor):
        raise _Skip
    return v


def _same_sizes(a, b) -> bool:
    return len(a) == len(b) and all(statically_known_true(x == y) for x, y in zip(a, b))


def _same_layout(a: Node, b: Node) -> bool:
    """Same dtype, device, sizes and strides, provably (symbolic sizes are not guarded on)."""
    va, vb = _tensor(a), _tensor(b)
    return (va.dtype == vb.dtype and va.device == vb.device and _same_sizes(va.shape, vb.shape)
            and _same_sizes(va.stride(), vb.stride()))


def _replace(node: Node, by: Node, view_of_same_base: bool = False) -> int:
    # A graph output keeps its own tensor: returning ``by`` instead would make the output alias
    # another tensor (an input, say) where the traced program returned a fresh one; its other
    # users read ``by`` (a model returning its K/V cache clones them there). A slice for a
    # split's part is a view of the same base as the part: nothing changes.
    keep = (lambda u: u.op != "output") if not view_of_same_base else (lambda u: True)
    if not any(keep(u) for u in node.users):
        return 0
    node.replace_all_uses_with(by, delete_user_cb=keep)
    return 1


def _rewrite(graph: Graph, n: Node) -> int:
    if is_op(n, aten.alias.default) and _same_layout(n, n.args[0]):
        return _replace(n, n.args[0])
    if is_op(n, aten.clone.default) and _same_layout(n, n.args[0]):
        return _replace(n, n.args[0])
    if is_op(n, *CASTS) and _same_layout(n, n.args[0]):
        return _replace(n, n.args[0])
    if is_op(n, aten.view.default, aten.reshape.default, aten._unsafe_view.default,
             aten.expand.default) and _same_layout(n, n.args[0]):
        return _replace(n, n.args[0])
    if is_op(n, aten.mul.Tensor, aten.div.Tensor):
        a, b = n.args[:2]
        one = lambda c: isinstance(c, (int, float)) and not isinstance(c, bool) and c == 1  # noqa
        if isinstance(a, Node) and one(b) and _same_layout(n, a):
            return _replace(n, a)
        if is_op(n, aten.mul.Tensor) and isinstance(b, Node) and one(a) and _same_layout(n, b):
            return _replace(n, b)
    if is_op(n, *_BINARY):
        return _explicit_promotion(graph, n)
    if n.target is operator.getitem and is_op(n.args[0], aten.split.Tensor,
                                              aten.split_with_sizes.default):
        return _split_item(graph, n)
    if n.target is operator.getitem and is_op(n.args[0], aten.unbind.int):
        src = n.args[0].args[0]
        dim = n.args[0].args[1] if len(n.args[0].args) > 1 else n.args[0].kwargs.get("dim", 0)
        with graph.inserting_before(n):
            sel = graph.call_function(aten.select.int, (src, dim, n.args[1]))
        sel.meta.update(n.meta)
        return _replace(n, sel, view_of_same_base=True)
    return 0


def _explicit_promotion(graph: Graph, n: Node) -> int:
    """``a * b`` with a bfloat16 ``a`` and a float32 ``b`` computes ``a.float() * b``: write the
    cast, so recognizers see one form (an upcast is exact, the product unchanged). Only operands of
    a lower precision than the result are cast: a 0-d float32 tensor times a bfloat16 one is read
    at full precision by the kernel, which a cast to bfloat16 would change."""
    out = _tensor(n).dtype
    if not out.is_floating_point:
        return 0
    args, count = list(n.args), 0
    for i, a in enumerate(args[:2]):
        va = val(a) if isinstance(a, Node) else None
        if not (isinstance(va, torch.Tensor) and va.dtype.is_floating_point and va.dtype != out
                and torch.promote_types(va.dtype, out) == out):
            continue
        with graph.inserting_before(n):
            cast = graph.call_function(prims.convert_element_type.default, (a, out))
        cast.meta.update({k: v for k, v in a.meta.items() if k != "val"})
        cast.meta["val"] = va.to(out)
        args[i] = cast
        count += 1
    if count:
        n.args = tuple(args)
    return count


def _split_item(graph: Graph, n: Node) -> int:
    split, i = n.args
    src = split.args[0]
    sizes = split.args[1]
    dim = split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0)
    v = _tensor(src)
    dim = dim % v.dim()
    total = v.shape[dim]
    if isinstance(sizes, int):
        if not isinstance(total, int):
            raise _Skip
        sizes = [min(sizes, total - k) for k in range(0, total, sizes)]
    if not all(isinstance(s, int) for s in sizes):
        raise _Skip
    start = sum(sizes[:i])
    end = start + sizes[i]
    with graph.inserting_before(n):
        if is_op(src, aten.permute.default):
            # slice before the permute, so a fused projection's rows are found through a view
            inner, perm = src.args[0], list(src.args[1])
            d = perm[dim] % len(perm)
            sl = graph.call_function(aten.slice.Tensor, (inner, d, start, end))
            sl.meta["val"] = _tensor(inner).narrow(d, start, end - start)
            out = graph.call_function(aten.permute.default, (sl, perm))
        else:
            out = graph.call_function(aten.slice.Tensor, (src, dim, start, end))
    out.meta.update(n.meta)
    return _replace(n, out, view_of_same_base=True)
