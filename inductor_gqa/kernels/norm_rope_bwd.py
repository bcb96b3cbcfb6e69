"""The backward of ``qk_epilogue.norm_rope``: per-head RMSNorm (float32) then RoPE, on q and k.

Forward, per head row x (one token x head, D features), as BlockSpec describes it:
    n = x * r,  r = 1 / sqrt(mean(x^2) + eps)            (float32)
    y = n * w  (fp32_weight) | round(n) * w  (cast_weight) | n * (1 + w)  (fp32_one_plus_weight)
    out = y * cos + rot(y) * sin    on the first R features (rot: rotate-half or interleaved),
          y                         on the rest
Backward, for the gradient g of out (roundings to the activation dtype pass gradients through):
    dy = g * cos - rot(g * sin)       (rot's transpose is -rot: with the usual tables, whose two
                                       halves / pair members share an angle, a rotation by the
                                       negative angle; exact for any table)
    dn = dy * w  (or dy * (1 + w));   dw = sum over rows of dy * n  (round(n) for cast_weight)
    dx = r * (dn - n * mean(dn * n))
What the forward must keep: the pre-norm q and k (the projections' output before the in-place
epilogue) when there is a norm; r is recomputed from them (one reduction per row). RoPE alone
needs nothing but the tables.

One launch over q's and k's head rows: ``programs`` programs per part, each looping over its row
tiles (a strided walk) and rewriting the gradient rows in place (dq_out -> dq_in), keeping one
float32 partial sum of the weight gradient per program; the partials are summed by the host
(a [programs, D] reduction, deterministic; no atomics).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import cdiv, interpreting, launch as _launch, next_pow2, static_int
from .qk_epilogue import NORM_CODES, ROPE_CODES, rotated, round_to, default_rows, rope_partner

GPU_PROGRAMS = 264          # per part: two per H200 SM


@triton.jit
def _bwd_tile(g_ptr, x_ptr, w_ptr, n_rows, heads, S, tile, eps, cos_ptr, sin_ptr, cs_b, cs_s,
              cs_d, ld_g, ld_x, D: tl.constexpr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr,
              NORM: tl.constexpr, ROPE: tl.constexpr, R: tl.constexpr, DT: tl.constexpr):
    """One [ROWS, BLOCK_D] tile of gradient rows, rewritten in place; returns the tile's
    weight-gradient contribution [BLOCK_D] (zeros without a norm)."""
    rows = tile * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_D)
    rmask = rows < n_rows
    cmask = cols < D
    m2 = rmask[:, None] & cmask[None, :]
    tok = rows // heads                             # b * S + s
    hd = rows - tok * heads
    g_base = g_ptr + (tok.to(tl.int64) * ld_g + hd * D)[:, None]
    g = tl.load(g_base + cols[None, :], mask=m2, other=0.0).to(tl.float32)
    if ROPE != 0:
        bi = tok // S
        cso = bi[:, None].to(tl.int64) * cs_b + (tok - bi * S)[:, None] * cs_s
        REG_ROT: tl.constexpr = (R == D) & (BLOCK_D == D)
        if REG_ROT:
            c = tl.load(cos_ptr + cso + cols[None, :] * cs_d, mask=m2, other=1.0).to(tl.float32)
            s_ = tl.load(sin_ptr + cso + cols[None, :] * cs_d, mask=m2, other=0.0).to(
                tl.float32)
            dy = g * c - rotated(g * s_, ROWS, D, ROPE)
        else:
            pcol, sign, in_rot = rope_partner(cols, R, ROPE)
            rm = rmask[:, None] & in_rot[None, :]
            c = tl.load(cos_ptr + cso + cols[None, :] * cs_d, mask=rm, other=1.0).to(tl.float32)
            sp = tl.load(sin_ptr + cso + pcol[None, :] * cs_d, mask=rm, other=0.0).to(
                tl.float32)
            gp = tl.load(g_base + pcol[None, :], mask=rm, other=0.0).to(tl.float32)
            # rot(z)[c] = sign[c] * z[pcol[c]]; columns past R: cos 1, sin 0 (dy = g)
            dy = g * c - sign[None, :] * (gp * sp)
    else:
        dy = g
    dw = tl.zeros([BLOCK_D], tl.float32)
    if NORM != 0:
        x_base = x_ptr + (tok.to(tl.int64) * ld_x + hd * D)[:, None]
        x = tl.load(x_base + cols[None, :], mask=m2, other=0.0).to(tl.float32)
        r = (1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps))[:, None]
        n = x * r
        w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
        if NORM == 2:
            dw = tl.sum(dy * round_to(n, DT), axis=0)
        else:
            dw = tl.sum(dy * n, axis=0)
        if NORM == 3:
            dn = dy * (1.0 + w)
        else:
            dn = dy * w
        dx = r * (dn - n * (tl.sum(dn * n, axis=1) / D)[:, None])
    else:
        dx = dy
    tl.store(g_base + cols[None, :], dx.to(g_ptr.dtype.element_ty), mask=m2)
    return dw


@triton.jit
def norm_rope_bwd_kernel(
        GQ, GK, XQ, XK, QW, KW, cos_ptr, sin_ptr, DW,
        q_rows, k_rows, HQ, HK, S, eps, eps_k, cs_b, cs_s, cs_d, ld_g, ld_gk, k_col, ld_xq,
        ld_xk, npq, npk, D: tl.constexpr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr,
        NORM: tl.constexpr, ROPE: tl.constexpr, R: tl.constexpr, STRIDED: tl.constexpr):
    """Programs [0, npq) take q's head rows, [npq, npq + npk) k's. GQ/GK: the gradients,
    rewritten in place, rows ld_g and ld_gk apart (STRIDED: GQ is one buffer holding q's
    gradient at column 0 and k's at k_col). XQ/XK: the pre-norm q and k (row strides ld_xq,
    ld_xk). DW: per program the float32 partial of its part's weight gradient."""
    eps = tl.cast(eps, tl.float32)        # fp64 from Inductor's launcher, fp32 from Triton's
    eps_k = tl.cast(eps_k, tl.float32)
    pid = tl.program_id(0)
    DT: tl.constexpr = XQ.dtype.element_ty
    if STRIDED:
        gk_ptr = GQ + k_col
    else:
        gk_ptr = GK
    dw = tl.zeros([BLOCK_D], tl.float32)
    if pid < npq:
        for tile in range(pid, tl.cdiv(q_rows, ROWS), npq):
            dw += _bwd_tile(GQ, XQ, QW, q_rows, HQ, S, tile, eps, cos_ptr, sin_ptr, cs_b, cs_s,
                            cs_d, ld_g, ld_xq, D, BLOCK_D, ROWS, NORM, ROPE, R, DT)
    else:
        for tile in range(pid - npq, tl.cdiv(k_rows, ROWS), npk):
            dw += _bwd_tile(gk_ptr, XK, KW, k_rows, HK, S, tile, eps_k, cos_ptr, sin_ptr, cs_b,
                            cs_s, cs_d, ld_gk, ld_xk, D, BLOCK_D, ROWS, NORM, ROPE, R, DT)
    if NORM != 0:
        cols = tl.arange(0, BLOCK_D)
        tl.store(DW + pid * BLOCK_D + cols, dw)


def launch(dq=None, dk=None, *, q=None, k=None, q_norm_weight=None, k_norm_weight=None,
           cos=None, sin=None, seq, num_heads, num_kv_heads, head_dim, norm, eps=1e-6,
           eps_k=None, rope, rotary_dim=0, dqkv=None, rows=None, programs=None, num_warps=4):
    """The norm/RoPE backward; returns (dq_in, dk_in, dwq, dwk), or (dqkv, dwq, dwk) with
    ``dqkv`` (dwq, dwk: float32 [D], None without a norm).

    dq [B*S, H*D], dk [B*S, Hkv*D]: the gradients of the normed and roped q and k (whole
    contiguous tensors), rewritten in place into the gradients of the pre-norm q and k; or
    ``dqkv``, one whole [B*S, ld] buffer (unit column stride) holding them as column blocks
    [0, H*D) and [H*D, H*D + Hkv*D) (flash_bwd's fused layout; the columns after are left
    alone). q, k: the pre-norm q and k ([B*S, heads*D] with unit column stride, any row stride;
    needed with a norm). cos/sin: [B, S, R]-broadcast views, as ``qk_epilogue.norm_rope`` takes
    them. ``eps_k`` defaults to ``eps``."""
    d = head_dim
    block_d = next_pow2(d)
    rows = rows or default_rows(block_d)
    eps_k = eps if eps_k is None else eps_k
    if dqkv is not None:
        if dqkv.stride(-1) != 1:
            raise ValueError("norm_rope_bwd.launch: dqkv needs a unit column stride")
        m = dqkv.shape[0]
        gq, gk, ld_g, ld_gk, k_col = dqkv, dqkv, dqkv.stride(0), dqkv.stride(0), num_heads * d
    else:
        if dq is None or dk is None:
            raise ValueError("norm_rope_bwd.launch: pass dq and dk, or dqkv")
        if not (dq.is_contiguous() and dk.is_contiguous()):
            raise ValueError("norm_rope_bwd.launch: dq and dk must be whole contiguous tensors")
        m = dq.shape[0]
        gq, gk, ld_g, ld_gk, k_col = dq, dk, num_heads * d, num_kv_heads * d, 0
    if dqkv is None and (dq.shape[1] != num_heads * d or dk.shape[1] != num_kv_heads * d):
        raise ValueError("norm_rope_bwd.launch: dq, dk must be [B*S, heads * head_dim]")
    has_norm = norm != "none"
    if has_norm and (q is None or k is None or q_norm_weight is None or k_norm_weight is None):
        raise ValueError("norm_rope_bwd.launch: the norm's backward needs the pre-norm q and k "
                         "and both norm weights")
    if has_norm and (q.stride(-1) != 1 or k.stride(-1) != 1):
        raise ValueError("norm_rope_bwd.launch: q and k need a unit column stride")
    q_rows, k_rows = m * num_heads, m * num_kv_heads
    cap = programs or (3 if interpreting() else GPU_PROGRAMS)

    def n_programs(n_rows):
        n = static_int(cdiv(n_rows, rows))
        return cap if n is None else max(1, min(cap, n))
    npq, npk = n_programs(q_rows), n_programs(k_rows)
    dummy = gq
    if rope != "none":
        cs = (cos.stride(0), cos.stride(1), cos.stride(2))
    else:
        cos = sin = dummy
        cs = (0, 0, 0)
    dw = (torch.empty((npq + npk, block_d), device=gq.device, dtype=torch.float32)
          if has_norm else None)
    outputs = ["GQ"] + (["GK"] if dqkv is None else []) + (["DW"] if has_norm else [])
    res = _launch(
        norm_rope_bwd_kernel, (npq + npk,), outputs, num_warps=num_warps, num_stages=1,
        GQ=gq, GK=gk if dqkv is None else dummy, XQ=q if has_norm else gq,
        XK=k if has_norm else gq, QW=q_norm_weight if has_norm else dummy,
        KW=k_norm_weight if has_norm else dummy, cos_ptr=cos, sin_ptr=sin,
        DW=dw if has_norm else dummy, q_rows=q_rows, k_rows=k_rows, HQ=num_heads,
        HK=num_kv_heads, S=seq, eps=float(eps), eps_k=float(eps_k), cs_b=cs[0], cs_s=cs[1],
        cs_d=cs[2], ld_g=ld_g, ld_gk=ld_gk, k_col=k_col, ld_xq=q.stride(0) if has_norm else 0,
        ld_xk=k.stride(0) if has_norm else 0, npq=npq, npk=npk, D=d, BLOCK_D=block_d,
        ROWS=rows, NORM=NORM_CODES[norm], ROPE=ROPE_CODES[rope],
        R=rotary_dim if rope != "none" else 0, STRIDED=dqkv is not None)
    res = list(res)
    if has_norm:
        dw = res.pop()
        dwq, dwk = dw[:npq, :d].sum(0), dw[npq:, :d].sum(0)
    else:
        dwq = dwk = None
    return (*res, dwq, dwk)
