"""kernels/host.py's integer helpers agree with Triton's (which the launchers used before)."""
import triton

from inductor_gqa.kernels.host import cdiv, next_pow2


def test_cdiv_matches_triton():
    assert all(cdiv(a, b) == triton.cdiv(a, b) for a in range(0, 300) for b in range(1, 70))


def test_next_pow2_matches_triton():
    assert all(next_pow2(n) == triton.next_power_of_2(n) for n in range(1, 5000))
    assert next_pow2(0) == 1
