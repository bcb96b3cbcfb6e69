"""kernels/launcher.py: the key that decides when a kept compiled kernel may be launched again, and
the argument order of that launch (the launch itself runs on the GPU only; here a stand-in
compiled kernel records what it is given)."""

import torch
import triton.language as tl
from triton.runtime.jit import JITFunction

from inductor_gqa.kernels import launcher


def _probe(X, Y, n, scale, BLOCK: tl.constexpr, MODE: tl.constexpr = 1, EXTRA=None):
    pass


# the parameters as a JITFunction sees them (triton.jit gives an interpreter object here)
_PARAMS = JITFunction(_probe).params


class _Compiled:
    """Stands in for triton's CompiledKernel: ``[grid](*args)`` launches."""
    function = packed_metadata = None

    def __init__(self, calls):
        self.calls = calls

    def run(self, *a):
        raise AssertionError("launch goes through __getitem__")

    def __getitem__(self, grid):
        return lambda *args: self.calls.append(("fast", grid, args))


class _Kernel:
    """A JITFunction's ``params`` and ``[grid](...)``, recording the calls Triton would see."""
    def __init__(self):
        self.params = _PARAMS
        self.calls = []
        self.compiled = _Compiled(self.calls)

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.calls.append(("triton", grid, args, kwargs))
            return self.compiled
        return run


def _tensor(offset=0, dtype=torch.float32):
    return torch.zeros(64, dtype=dtype)[offset:]


def test_key_is_at_least_as_fine_as_tritons(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    k = _Kernel()
    x, y = _tensor(), _tensor()
    base = launcher.key(k, (x, y, 64, 1.0), {"BLOCK": 32, "num_warps": 4})
    assert base is not None
    # the same specialization: another aligned tensor, another multiple of 16
    assert launcher.key(k, (_tensor(), y, 128, 2.0), {"BLOCK": 32, "num_warps": 4}) == base
    # each of Triton's specializations changes it
    for args, kw in [((_tensor(1), y, 64, 1.0), {}),                     # 16-byte alignment
                     ((_tensor(dtype=torch.float16), y, 64, 1.0), {}),    # dtype
                     ((x, y, 1, 1.0), {}), ((x, y, 65, 1.0), {}),         # n == 1, n % 16
                     ((x, y, 2 ** 40, 1.0), {}),                          # i64
                     ((x, y, 64, 1.0), {"BLOCK": 64}),                    # a constexpr
                     ((x, y, 64, 1.0), {"MODE": 2}),
                     ((x, y, 64, 1.0), {"num_warps": 8})]:                # an option
        kwargs = {"BLOCK": 32, "num_warps": 4, **kw}
        assert launcher.key(k, args, kwargs) != base, (args, kw)
    # a constexpr passed by position is keyed on its value
    assert (launcher.key(k, (x, y, 64, 1.0, 32), {})
            != launcher.key(k, (x, y, 64, 1.0, 48), {}))
    # arguments it cannot key go to Triton
    assert launcher.key(k, (x, y, 64, object()), {"BLOCK": 32}) is None
    assert launcher.key(k, (x, y, 64, 1.0), {"BLOCK": [32]}) is None


def test_second_launch_takes_the_kept_kernel_with_arguments_in_order(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(launcher, "enabled", lambda: True)
    monkeypatch.setattr(launcher, "_COMPILED", {})
    k = _Kernel()
    x, y = _tensor(), _tensor()
    launcher.launch(k, (4,), x, y, 64, 1.0, BLOCK=32, num_warps=4)
    assert k.calls[-1][0] == "triton"
    launcher.launch(k, (4, 2), x, y, 64, 1.0, BLOCK=32, EXTRA=y, num_warps=4)
    assert k.calls[-1][0] == "triton"           # another key (EXTRA given)
    launcher.launch(k, (8,), x, y, 96, 0.5, BLOCK=32, num_warps=4)
    kind, grid, args = k.calls[-1]
    assert kind == "fast" and grid == (8, 1, 1)
    # every parameter in signature order, defaults filled in, options left out
    assert args[:4] == (x, y, 96, 0.5) and args[4:] == (32, 1, None)


def test_off_switch_and_interpreter(monkeypatch):
    monkeypatch.setenv("INDUCTOR_GQA_FAST_LAUNCH", "0")
    assert not launcher.enabled()
    monkeypatch.setenv("INDUCTOR_GQA_FAST_LAUNCH", "1")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not launcher.enabled()
