"""y = x @ W^T (+ b) for float32 with 3xTF32 dots: float32-level error at tensor-core speed.

Under ``torch.get_float32_matmul_precision() == "highest"`` cuBLAS runs IEEE float32 GEMMs on the
CUDA cores (about 51 TFLOP/s on an H200); three TF32 products per tile (``input_precision=
"tf32x3"``: hi*hi + hi*lo + lo*hi) keep the error at the float32 level and run on the tensor
cores. x [M, K] and W [N, K] are both K-contiguous, the layout Hopper's TF32 MMA wants for both
operands. Grouped tile order keeps a band of x rows hot in L2 while W streams.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def linear_kernel(X, W, BIAS, Y, M, N, K, sx_m, sw_n, sy_m,
                  HAS_BIAS: tl.constexpr, PREC: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * grid_n
    first_m = (pid // per_group) * GROUP_M
    group_m = min(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_m
    pid_n = (pid % per_group) // group_m
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < N
    x_ptrs = X + offs_m[:, None].to(tl.int64) * sx_m + offs_k[None, :]
    w_ptrs = W + offs_n[:, None].to(tl.int64) * sw_n + offs_k[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = (offs_k + k0) < K
        x = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        acc = tl.dot(x, tl.trans(w), acc, input_precision=PREC)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if HAS_BIAS:
        acc += tl.load(BIAS + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    y_ptrs = Y + offs_m[:, None].to(tl.int64) * sy_m + offs_n[None, :]
    tl.store(y_ptrs, acc.to(Y.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def launch(x2d, w, bias, y2d, prec, block_m, block_n, block_k, group_m, num_warps, num_stages):
    """x2d [M, K], w [N, K], y2d [M, N]; all K- (resp. N-) contiguous rows."""
    m, k = x2d.shape
    n = w.shape[0]
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n),)
    linear_kernel[grid](
        x2d, w, bias if bias is not None else w, y2d, m, n, k,
        x2d.stride(0), w.stride(0), y2d.stride(0),
        HAS_BIAS=bias is not None, PREC=prec, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_K=block_k, GROUP_M=group_m, num_warps=num_warps, num_stages=num_stages)
