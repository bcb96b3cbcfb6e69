"""Replace a matched block by one call of ``inductor_gqa::attention_block``."""

from __future__ import annotations

import operator

import torch
from torch._guards import detect_fake_mode
from torch.fx import Graph, Node

from ..op.attention_block import TENSOR_ARGS
from .assemble import BlockMatch

aten = torch.ops.aten


def _fake(graph: Graph):
    vals = [n.meta.get("val") for n in graph.nodes if n.op == "placeholder"]
    return detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])


def _add(graph: Graph, target, args, fake_mode) -> Node:
    node = graph.call_function(target, args)

    def meta(a):
        if isinstance(a, Node):
            return a.meta["val"]
        if isinstance(a, (list, tuple)):
            return type(a)(meta(x) for x in a)
        return a

    with fake_mode:
        node.meta["val"] = target(*meta(args))
    return node


def rewrite(graph: Graph, match: BlockMatch) -> Node:
    order = {n: i for i, n in enumerate(graph.nodes)}
    inputs = []
    for value in match.tensors.values():
        if isinstance(value, tuple):
            value = value[0]
        if isinstance(value, Node):
            inputs.append(value)
    latest = max(inputs, key=order.__getitem__)
    fake_mode = _fake(graph)
    with graph.inserting_before(latest.next):
        args = []
        for name in TENSOR_ARGS:
            value = match.tensors[name]
            if isinstance(value, tuple):     # rows of a fused QKV weight/bias
                value = _rows(graph, value, fake_mode)
            args.append(value)
        spec = match.spec.op_kwargs()
        op = torch.ops.inductor_gqa.attention_block.default
        call = _add(graph, op, (*args, *spec.values()), fake_mode)
        out = _add(graph, operator.getitem, (call, 0), fake_mode)
        probs = _add(graph, operator.getitem, (call, 1), fake_mode)
        if not match.end.merged:
            out = _unmerge(graph, out, match, fake_mode)
    match.end.last.replace_all_uses_with(out)
    if match.spec.return_probs:
        match.core.probs.replace_all_uses_with(probs)
    return call


def _rows(graph: Graph, value: tuple, fake_mode) -> Node:
    """Rows start..end-1 of a fused weight or bias; with (groups, stride), those rows of every
    group of ``stride`` rows, gathered into one tensor (a copy: the rows are not evenly spaced)."""
    if len(value) == 3:
        src, start, end = value
        return _add(graph, aten.slice.Tensor, (src, 0, start, end), fake_mode)
    src, start, end, groups, stride = value
    rest = list(val_shape(src)[1:])
    grouped = _add(graph, aten.view.default, (src, [groups, stride, *rest]), fake_mode)
    part = _add(graph, aten.slice.Tensor, (grouped, 1, start, end), fake_mode)
    dense = _add(graph, aten.clone.default, (part,), fake_mode)
    dense.kwargs = {"memory_format": torch.contiguous_format}
    return _add(graph, aten.view.default, (dense, [groups * (end - start), *rest]), fake_mode)


def val_shape(n: Node) -> tuple:
    return tuple(n.meta["val"].shape)


def _unmerge(graph: Graph, out: Node, match: BlockMatch, fake_mode) -> Node:
    """[B, S, H*D] -> [B, H, S, D] for blocks that end at the attention output."""
    b = _add(graph, aten.sym_size.int, (out, 0), fake_mode) if not isinstance(
        match.heads_shape[0], int) else match.heads_shape[0]
    s = _add(graph, aten.sym_size.int, (out, 1), fake_mode) if not isinstance(
        match.heads_shape[2], int) else match.heads_shape[2]
    spec = match.spec
    view = _add(graph, aten.view.default, (out, [b, s, spec.num_heads, spec.head_dim]), fake_mode)
    return _add(graph, aten.permute.default, (view, [0, 2, 1, 3]), fake_mode)
