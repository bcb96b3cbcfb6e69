"""``python -m inductor_gqa demo``: compile both reference workloads and show what was fused.

On a CPU-only machine it runs them at reduced size and checks results against eager, then a
training step of each module form (gradients against eager's). On a GPU it
runs full-size cases and prints times against eager and stock torch.compile (a quick look; the
perf job in ``perf/`` is the measurement of record).

``python -m inductor_gqa explain package.module:factory`` (or ``path/to/file.py:factory``):
``factory()`` returns
``(model, args)`` or ``(model, args, kwargs)``; the model is compiled on the CPU and every
attention-like block is listed by module path, fused or left with the reason.
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch._dynamo.utils import counters

import inductor_gqa
from inductor_gqa import workloads as wl
from inductor_gqa.explain import explain

SMALL = dict(num_heads=4, num_kv_heads=2, head_dim=32)
GPU_CASES = {"W075": [(256, 4), (1024, 2), (4096, 1)], "W092": [(128, 4), (512, 4), (2048, 1)]}


def _outs(x):
    return x if isinstance(x, tuple) else (x,)


def _check(workload, out, ref, seq, batch, small):
    rtol = workload.rtol
    atol = 5e-3 if (small and workload.dtype != torch.float32) else wl.atol(workload, seq, batch)
    results = [wl.check(o, r, atol, rtol) for o, r in zip(_outs(out), _outs(ref))]
    return all(ok for ok, _ in results), min(frac for _, frac in results)


def _compile(fn, **kw):
    torch._dynamo.reset()
    counters["inductor_gqa"].clear()
    return torch.compile(fn, backend="inductor_gqa", **kw)


def demo_cpu() -> int:
    print("No GPU: compiling both workloads at reduced size (hidden 128, 4 heads, 2 KV heads).\n")
    failures = 0
    for workload in (wl.W075, wl.W092):
        for form in ("function", "module"):
            torch.manual_seed(0)
            seq, batch = 33, 2
            if form == "function":
                fn = wl.workload_fn(workload, **SMALL)
                inputs = wl.make_inputs(workload, seq, batch, hidden=128, **SMALL)
                call = lambda f: f(**inputs)  # noqa: E731
            else:
                fn, args = _module(workload, seq, batch)
                call = lambda f: f(*args)  # noqa: E731
            compiled = _compile(fn)
            with torch.no_grad():
                out, ref = call(compiled), call(fn)
            ok, frac = _check(workload, out, ref, seq, batch, small=True)
            stats = dict(counters["inductor_gqa"])
            fused = stats.get("blocks_fused", 0)
            failures += (not ok) + (fused != 1)
            print(f"{workload.name} {form:8s} fused {fused} of {stats.get('blocks_seen', 0)} "
                  f"block(s); matches eager: {'yes' if ok else 'NO'} ({frac:.2%} within tolerance)")
            for key, n in stats.items():
                if key.startswith("rejected"):
                    print(f"    {key} x{n}")
    for workload in (wl.W075, wl.W092):
        failures += _demo_training_cpu(workload)
    print("\nall good" if not failures else f"\n{failures} problem(s)")
    return 1 if failures else 0


def _demo_training_cpu(workload) -> int:
    """A forward and backward of the module form (eval mode, its parameters and hidden states
    requiring grad; every output gets a cotangent): fused before autograd, every gradient
    against eager's."""
    torch.manual_seed(0)
    seq, batch = 33, 2
    m, args = _module(workload, seq, batch)
    leaves = [args[0].requires_grad_(), *m.parameters()]

    def grads(f):
        out = _outs(f(*args))
        cot = [torch.randn(o.shape, generator=torch.Generator().manual_seed(i)).to(o.dtype)
               for i, o in enumerate(out)]
        return torch.autograd.grad(out, leaves, cot)

    got, ref = grads(_compile(m)), grads(m)
    stats = dict(counters["inductor_gqa"])
    fused = stats.get("blocks_fused", 0)
    # the largest error of each gradient, relative to that gradient's largest element
    worst = max(((g - r).abs().max() / r.abs().max().clamp_min(1e-12)).item()
                for g, r in zip(got, ref))
    ok = worst <= (2e-2 if workload.dtype != torch.float32 else 1e-4)
    print(f"{workload.name} training fused {fused} of {stats.get('blocks_seen', 0)} block(s); "
          f"gradients match eager: {'yes' if ok else 'NO'} (worst {worst:.1e} of scale)")
    return (not ok) + (fused != 1)


def _module(workload, seq, batch, device="cpu", small=True):
    kw = dict(hidden=128, **SMALL) if small else {}
    if workload.name == "W075":
        m = wl.W075Attention(**kw).to(device).eval()
        hidden = kw.get("hidden", 1024)
        return m, (torch.randn(batch, seq, hidden, device=device),
                   torch.arange(seq, device=device)[None].expand(batch, seq))
    m = wl.W092Attention(**kw).to(device=device, dtype=torch.bfloat16).eval()
    hidden, d = kw.get("hidden", 4096), kw.get("head_dim", 128)
    return m, (torch.randn(batch, seq, hidden, device=device).bfloat16(),
               torch.randn(batch, seq, d, device=device).cos().bfloat16(),
               torch.randn(batch, seq, d, device=device).sin().bfloat16())


def demo_gpu() -> int:
    from triton.testing import do_bench

    torch.set_float32_matmul_precision("high")
    print(f"{torch.cuda.get_device_name()}: full-size cases, plain-launch median times (us); "
          "W075 with float32 matmul precision 'high'.\n")
    print(f"{'case':>16} {'eager':>9} {'stock':>9} {'ours':>9} {'ours/stock':>10} {'check':>6}")
    failures = 0
    for workload in (wl.W075, wl.W092):
        fn = wl.workload_fn(workload)
        stock = torch.compile(fn)
        ours = torch.compile(fn, backend="inductor_gqa")
        for seq, batch in GPU_CASES[workload.name]:
            inputs = wl.make_inputs(workload, seq, batch, device="cuda")
            with torch.no_grad():
                ok, _ = _check(workload, ours(**inputs), fn(**inputs), seq, batch, small=False)
                times = [do_bench(lambda f=f: f(**inputs), return_mode="median") * 1e3
                         for f in (fn, stock, ours)]
            failures += not ok
            print(f"{workload.name} {seq:>5}x{batch:<3} {times[0]:9.1f} {times[1]:9.1f} "
                  f"{times[2]:9.1f} {times[2] / times[1]:10.2f} {'ok' if ok else 'FAIL':>6}")
    print(f"\nfused blocks: {dict(counters['inductor_gqa'])}")
    return 1 if failures else 0


def _fresh_compiles() -> None:
    """The demo compiles afresh, so what it prints is what our pass did now (a cache hit would
    count the blocks recorded for its code, inductor_gqa/fused.py)."""
    torch._inductor.config.fx_graph_cache = False
    torch._functorch.config.enable_autograd_cache = False


class TargetError(Exception):
    """What is wrong with an explain target, in one line with a hint."""


_USAGE = "python -m inductor_gqa explain package.module:factory (or path/to/file.py:factory)"


def load_factory(target: str):
    """The factory a target names: ``package.module:factory`` (imported as Python would from
    the current folder) or ``path/to/file.py:factory`` (loaded from that file, its folder on
    ``sys.path`` for its own imports). Every failure is a ``TargetError`` of one line."""
    import difflib
    import importlib
    import importlib.util
    import os

    where, sep, attr = target.rpartition(":")
    if not sep or not where or not attr:
        raise TargetError(f"expected module:factory, got {target!r}; usage: {_USAGE}")
    is_file = where.endswith(".py") or os.sep in where or "/" in where
    try:
        if is_file:
            path = os.path.abspath(where)
            if not os.path.isfile(path):
                raise TargetError(f"no file {where!r} (from {os.getcwd()}); usage: {_USAGE}")
            folder, name = os.path.split(path)
            sys.path.insert(0, folder)
            spec = importlib.util.spec_from_file_location(os.path.splitext(name)[0], path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
        else:
            if "" not in sys.path and os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(where)
    except TargetError:
        raise
    except ModuleNotFoundError as e:
        hint = (f"run from the folder that holds {where.split('.')[0]}.py, or give its path "
                f"(path/to/{where.split('.')[-1]}.py:{attr})" if e.name == where.split(".")[0]
                else "is it installed in this environment?")
        raise TargetError(f"cannot import {where!r}: {e}; {hint}") from None
    except Exception as e:  # noqa: BLE001  (the user's module failed while importing)
        raise TargetError(f"importing {where!r} failed: {type(e).__name__}: {e}") from None
    factory = getattr(module, attr, None)
    if factory is None:
        names = [n for n in vars(module) if not n.startswith("_") and callable(vars(module)[n])]
        close = difflib.get_close_matches(attr, names, n=3)
        hint = f"did you mean {', '.join(close)}?" if close else f"its callables: {names[:8]}"
        raise TargetError(f"{where!r} has no {attr!r}; {hint}")
    return factory


def explain_main(target: str, dynamic: bool = False) -> int:
    """``explain``: the table on stdout, exit status 0; a bad target or a failing factory: one
    line on stderr (no traceback) and exit status 2."""
    try:
        factory = load_factory(target)
        try:
            made = factory()
        except Exception as e:  # noqa: BLE001
            raise TargetError(f"{target}() failed: {type(e).__name__}: {e}") from None
        if not (isinstance(made, tuple) and len(made) in (2, 3)):
            raise TargetError(f"{target}() must return (model, args) or (model, args, kwargs), "
                              f"not {type(made).__name__}")
    except TargetError as e:
        print(f"explain: {e}", file=sys.stderr)
        return 2
    model, args, kwargs = (*made, {}) if len(made) == 2 else made
    if isinstance(model, torch.nn.Module):
        model = model.eval()
    result = explain(model, *args, dynamic=dynamic or None, **kwargs)
    print(result.table())
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m inductor_gqa", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", nargs="?", default="demo", choices=("demo", "explain"))
    p.add_argument("target", nargs="?",
                   help="explain: package.module:factory or path/to/file.py:factory")
    p.add_argument("--cpu", action="store_true", help="run the CPU demo even if a GPU is present")
    p.add_argument("--dynamic", action="store_true", help="explain: compile with dynamic=True")
    args = p.parse_args(argv)
    _fresh_compiles()
    if args.command == "explain":
        if not args.target:
            p.error(f"explain needs a target: {_USAGE}")
        return explain_main(args.target, args.dynamic)
    if torch.cuda.is_available() and not args.cpu:
        return demo_gpu()
    return demo_cpu()


if __name__ == "__main__":
    sys.exit(main())
