"""Tolerances for whole-model results, set against stock Inductor's own deviation from eager.

A whole model compiled by Inductor does not compute eager's numbers bit for bit (its kernels sum
in another order, fuse casts, and through Adam the rounding grows step by step), and how far it
strays depends on the machine. A fixed limit is therefore either loose or, on some machine,
tighter than the compiler itself. So each quantity (a loss, a step's gradients, the weights
after some steps) has a floor under which it always passes; above it, the same computation is run
through stock ``backend="inductor"`` and ours must stay within ``MARGIN`` times stock's deviation
from eager. A wrong fusion misses by orders of magnitude, rounding by a small factor.

bf16 results are judged the same way against a float32 run: ours may stray from float32 by
``MARGIN`` times what bf16 eager strays.
"""

from __future__ import annotations

import os
from typing import Callable, Mapping

import torch

MARGIN = 3.0        # ours may deviate from eager up to this many times stock's deviation
# set to 1 to measure stock and judge against it even where ours is under the floor
ALWAYS_STOCK = os.environ.get("INDUCTOR_GQA_TESTS_ALWAYS_STOCK") == "1"


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| over max |ref| (float32)."""
    out, ref = out.detach().float(), ref.detach().float()
    return ((out - ref).abs().max() / ref.abs().max().clamp_min(1e-12)).item()


def worst_rel_err(got: Mapping[str, torch.Tensor], ref: Mapping[str, torch.Tensor]):
    """(error, name): the largest of the tensors' errors, each relative to its own largest
    element (a gradient's scale)."""
    assert got.keys() == ref.keys(), sorted(set(got) ^ set(ref))
    return max(((rel_err(got[k], ref[k]), k) for k in ref), default=(0.0, ""))


def judge(ours: Mapping[str, float], floors: Mapping[str, float],
          stock: Callable[[], Mapping[str, float]], margin: float = MARGIN,
          notes: Mapping[str, str] | None = None) -> None:
    """Assert each deviation ``ours[q]`` from eager is at most ``floors[q]``, or else at most
    ``margin`` times stock's deviation of the same quantity; ``stock()`` computes those (only
    called when some quantity is above its floor)."""
    above = [q for q in ours if ours[q] > floors[q] or ALWAYS_STOCK]
    if not above:
        return
    theirs = stock()
    notes = notes or {}
    print("deviation from eager, ours / stock Inductor:",
          "; ".join(f"{q}: {ours[q]:.2e} / {theirs[q]:.2e}" for q in ours))
    failed = [f"{q}: ours {ours[q]:.2e} ({notes.get(q, '')}), stock {theirs[q]:.2e}, limit "
              f"{max(floors[q], margin * theirs[q]):.2e}"
              for q in above if ours[q] > max(floors[q], margin * theirs[q])]
    assert not failed, "deviation from eager beyond stock Inductor's: " + "; ".join(failed)


def judge_bf16(ours: torch.Tensor, eager16: torch.Tensor, ref32: torch.Tensor,
               margin: float = MARGIN) -> None:
    """A bf16 result against a float32 run of the same model: ours may stray from float32 at
    most ``margin`` times as far as bf16 eager does (largest and mean error alike)."""
    assert torch.isfinite(ours.float()).all()
    d_ours = (ours.float() - ref32.float()).abs()
    d_eager = (eager16.float() - ref32.float()).abs()
    for what, a, b in (("largest", d_ours.max(), d_eager.max()),
                       ("mean", d_ours.mean(), d_eager.mean())):
        assert a <= margin * b, (f"{what} error from float32: ours {a.item():.3e}, bf16 eager "
                                 f"{b.item():.3e}")
