"""float32 blocks under "high" on fp16 copies: which plans are offered, their buffers, the fp16
o_proj, and the plan that also runs the projections on fp16 (f16proj: cuBLAS fp16 GEMM and the
norm/RoPE launch). The "f16" plan itself (float32 projections, fp16 copies for attention) is
block._run_plan's. "f16tma" runs the f16proj GEMM and its norm/RoPE epilogue as one launch
(``kernels/proj_rope.py``: the operands on the copy engine; an earlier fused kernel on pointer
loads, "f16fused", lost and was removed: docs/kernels.md notes 16-17, 47).

fp16 has TF32's 10-bit significand and rounds to nearest; only its range differs. Every copy is
range-checked into one device flag, and every fp16 launch has a guarded float32 twin that runs
only when the flag is raised, so no host sync is needed (docs/kernels.md, notes 12-16).
"""

from __future__ import annotations

import os

import torch

from ..kernels import fp16_rows, proj_rope, proj_rope_ws, qk_epilogue, tuning
from ..kernels import linear as linear_kernels
from ..kernels.host import capability
from ..kernels.qk_epilogue import qk_norm_rope_, wo16_
from .attention import attention
from .linear import _INTERPRETER_CONFIG, linear


def f16_projections_offered(t, x) -> bool:
    """The fp16-copies plan with the Q/K/V GEMMs on fp16 copies too (``fp16_rows``: exact per-row
    power-of-two scales, cuBLAS fp16 with float32 output, measured 74 vs 133 us at M=7184 for the
    GEMMs alone) and the norm/RoPE launch writing only the copies (a guarded launch finishes the
    float32 tensors for the fallback). Whole block on the H200: 46 -> 38 us at 131x1, 337 -> 310
    at 449x16, 550 -> 527 at 4096x1. Needs no projection biases (the scales are undone before
    the bias would be added) and rows of at most 16384. INDUCTOR_GQA_FP16_PROJECTIONS=0 turns it
    off."""
    if os.environ.get("INDUCTOR_GQA_FP16_PROJECTIONS", "1") == "0":
        return False
    if any(t[n] is not None for n in ("bq", "bk", "bv")) or x.shape[-1] > fp16_rows.MAX_COLS:
        return False
    return not x.is_cuda or _mm_fp32_out_ok(x.device)


_MM_OK: dict = {}


def _mm_fp32_out_ok(device) -> bool:
    """Whether this torch multiplies fp16 into a float32 result (``torch.mm(out_dtype=)``)."""
    if device not in _MM_OK:
        if tuning._capturing():
            return False
        a = torch.ones((16, 16), device=device, dtype=torch.float16)
        try:
            _MM_OK[device] = torch.mm(a, a, out_dtype=torch.float32).dtype == torch.float32
        except (TypeError, RuntimeError, NotImplementedError):
            _MM_OK[device] = False
    return _MM_OK[device]


def _mm16(a, b):
    """fp16 operands, float32 result with float32 accumulation (exact products)."""
    if a.is_cuda:
        return torch.mm(a, b, out_dtype=torch.float32)
    return a.float() @ b.float()        # the interpreter tests: same products, on the CPU


def _mm16_out16(a, b):
    """fp16 operands and result, float32 accumulation: cuBLAS may otherwise reduce split-K
    partial sums in fp16 (torch's allow_fp16_reduced_precision_reduction, on by default)."""
    if not a.is_cuda:
        return (a.float() @ b.float()).half()
    matmul = torch.backends.cuda.matmul
    allowed = matmul.allow_fp16_reduced_precision_reduction
    matmul.allow_fp16_reduced_precision_reduction = False
    try:
        return torch.mm(a, b)
    finally:
        matmul.allow_fp16_reduced_precision_reduction = allowed


def f16_products_offered() -> bool:
    """f16proj16: the f16proj plan with its Q/K/V GEMM writing fp16 (half the bytes written and
    read again by the norm/RoPE launch) on operands scaled so that no product can overflow
    (``fp16_rows.out16_target``); the epilogue checks the scaled outputs' range
    (``qk_epilogue._check_scaled16``) and the fallback recomputes the products in float32 (a
    guarded GEMM). A timed plan beside f16proj: on the H200 the whole block 231.8 -> 226.6 us at
    512x16 and 231.3 -> 226.4 at 449x16, a tie at 131x1 and 4096x1, 0.8 us slower at 1024x2
    (docs/kernels.md note 30). INDUCTOR_GQA_FP16_QKV_OUT=0 turns it off."""
    return os.environ.get("INDUCTOR_GQA_FP16_QKV_OUT", "1") != "0"


def f16_fused_offered(spec, x) -> bool:
    """f16tma: the f16proj plan with its Q/K/V GEMM and the norm/RoPE epilogue in one launch
    (``proj_rope``), where that launch covers the head and a CUDA device has the copy engine
    (sm_90+), or in the CPU interpreter. A timed plan beside the others.
    INDUCTOR_GQA_FUSED_PROJECTION=0 turns it off."""
    if os.environ.get("INDUCTOR_GQA_FUSED_PROJECTION", "1") == "0":
        return False
    d = spec.head_dim
    parts = (spec.num_heads * d, spec.num_kv_heads * d, spec.num_kv_heads * d)
    if not (proj_rope.covers(d, spec.rope, spec.rotary_dim)
            and proj_rope.candidates(parts, d)):
        return False
    if x.is_cuda:
        return capability(x.device)[0] >= 9
    return tuning.interpreting()


def f16_operands_allowed(dt, prec) -> bool:
    """float32 blocks whose dots may use TF32 may run them on fp16 copies instead: the same
    10-bit significand, rounded to nearest, at twice the tensor-core rate (the copies fall back
    to float32 when a value leaves fp16's range). INDUCTOR_GQA_FP16_OPERANDS=0 turns the
    candidate off."""
    return (dt == torch.float32 and prec == "tf32"
            and os.environ.get("INDUCTOR_GQA_FP16_OPERANDS", "1") != "0")


def o_proj(t, spec, o, probs, prec, o16=None, copies=None, pending=(), wo16_ready=None):
    """4. o_proj: on the fp16 copies (o16, Wo16) with a guarded float32 fallback, or float32.
    ``pending``: the attention's deferred guarded fallback launches (``attention(deferred=)``),
    run before anything reads the float32 o. ``wo16_ready``: ``fork_wo16``'s event."""
    if o16 is not None:
        out = _o_proj16(o, *o16, copies[3], pending, wo16_ready)
    else:
        for run in pending:
            run()
        out = linear(o, t["wo"], t["bo"], prec) if t["wo"] is not None else o
    return out.contiguous(), (probs if spec.return_probs else o.new_empty((0,)))


# the guarded GEMMs of the float32 fallback (the o_proj behind the fp16 one, f16proj16's float32
# products): they run only when a value left fp16's range, so they are checked to run, not tuned
_GUARDED_GEMM = (128, 128, 32, 8, 8, 3)   # few programs: each exits at once when unused


def _guarded_gemm(x2d, w, y2d, prec, flag):
    """y2d = x2d @ w^T, only if ``flag`` is raised (linear.py's GUARD 2)."""
    cfg = _INTERPRETER_CONFIG if tuning.interpreting() else _GUARDED_GEMM
    linear_kernels.launch(x2d, w, None, y2d, prec, *cfg, flag=flag, guard=2)


def fp16_o_proj(t, spec, x):
    """(o16 [B, S, H*D], Wo [E, H*D] contiguous, Wo16): buffers for o_proj on fp16 copies, or
    None where it does not apply (no o_proj, an o_proj bias, no fp16 GEMM with float32 output).
    The attention kernel writes o16 and raises the range flag for rows outside fp16's useful
    range (flash.py), the epilogue launch writes Wo16 and checks it the same way; when the flag
    is raised a guarded float32 GEMM redoes o_proj from the fallback's float32 o.
    INDUCTOR_GQA_FP16_OPROJ=0 turns it off."""
    wo = t["wo"]
    if (wo is None or t["bo"] is not None or wo.dtype != torch.float32
            or os.environ.get("INDUCTOR_GQA_FP16_OPROJ", "1") == "0"
            or (x.is_cuda and not _mm_fp32_out_ok(x.device))):
        return None
    b, s, _ = x.shape
    wo = wo.contiguous()
    return (torch.empty((b, s, spec.num_heads * spec.head_dim), device=x.device,
                        dtype=torch.float16), wo, torch.empty_like(wo, dtype=torch.float16))


_SIDE_STREAMS: dict = {}


def _side_stream(device):
    side = _SIDE_STREAMS.get(device)
    if side is None:
        side = _SIDE_STREAMS[device] = torch.cuda.Stream(device=device)
    return side


def wo16_mode(o16) -> int:
    """Where o_proj's fp16 weight copy is made: 0 in the norm/RoPE launch; while a CUDA graph is
    captured, as a launch of its own on the side stream (``fork_wo16``) forked 1 after the
    operands' scale_rows launch (beside the Q/K/V GEMM) or 2 after the norm/RoPE launch (beside
    attention), per INDUCTOR_GQA_WO16_ASIDE (default 2). On the H200 (W075 "high", all three
    in one process, runs/7462dcd): mean 109.54 us in line, 109.66 forked at 1, 109.25 at 2 (11
    of 16 cases faster, 256x4 -1.2 us, 541x1 +1.2). Plain launches keep it in the norm/RoPE
    launch: one launch fewer, and host time is their limit."""
    if o16 is None or not (o16[1].is_cuda and tuning._capturing()):
        return 0
    mode = os.environ.get("INDUCTOR_GQA_WO16_ASIDE", "2")
    return int(mode) if mode in ("1", "2") else 0


def fork_wo16(o16, flag, head_dim):
    """Wo's fp16 copy on the side stream, after everything issued so far on this one (call it
    after the flag was cleared); returns the event o_proj waits for (``_o_proj16``)."""
    _, wo, wo16 = o16
    side = _side_stream(wo.device)
    side.wait_stream(torch.cuda.current_stream(wo.device))
    with torch.cuda.stream(side):
        wo16_(wo, wo16, flag, head_dim)
        ready = torch.cuda.Event()
        ready.record(side)
    return ready


def wo16_before_epilogue(o16, flag, head_dim):
    """o_proj's fp16 weight copy as ``wo16_mode`` places it, up to the norm/RoPE launch:
    (mode, that launch's ``wo`` argument, the event o_proj waits for or None). Mode 1 forks the
    copy here; pass the result to ``wo16_after_epilogue`` once the norm/RoPE launch is issued."""
    mode = wo16_mode(o16)
    ready = fork_wo16(o16, flag, head_dim) if mode == 1 else None
    return mode, (o16[1:] if o16 and not mode else None), ready


def wo16_after_epilogue(mode, o16, flag, head_dim, ready):
    """The event o_proj waits for: mode 2 forks the copy here, after the norm/RoPE launch."""
    return fork_wo16(o16, flag, head_dim) if mode == 2 else ready


def _o_proj16(o, o16, wo, wo16, flag, pending=(), wo16_ready=None):
    """The fp16 o_proj, then its guarded float32 twin. The attention's guarded fallbacks
    (``pending``) read only the flag unless it is raised, and nothing of the fp16 GEMM's: while a
    CUDA graph is captured they go on a side stream beside that GEMM, so their early-exit
    launches overlap it instead of adding a node each to the chain (plain launches keep one
    stream: their host time, not the GPU, is the limit there). ``wo16_ready``: Wo16 was made
    on the side stream (``fork_wo16``); everything from here waits for it, the fallbacks
    because that launch may raise the flag."""
    b, s, hd = o.shape
    if wo16_ready is not None:
        torch.cuda.current_stream(o.device).wait_event(wo16_ready)
    side = None
    if pending and o.is_cuda and tuning._capturing():
        side = _side_stream(o.device)
        main = torch.cuda.current_stream(o.device)
        side.wait_stream(main)
    with torch.cuda.stream(side):       # no-op for None: the pending launches run in line
        for run in pending:
            run()
    out = _mm16(o16.view(b * s, hd), wo16.t())
    if side is not None:
        main.wait_stream(side)      # the float32 twin reads the fallback's o
    # 3xTF32: Triton's TF32 truncates the operands
    _guarded_gemm(o.view(b * s, hd), wo, out, "tf32x3", flag)
    return out.view(b, s, -1)


def fp16_copies(q, k, v, flag=None):
    """(q16, k16, v16, flag): buffers for the epilogue's fp16 copies, and the range flag (zeroed
    here unless given: ``_range_flag``'s, which scale_rows clears)."""
    if flag is None:
        flag = torch.zeros((1,), device=q.device, dtype=torch.int32)
    return tuple(torch.empty(a.shape, device=a.device, dtype=torch.float16)
                 for a in (q, k, v)) + (flag,)


def _range_flag(x):
    """The range flag, uninitialized: the plans that scale their GEMM operands have scale_rows
    clear it in its launch (one launch fewer than a fill kernel)."""
    return torch.empty((1,), device=x.device, dtype=torch.int32)


def run_f16proj(t, spec, cos, sin, mask, eps_value, eps_k_value, scale_value, prec, table=None,
                out16=False, fused=False):
    """The fp16-copies plan with the Q/K/V projections on fp16 copies as well (see
    ``f16_projections_offered``); ``table``: a RoPE TableJob its first launch also runs;
    ``out16``: the f16proj16 plan (``f16_products_offered``); ``fused``: the f16tma plan
    (``f16_fused_offered``)."""
    if fused:
        return _run_f16tma(t, spec, cos, sin, mask, eps_value, eps_k_value, scale_value, prec,
                           table)
    x = t["x"]
    b, s, e = x.shape
    h, hk, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
    # the three weights' copies are row blocks of one operand: one GEMM for q, k and v
    flag = _range_flag(x)
    target = fp16_rows.out16_target(e) if out16 else fp16_rows.TARGET_EXP
    x16, x_inv, w16, w_inv, cuts = _scaled_fp16_operands(x, [t["wq"], t["wk"], t["wv"]], flag,
                                                         table, target)
    q_inv, k_inv, v_inv = (w_inv[a:z] for a, z in cuts)
    o16 = fp16_o_proj(t, spec, x)
    wo_mode, wo_arg, wo16_ready = wo16_before_epilogue(o16, flag, d)
    # scaled products [B*S, Nq+Nk+Nv] (float32, or fp16 with out16): q, k, v are its column
    # slices; the epilogue multiplies by x_inv (per token) and w_inv (per feature)
    qkv = (_mm16_out16 if out16 else _mm16)(x16, w16.t())
    q, k, v = (qkv[:, a:z] for a, z in cuts)
    copies = fp16_copies(q, k, v, flag)
    scales = (x_inv, q_inv, k_inv, v_inv)
    tail = (t["q_norm_weight"], t["k_norm_weight"], cos, sin, b, s, h, hk, d, spec.norm,
            eps_value, spec.rope, spec.rotary_dim)
    copies_kw = dict(eps_k=eps_k_value, v=v, copies=copies[:3], flag=copies[3], scales=scales,
                     store32=False, wo=wo_arg, in16=out16)
    tokens = _epilogue_form(spec, b * s, out16, lambda c: qk_norm_rope_(
        q, k, *tail, tokens=c, **dict(copies_kw, wo=None)))
    qk_norm_rope_(q, k, *tail, tokens=tokens, **copies_kw)
    wo16_ready = wo16_after_epilogue(wo_mode, o16, flag, d, wo16_ready)
    # with fp16 products the float32 fallback makes its own (a guarded GEMM)
    return _attend_and_project(t, spec, qkv if not out16 else None, x16, w16, cuts, scales,
                               copies, o16, wo16_ready, tail, eps_k_value, mask, scale_value,
                               prec)


def _attend_and_project(t, spec, qkv32, x16, w16, cuts, scales, copies, o16, wo16_ready, tail,
                        eps_k_value, mask, scale_value, prec):
    """The fp16-copies plans' attention and o_proj, with the float32 fallback's q, k, v (column
    slices of ``qkv32``, the scaled float32 products) finished in place only if the range flag
    was raised (by a copy, or by the fp16-operand attention's output: hence after its
    launches). ``qkv32`` None: the plan kept no float32 products, and a guarded GEMM on the
    fp16 operand copies (exact products, float32 accumulation) makes them first."""
    b, s = t["x"].shape[:2]
    remake = qkv32 is None
    if remake:      # written only if the flag is raised
        qkv32 = torch.empty((b * s, cuts[-1][1]), device=x16.device, dtype=torch.float32)
    q, k, v = (qkv32[:, a:z] for a, z in cuts)

    def finish_fp32():
        if remake:
            _guarded_gemm(x16, w16, qkv32, "tf32", copies[3])
        qk_norm_rope_(q, k, *tail, eps_k=eps_k_value, scales=scales, store32=True, guard=2,
                      v=v, flag=copies[3])

    pending = []
    o, probs = attention(q, k, v, mask, spec, b, s, scale_value, False, f16=copies,
                         out16=o16[0] if o16 else None, before_fallback=finish_fp32,
                         deferred=pending)
    return o_proj(t, spec, o, probs, prec, o16, copies, pending, wo16_ready)


def _run_f16tma(t, spec, cos, sin, mask, eps_value, eps_k_value, scale_value, prec, table):
    """f16tma: scale_rows (fp16 operand copies, RoPE tables, the flag cleared), then one launch
    for the Q/K/V GEMM and the norm/RoPE epilogue writing the copies as column slices of one
    [B*S, Nq + Nk + Nv] buffer (``proj_rope``); the fallback's float32 products come from a
    guarded GEMM as in f16proj16. With RoPE tables built from inv_freq and position_ids, the
    launch computes the angles' cos/sin itself (the tables are the fallback's;
    INDUCTOR_GQA_FUSED_ANGLES=0 has it load them)."""
    x = t["x"]
    b, s, e = x.shape
    h, hk, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
    flag = _range_flag(x)
    x16, x_inv, w16, w_inv, cuts = _scaled_fp16_operands(x, [t["wq"], t["wk"], t["wv"]], flag,
                                                         table)
    q_inv, k_inv, v_inv = (w_inv[a:z] for a, z in cuts)
    parts = tuple(z - a for a, z in cuts)
    o16 = fp16_o_proj(t, spec, x)
    wo_mode, _, wo16_ready = wo16_before_epilogue(o16, flag, d)
    qkv16 = torch.empty((b * s, sum(parts)), device=x.device, dtype=torch.float16)
    angles = None
    if (table is not None and spec.rope == "half" and spec.rotary_dim == d
            and os.environ.get("INDUCTOR_GQA_FUSED_ANGLES", "1") != "0"):
        angles = (table.inv, table.positions)

    def run(cfg):
        if cfg[0] == "ws":
            proj_rope_ws.launch(x16, w16, x_inv, w_inv, qkv16, flag, parts, s, d, spec.rope,
                                cfg, angles=angles)
        else:
            proj_rope.launch(x16, w16, x_inv, w_inv, qkv16, flag, parts, t["q_norm_weight"],
                             t["k_norm_weight"], cos, sin, s, d, spec.norm, eps_value,
                             eps_k_value, spec.rope, cfg, angles=angles)

    ws = os.environ.get("INDUCTOR_GQA_WS_PROJECTION", "1") != "0"
    key = ("proj_rope", tuning.gemm_rows_bucket(b * s), parts, e, d, spec.norm, spec.rope,
           angles is not None, ws)
    cands = proj_rope.candidates(parts, d)
    if ws:      # kernels/proj_rope_ws.py (Hopper, the blocks it covers): timed beside them
        cands += proj_rope_ws.candidates(parts, d, x.device, spec.norm, spec.rope,
                                         spec.rotary_dim, angles is not None)
    run(tuning.pick(key, cands, run))
    if wo_mode == 0 and o16 is not None:    # plain launches: Wo's copy in line
        wo16_(o16[1], o16[2], flag, d)
    wo16_ready = wo16_after_epilogue(wo_mode, o16, flag, d, wo16_ready)
    copies = tuple(qkv16[:, a:z] for a, z in cuts) + (flag,)
    tail = (t["q_norm_weight"], t["k_norm_weight"], cos, sin, b, s, h, hk, d, spec.norm,
            eps_value, spec.rope, spec.rotary_dim)
    return _attend_and_project(t, spec, None, x16, w16, cuts, (x_inv, q_inv, k_inv, v_inv),
                               copies, o16, wo16_ready, tail, eps_k_value, mask, scale_value,
                               prec)


def _epilogue_form(spec, n_tok, out16, run):
    """The copies launch's programs: token-major (a ``qk_epilogue.TOKEN_CONFIGS`` entry) or
    head rows (None), timed per bucket of token count. Token-major programs load the feature
    scales once per program and cos/sin once per token instead of per head row
    (``qk_epilogue._tokens``); they cover no or rotate-half RoPE over the whole power-of-two head.
    ``run`` times them without o_proj's weight copy: the choice is for the q, k, V programs, and
    under CUDA-graph capture (where no timing happens) the launch has no Wo programs
    (``wo16_mode``), so the eager first call decides for the captured launch too.
    INDUCTOR_GQA_TOKEN_EPILOGUE=0 keeps the head-row form."""
    d = spec.head_dim
    if (os.environ.get("INDUCTOR_GQA_TOKEN_EPILOGUE", "1") == "0"
            or not qk_epilogue.token_major_covers(d, spec.rope, spec.rotary_dim)):
        return None
    key = ("copies epilogue", tuning.bucket(n_tok), spec.num_heads, spec.num_kv_heads, d,
           spec.norm, spec.rope, out16)
    return tuning.pick(key, list(qk_epilogue.TOKEN_CONFIGS) + [None], run)


def _scaled_fp16_operands(x, ws, flag, table=None, target=fp16_rows.TARGET_EXP):
    """x [B, S, E] and the weights as fp16 copies with exact power-of-two row scales (each row's
    maximum in [2^target, 2^(target+1))): (x16 [B*S, E], x_inv, w16 [sum N, E], w_inv, cuts)
    with the weights as row blocks of w16; the same launch sets ``flag`` to 0."""
    e = x.shape[-1]
    x2d = x.reshape(-1, e).contiguous()
    ws = [w.contiguous() for w in ws]
    n = [w.shape[0] for w in ws]
    w16 = torch.empty((sum(n), e), device=x.device, dtype=torch.float16)
    w_inv = torch.empty((sum(n),), device=x.device, dtype=torch.float32)
    cuts = ((0, n[0]), (n[0], n[0] + n[1]), (n[0] + n[1], sum(n)))
    (x16, x_inv), *_ = fp16_rows.scale_rows(
        [x2d] + ws, [None] + [(w16[a:z], w_inv[a:z]) for a, z in cuts], zero=flag, table=table,
        target=target)
    return x16, x_inv, w16, w_inv, cuts
