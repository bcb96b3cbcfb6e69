"""Eager attention as the kernels must compute it (float64), for the forward and backward tests."""

import torch


def attention(q, k, v, *, scale, causal=False, window=0, softcap=0.0, mask=None,
              mask_kind="none", mask_fill=float("-inf"), empty_zero=False, divisor=None):
    """(o, p) of q [B, H, S, D], k/v [B, Hkv, S, D] (GQA by repeating K/V, as eager code does),
    masks applied in eager's order; differentiable."""
    g = q.shape[1] // k.shape[1]
    kr, vr = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = q @ kr.transpose(-1, -2)
    s = s / divisor if divisor is not None else s * scale
    if softcap:
        s = torch.tanh(s / softcap) * softcap
    n = q.shape[2]
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    if causal:
        s = s.masked_fill(j > i, float("-inf"))
    if window:
        s = s.masked_fill(i - j >= window, float("-inf"))
    if mask_kind == "bool_fill":
        s = s.masked_fill(mask, mask_fill)
    elif mask_kind == "bool_keep":
        s = s.masked_fill(~mask, float("-inf"))
    elif mask_kind == "additive":
        s = s + mask.to(s.dtype)
    if empty_zero:      # SDPA's rule, with a finite softmax on the empty rows (zero gradients)
        empty = (s == float("-inf")).all(-1, keepdim=True)
        p = torch.softmax(s.masked_fill(empty, 0.0), -1).masked_fill(empty, 0.0)
    else:
        p = torch.softmax(s, -1)
    return p @ vr, p
