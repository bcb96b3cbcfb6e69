"""Lower a fused op node to its plan: trace ``emit`` with the node's fake inputs and splice the
traced graph in place of the node (``replace_call``, which the training form uses too).

The traced graph is normalized ATen (Inductor's decompositions applied, as its pattern
replacements are) plus ``triton_kernel_wrapper_functional`` nodes, so the rest of Inductor's
pipeline (its reinplacing pass, scheduling, the Python and C++ wrappers, AOTInductor) treats our
kernels as it treats user-defined Triton kernels. Sizes stay symbolic under dynamic shapes: the
plan read only their hints.
"""

from __future__ import annotations

import operator

import torch
from torch._guards import detect_fake_mode
from torch.fx import Graph, Node
from torch.fx.experimental.proxy_tensor import make_fx

from ..op.attention_block import TENSOR_ARGS
from ..plan.plans import Plan
from ..plan.spec import BlockSpec
from .emit import emit


def expand(graph: Graph, call: Node, plan: Plan, spec: BlockSpec) -> None:
    """Replace ``call`` (an ``inductor_gqa::attention_block`` node) by ``plan``'s graph."""
    replace_call(graph, call, TENSOR_ARGS, lambda t: emit(plan, spec, t))


def replace_call(graph: Graph, call: Node, names, build, decompose: bool = True,
                 differentiable: bool = False) -> None:
    """Replace ``call`` by the traced graph of ``build(t)``, where ``t`` maps ``names`` to the
    fake values of the call's first ``len(names)`` arguments (None where absent); ``build``
    returns one value per output of the call. ``decompose``: with Inductor's decompositions
    (a joint graph's form; before autograd the graph was traced with them too).
    ``differentiable`` (a graph before autograd): floating-point values are traced as requiring
    grad, so that composite ops decompose as they will be differentiated (SDPA keeps its
    log-sum-exp for the backward only when an input requires grad)."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.traceback import preserve_node_meta

    nodes = list(call.args[:len(names)])
    present = [i for i, n in enumerate(nodes) if n is not None]
    vals = [nodes[i].meta["val"] for i in present]

    def block(*tensors):
        t = dict.fromkeys(names)
        for i, v in zip(present, tensors):
            t[names[i]] = v
        return tuple(build(t))

    fake_mode = detect_fake_mode(vals)
    with fake_mode, enable_python_dispatcher(), preserve_node_meta(), \
            torch.set_grad_enabled(differentiable):
        if differentiable:
            vals = [v.detach().requires_grad_(v.is_floating_point()) for v in vals]
        traced = make_fx(block, select_decomp_table() if decompose else None,
                         tracing_mode="real")(*vals)
    traced.graph.eliminate_dead_code()

    env: dict = {}
    placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
    for ph, i in zip(placeholders, present):
        env[ph] = nodes[i]
    outputs = None
    with graph.inserting_before(call):
        for n in traced.graph.nodes:
            if n.op == "placeholder":
                continue
            if n.op == "output":
                outputs = n.args[0]
                continue
            if n.op == "get_attr":
                raise RuntimeError("inductor_gqa: a plan traced a constant tensor; plans must "
                                   "build every buffer from sizes")
            env[n] = graph.node_copy(n, lambda a: env[a])
    for user in list(call.users):
        if user.target is not operator.getitem:
            raise RuntimeError(f"inductor_gqa: unexpected user {user} of the fused op")
        user.replace_all_uses_with(env[outputs[user.args[1]]])
        graph.erase_node(user)
    graph.erase_node(call)


def input_values(call: Node) -> dict:
    """The fake values of a fused op node's tensor arguments, by name."""
    return {name: (a.meta["val"] if isinstance(a, Node) else None)
            for name, a in zip(TENSOR_ARGS, call.args)}


def is_fused_op(node: Node) -> bool:
    return (node.op == "call_function"
            and node.target is torch.ops.inductor_gqa.attention_block.default)
