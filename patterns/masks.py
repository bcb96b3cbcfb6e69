"""Masks built inside the graph: recognize the causal ones exactly, refuse everything else.

A mask subgraph built only from iota/full/compare ops is evaluated on the CPU at several sequence
lengths and compared with the causal pattern. Only comparisons against -1, 0 or 1 are allowed, so a
window width (a constant or a runtime value) can never pass for causal at the sizes tried.
"""

from __future__ import annotations

import operator

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx import Node

from inductor_gqa.find.graph import CASTS, VIEWS, Reject, val

aten, prims = torch.ops.aten, torch.ops.prims

_BUILDERS = {
    prims.iota.default, aten.arange.default, aten.arange.start, aten.arange.start_step,
    aten.full.default, aten.ones.default, aten.zeros.default, aten.scalar_tensor.default,
    aten.unsqueeze.default, aten.expand.default, aten.sub.Tensor, aten.add.Tensor,
    aten.ge.Scalar, aten.gt.Scalar, aten.le.Scalar, aten.lt.Scalar, aten.eq.Scalar, aten.ne.Scalar,
    aten.ge.Tensor, aten.gt.Tensor, aten.le.Tensor, aten.lt.Tensor, aten.eq.Tensor,
    aten.where.self, aten.logical_and.default, aten.logical_or.default, aten.logical_not.default,
    aten.bitwise_not.default, aten.bitwise_and.Tensor, aten.clone.default, aten.slice.Tensor,
    aten.alias.default, aten.mul.Tensor, aten.triu.default, aten.tril.default,
    *VIEWS, *CASTS,
}
_SYM_OPS = {operator.add, operator.sub, operator.mul, operator.floordiv, operator.neg}


def _ancestors(node: Node):
    """The node and everything it is computed from, once each."""
    seen, stack = set(), [node]
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            yield n
            stack.extend(n.all_input_nodes)


def is_constant_mask(node: Node) -> bool:
    """True when the node's value depends on no tensor input (only sizes and constants)."""
    for n in _ancestors(node):
        if n.op == "placeholder" and isinstance(val(n), torch.Tensor):
            return False
        if n.op not in ("placeholder", "call_function"):
            return False
    return True


def _check_constants(node: Node, placeholders: set) -> None:
    for n in _ancestors(node):
        if n.op == "placeholder":
            placeholders.add(n)
            continue
        if n.target in _SYM_OPS:
            continue
        if n.target not in _BUILDERS:
            raise Reject("in-graph mask not recognized", f"{n.target} in mask")
        if n.target in (aten.ge.Scalar, aten.gt.Scalar, aten.le.Scalar, aten.lt.Scalar,
                        aten.eq.Scalar, aten.ne.Scalar):
            c = n.args[1]
            if not isinstance(c, (int, float)) or c not in (-1, 0, 1):
                raise Reject("in-graph mask not recognized", f"window-like constant {c}")
        if n.target in (aten.triu.default, aten.tril.default):
            d = n.args[1] if len(n.args) > 1 else 0
            if d not in (-1, 0, 1):
                raise Reject("in-graph mask not recognized", f"triu/tril diagonal {d}")


def _evaluate(node: Node, env: dict):
    if node in env:
        return env[node]

    def conv(a):
        if isinstance(a, Node):
            return _evaluate(a, env)
        if isinstance(a, (list, tuple)):
            return type(a)(conv(x) for x in a)
        return a

    args = conv(node.args)
    kwargs = {k: (torch.device("cpu") if k == "device" else conv(v)) for k, v in node.kwargs.items()}
    out = node.target(*args, **kwargs)
    env[node] = out
    return out


def causal_mask_value(mask: Node, seq_len) -> tuple[torch.Tensor, list]:
    """Evaluate a constant mask at its traced length and a few others (if the length is symbolic).

    Returns (value at the traced length, values at other lengths). Raises Reject if unrecognized.
    """
    placeholders: set = set()
    _check_constants(mask, placeholders)
    hint = seq_len if isinstance(seq_len, int) else seq_len.node.hint
    sym_inputs = [p for p in placeholders if isinstance(val(p), torch.SymInt)]
    hints = {p: val(p).node.hint for p in sym_inputs}
    # Vary the sizes that stand for the sequence length; hold the others (batch, say) at their
    # traced value (an unbacked size has none: any positive value will do).
    varying = [p for p in sym_inputs if hint is not None and hints[p] == hint]
    tries = [hint] + ([1, 2, 3, 5, 17, 64] if varying else [])
    outs = []
    for s in tries:
        env = {p: (s if p in varying else (hints[p] or 2)) for p in sym_inputs}
        try:
            with unset_fake_temporarily():   # passes run under a fake mode; we want real values
                outs.append((s, _evaluate(mask, env)))
        except Exception as e:  # noqa: BLE001 - anything odd means we do not reproduce it
            raise Reject("in-graph mask not recognized", f"could not evaluate: {e}") from e
    return outs


def classify_masked_positions(kind: str, mask: Node, fill, seq_len) -> bool:
    """Check that the in-graph mask makes exactly the strict upper triangle unattendable.

    Returns True when masked scores become exactly -inf, False when they become a huge finite
    value (``finfo.min``): alone, both give the same softmax (the diagonal is always kept), but
    not once another mask can empty a row.

    kind: 'fill' (mask True -> score replaced by fill), 'keep' (bool, True = attend),
    'additive' (mask value added).
    """
    with unset_fake_temporarily():
        return _classify(kind, mask, fill, seq_len)


def _classify(kind, mask, fill, seq_len) -> bool:
    exact = True
    for s, value in causal_mask_value(mask, seq_len):
        value = torch.as_tensor(value)
        if value.dim() < 2 or value.shape[-1] != s or value.shape[-2] != s:
            raise Reject("in-graph mask not recognized", f"shape {tuple(value.shape)} at S={s}")
        value = value.reshape(-1, s, s)
        if not bool((value == value[:1]).all()):
            raise Reject("in-graph mask not recognized", "mask varies over batch/heads")
        value = value[0]
        upper = torch.ones(s, s, dtype=torch.bool).triu(1)
        if kind == "keep":
            if value.dtype != torch.bool or not torch.equal(value, ~upper):
                raise Reject("in-graph mask not recognized", "not causal")
        elif kind == "fill":
            if value.dtype != torch.bool or not torch.equal(value, upper):
                raise Reject("in-graph mask not recognized", "not causal")
            if not _is_neg_inf_like(fill):
                raise Reject("in-graph mask not recognized", f"fill value {fill}")
            exact = exact and fill == float("-inf")
        else:
            v = value.float()
            if not (bool((v[~upper] == 0).all()) and bool(
                    (v[upper] <= -1e30).all() if upper.any() else True)):
                raise Reject("in-graph mask not recognized", "additive mask is not causal")
            exact = exact and bool((v[upper] == float("-inf")).all())
    return exact


def _is_neg_inf_like(x) -> bool:
    return x is not None and x <= -1e30
