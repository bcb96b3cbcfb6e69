"""fp16 copies of float32 matrices with one exact power-of-two scale per row, in one launch.

For the projection GEMMs of float32 blocks under "high" (TF32 allowed): fp16 keeps TF32's 10-bit
significand and cuBLAS multiplies fp16 at twice the TF32 rate; its range is what differs. Scaling
each row by 2^e so that its largest magnitude lands in [2^13, 2^14) keeps every row in range
whatever its magnitude, and the scale is exact, so the GEMM result is undone exactly by the
reciprocals ``inv`` of the two operands' row scales (the norm/RoPE launch applies them):

    x @ w^T = diag(inv_x) (x16 @ w16^T) diag(inv_w)

Up to four matrices with the same row length share the launch (one flat grid), and it may also
build the RoPE tables (``rope_table.TableJob``). A row of
zeros gets scale 1; a row holding inf or NaN keeps them (the result is inf/NaN, as in eager).
The launch may also clear the fp16 plans' range flag (``zero``), which saves the plan a launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl
from .host import cdiv, next_pow2
from .rope_table import table_rows

TARGET_EXP = 13         # row maxima land in [2^13, 2^14): fp16's largest finite value is ~2^16
MAX_COLS = 16384


def out16_target(k: int) -> int:
    """The target exponent T for GEMM operands whose product is stored as fp16 (f16proj16): every
    product |x16 @ w16^T| is at most K * 2^(T+1) * 2^(T+1) <= 2^15, half of fp16's range, so no
    output (nor a partial sum) can overflow. K = 1024 gives T = 1 (row maxima in [2, 4)); values
    of a row below fp16's normal range then keep an absolute error of 2^-25, far below TF32's
    2^-11 of the row's maximum."""
    return (13 - (k - 1).bit_length()) // 2


@triton.jit
def _rows(x_ptr, y_ptr, inv_ptr, n_rows, K, pid, ROWS: tl.constexpr, BLOCK_K: tl.constexpr,
          TARGET: tl.constexpr):
    rows = pid * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_K)
    m2 = (rows < n_rows)[:, None] & (cols < K)[None, :]
    offs = rows[:, None].to(tl.int64) * K + cols[None, :]
    x = tl.load(x_ptr + offs, mask=m2, other=0.0)
    amax = tl.max(tl.abs(x), 1)
    # floor(log2(amax)) from the exponent field; shifts are clamped to +-126 so that both 2^shift
    # and 2^-shift are normal floats (a row whose maximum is subnormal in float32 then stays
    # short of the target, still exactly scaled); inf/NaN rows read exponent 128: scale 2^-115
    e = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    shift = tl.minimum(tl.maximum(TARGET - e, -126), 126)
    shift = tl.where(amax == 0.0, 0, shift)
    scale = ((shift + 127) << 23).to(tl.float32, bitcast=True)        # 2^shift, exact
    inv = ((127 - shift) << 23).to(tl.float32, bitcast=True)          # 2^-shift
    tl.store(y_ptr + offs, (x * scale[:, None]).to(tl.float16), mask=m2)
    tl.store(inv_ptr + rows, inv, mask=rows < n_rows)


@triton.jit
def scale_rows_kernel(x0, y0, i0, n0, x1, y1, i1, n1, x2, y2, i2, n2, x3, y3, i3, n3, K, zero_ptr,
                      e1, e2, e3, e4,
                      inv_ptr, pos_ptr, cos_ptr, sin_ptr, n_tok, S, pos_b, pos_s,
                      ROWS: tl.constexpr, BLOCK_K: tl.constexpr, TARGET: tl.constexpr,
                      ZERO: tl.constexpr, TABLE: tl.constexpr = False, R: tl.constexpr = 0,
                      BLOCK_H: tl.constexpr = 1, BLOCK_T: tl.constexpr = 1,
                      INTERLEAVED: tl.constexpr = False, LIBDEVICE: tl.constexpr = False,
                      PDL: tl.constexpr = 0):
    pdl.wait_for_predecessor(PDL)
    # one flat grid: programs [0, e1) scale matrix 0, [e1, e2) matrix 1, ... and, with TABLE,
    # the programs from e4 on build the RoPE tables (rope_table.table_rows): one launch fewer
    # (a 2-D grid sized by the longest matrix left most programs idle)
    pid = tl.program_id(0)
    if ZERO:
        if pid == 0:
            tl.store(zero_ptr, 0)
    if pid < e1:
        _rows(x0, y0, i0, n0, K, pid, ROWS, BLOCK_K, TARGET)
    elif pid < e2:
        _rows(x1, y1, i1, n1, K, pid - e1, ROWS, BLOCK_K, TARGET)
    elif pid < e3:
        _rows(x2, y2, i2, n2, K, pid - e2, ROWS, BLOCK_K, TARGET)
    elif pid < e4:
        _rows(x3, y3, i3, n3, K, pid - e3, ROWS, BLOCK_K, TARGET)
    elif TABLE:
        table_rows(inv_ptr, pos_ptr, cos_ptr, sin_ptr, n_tok, S, pos_b, pos_s, pid - e4,
                   R, BLOCK_H, BLOCK_T, INTERLEAVED, LIBDEVICE)


def scale_rows(mats, outs=None, zero=None, table=None, target=TARGET_EXP, rows=None,
               num_warps=None):
    """[x (M, K) float32 contiguous, ...] (one to four, same K) -> [(x16, inv), ...]: fp16 copies
    and the float32 reciprocals of their row scales (x == inv[:, None] * x16, up to fp16
    rounding). ``outs``: preallocated (x16, inv) per matrix, or None to allocate (contiguous;
    e.g. row blocks of one buffer, so that several weights become one GEMM operand). ``zero``:
    a one-element int32 tensor the launch sets to 0 (the fp16 plans' range flag). ``table``: a
    ``rope_table.TableJob`` whose RoPE tables the same launch builds. ``target``: the exponent
    each row's maximum is scaled to (``TARGET_EXP``, or ``out16_target`` for fp16 products).
    ``rows`` (rows per program) and ``num_warps``: the launch shape, for benchmarks."""
    if not 1 <= len(mats) <= 4:
        raise ValueError("scale_rows: one to four matrices")
    k = mats[0].shape[1]
    for m in mats:
        if m.dim() != 2 or m.shape[1] != k or m.dtype != torch.float32 or not m.is_contiguous():
            raise ValueError("scale_rows: float32 contiguous [rows, K] matrices with the same K")
    if k > MAX_COLS:
        raise ValueError(f"scale_rows: rows longer than {MAX_COLS}")
    outs = [o if o is not None else
            (torch.empty_like(m, dtype=torch.float16),
             torch.empty(m.shape[0], device=m.device, dtype=torch.float32))
            for m, o in zip(mats, outs or [None] * len(mats))]
    for m, (y, inv) in zip(mats, outs):
        if (y.shape != m.shape or y.dtype != torch.float16 or not y.is_contiguous()
                or inv.shape != m.shape[:1] or inv.dtype != torch.float32):
            raise ValueError("scale_rows: outs must match the matrices (fp16 copy, fp32 [rows])")
    block_k = next_pow2(k)
    rows = rows or max(1, 4096 // block_k)
    if zero is not None and (zero.dtype != torch.int32 or zero.numel() != 1
                             or zero.device != mats[0].device):
        raise ValueError("scale_rows: zero must be a one-element int32 tensor on the device")
    args = []
    ends = []
    for i in range(4):
        j = min(i, len(mats) - 1)
        n = mats[i].shape[0] if i < len(mats) else 0
        args += [mats[j], outs[j][0], outs[j][1], n]
        ends.append((ends[-1] if ends else 0) + cdiv(n, rows))
    if table is not None:
        targs, tconsts, tprog = table.args, dict(table.consts, TABLE=True), table.programs
    else:
        # no tables: placeholders for the four pointers and four integers TABLE=False never reads
        targs, tconsts, tprog = (outs[0][1],) * 4 + (0, 1, 0, 0), {}, 0
    grid = (ends[-1] + tprog,)
    scale_rows_kernel[grid](*args, k, zero if zero is not None else outs[0][1], *ends, *targs,
                            ROWS=rows, BLOCK_K=block_k, TARGET=int(target), ZERO=zero is not None,
                            **tconsts, num_warps=num_warps or (8 if block_k >= 4096 else 4),
                            **pdl.launch_options(mats[0].device))
    return outs
