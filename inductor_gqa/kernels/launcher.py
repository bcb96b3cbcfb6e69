"""Launch a compiled Triton kernel again without Triton's per-call argument binding.

``kernel[grid](*args, **kwargs)`` binds every argument, specializes it (dtype and 16-byte
alignment of each tensor, ints equal to 1 or divisible by 16, constexpr values), hashes the
result into the kernel cache and only then launches: about 35-45 us of host time per launch on
the H200 machine (perf/experiments/host_breakdown.py), eight launches per W075 block, which
without CUDA graphs is host-bound. ``launch`` keys each call on a specialization at least as fine
as Triton's (every constexpr, option and keyword by value; per positional argument its type, a
tensor's dtype and alignment, an int's value class), takes the first call through Triton, keeps
the compiled kernel it returns, and later calls with the same key go straight to that kernel's
launcher with the arguments in signature order. A call whose arguments it does not know how to
key (tensor descriptors, anything unusual) always goes through Triton.

Off under the interpreter and with ``INDUCTOR_GQA_FAST_LAUNCH=0``.
"""

from __future__ import annotations

import os

import torch

_COMPILED: dict = {}
_INT32 = (-2 ** 31, 2 ** 31)


def enabled() -> bool:
    return (os.environ.get("INDUCTOR_GQA_FAST_LAUNCH", "1") != "0"
            and os.environ.get("TRITON_INTERPRET", "0") != "1")


def _arg_key(arg, constexpr: bool):
    """One positional argument's part of the key, or None when it cannot be keyed."""
    if constexpr:
        return ("c", type(arg), arg) if _hashable(arg) else None
    if isinstance(arg, torch.Tensor):
        return ("t", arg.dtype, arg.device, arg.data_ptr() % 16 == 0)
    if arg is None or isinstance(arg, bool):
        return ("v", arg)
    if isinstance(arg, int):
        return ("i", arg == 1, arg % 16 == 0, _INT32[0] <= arg < _INT32[1], 0 <= arg < 2 ** 63)
    if isinstance(arg, float):
        return ("f",)
    return None


def _hashable(v) -> bool:
    try:
        hash(v)
    except TypeError:
        return False
    return True


def key(kernel, args, kwargs):
    """The cache key of a launch, or None where ``launch`` must leave it to Triton."""
    params = getattr(kernel, "params", None)
    if params is None or len(args) > len(params):
        return None
    parts = [id(kernel), torch.cuda.current_device()]
    for p, a in zip(params, args):
        k = _arg_key(a, p.is_constexpr)
        if k is None:
            return None
        parts.append(k)
    for name in sorted(kwargs):
        v = kwargs[name]
        if isinstance(v, torch.Tensor):
            k = _arg_key(v, False)
        else:
            k = ("k", type(v), v) if _hashable(v) else None
        if k is None:
            return None
        parts.append((name, k))
    return tuple(parts)


def launch(kernel, grid, /, *args, **kwargs):
    """``kernel[grid](*args, **kwargs)``, through the kept compiled kernel where the key has been
    seen (see the module docstring). ``grid``: a tuple of up to three ints."""
    k = key(kernel, args, kwargs) if enabled() else None
    if k is None:
        return kernel[grid](*args, **kwargs)
    hit = _COMPILED.get(k)
    if hit is None:
        compiled = kernel[grid](*args, **kwargs)
        if hasattr(compiled, "result"):     # an asynchronous compile's future
            compiled = compiled.result()
        if all(hasattr(compiled, a) for a in ("run", "function", "packed_metadata")):
            names = {p.name for p in kernel.params}
            if all(n in names for n in kwargs if isinstance(kwargs[n], torch.Tensor)):
                tail = tuple((p.name, p.default) for p in kernel.params[len(args):])
                _COMPILED[k] = (compiled, tail)
        return compiled
    compiled, tail = hit
    full = args + tuple(kwargs[n] if n in kwargs else d for n, d in tail)
    g = tuple(grid) + (1,) * (3 - len(grid))
    compiled[g](*full)
    return compiled
