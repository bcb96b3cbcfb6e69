"""Ways in: the ``inductor_gqa`` torch.compile backend, and install()/uninstall() for stock Inductor."""

from __future__ import annotations

import contextlib
from typing import Optional

import torch
from torch._inductor import config as inductor_config

from . import before_autograd
from . import fused as fused_record
from .find import report
from .graph_pass import AttentionBlockPass
from .options import Options, as_options, split_options


def _prior_pass():
    """The joint-graph pass configured before ours (ours is never chained to itself)."""
    current = inductor_config.joint_custom_pre_pass
    return current.chain if isinstance(current, AttentionBlockPass) else current


def install(options: Optional[Options] = None) -> AttentionBlockPass:
    """Put our pass into stock Inductor; a joint-graph pass the user set before is chained."""
    p = AttentionBlockPass(as_options(options), chain=_prior_pass())
    inductor_config.joint_custom_pre_pass = p
    return p


def uninstall() -> None:
    """Remove our pass, restoring whatever pass was configured before install()."""
    inductor_config.joint_custom_pre_pass = _prior_pass()


def is_installed() -> bool:
    return isinstance(inductor_config.joint_custom_pre_pass, AttentionBlockPass)


@contextlib.contextmanager
def installed(options: Optional[Options] = None):
    """``with inductor_gqa.installed(): torch.compile(model)(...)``"""
    before = inductor_config.joint_custom_pre_pass
    install(options)
    try:
        yield
    finally:
        inductor_config.joint_custom_pre_pass = before


def inductor_gqa_backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """``torch.compile(model, backend="inductor_gqa")``: stock Inductor plus our pass.

    ``mode=`` means what it means for stock Inductor (``torch._inductor.list_mode_options``):
    "reduce-overhead" replays the compiled graph, our op's launches included, as a CUDA graph.
    ``options=`` takes this package's ``Options`` (or a dict of its fields) and, in the same
    dict, stock Inductor's options as ``backend="inductor"`` takes them (``"max_autotune"``,
    ``"triton.cudagraphs"``, ...), which are passed on to Inductor (``split_options``).

    The blocks are counted once the graph has compiled (``report.deferred``), and the returned
    callable carries them (``fused.fused_blocks``), on an FX graph cache hit too."""
    from torch._inductor import list_mode_options
    from torch._inductor.compile_fx import compile_fx

    options, inductor_options = split_options(kwargs.pop("options", None))
    mode = kwargs.pop("mode", None)
    if kwargs:
        raise TypeError(f"inductor_gqa backend: unexpected arguments {sorted(kwargs)}; it takes "
                        "mode= (as stock Inductor) or options= (inductor_gqa.Options fields and "
                        "stock Inductor options)")
    patches = dict(list_mode_options(mode)) if mode else {}
    patches.update(inductor_options)
    opts = options or Options()
    with report.deferred() as pending:
        early = before_autograd.applies(gm, example_inputs, opts)
        fused = before_autograd.fuse_before_autograd(gm, example_inputs, opts) if early else None
        graph_pass = AttentionBlockPass(options, chain=_prior_pass(), before_autograd=early)
        patches["joint_custom_pre_pass"] = graph_pass
        compiled = compile_fx(fused if fused is not None else gm, example_inputs,
                              config_patches=patches)
    return fused_record.after_compile(compiled, pending.rows, graph_pass.ran or early)
