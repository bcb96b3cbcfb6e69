"""Gradients of the training form: every fused variant's rewritten graph, run eagerly with
inputs that require grad, gives the eager block's gradients (CPU, reference path).

The graph is the variant traced to ATen (fake tensors, Inductor's decompositions) and rewritten
as the backend does before AOTAutograd: the block in its training form (lower/training.py), ATen
projections, norm and RoPE around the differentiable core op, whose backward is the reference's
vector-Jacobian product here (docs/pipeline.md, "Gradients")."""

import pytest
import torch
from torch._inductor.decomposition import select_decomp_table
from torch.fx.experimental.proxy_tensor import make_fx
from variants import FUSED, build

from inductor_gqa.graph_pass import run
from inductor_gqa.lower.training import expand_for_training
from inductor_gqa.options import Options


def _rewritten(fn, inputs):
    names = list(inputs)

    def flat(*args):
        return fn(**dict(zip(names, args)))

    with torch.no_grad():
        gm = make_fx(flat, decomposition_table=select_decomp_table(),
                     tracing_mode="fake")(*inputs.values())
    fused = run(gm.graph, Options(), lower=False)
    expand_for_training(gm.graph, Options())
    gm.recompile()
    return flat, gm, fused


def _grads(call, inputs):
    """Gradients of a fixed random projection of every output, per float input (masks aside)."""
    args = [t.detach().clone().requires_grad_(t.dtype.is_floating_point and "mask" not in k)
            if torch.is_tensor(t) else t for k, t in inputs.items()]
    out = call(*args)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    g = torch.Generator().manual_seed(1)
    loss = sum((o.float() * torch.randn(o.shape, generator=g)).nan_to_num().sum() for o in outs)
    loss.backward()
    return {k: a.grad for k, a in zip(inputs, args) if torch.is_tensor(a) and a.requires_grad}


@pytest.mark.parametrize("v", FUSED, ids=lambda v: v.name)
def test_fused_graph_gradients_equal_eager(v):
    fn, inputs = build(v)
    flat, gm, fused = _rewritten(fn, inputs)
    assert fused == 1
    eager, ours = _grads(flat, inputs), _grads(gm, inputs)
    assert eager.keys() == ours.keys()
    # fp32: the same math in the same order up to the decompositions (1e-4 relative to the
    # gradient's scale); half types: the W092 rule's rtol
    tol = 1e-4 if v.dtype == torch.float32 else 0.05
    for k in eager:
        a, b = eager[k].float(), ours[k].float()
        scale = a.nan_to_num().abs().max().clamp_min(1e-6)
        torch.testing.assert_close(b / scale, a / scale, rtol=0, atol=tol, equal_nan=True,
                                   msg=lambda m: f"{v.name} d{k}: {m}")
