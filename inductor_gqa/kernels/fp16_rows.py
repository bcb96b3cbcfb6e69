"""fp16 copies of float32 matrices with one exact power-of-two scale per row, in one launch.

For the projection GEMMs of float32 blocks under "high" (TF32 allowed): fp16 keeps TF32's 10-bit
significand and cuBLAS multiplies fp16 at twice the TF32 rate; its range is what differs. Scaling
each row by 2^e so that its largest magnitude lands in [2^13, 2^14) keeps every row in range
whatever its magnitude, and the scale is exact, so the GEMM result is undone exactly by the
reciprocals ``inv`` of the two operands' row scales (the norm/RoPE launch applies them):

    x @ w^T = diag(inv_x) (x16 @ w16^T) diag(inv_w)

x and the three projection weights share the launch (one flat grid; the weights become row
blocks of one fp16 operand, so q, k and v are one GEMM), and it may also build the RoPE tables
(``rope_table``). A row of zeros gets scale 1; a row holding inf or NaN keeps them (the result is
inf/NaN, as in eager). The launch also clears the fp16 plan's range flag, which saves the plan a
launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import cdiv, launch, next_pow2
from .rope_table import table_rows

TARGET_EXP = 13         # row maxima land in [2^13, 2^14): fp16's largest finite value is ~2^16
MAX_COLS = 16384


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
def scale_rows_kernel(X, X16, XINV, n_x, W0, W1, W2, n0, n1, n2, W16, WINV, K, FLAG,
                      e0, e1, e2, e3,
                      inv_ptr, pos_ptr, cos_ptr, sin_ptr, n_tok, S, pos_b, pos_s,
                      ROWS: tl.constexpr, BLOCK_K: tl.constexpr, TARGET: tl.constexpr,
                      TABLE: tl.constexpr = False, R: tl.constexpr = 0,
                      BLOCK_H: tl.constexpr = 1, BLOCK_T: tl.constexpr = 1,
                      INTERLEAVED: tl.constexpr = False, LIBDEVICE: tl.constexpr = False):
    # one flat grid: programs [0, e0) scale x, [e0, e1) the first weight, [e1, e2) the second,
    # [e2, e3) the third (row blocks of W16), and with TABLE the programs from e3 on build the
    # RoPE tables (rope_table.table_rows): one launch for all of it
    pid = tl.program_id(0)
    if pid == 0:
        tl.store(FLAG, 0)
    if pid < e0:
        _rows(X, X16, XINV, n_x, K, pid, ROWS, BLOCK_K, TARGET)
    elif pid < e1:
        _rows(W0, W16, WINV, n0, K, pid - e0, ROWS, BLOCK_K, TARGET)
    elif pid < e2:
        _rows(W1, W16 + n0 * K, WINV + n0, n1, K, pid - e1, ROWS, BLOCK_K, TARGET)
    elif pid < e3:
        _rows(W2, W16 + (n0 + n1) * K, WINV + n0 + n1, n2, K, pid - e2, ROWS, BLOCK_K, TARGET)
    elif TABLE:
        table_rows(inv_ptr, pos_ptr, cos_ptr, sin_ptr, n_tok, S, pos_b, pos_s, pid - e3,
                   R, BLOCK_H, BLOCK_T, INTERLEAVED, LIBDEVICE)


def scale_rows(x2d, weights, flag, *, table=None, target=TARGET_EXP):
    """x2d [M, K] float32 and three weights [N_i, K] float32 (contiguous) -> (x16 [M, K],
    x_inv [M], w16 [sum N_i, K], w_inv [sum N_i], flag, cos, sin): fp16 copies with exact
    power-of-two row scales and the float32 reciprocals of those scales (x == x_inv[:, None] *
    x16 up to fp16 rounding), the weights as row blocks of one operand. ``flag`` (one int32) is
    cleared. ``table``: a ``rope_table.TableSpec`` whose cos/sin the same launch builds (cos,
    sin are None without one)."""
    k = x2d.shape[1]
    for m in (x2d, *weights):
        if m.dim() != 2 or m.shape[1] != k or m.dtype != torch.float32:
            raise ValueError("scale_rows: float32 [rows, K] matrices with the same K")
    if len(weights) != 3:
        raise ValueError("scale_rows: three weights (q, k, v)")
    if k > MAX_COLS:
        raise ValueError(f"scale_rows: rows longer than {MAX_COLS}")
    dev = x2d.device
    ns = [w.shape[0] for w in weights]
    m = x2d.shape[0]
    x16 = torch.empty((m, k), device=dev, dtype=torch.float16)
    x_inv = torch.empty((m,), device=dev, dtype=torch.float32)
    w16 = torch.empty((sum(ns), k), device=dev, dtype=torch.float16)
    w_inv = torch.empty((sum(ns),), device=dev, dtype=torch.float32)
    block_k = next_pow2(k)
    rows = max(1, 4096 // block_k)
    ends = [cdiv(m, rows)]
    for n in ns:
        ends.append(ends[-1] + cdiv(n, rows))
    outputs = ["X16", "XINV", "W16", "WINV", "FLAG"]
    if table is not None:
        cos, sin = table.buffers()
        targs = dict(inv_ptr=table.inv, pos_ptr=table.positions, cos_ptr=cos, sin_ptr=sin,
                     **table.scalars(), TABLE=True, **table.consts)
        programs = table.programs
        outputs += ["cos_ptr", "sin_ptr"]
    else:
        # no tables: placeholders for the pointers and integers TABLE=False never reads
        targs = dict(inv_ptr=x_inv, pos_ptr=x_inv, cos_ptr=x_inv, sin_ptr=x_inv, n_tok=0, S=1,
                     pos_b=0, pos_s=0)
        programs = 0
    out = launch(scale_rows_kernel, (ends[-1] + programs,), outputs,
                 num_warps=8 if block_k >= 4096 else 4, num_stages=1,
                 X=x2d, X16=x16, XINV=x_inv, n_x=m, W0=weights[0], W1=weights[1], W2=weights[2],
                 n0=ns[0], n1=ns[1], n2=ns[2], W16=w16, WINV=w_inv, K=k, FLAG=flag,
                 e0=ends[0], e1=ends[1], e2=ends[2], e3=ends[3], **targs,
                 ROWS=rows, BLOCK_K=block_k, TARGET=int(target))
    return out if table is not None else out + (None, None)
