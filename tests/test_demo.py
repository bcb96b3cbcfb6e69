"""The README's main job (``python -m inductor_gqa demo``) on the CPU: both workloads, function
and module forms, and a training step of each, fused and checked against eager."""

from inductor_gqa.__main__ import main


def test_cpu_demo_fuses_and_checks_everything(capsys):
    assert main(["demo", "--cpu"]) == 0
    out = capsys.readouterr().out
    for name in ("W075", "W092"):
        assert f"{name} training fused 1 of 1 block(s); gradients match eager: yes" in out
    assert out.count("fused 1 of 1 block(s)") == 6 and "all good" in out
