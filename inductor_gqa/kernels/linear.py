"""Projection GEMMs in Triton: y = x @ W^T (+ b), one tile template for two kernels.

* ``linear_kernel``: one weight (o_proj, or any single projection).
* ``qkv_kernel``: the Q, K and V projections in one launch, reading the three weights where they
  are (no concatenation per call); each output has its own strides, so V can be written
  transposed ([Hkv*D, B*S], the K-major operand the float32 attention kernel wants) by the same
  store.

float32 follows the matmul precision in force: "tf32" (TF32 tensor cores), or "tf32x3" (three
TF32 products per tile, hi*hi + hi*lo + lo*hi: float32-level error at tensor-core speed) under
"highest". x [M, K] and W [N, K] are both K-contiguous, the layout Hopper's TF32 MMA wants for both
operands. Grouped tile order keeps a band of x rows hot in L2 while W streams. They are planned
where they beat the library GEMM (float32 under "highest", and the guarded float32 twins of the
fp16-copies plan's GEMMs: ``plan/plans.py``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .launch import cdiv, interpreting, launch as _launch

GUARDED_PROGRAMS = 128


@triton.jit
def _grouped(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * grid_n
    first_m = (pid // per_group) * GROUP_M
    group_m = min(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_m
    pid_n = (pid % per_group) // group_m
    return pid_m, pid_n


@triton.jit
def _mainloop(X, W, offs_m, offs_n, m_ok, n_ok, K, sx_m, sw_n, PREC: tl.constexpr,
              UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr):
    """x[offs_m] @ w[offs_n]^T over K (both K-contiguous), fp32 accumulation. ``UPCAST``: 16-bit
    operands multiplied as fp32 (the interpreter's 16-bit dot is not exact)."""
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = X + offs_m[:, None].to(tl.int64) * sx_m + offs_k[None, :]
    w_ptrs = W + offs_n[:, None].to(tl.int64) * sw_n + offs_k[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = (offs_k + k0) < K
        x = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        if UPCAST:
            x = x.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(x, tl.trans(w), acc, input_precision=PREC)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    return acc


@triton.jit
def _tile(X, W, BIAS, Y, M, N, K, sx_m, sw_n, sy_m, sy_n, pid_m, pid_n,
          HAS_BIAS: tl.constexpr, PREC: tl.constexpr, BLOCK_M: tl.constexpr,
          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr = False):
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = offs_m < M
    n_ok = offs_n < N
    acc = _mainloop(X, W, offs_m, offs_n, m_ok, n_ok, K, sx_m, sw_n, PREC, UPCAST, BLOCK_M,
                    BLOCK_N, BLOCK_K)
    if HAS_BIAS:
        acc += tl.load(BIAS + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    y_ptrs = Y + offs_m[:, None].to(tl.int64) * sy_m + offs_n[None, :].to(tl.int64) * sy_n
    tl.store(y_ptrs, acc.to(Y.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def linear_kernel(X, W, BIAS, Y, FLAG, M, N, K, sx_m, sw_n, sy_m, sy_n,
                  HAS_BIAS: tl.constexpr, PREC: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                  GUARD: tl.constexpr, UPCAST: tl.constexpr = False):
    if GUARD == 2:      # the float32 fallback of an fp16 GEMM: only once FLAG is raised
        if tl.load(FLAG) == 0:
            return
        # a few programs loop over the tiles: cheap to launch when the flag is clear
        n_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
        for t in range(tl.program_id(0), n_tiles, tl.num_programs(0)):
            pid_m, pid_n = _grouped(t, M, N, BLOCK_M, BLOCK_N, GROUP_M)
            _tile(X, W, BIAS, Y, M, N, K, sx_m, sw_n, sy_m, sy_n, pid_m, pid_n,
                  HAS_BIAS, PREC, BLOCK_M, BLOCK_N, BLOCK_K, UPCAST)
    else:
        pid_m, pid_n = _grouped(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
        _tile(X, W, BIAS, Y, M, N, K, sx_m, sw_n, sy_m, sy_n, pid_m, pid_n,
              HAS_BIAS, PREC, BLOCK_M, BLOCK_N, BLOCK_K, UPCAST)


@triton.jit
def qkv_kernel(X, M, K, sx_m,
               WQ, BQ, YQ, NQ, sq_m, sq_n,
               WK, BK, YK, NK, sk_m, sk_n,
               WV, BV, YV, NV, sv_m, sv_n,
               HAS_BIAS: tl.constexpr, PREC: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # programs [0, tq) are Q tiles, then K tiles, then V tiles; each part in grouped order
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BLOCK_M)
    tq = grid_m * tl.cdiv(NQ, BLOCK_N)
    tk = grid_m * tl.cdiv(NK, BLOCK_N)
    if pid < tq:
        pid_m, pid_n = _grouped(pid, M, NQ, BLOCK_M, BLOCK_N, GROUP_M)
        _tile(X, WQ, BQ, YQ, M, NQ, K, sx_m, K, sq_m, sq_n, pid_m, pid_n,
              HAS_BIAS, PREC, BLOCK_M, BLOCK_N, BLOCK_K)
    elif pid < tq + tk:
        pid_m, pid_n = _grouped(pid - tq, M, NK, BLOCK_M, BLOCK_N, GROUP_M)
        _tile(X, WK, BK, YK, M, NK, K, sx_m, K, sk_m, sk_n, pid_m, pid_n,
              HAS_BIAS, PREC, BLOCK_M, BLOCK_N, BLOCK_K)
    else:
        pid_m, pid_n = _grouped(pid - tq - tk, M, NV, BLOCK_M, BLOCK_N, GROUP_M)
        _tile(X, WV, BV, YV, M, NV, K, sx_m, K, sv_m, sv_n, pid_m, pid_n,
              HAS_BIAS, PREC, BLOCK_M, BLOCK_N, BLOCK_K)


def launch(x2d, w, bias, y2d, prec, cfg, flag=None, guard=0):
    """y2d = x2d @ w^T (+ bias): x2d [M, K], w [N, K] (K-contiguous rows), y2d [M, N] (a whole
    contiguous tensor, written in place); returns y2d's new value. ``guard=2``: every program
    exits at once unless ``flag`` (int32) is nonzero (a few programs loop over the tiles)."""
    m, k = x2d.shape
    n = w.shape[0]
    if guard and flag is None:
        raise ValueError("linear launch: a guarded launch needs the flag")
    grid = (GUARDED_PROGRAMS,) if guard == 2 else (cdiv(m, cfg.block_m) * cdiv(n, cfg.block_n),)
    (y,) = _launch(
        linear_kernel, grid, ("Y",), num_warps=cfg.warps, num_stages=cfg.stages,
        X=x2d, W=w, BIAS=bias if bias is not None else w, Y=y2d, FLAG=flag if guard else w,
        M=m, N=n, K=k, sx_m=x2d.stride(0), sw_n=w.stride(0), sy_m=y2d.stride(0),
        sy_n=y2d.stride(1), HAS_BIAS=bias is not None, PREC=prec, BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, GUARD=int(guard),
        UPCAST=interpreting() and x2d.dtype != y2d.dtype)
    return y


def launch_qkv(x2d, parts, prec, cfg):
    """The three projections in one launch. parts: three (w [N, K] contiguous, bias [N] or
    None, y: a fresh whole output, (stride m, stride n) of its [M, N] view: V may be written
    transposed, y [N, M] with strides (1, M)); all three biases present or none. Returns the
    three outputs' new values."""
    m, k = x2d.shape
    args = {}
    tiles = 0
    for tag, (w, bias, y, (s_m, s_n)) in zip("QKV", parts):
        n = w.shape[0]
        args.update({f"W{tag}": w, f"B{tag}": bias if bias is not None else w, f"Y{tag}": y,
                     f"N{tag}": n, f"s{tag.lower()}_m": s_m, f"s{tag.lower()}_n": s_n})
        tiles = tiles + cdiv(m, cfg.block_m) * cdiv(n, cfg.block_n)
    has_bias = parts[0][1] is not None
    if any((p[1] is not None) != has_bias for p in parts):
        raise ValueError("launch_qkv: all three biases or none")
    return _launch(
        qkv_kernel, (tiles,), ("YQ", "YK", "YV"), num_warps=cfg.warps, num_stages=cfg.stages,
        X=x2d, M=m, K=k, sx_m=x2d.stride(0), **args, HAS_BIAS=has_bias, PREC=prec,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m)
