"""``python -m inductor_gqa explain``: a target given as a module or as a file path, and every
mistake in it answered in one line with a hint and a non-zero exit status (no traceback)."""

import subprocess
import sys
import textwrap

import pytest

from inductor_gqa.__main__ import main

_MODULE = textwrap.dedent('''
    import torch
    import torch.nn.functional as F


    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.q = torch.nn.Linear(32, 64, bias=False)
            self.k = torch.nn.Linear(32, 32, bias=False)
            self.v = torch.nn.Linear(32, 32, bias=False)
            self.o = torch.nn.Linear(64, 32, bias=False)

        def forward(self, x):
            b, s, _ = x.shape
            q = self.q(x).view(b, s, 4, 16).transpose(1, 2)
            k = self.k(x).view(b, s, 2, 16).transpose(1, 2)
            v = self.v(x).view(b, s, 2, 16).transpose(1, 2)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            return self.o(o.transpose(1, 2).reshape(b, s, 64))


    def factory():
        return Block(), (torch.randn(2, 5, 32),)


    def broken():
        raise ValueError("no weights here")
''')


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """A module file in tmp/models/, the current folder tmp/work/."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "mymod_cli.py").write_text(_MODULE)
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.setattr(sys, "path", list(sys.path))    # a file's folder is put on it
    yield tmp_path
    sys.modules.pop("mymod_cli", None)


def test_a_file_path_from_another_folder(elsewhere, capsys):
    assert main(["explain", str(elsewhere / "models" / "mymod_cli.py") + ":factory"]) == 0
    out = capsys.readouterr().out
    assert out.strip().endswith("fused 1 of 1 attention blocks; 0 left")
    assert main(["explain", "../models/mymod_cli.py:factory"]) == 0     # relative to the cwd


@pytest.mark.parametrize("target,expected", [
    ("mymod_cli:factory", "cannot import 'mymod_cli'"),          # not in this folder
    ("../models/mymod_cli.py:factroy", "did you mean factory?"),
    ("../models/nope.py:factory", "no file '../models/nope.py'"),
    ("../models/mymod_cli.py:broken", "failed: ValueError: no weights here"),
    ("../models/mymod_cli.py", "expected module:factory"),
])
def test_mistakes_are_one_line_with_a_hint(elsewhere, capsys, target, expected):
    assert main(["explain", target]) == 2
    err = capsys.readouterr().err
    assert expected in err and err.count("\n") == 1, err
    if target.startswith("mymod_cli"):
        assert "give its path (path/to/mymod_cli.py:factory)" in err


def test_a_missing_module_without_traceback(tmp_path):
    """The command itself, as a user runs it."""
    run = subprocess.run([sys.executable, "-m", "inductor_gqa", "explain", "mymdo:factory"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2
    assert "Traceback" not in run.stderr
    assert run.stderr.strip().startswith("explain: cannot import 'mymdo'"), run.stderr
