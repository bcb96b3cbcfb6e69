"""RoPE cos/sin tables from ``inv_freq`` and ``position_ids``, in one launch.

The eager model computes the angles as a float32 outer product (``inv_freq @ position_ids``, an
exact product per element), duplicates or interleaves them to the rotary width, and takes
``cos``/``sin`` rounded to the activation dtype. This kernel does exactly that per token, once,
for the [B, S, R] tables the norm/RoPE epilogue reads: one launch instead of the handful of small
kernels the same code becomes in the graph, and the epilogue stays a pure load (computing the
angles per head row inside it measured slower on the H200).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import cdiv, launch, next_pow2

try:  # accurate cos/sin for angles of thousands of radians (tl.cos may be an approximation)
    from triton.language.extra import libdevice
except Exception:  # pragma: no cover
    libdevice = None


@triton.jit
def rope_table_kernel(inv_ptr, pos_ptr, cos_ptr, sin_ptr, n_tok, S, pos_b, pos_s,
                      R: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr,
                      INTERLEAVED: tl.constexpr, LIBDEVICE: tl.constexpr):
    table_rows(inv_ptr, pos_ptr, cos_ptr, sin_ptr, n_tok, S, pos_b, pos_s, tl.program_id(0),
               R, BLOCK_H, BLOCK_T, INTERLEAVED, LIBDEVICE)


@triton.jit
def table_rows(inv_ptr, pos_ptr, cos_ptr, sin_ptr, n_tok, S, pos_b, pos_s, pid,
               R: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr,
               INTERLEAVED: tl.constexpr, LIBDEVICE: tl.constexpr):
    """BLOCK_T tokens' rows of the tables (program ``pid``); other launches may host these
    programs (fp16_rows.scale_rows does, one launch fewer)."""
    # each frequency's cos/sin is computed once and stored to its two columns
    toks = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    i = tl.arange(0, BLOCK_H)
    t_ok = toks < n_tok
    i_ok = i < R // 2
    bi = toks // S
    si = toks - bi * S
    pos = tl.load(pos_ptr + bi.to(tl.int64) * pos_b + si.to(tl.int64) * pos_s, mask=t_ok,
                  other=0).to(tl.float32)
    f = tl.load(inv_ptr + i, mask=i_ok, other=0.0)
    ang = pos[:, None] * f[None, :]
    if LIBDEVICE:
        c = libdevice.cos(ang)
        s = libdevice.sin(ang)
    else:
        c = tl.cos(ang)
        s = tl.sin(ang)
    c = c.to(cos_ptr.dtype.element_ty)
    s = s.to(sin_ptr.dtype.element_ty)
    if INTERLEAVED:
        col0 = 2 * i                    # (f0, f0, f1, f1, ...)
        col1 = 2 * i + 1
    else:
        col0 = i                        # cat((f, f), -1)
        col1 = i + R // 2
    row = toks[:, None].to(tl.int64) * R
    m = t_ok[:, None] & i_ok[None, :]
    tl.store(cos_ptr + row + col0[None, :], c, mask=m)
    tl.store(cos_ptr + row + col1[None, :], c, mask=m)
    tl.store(sin_ptr + row + col0[None, :], s, mask=m)
    tl.store(sin_ptr + row + col1[None, :], s, mask=m)


class TableSpec:
    """The tables' inputs, buffers and launch constants: ``launch()`` builds them alone, or
    another kernel hosts ``programs`` more programs that call ``table_rows`` (fp16_rows)."""

    def __init__(self, inv_freq, position_ids, rotary_dim, interleaved, dtype, interpret=False):
        _check(inv_freq, position_ids, rotary_dim)
        self.inv = inv_freq.reshape(-1)
        self.positions = position_ids
        self.rotary_dim = rotary_dim
        self.dtype = dtype
        b, s = position_ids.shape
        self.n_tok = b * s
        block_h = next_pow2(rotary_dim // 2)
        block_t = max(1, 256 // block_h)    # small programs: short sequences still fill the GPU
        self.programs = cdiv(self.n_tok, block_t)
        self.consts = dict(R=rotary_dim, BLOCK_H=block_h, BLOCK_T=block_t,
                           INTERLEAVED=bool(interleaved),
                           LIBDEVICE=(not interpret) and libdevice is not None)

    def buffers(self):
        b, s = self.positions.shape
        cos = torch.empty((b, s, self.rotary_dim), device=self.inv.device, dtype=self.dtype)
        return cos, torch.empty_like(cos)

    def scalars(self) -> dict:
        return dict(n_tok=self.n_tok, S=self.positions.shape[1],
                    pos_b=self.positions.stride(0), pos_s=self.positions.stride(1))

    def launch(self):
        cos, sin = self.buffers()
        return launch(rope_table_kernel, (self.programs,), ("cos_ptr", "sin_ptr"), num_warps=4,
                      num_stages=1, inv_ptr=self.inv, pos_ptr=self.positions, cos_ptr=cos,
                      sin_ptr=sin, **self.scalars(), **self.consts)


def rope_tables(inv_freq: torch.Tensor, position_ids: torch.Tensor, rotary_dim: int,
                interleaved: bool, dtype: torch.dtype, interpret: bool = False):
    """cos, sin [B, S, rotary_dim] in ``dtype`` for float32 ``inv_freq`` [rotary_dim / 2] and
    integer ``position_ids`` [B, S] (any strides, broadcast views included)."""
    return TableSpec(inv_freq, position_ids, rotary_dim, interleaved, dtype, interpret).launch()


def _check(inv_freq, position_ids, rotary_dim):
    if (inv_freq.dtype != torch.float32 or rotary_dim % 2
            or inv_freq.numel() * 2 != rotary_dim):
        raise ValueError(f"rope_tables: inv_freq must be float32 [{rotary_dim // 2}], got "
                         f"{inv_freq.dtype} {tuple(inv_freq.shape)}")
    if position_ids.dim() != 2 or position_ids.dtype.is_floating_point:
        raise ValueError(f"rope_tables: position_ids must be an integer [B, S] tensor, got "
                         f"{position_ids.dtype} {tuple(position_ids.shape)}")
