"""One way to launch a kernel: as Inductor's own user-defined Triton kernel call.

``launch(kernel, grid, outputs, ...)`` calls the ``triton_kernel_wrapper_functional`` higher-order
op with the kernel's arguments by name. Eagerly (the CPU interpreter tests) it clones the
``outputs``, runs the kernel and returns the clones; traced (``lower/splice.py`` traces a plan
into the FX graph while Inductor compiles) it becomes one graph node that Inductor compiles and
launches from its generated code like its own kernels, in the Python wrapper, the C++ wrapper and
AOTInductor alike, and whose clones its reinplacing pass removes.

Naming the written tensors here, instead of letting the op infer them from the kernel's IR, keeps
the graph exact on every machine (the inference needs a GPU driver and falls back to "every
tensor is written"). A kernel must therefore write only the tensors it names in ``outputs``, and
only whole tensors: a written view would leave its base stale in the functional graph.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from typing import Sequence

import torch
import triton
from torch._higher_order_ops.triton_kernel_wrap import (kernel_side_table,
                                                         triton_kernel_wrapper_functional)

_recorder = None     # set by ``recording()``: launches are recorded instead of run
_direct = False      # set by ``direct_launches()``: kernels run in place, no higher-order op

_GRAPHABLE = (torch.Tensor, int, float, bool, str, torch.SymInt, torch.SymFloat, torch.SymBool,
              torch.dtype)


def interpreting() -> bool:
    """Whether Triton kernels run in its CPU interpreter (the tests): a few kernels then upcast
    16-bit operands, whose interpreted dot products are not exact."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.lru_cache(maxsize=None)
def _configured(kernel, num_warps: int, num_stages: int):
    """The kernel with its launch shape as a one-config autotuner: how a user-defined kernel
    carries num_warps / num_stages into Inductor. Cached, so that every launch of the same
    (kernel, shape) has one side-table entry and Inductor defines the kernel once."""
    return triton.autotune(configs=[triton.Config({}, num_warps=num_warps,
                                                  num_stages=num_stages)], key=[])(kernel)


def launch(kernel, grid: Sequence, outputs: Sequence[str], *, num_warps: int = 4,
           num_stages: int = 2, tma: dict | None = None, **args) -> tuple:
    """Run ``kernel`` on ``grid`` with ``args`` (every parameter by name; tensors, ints, floats,
    SymInts and constexpr values); returns the new values of the tensors named in ``outputs``,
    in that order. ``tma``: {name: block shape} for parameters that are tensor descriptors: pass
    the tensor itself as the argument (the descriptor is made where the kernel is launched)."""
    missing = [n for n in outputs if not isinstance(args.get(n), torch.Tensor)]
    if missing:
        raise ValueError(f"launch {kernel.__name__}: outputs {missing} are not tensor arguments")
    args = _with_defaults(kernel, args)
    if _recorder is not None:
        _recorder.append(Launch(kernel, tuple(grid), dict(args), num_warps, num_stages,
                                dict(tma or {}), tuple(outputs)))
        return tuple(torch.empty_like(args[n]) for n in outputs)
    if _direct:
        run_args = dict(args)
        for name, shape in (tma or {}).items():
            from triton.tools.tensor_descriptor import TensorDescriptor
            run_args[name] = TensorDescriptor.from_tensor(args[name], list(shape))
        grid3 = tuple(grid) + (1,) * (3 - len(grid))
        _configured(kernel, num_warps, num_stages)[grid3](**run_args)
        return tuple(args[n] for n in outputs)
    graphable = {k: v for k, v in args.items() if isinstance(v, _GRAPHABLE) or v is None}
    constants = {k: v for k, v in args.items() if k not in graphable}
    grid = tuple(grid) + (1,) * (3 - len(grid))
    result = triton_kernel_wrapper_functional(
        kernel_idx=kernel_side_table.add_kernel(_configured(kernel, num_warps, num_stages)),
        constant_args_idx=kernel_side_table.add_constant_args(constants),
        grid=[grid],
        tma_descriptor_metadata={n: ("stable", (list(shape),)) for n, shape in (tma or {}).items()},
        kwargs=graphable,
        tensors_to_clone=list(outputs))
    return tuple(result[n] for n in outputs)


def _with_defaults(kernel, args: dict) -> dict:
    """``args`` with every parameter the launch leaves to its default filled in: Inductor's
    write analysis compiles the kernel from the arguments it is given and, short of one, takes
    every tensor argument as written (a graph input among them then reads as mutated)."""
    params = getattr(kernel, "params", None)
    if params is None:
        return args
    extra = {p.name: p.default for p in params if p.name not in args and p.has_default}
    return {**args, **extra} if extra else args


@dataclasses.dataclass
class Launch:
    """One recorded launch (``recording``)."""
    kernel: object
    grid: tuple
    args: dict
    num_warps: int
    num_stages: int
    tma: dict
    outputs: tuple = ()


@contextlib.contextmanager
def recording():
    """Record the launches made inside (nothing runs): what tests/kernels/sm90_compile.py
    compiles for the GPU, for every launch the plans make."""
    global _recorder
    previous, _recorder = _recorder, []
    try:
        yield _recorder
    finally:
        _recorder = previous


@contextlib.contextmanager
def direct_launches():
    """Run kernels directly, writing their outputs in place (no higher-order op, no clones):
    for timing a plan eagerly (``tune.py``)."""
    global _direct
    previous, _direct = _direct, True
    try:
        yield
    finally:
        _direct = previous


def cdiv(a, b):
    """Ceiling division for ints and SymInts (no guard)."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def static_int(v):
    """``v`` as an int when it is one (or a SymInt with a constant value), else None: sizes that
    are symbolic under dynamic shapes choose nothing that would need a guard."""
    if isinstance(v, int):
        return v
    if isinstance(v, torch.SymInt):
        expr = v.node.expr
        if expr.is_number:
            return int(expr)
    return None
