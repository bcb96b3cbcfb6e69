"""kernels/host.py's integer helpers agree with Triton's (which the launchers used before)."""
import torch
import triton

from inductor_gqa.kernels.host import cdiv, next_pow2, row4


def test_cdiv_matches_triton():
    assert all(cdiv(a, b) == triton.cdiv(a, b) for a in range(0, 300) for b in range(1, 70))


def test_next_pow2_matches_triton():
    assert all(next_pow2(n) == triton.next_power_of_2(n) for n in range(1, 5000))
    assert next_pow2(0) == 1


def test_row4_where_the_launcher_leaves_a_multiple_of_4_unmarked():
    def probs(s, pad=0):
        return torch.empty(1, 2, s, s + pad)[..., :s]
    assert row4(probs(452), 452) and row4(probs(20), 20)
    assert not row4(probs(448), 448)            # multiples of 16: marked by the launcher
    assert not row4(probs(449), 449) and not row4(probs(450), 450)
    assert row4(probs(448, 4), 448)             # stride 452: a multiple of 4 only
    assert not row4(probs(452, 1), 452)         # stride 453
