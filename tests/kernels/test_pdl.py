"""kernels/pdl.py: when programmatic dependent launch is used."""


def test_pdl_only_on_cuda_and_switchable(monkeypatch):
    """Programmatic dependent launch: never for CPU tensors (the interpreter), off with
    INDUCTOR_GQA_PDL=0; the constexpr and the launch option always come together."""
    import torch

    from inductor_gqa.kernels import pdl
    assert pdl.launch_options(torch.device("cpu")) == {}
    monkeypatch.setenv("INDUCTOR_GQA_PDL", "0")
    assert not pdl.enabled(torch.device("cuda", 0))
    monkeypatch.setenv("INDUCTOR_GQA_PDL", "1")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not pdl.enabled(torch.device("cuda", 0))
    assert set(pdl._ON) == {"PDL", "launch_pdl"}
