"""Frozen experiment (not part of the package): the probabilities pass with switches that leave
parts out or change the V layout / store path, for probabilities_pass_bench.py. The kernel that
ships is inductor_gqa/kernels/flash.py."""
import triton
import triton.language as tl


@triton.jit
def exp_kernel(Q, K, V, O, P, PD, ML,
               sq_b, sq_h, sq_s, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, sv_d, so_b, so_s, so_h,
               sp_b, sp_h, sp_s,
               H, G, S, scale,
               D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               MODE: tl.constexpr, VT: tl.constexpr, STORE: tl.constexpr, PV: tl.constexpr):
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh - b * H
    kvh = h // G
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    offs_nb = tl.arange(0, BLOCK_N)
    m_ok = offs_m < S
    b64 = b.to(tl.int64)
    q = tl.load(Q + b64 * sq_b + h * sq_h + offs_m[:, None].to(tl.int64) * sq_s + offs_d[None, :],
                mask=m_ok[:, None], other=0.0)
    q = q * (scale * 1.4426950408889634)
    k_base = K + b64 * sk_b + kvh * sk_h + offs_d[None, :]
    if VT:
        v_base = V + b64 * sv_b + kvh * sv_h + offs_d[:, None].to(tl.int64) * sv_d
    else:
        v_base = V + b64 * sv_b + kvh * sv_h + offs_d[None, :]
    ml_off = bh.to(tl.int64) * S + offs_m
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    if MODE != 2:
        for start_n in range(0, S, BLOCK_N):
            offs_n = start_n + offs_nb
            n_ok = offs_n < S
            k = tl.load(k_base + offs_n[:, None].to(tl.int64) * sk_s, mask=n_ok[:, None], other=0.0)
            t = tl.dot(q, tl.trans(k), input_precision="tf32")
            t = tl.where(n_ok[None, :], t, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(t, 1))
            p = tl.exp2(t - m_new[:, None])
            l_i = l_i * tl.exp2(m_i - m_new) + tl.sum(p, 1)
            m_i = m_new
    if MODE == 1:
        tl.store(ML + ml_off * 2, m_i, mask=m_ok)
        tl.store(ML + ml_off * 2 + 1, l_i, mask=m_ok)
    else:
        if MODE == 2:
            m_i = tl.load(ML + ml_off * 2, mask=m_ok, other=0.0)
            l_i = tl.load(ML + ml_off * 2 + 1, mask=m_ok, other=1.0)
        inv_l = 1.0 / l_i
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        p_row = P + b64 * sp_b + h.to(tl.int64) * sp_h + offs_m[:, None].to(tl.int64) * sp_s
        for start_n in range(0, S, BLOCK_N):
            offs_n = start_n + offs_nb
            n_ok = offs_n < S
            k = tl.load(k_base + offs_n[:, None].to(tl.int64) * sk_s, mask=n_ok[:, None], other=0.0)
            t = tl.dot(q, tl.trans(k), input_precision="tf32")
            t = tl.where(n_ok[None, :], t, float("-inf"))
            p = tl.exp2(t - m_i[:, None]) * inv_l[:, None]
            if STORE == 1:
                tl.store(p_row + offs_n[None, :], p, mask=m_ok[:, None] & n_ok[None, :],
                         eviction_policy="evict_first")
            elif STORE == 2:
                PD.store([bh, start_m * BLOCK_M, start_n], p.reshape(1, BLOCK_M, BLOCK_N))
            if PV:
                if VT:
                    vt = tl.load(v_base + offs_n[None, :], mask=n_ok[None, :], other=0.0)
                    acc += tl.dot(p, tl.trans(vt), input_precision="tf32")
                else:
                    v = tl.load(v_base + offs_n[:, None].to(tl.int64) * sv_s, mask=n_ok[:, None],
                                other=0.0)
                    acc += tl.dot(p, v, input_precision="tf32")
        o_ptrs = (O + b64 * so_b + h * so_h + offs_m[:, None].to(tl.int64) * so_s
                  + offs_d[None, :])
        tl.store(o_ptrs, acc, mask=m_ok[:, None])
