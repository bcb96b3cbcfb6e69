"""Integer helpers for the launchers' host code, the config flag they share, the device's
compute capability and SM count, and the probabilities' row alignment the attention launchers
state.

``triton.cdiv`` and ``triton.next_power_of_2`` are Triton constexpr functions: called from Python
they pass through a wrapper that unwraps every argument (about 2-3 us a call on a 2-core CPU,
20-odd calls per attention block); these are the plain arithmetic.
"""

import functools
import os

import torch


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple:
    return torch.cuda.get_device_capability(index)


def capability(device: torch.device) -> tuple:
    """``torch.cuda.get_device_capability`` of a CUDA device, asked once per device (the torch
    call costs ~7 us of host time, several per block call)."""
    return _capability(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def sm_count(device) -> int:
    """The device's streaming multiprocessors (persistent kernels launch one program each),
    asked once per device."""
    return torch.cuda.get_device_properties(device).multi_processor_count


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def heads_per_program(cfg) -> int:
    """GP from a config's "gp<N>" flag (N query heads of one KV head per row tile: flash.py's
    and probs_staged.py's packed configs); 1 without it."""
    return next((int(f[2:]) for f in cfg[4:] if isinstance(f, str) and f.startswith("gp")), 1)


def row4(probs, seq) -> bool:
    """Whether the probabilities' row stride and S are multiples of 4 that Triton's launcher
    does not mark (it marks multiples of 16): the attention kernels then say so (their ROW4
    switch rewrites both as (x // 4) * 4, the same values in a form the compiler's alignment
    analysis keeps), so that with the buffer 16-byte aligned (the launcher checks that) every
    row starts 16-byte aligned and the column mask is constant over four columns:
    the probabilities go out as 16-byte stores instead of 4-byte ones. H200, staged ping-pong
    at 452x16: 109.2 -> 96.8 us with it (448x16: 92.5; docs/kernels.md note 55).
    INDUCTOR_GQA_ROW4=0 turns it off."""
    sp = probs.stride(2)
    return (sp % 4 == 0 and seq % 4 == 0 and (sp % 16 != 0 or seq % 16 != 0)
            and os.environ.get("INDUCTOR_GQA_ROW4", "1") != "0")
