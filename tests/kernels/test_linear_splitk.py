"""linear.py's split-K kernel through the Triton interpreter: every split of K, ragged K and
tiles, 16-bit and float32 outputs, bitwise-repeatable sums, counters left at zero."""

import pytest
import torch

from inductor_gqa.kernels import linear

CFG = dict(block_m=32, block_n=32, block_k=16, group_m=2, num_warps=4, num_stages=1)


@pytest.mark.parametrize("split_k", [1, 2, 3])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16])
def test_splitk_matches_a_float64_product(split_k, out_dtype):
    g = torch.Generator().manual_seed(split_k)
    m, n, k = 45, 70, 88        # ragged tiles; K not a multiple of BLOCK_K * split_k
    x = torch.randn(m, k, generator=g).half()
    w = torch.randn(n, k, generator=g).half()
    y = torch.full((m, n), float("nan"), dtype=out_dtype)
    ws = linear.splitk_workspace(m, n, CFG["block_m"], CFG["block_n"], split_k, "cpu")
    linear.launch_splitk(x, w, y, ws, split_k=split_k, **CFG)
    ref = x.double() @ w.double().t()
    tol = 1e-5 if out_dtype == torch.float32 else 2e-3
    torch.testing.assert_close(y.double(), ref, rtol=tol, atol=tol)
    assert int(ws[1].abs().sum()) == 0          # every tile's counter reset by its last program
    again = torch.full_like(y, float("nan"))
    linear.launch_splitk(x, w, again, ws, split_k=split_k, **CFG)
    assert torch.equal(again, y)


def test_splitk_writes_strided_outputs_and_checks_its_workspace():
    x = torch.randn(20, 40).half()
    w = torch.randn(24, 40).half()
    y = torch.zeros(24, 20).t()                 # column-major [20, 24]
    ws = linear.splitk_workspace(20, 24, CFG["block_m"], CFG["block_n"], 2, "cpu")
    linear.launch_splitk(x, w, y, ws, split_k=2, **CFG)
    torch.testing.assert_close(y.double(), x.double() @ w.double().t(), rtol=1e-5, atol=1e-5)
    small = linear.splitk_workspace(20, 24, CFG["block_m"], CFG["block_n"], 1, "cpu")
    with pytest.raises(ValueError, match="workspace"):
        linear.launch_splitk(x, w, y, small, split_k=2, **CFG)
