"""kernels/proj_rope.py (the Q/K/V GEMM with the norm/RoPE epilogue in one launch) against the
two-launch path it replaces: float32 products of the same fp16 operand copies, then
qk_epilogue's fp16 copies. The interpreter runs both on the CPU."""

import pytest
import torch

from inductor_gqa.kernels import proj_rope
from inductor_gqa.kernels.qk_epilogue import qk_norm_rope_
from inductor_gqa.lower import fp16_plans


def _case(b, s, e, h, hk, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, s, e, generator=g)
    ws = [torch.randn(n, e, generator=g) * 0.05 for n in (h * d, hk * d, hk * d)]
    pos = torch.arange(s)[None].expand(b, s) + 5 * torch.arange(b)[:, None]
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    ang = pos[..., None].float() * inv
    ang = torch.cat([ang, ang], -1)
    qn = 1.0 + 0.3 * torch.randn(d, generator=g)
    kn = 1.0 + 0.3 * torch.randn(d, generator=g)
    return x, ws, ang.cos(), ang.sin(), qn, kn, inv, pos


@pytest.mark.parametrize("angles", [False, True])
@pytest.mark.parametrize("norm,rope", [("none", "half"), ("fp32_weight", "half"),
                                       ("none", "none"), ("cast_weight", "half")])
@pytest.mark.parametrize("b,s,h,hk,d", [(1, 37, 4, 2, 32), (2, 5, 2, 1, 16)])
def test_matches_the_two_launch_path(norm, rope, b, s, h, hk, d, angles):
    """Both forms of the launch: cos/sin loaded from tables, or computed from inv_freq and the
    positions (``angles``; the hardware's approximations on the GPU, ~1e-6 from the tables)."""
    if angles and rope == "none":
        pytest.skip("no RoPE: no angles")
    x, ws, cos, sin, qn, kn, inv, pos = _case(b, s, 96, h, hk, d)
    flag = torch.zeros(1, dtype=torch.int32)
    x16, x_inv, w16, w_inv, cuts = fp16_plans._scaled_fp16_operands(x, ws, flag)
    parts = tuple(z - a for a, z in cuts)
    out = torch.full((b * s, sum(parts)), float("nan"), dtype=torch.float16)
    cs = (cos, sin) if rope != "none" else (None, None)
    proj_rope.launch(x16, w16, x_inv, w_inv, out, flag, parts, qn, kn, *cs, s, d, norm,
                     1e-6, 1e-5, rope, proj_rope.candidates(parts, d)[0],
                     angles=(inv, pos) if angles else None)
    prod = x16.float() @ w16.float().t()
    q, k, v = (prod[:, a:z].contiguous() for a, z in cuts)
    copies = tuple(torch.empty(t.shape, dtype=torch.float16) for t in (q, k, v))
    ref_flag = torch.zeros(1, dtype=torch.int32)
    qk_norm_rope_(q, k, qn, kn, *cs, b, s, h, hk, d, norm, 1e-6, rope, d if rope != "none" else 0,
                  eps_k=1e-5, v=v, copies=copies, flag=ref_flag,
                  scales=(x_inv, *(w_inv[a:z] for a, z in cuts)), store32=False)
    ref = torch.cat(copies, 1).float()
    assert not out.isnan().any()
    assert flag.item() == 0 and ref_flag.item() == 0
    # the same float32 steps; only the products' summation order differs (an fp16 ulp at most)
    torch.testing.assert_close(out.float(), ref, atol=2e-3, rtol=2e-3)


def test_range_flag():
    """A head row past fp16's range (k scaled up) raises the flag, as qk_epilogue's rule does."""
    x, ws, cos, sin, qn, kn, _, _ = _case(1, 9, 64, 2, 1, 16)
    ws[1] = ws[1] * 2.0 ** 18
    flag = torch.zeros(1, dtype=torch.int32)
    x16, x_inv, w16, w_inv, cuts = fp16_plans._scaled_fp16_operands(x, ws, flag)
    parts = tuple(z - a for a, z in cuts)
    out = torch.empty((9, sum(parts)), dtype=torch.float16)
    proj_rope.launch(x16, w16, x_inv, w_inv, out, flag, parts, qn, kn, cos, sin, 9, 16, "none",
                     1e-6, 1e-6, "half", proj_rope.candidates(parts, 16)[0])
    assert flag.item() == 1


def test_refusals():
    x, ws, cos, sin, qn, kn, _, _ = _case(1, 8, 64, 2, 1, 16)
    flag = torch.zeros(1, dtype=torch.int32)
    x16, x_inv, w16, w_inv, cuts = fp16_plans._scaled_fp16_operands(x, ws, flag)
    parts = tuple(z - a for a, z in cuts)
    out = torch.empty((8, sum(parts)), dtype=torch.float16)
    args = (x16, w16, x_inv, w_inv, out, flag, parts, qn, kn, cos, sin, 8, 16, "none", 1e-6,
            1e-6)
    with pytest.raises(ValueError, match="not covered"):     # a tile would split a head
        proj_rope.launch(*args, "half", (32, 8, 32, 4, 1, False))
    with pytest.raises(ValueError, match="not covered"):     # only rotate-half RoPE
        proj_rope.launch(*args, "interleaved", proj_rope.candidates(parts, 16)[0])
    with pytest.raises(ValueError, match="16-byte"):
        proj_rope.launch(x16[:, 1:], w16[:, 1:], *args[2:4],
                         torch.empty((8, sum(parts)), dtype=torch.float16), *args[5:], "half",
                         proj_rope.candidates(parts, 16)[0])
    assert not proj_rope.covers(24, "half", 24) and not proj_rope.covers(16, "half", 8)
    assert proj_rope.config_fits((64, 128, 64, 4, 4, False), (1024, 256, 256), 64)
    assert not proj_rope.config_fits((64, 128, 64, 4, 4, False), (1024, 192, 192), 64)
