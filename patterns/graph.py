"""Small helpers for reading normalized ATen graphs (joint-graph stage, before Inductor's own
attention rewrite): op tests, layout-op skipping, shapes, and constant scalars."""

from __future__ import annotations

import math
import operator
from typing import Optional

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx import Node
from torch.fx.experimental.symbolic_shapes import (guard_bool, guard_float, guard_int,
                                                   statically_known_true)

aten = torch.ops.aten
prims = torch.ops.prims

# Ops that only re-view or copy a tensor without changing values (order may change).
VIEWS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)
CASTS = (prims.convert_element_type.default, aten._to_copy.default)


class Reject(Exception):
    """A near miss: the structure looked like an attention block but is not one we reproduce.
    ``reason`` is one of ``find/reasons.py``'s (the counters' and the README's), ``detail``
    free text."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(reason if not detail else f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class NotAttention(Reject):
    """Not an attention candidate at all (a MoE router's softmax, whose probabilities no matmul
    reads): not counted as a block seen or left, only logged at DEBUG."""


def is_op(node, *targets) -> bool:
    if not isinstance(node, Node) or node.op != "call_function":
        return False
    tgt = node.target
    for t in targets:
        if tgt is t:
            return True
        # allow an OpOverloadPacket to match any of its overloads
        if isinstance(t, torch._ops.OpOverloadPacket) and getattr(tgt, "overloadpacket", None) is t:
            return True
    return False


def val(node):
    return node.meta.get("val") if isinstance(node, Node) else None


def shape(node) -> tuple:
    v = val(node)
    if not isinstance(v, torch.Tensor):
        raise Reject("no shape metadata", str(node))
    return tuple(v.shape)


def dtype(node) -> torch.dtype:
    v = val(node)
    if not isinstance(v, torch.Tensor):
        raise Reject("no dtype metadata", str(node))
    return v.dtype


def same(a, b) -> bool:
    """Size equality. Symbolic sizes that are not provably equal are compared on their hints and
    the answer is guarded, so the compiled graph is only reused where it holds (head counts written
    as ``Hkv * (H // Hkv)`` versus ``H``, say)."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if statically_known_true(a == b):
        return True
    return bool(guard_bool(a == b)) if isinstance(a == b, torch.SymBool) else bool(a == b)


def same_shape(a, b) -> bool:
    return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))


def concrete_int(x) -> int:
    """A size that must be static for the op's schema (head counts, head_dim); guards if symbolic."""
    return x if isinstance(x, int) else guard_int(x)


def arg(node: Node, name: str, default=None):
    """Argument by schema name, positional or keyword."""
    if name in node.kwargs:
        return node.kwargs[name]
    schema = getattr(node.target, "_schema", None)
    if schema is not None:
        for i, a in enumerate(schema.arguments):
            if a.name == name:
                return node.args[i] if i < len(node.args) else default
    return default


def through_views(node: Node) -> Node:
    """Skip view/reshape/_unsafe_view/contiguous clones upward (values and order unchanged)."""
    while is_op(node, *VIEWS) or _is_contig_clone(node) or is_op(node, aten.alias.default):
        node = node.args[0]
    return node


def through_clones(node: Node) -> Node:
    """Skip clones upward (values unchanged): a model that returns its K/V cache clones the
    projected k and v it also attends with, so that the returned tensors are its own."""
    while _is_contig_clone(node):
        node = node.args[0]
    return node


def _is_contig_clone(node) -> bool:
    return is_op(node, aten.clone.default) and node.kwargs.get("memory_format") in (
        None, torch.contiguous_format)


def through_noop_expand(node: Node) -> Node:
    """Skip expand/clone/view that keep the shape (matmul decompositions add these)."""
    while True:
        if (is_op(node, aten.expand.default, *VIEWS) or _is_contig_clone(node)) and same_shape(
                shape(node), shape(node.args[0])):
            node = node.args[0]
            continue
        if is_op(node, aten.slice.Tensor) and same_shape(shape(node), shape(node.args[0])):
            node = node.args[0]
            continue
        return node


def is_permute(node, dims) -> bool:
    if not is_op(node, aten.permute.default, aten.transpose.int):
        return False
    if is_op(node, aten.transpose.int):
        n = len(shape(node))
        d0, d1 = (d % n for d in node.args[1:3])
        perm = list(range(n))
        perm[d0], perm[d1] = perm[d1], perm[d0]
        return perm == list(dims)
    n = len(node.args[1])
    return [d % n for d in node.args[1]] == list(dims)


def scalar(x) -> Optional[float]:
    """A Python number for a constant scalar expression in the graph, else None.

    Handles literals, symbolic ints (guarded), and the small tensor chains Dynamo emits for
    expressions like ``head_dim ** -0.5`` (scalar_tensor, casts, pow, mul, div, sqrt).
    """
    if isinstance(x, bool):
        return None
    if isinstance(x, (int, float)):
        return float(x)
    if isinstance(x, torch.SymInt):
        return float(guard_int(x))
    if not isinstance(x, Node):
        return None
    if x.op == "call_function" and x.target in (operator.mul, operator.truediv, operator.pow,
                                                 operator.floordiv):
        a, b = scalar(x.args[0]), scalar(x.args[1])
        return None if a is None or b is None else float(x.target(a, b))
    v = val(x)
    if isinstance(v, torch.SymInt):
        return float(guard_int(v))
    if isinstance(v, torch.SymFloat) and _from_sizes(v):
        return float(guard_float(v))
    if isinstance(v, int) and not isinstance(v, bool):
        return float(v)
    if not isinstance(v, torch.Tensor) or v.numel() != 1:
        return None
    if is_op(x, aten.scalar_tensor.default):
        return scalar(x.args[0])
    if is_op(x, aten.full.default) and not x.args[0]:
        return scalar(x.args[1])
    if is_op(x, *CASTS):
        inner = scalar(x.args[0])
        if inner is None:
            return None
        with unset_fake_temporarily():
            return torch.tensor(inner, dtype=torch.float64).to(v.dtype).item()
    if is_op(x, aten.sqrt.default):
        inner = scalar(x.args[0])
        return None if inner is None else math.sqrt(inner)
    fns = {aten.pow.Tensor_Tensor: operator.pow, aten.pow.Tensor_Scalar: operator.pow,
           aten.mul.Tensor: operator.mul, aten.div.Tensor: operator.truediv,
           aten.reciprocal.default: None}
    for op, fn in fns.items():
        if is_op(x, op):
            if fn is None:
                inner = scalar(x.args[0])
                return None if inner is None else 1.0 / inner
            a, b = scalar(x.args[0]), scalar(x.args[1])
            return None if a is None or b is None else fn(a, b)
    return None


def _from_sizes(v: torch.SymFloat) -> bool:
    """A symbolic float computed from sizes alone (``head_dim ** -0.5`` under dynamic=True,
    where every size is symbolic): guarded like the head sizes it comes from. A float of the
    user's that Dynamo left unspecialized is a runtime value instead."""
    syms = v.node.expr.free_symbols
    return bool(syms) and all(getattr(sym, "is_integer", False) for sym in syms)


def runtime_scalar(x) -> Optional[Node]:
    """A node holding a 0-d float tensor computed at run time (a float that Dynamo did not
    specialize), else None. The op takes such a node as a tensor input."""
    if not isinstance(x, Node):
        return None
    v = val(x)
    if isinstance(v, torch.Tensor) and v.dim() == 0 and v.dtype.is_floating_point:
        return x
    return None

