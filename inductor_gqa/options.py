"""User-visible options of the pass. Everything here feeds the pass's uuid (FX graph cache key)."""

from __future__ import annotations

import dataclasses
from typing import Optional


@dataclasses.dataclass(frozen=True)
class Options:
    # head_dim values the fused kernels are built for; other sizes are left to stock Inductor.
    head_dims: tuple = (16, 32, 64, 128, 256)
    # Fuse blocks whose core is F.scaled_dot_product_attention.
    fuse_sdpa: bool = True
    # Fuse blocks written as explicit matmul -> softmax -> matmul chains.
    fuse_explicit: bool = True
    # When cos/sin are computed in the graph from inv_freq and position_ids, hand those to the op,
    # which builds the tables in one launch (kernels/rope_table.py) instead of the several small
    # kernels the graph's own code becomes. Off: keep the model's cos/sin computation as it is.
    rope_from_positions: bool = True
    # float32 blocks where TF32 is allowed may run on fp16 operand copies (plan/plans.py's
    # Fp16CopiesPlan: TF32's precision at twice its rate, with a guarded float32 fallback).
    fp16_operands: bool = True
    # Use the measured per-GPU config tables (plan/tables/); off: every family's default config.
    tuned_tables: bool = True
    # Measure each block's kernel configs for its own shape while it compiles (seconds per new
    # block, kept in Inductor's cache directory so a second process measures nothing). None:
    # on under mode="max-autotune", off otherwise.
    autotune: Optional[bool] = None
    # Lower blocks on CPU tensors to the GPU kernel plans, run by Triton's interpreter
    # (TRITON_INTERPRET=1): how the CPU tests run the GPU path. Off: CPU blocks run the PyTorch
    # reference inside the fused op.
    cpu_kernels: bool = False
    # Graphs whose inputs require grad (training, or a forward without torch.no_grad()): fuse
    # their blocks' attention before AOTAutograd (lower/training.py): projections, norm and RoPE
    # stay ATen ops that autograd differentiates, the attention core becomes one differentiable
    # op with a FlashAttention-style backward. Only backend="inductor_gqa" can (install()'s
    # joint-graph pass sees the backward already derived). On by default since the five models'
    # training steps measured faster than stock (docs/decisions.md);
    # False leaves such graphs to stock Inductor.
    fuse_with_grad: bool = True
    # The core of a block with gradients: "auto" takes the library's fused attention
    # (F.scaled_dot_product_attention, its own backward) where it computes the same thing
    # (16-bit, no mask tensor, window or softcap, no probabilities returned, head_dim 64 or
    # 128, on a GPU, more than plans.SHORT_SEQ tokens), at SHORT_SEQ tokens or fewer its
    # forward with our backward where the grid is large, and our kernels elsewhere; "kernels":
    # ours everywhere.
    training_core: str = "auto"

    def __post_init__(self):
        if self.training_core not in ("auto", "kernels"):
            raise ValueError(f"inductor_gqa: training_core must be 'auto' or 'kernels', not "
                             f"{self.training_core!r}")

def as_options(value) -> "Options | None":
    """Options from an Options, a dict of its fields (``torch.compile(..., options={...})``), or
    None; anything else, or an unknown field, is an error rather than silently ignored."""
    options, inductor = split_options(value, inductor_ok=False)
    return options


def split_options(value, inductor_ok: bool = True) -> "tuple[Options | None, dict]":
    """(our Options, stock Inductor's options) from what ``options=`` was given: an Options, or
    a dict whose keys are ``Options`` fields (ours keep their names) or, with ``inductor_ok``,
    stock Inductor's options as ``backend="inductor"`` takes them (``"max_autotune"``,
    ``"triton.cudagraphs"``: ``torch._inductor.list_options()``). A name that is neither is an
    error that lists both."""
    if value is None or isinstance(value, Options):
        return value, {}
    if not isinstance(value, dict):
        raise TypeError(f"inductor_gqa: options must be an Options or a dict, not {type(value)}")
    ours = {f.name for f in dataclasses.fields(Options)}
    stock = set(_inductor_options()) if inductor_ok else set()
    unknown = sorted(set(value) - ours - stock)
    if unknown:
        where = (" or a stock Inductor option (torch._inductor.list_options(): "
                 "max_autotune, triton.cudagraphs, ...)" if inductor_ok else "")
        raise TypeError(f"inductor_gqa: unknown option(s) {unknown}: neither an "
                        f"inductor_gqa.Options field {sorted(ours)}{where}")
    mine = {k: v for k, v in value.items() if k in ours}
    return (Options(**mine) if mine else None), {k: v for k, v in value.items() if k not in ours}


def _inductor_options() -> list:
    from torch._inductor import list_options
    return list_options()
