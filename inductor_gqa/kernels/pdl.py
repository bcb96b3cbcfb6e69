"""Programmatic dependent launch (PDL): a kernel's launch overlaps the end of the one before it.

With ``launch_pdl=True`` the driver may start a kernel while its predecessor in the stream is
still running; the kernel must then wait (``griddepcontrol.wait``) before it touches memory, which
returns once the predecessor has finished and its writes are visible. Every kernel of the block
does that first thing (``wait_for_predecessor``), then lets its own successor launch early
(``griddepcontrol.launch_dependents``; the successor still waits for this one to finish). What
is saved is the launch and block scheduling between kernels: on the H200, 0.2-0.3 us per kernel
boundary under CUDA-graph replay (perf/results/nvidia-h200/runs/profiles/README.md, PDL chain).

The ``PDL`` constexpr and the ``launch_pdl`` option always travel together (``launch_options``):
a kernel launched early without the wait could read its inputs before they are written.
Hopper (sm_90) and later only; off in the CPU interpreter and with ``INDUCTOR_GQA_PDL=0``.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def wait_for_predecessor(PDL: tl.constexpr):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@functools.lru_cache(maxsize=None)
def _device_supports(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (9, 0) and torch.version.hip is None


def enabled(device: torch.device) -> bool:
    """Read at every launch (the switch may change between calls)."""
    if device.type != "cuda" or os.environ.get("INDUCTOR_GQA_PDL", "1") == "0":
        return False
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        return False
    return _device_supports(device.index if device.index is not None
                            else torch.cuda.current_device())


_ON = {"PDL": True, "launch_pdl": True}
_OFF: dict = {}


def launch_options(device: torch.device) -> dict:
    """Keyword arguments for a Triton launch of a kernel with a ``PDL`` constexpr."""
    return _ON if enabled(device) else _OFF
