"""Programmatic dependent launch (PDL): a kernel's launch overlaps the end of the one before it.

With ``launch_pdl=True`` the driver may start a kernel while its predecessor in the stream is
still running; the kernel must then wait (``griddepcontrol.wait``) before it touches memory, which
returns once the predecessor has finished and its writes are visible. Every kernel of the block
does that first thing (``wait_for_predecessor``). Its successor is launched when all of its
blocks have exited (PDL 1) or, with PDL 2, as soon as all of them have started
(``griddepcontrol.launch_dependents``): the successor's blocks are then placed on the SMs while
this kernel runs, and still wait for it to finish. What is saved is the launch and block
scheduling between kernels: on the H200, 0.2-0.3 us per kernel boundary under CUDA-graph replay
with PDL 2 (perf/results/nvidia-h200/runs/profiles/README.md, PDL chain); in the block, PDL 2
made 541x1 3 us slower (its blocks placed early, beside the running kernel's).

The ``PDL`` constexpr and the ``launch_pdl`` option always travel together (``launch_options``):
a kernel launched early without the wait could read its inputs before they are written.
Hopper (sm_90) and later only; off in the CPU interpreter and with ``INDUCTOR_GQA_PDL=0``
(``INDUCTOR_GQA_PDL=2`` for the early trigger).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .host import capability


@triton.jit
def wait_for_predecessor(PDL: tl.constexpr):
    if PDL:
        gdc_wait()
    if PDL == 2:
        gdc_launch_dependents()


_MODES: dict = {}


def mode(device: torch.device) -> int:
    """0 (off), 1 or 2 (see above); read at every launch (the switch may change between
    calls), the answer kept per switch values and device (a few us of host time per launch
    otherwise)."""
    env = os.environ.get("INDUCTOR_GQA_PDL", "1")
    interp = os.environ.get("TRITON_INTERPRET", "0")
    key = (env, interp, device)
    m = _MODES.get(key)
    if m is None:
        if env not in ("0", "1", "2"):
            raise ValueError(f"INDUCTOR_GQA_PDL must be 0, 1 or 2, not {env!r}")
        if env == "0" or device.type != "cuda" or interp == "1":
            m = 0
        else:
            m = int(env) if capability(device) >= (9, 0) and torch.version.hip is None else 0
        _MODES[key] = m
    return m


_OPTIONS = ({}, {"PDL": 1, "launch_pdl": True}, {"PDL": 2, "launch_pdl": True})


def launch_options(device: torch.device) -> dict:
    """Keyword arguments for a Triton launch of a kernel with a ``PDL`` constexpr."""
    return _OPTIONS[mode(device)]
