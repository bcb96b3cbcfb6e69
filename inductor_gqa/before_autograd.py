"""Blocks in graphs whose inputs require grad: fused before AOTAutograd builds the backward.

A training step, or a forward without ``torch.no_grad()``, reaches Inductor's joint-graph pass
with the backward already derived from the block's separate ops. So the backend traces Dynamo's
graph to ATen first (fake tensors, Inductor's decompositions: the same forms the joint-graph
pass reads), finds and plans each block as for inference, and writes it in its training form
(lower/training.py): ATen projections, norm and RoPE around one differentiable attention-core
op. AOTAutograd then differentiates the graph (the core by its own formula, whose backward is
one op), and the joint-graph pass lowers the core's forward and backward calls to their kernels
(``graph_pass.lower_fused_calls``).

On by default (``Options(fuse_with_grad=False)`` turns it off); ``backend="inductor_gqa"``
only, since ``install()``'s joint-graph pass comes after autograd. Symbolic
sizes stay symbolic: the retrace runs in the tracing context's fake mode, whose shape environment
holds Dynamo's symbols and guards, so one graph serves every length as for inference.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch._dynamo.utils import counters
from torch.fx import GraphModule

from .find import report
from .find.report import log
from .graph_pass import run
from .lower import training

# Dynamo-level call targets that can start a block (its softmax or SDPA); a graph without one
# is handed to Inductor untouched, at no cost.
_ANCHOR_NAMES = ("softmax", "scaled_dot_product_attention")


def wants_grad(example_inputs) -> bool:
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs)


def _may_hold_a_block(gm: GraphModule) -> bool:
    for n in gm.graph.nodes:
        name = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", "")
        if n.op in ("call_function", "call_method") and any(a in str(name)
                                                             for a in _ANCHOR_NAMES):
            return True
    return False


def applies(gm: GraphModule, example_inputs, options) -> bool:
    """Whether this compilation's blocks are looked for before autograd (then the joint-graph
    pass only lowers what was fused here, and reports nothing twice)."""
    if not options.fuse_with_grad or not wants_grad(example_inputs) or not _may_hold_a_block(gm):
        return False
    ctx = torch._guards.TracingContext.try_get()
    return ctx is not None and ctx.fake_mode is not None


# Ops whose own derivative formulas AOTAutograd must still see: traced through their
# decompositions, autograd would differentiate the pieces and keep their float32 intermediates
# (a language model's log-softmax over its vocabulary, an MLP's SiLU), where stock keeps one
# tensor. They are decomposed after autograd, as stock does.
_KEEP_FOR_AUTOGRAD = frozenset((
    "silu", "silu_", "gelu", "gelu_", "mish", "mish_", "softplus", "elu", "elu_", "celu",
    "celu_", "selu", "leaky_relu", "leaky_relu_", "hardswish", "hardswish_", "hardtanh",
    "hardtanh_", "prelu", "_prelu_kernel", "rrelu", "relu6",
    "_log_softmax", "log_softmax", "special_log_softmax", "nll_loss", "nll_loss_forward",
    "nll_loss2d", "nll_loss2d_forward", "nll_loss_nd", "cross_entropy_loss", "mse_loss",
    "smooth_l1_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits",
    "native_layer_norm", "layer_norm", "native_group_norm", "group_norm", "_fused_rms_norm",
    "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
    "_native_batch_norm_legit_no_training", "_batch_norm_with_update",
    "_batch_norm_with_update_functional", "_batch_norm_no_update", "cudnn_batch_norm",
    "native_dropout", "embedding_bag",
))


def pre_autograd_decompositions() -> dict:
    """Inductor's decompositions less the ops in ``_KEEP_FOR_AUTOGRAD``: the forms the block
    recognizers read, with the rest of the model's autograd left as stock has it."""
    from torch._inductor.decomposition import select_decomp_table
    return {op: fn for op, fn in select_decomp_table().items()
            if op.__name__.split(".")[0] not in _KEEP_FOR_AUTOGRAD}


def fuse_before_autograd(gm: GraphModule, example_inputs, options) -> Optional[GraphModule]:
    """The graph traced to ATen with its blocks fused, or None to compile ``gm`` as it is (no
    block fused). Call where ``applies``."""
    ctx = torch._guards.TracingContext.try_get()
    from torch.fx.experimental.proxy_tensor import make_fx

    fake_mode = ctx.fake_mode       # the mode AOTAutograd will trace in
    fakes = [fake_mode.from_tensor(t) if isinstance(t, torch.Tensor) else t
             for t in example_inputs]

    def interpret(*args):
        # run node by node so that each traced node keeps its source node's metadata
        # (nn_module_stack: the module path the reports name), as AOTAutograd does
        return torch.fx.Interpreter(gm).run(*args)

    try:
        with report.undone_on_error():
            with fake_mode, torch.fx.traceback.preserve_node_meta():
                traced = make_fx(interpret, decomposition_table=pre_autograd_decompositions(),
                                 tracing_mode="real", _allow_non_fake_inputs=True)(*fakes)
            if run(traced.graph, options, lower=False) == 0:
                return None
            training.expand_for_training(traced.graph, options)
            _differentiable_casts(traced.graph)
            traced.recompile()
    except Exception as e:  # noqa: BLE001  (Dynamo's own graph still compiles, as stock's)
        # A model whose graph our retrace cannot take must still train: its blocks are left to
        # stock Inductor, loudly (the counters no longer count them fused), rather than failing
        # the user's compile.
        counters["inductor_gqa"]["graphs left: retrace before autograd failed"] += 1
        log.warning("inductor_gqa: a graph with gradients left to stock Inductor, its retrace "
                    "before autograd failed: %s: %s (Options(fuse_with_grad=False) skips it)",
                    type(e).__name__, str(e)[:500])
        return None
    return traced


def _differentiable_casts(graph) -> None:
    """Inductor's decompositions write dtype casts as ``prims.convert_element_type``, which has
    no autograd formula; AOTAutograd must differentiate through the casts of a 16-bit model's
    norms and softmaxes, so they go back to ``aten._to_copy``."""
    prim = torch.ops.prims.convert_element_type.default
    for n in list(graph.find_nodes(op="call_function", target=prim)):
        x, dtype = n.args
        with graph.inserting_before(n):
            cast = graph.call_function(torch.ops.aten._to_copy.default, (x,), {"dtype": dtype})
        cast.meta.update(n.meta)
        n.replace_all_uses_with(cast)
        graph.erase_node(n)
