"""A static cache's block that writes its new K/V into the cache buffers itself.

After ``rewrite`` the block is one functional ``attention_block`` call that writes its k/v into
a copy of each buffer, while the graph still computes the written buffers (``index_put``, from
the model's ``index_copy_``) for the cache the model keeps. Here the call becomes
``attention_block_write_cache``, an op declared to mutate the buffers, traced through
functionalization as every mutating custom op is (``auto_functionalized``); the graph's written
buffers are replaced by the op's, so the graph's own K/V writes (and the k/v projections that fed
only them) go away. Inductor then reinplaces the call: the op writes into the model's buffers.
"""

from __future__ import annotations

import torch
from torch._guards import detect_fake_mode
from torch.fx import Graph, Node
from torch._subclasses.functional_tensor import FunctionalTensorMode, dispatch_functionalize
from torch.fx.experimental.proxy_tensor import make_fx

from ..op.attention_block import TENSOR_ARGS

aten = torch.ops.aten


def write_into_cache(graph: Graph, call: Node, cache: tuple) -> bool:
    """Replace ``call`` (a functional ``attention_block`` with a static cache) by the writing
    op; returns whether it did (False when the written buffers are not both there to replace).
    """
    ck, cv = cache
    if ck.written is None or cv.written is None or ck.written is cv.written:
        return False
    n = len(TENSOR_ARGS)
    nodes = list(call.args[:n])
    scalars = list(call.args[n:])
    present = [i for i, a in enumerate(nodes) if a is not None]
    vals = [nodes[i].meta["val"] for i in present]
    op = torch.ops.inductor_gqa.attention_block_write_cache.default

    def block(*tensors):
        args = [None] * n
        for i, t in zip(present, tensors):
            args[i] = t
        out = op(*args, *scalars)
        # the buffers after the op's write (functionalization: their new values)
        return (*out, args[TENSOR_ARGS.index("past_key")], args[TENSOR_ARGS.index("past_value")])

    fake_mode = detect_fake_mode(vals)
    with fake_mode:
        traced = make_fx(dispatch_functionalize(block, FunctionalTensorMode()),
                         tracing_mode="real")(*vals)
    env: dict = {}
    placeholders = [p for p in traced.graph.nodes if p.op == "placeholder"]
    for ph, i in zip(placeholders, present):
        env[ph] = nodes[i]
    outputs = None
    with graph.inserting_before(call):
        for t in traced.graph.nodes:
            if t.op == "placeholder":
                continue
            if t.op == "output":
                outputs = t.args[0]
                continue
            env[t] = graph.node_copy(t, lambda a: env[a])
    for user in list(call.users):
        user.replace_all_uses_with(env[outputs[user.args[1]]])
        graph.erase_node(user)
    graph.erase_node(call)
    ck.written.replace_all_uses_with(env[outputs[2]])
    cv.written.replace_all_uses_with(env[outputs[3]])
    _topological(graph)
    graph.eliminate_dead_code()
    return True


def _topological(graph: Graph) -> None:
    """Reorder nodes so that each comes after its inputs, keeping the order otherwise (users of
    a written buffer may sit before the op call that now computes it)."""
    order = list(graph.nodes)
    position = {nd: i for i, nd in enumerate(order)}
    if all(position[a] < position[nd] for nd in order for a in nd.all_input_nodes):
        return
    done: set = set()
    result: list = []

    def visit(nd: Node) -> None:
        stack = [(nd, False)]
        while stack:
            cur, expanded = stack.pop()
            if cur in done:
                continue
            if expanded:
                done.add(cur)
                result.append(cur)
                continue
            stack.append((cur, True))
            for a in reversed(cur.all_input_nodes):
                if a not in done:
                    stack.append((a, False))

    for nd in order:
        visit(nd)
    output = next(nd for nd in order if nd.op == "output")
    for nd in result:
        if nd is not output:
            output.prepend(nd)
