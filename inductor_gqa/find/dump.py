"""A readable dump of what the pass left in a graph: the fused calls with their arguments by name
and spec, and a count of the other ops (for expect tests and for users who ask why)."""

from __future__ import annotations

import collections

import torch
from torch.fx import Graph, Node

from ..op.attention_block import TENSOR_ARGS


def readable(graph: Graph) -> str:
    op = torch.ops.inductor_gqa.attention_block.default
    lines, others = [], collections.Counter()
    n_tensors = len(TENSOR_ARGS)
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is op:
            named = [f"{k}={_name(a)}" for k, a in zip(TENSOR_ARGS, node.args[:n_tensors])
                     if a is not None]
            schema = [a.name for a in op._schema.arguments][n_tensors:]
            scalars = [f"{k}={v!r}" for k, v in zip(schema, node.args[n_tensors:])]
            lines.append(f"attention_block({', '.join(named)})")
            lines.append(f"    {', '.join(scalars)}")
        else:
            others[getattr(node.target, "__name__", str(node.target))] += 1
    lines.append("other ops: " + ", ".join(f"{k} x{v}" for k, v in sorted(others.items())))
    return "\n".join(lines)


def _name(a) -> str:
    if isinstance(a, Node):
        if a.op == "call_function" and a.target is torch.ops.aten.slice.Tensor:
            return f"{_name(a.args[0])}[{a.args[2]}:{a.args[3]}]"
        return a.name
    return repr(a)
