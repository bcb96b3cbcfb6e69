"""kernels/pdl.py: when programmatic dependent launch is used."""

import pytest
import torch

from inductor_gqa.kernels import pdl


def test_pdl_only_on_cuda_and_switchable(monkeypatch):
    """Never for CPU tensors (the interpreter), off with INDUCTOR_GQA_PDL=0 and under the
    interpreter; the constexpr and the launch option always come together."""
    assert pdl.launch_options(torch.device("cpu")) == {}
    monkeypatch.setenv("INDUCTOR_GQA_PDL", "0")
    assert pdl.mode(torch.device("cuda", 0)) == 0
    monkeypatch.setenv("INDUCTOR_GQA_PDL", "1")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert pdl.mode(torch.device("cuda", 0)) == 0
    for opts in pdl._OPTIONS[1:]:
        assert set(opts) == {"PDL", "launch_pdl"} and opts["launch_pdl"]


def test_pdl_switch_rejects_other_values(monkeypatch):
    monkeypatch.setenv("INDUCTOR_GQA_PDL", "yes")
    with pytest.raises(ValueError, match="INDUCTOR_GQA_PDL"):
        pdl.mode(torch.device("cpu"))
