"""Training steps: forward + backward of W092's block (the ``train`` suite) and of the models
suite's models (``--model-tasks train``), eager / stock / ours.

A step is the compiled forward and ``torch.autograd.grad`` of the output against a fixed random
cotangent (blocks) or of the model's own LM loss (models), for every input that requires grad:
hidden states, weights, biases and norm weights (blocks; cos/sin do not), every parameter
(models). Ours is ``backend="inductor_gqa"`` with ``options={"fuse_with_grad": True}``. Every
compiled implementation compiles once per case with ``dynamic=False`` (ours' gradient path
needs static shapes; stock at its best).

Per row: ``gpu_us`` (CUDA-graph replay of whole steps, as the forward rows), ``plain_us`` (a
step from an idle device), ``peak_mib`` (peak allocated memory during a plain step above what
was allocated before it: the step's own memory, activations and gradients; weights, inputs and
whatever the process still holds from earlier rows are ``held_mib``, left out since they differ
with the rows' order, not with the implementation), ``saved_mib`` (memory still allocated
after the forward, before the backward: what the forward keeps for it, output included),
``fwd_grad_us`` / ``fwd_nograd_us`` (the forward alone with grad enabled and under
``torch.no_grad()``, each compiled for itself, GPU time, blocks of the two in turn), ``fused``,
and ``check``: every gradient against eager's on fresh inputs, an element passing when
|g - ref| <= 0.05 * (|ref| + rms(ref)) (the W092 rule's rtol, its absolute part scaled to the
gradient's size), at least 99% of every gradient's elements. A 16-bit model's gradients
(through its layers and LM loss) differ from eager's far beyond that rule, stock's as much as
ours: there every parameter's gradient must be as close to a float32 copy's as eager's is
(``grad_check_vs_float32``, rule "grad_vs_float32"; its fraction counts parameters).
"""

from __future__ import annotations

import contextlib
import statistics
import traceback
from typing import Callable

import torch

from . import bench, stats
from .rows import fusion_counts, open_row, token_ids

TRAIN_IMPLS = ("eager", "stock_static", "backend")
GRAD_OPTIONS = {"fuse_with_grad": True}
NO_GRAD_INPUTS = ("cos", "sin")
# rough seconds per case on an H200: compiling a forward and its backward, then the timings
EST_COMPILE_S = 30.0
EST_ROW_S = 4.0


def grad_check(got, ref, min_pass: float = 0.99) -> tuple[bool, float]:
    """(passed, smallest passing fraction) over pairs of gradients (see the module doc)."""
    worst = 1.0
    for g, r in zip(got, ref):
        g, r = g.float(), r.float()
        if g.shape != r.shape or not torch.isfinite(g).all():
            return False, 0.0
        rms = r.pow(2).mean().sqrt()
        ok = (g - r).abs() <= 0.05 * (r.abs() + rms)
        worst = min(worst, ok.float().mean().item())
    return worst >= min_pass, worst


def float32_grads(model, step_of, inputs) -> list:
    """Per input, the gradients of a float32 copy of ``model`` (on the host), or None where the
    copy does not fit: the reference a bf16 model's gradients are judged against."""
    import copy
    try:
        m32 = copy.deepcopy(model).float()
        out = [[g.detach().float().cpu() for g in step_of(m32, x)()] for x in inputs]
    except torch.OutOfMemoryError:
        return None
    finally:
        m32 = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return out


def _rel_errors(got, exact) -> list:
    return [((g.detach().float().cpu() - e).norm() / e.norm().clamp_min(1e-30)).item()
            for g, e in zip(got, exact)]


def grad_check_vs_float32(got, eager, exact, slack: float = 2.0) -> tuple[bool, float]:
    """(passed, fraction of parameters passing): a parameter passes when its gradient's
    relative error against float32's is at most ``slack`` times eager bf16's own, plus 1e-3.
    (Through several layers and an LM loss, bf16 gradients differ elementwise from each other
    far beyond the W092 rule, stock's as much as ours.)"""
    ours, base = _rel_errors(got, exact), _rel_errors(eager, exact)
    ok = [o <= slack * b + 1e-3 for o, b in zip(ours, base)]
    frac = sum(ok) / max(1, len(ok))
    return all(ok), frac


def compile_for_training(impl: str, fn, options=None):
    """``fn`` as the implementation trains it (static shapes); ``options``: ours' Options
    (default ``GRAD_OPTIONS``)."""
    if impl == "eager":
        return fn
    if impl in stats.STOCKS:
        return torch.compile(fn, backend="inductor", dynamic=False)
    if impl == "backend":
        why = bench.backend_available()
        if why:
            raise bench.Unavailable(why)
        return torch.compile(fn, backend="inductor_gqa", dynamic=False,
                             options=options or GRAD_OPTIONS)
    raise ValueError(f"no training step for implementation {impl!r}")


@contextlib.contextmanager
def _variant(row: dict, v: dict, device):
    """One implementation's compilation and timings: an error goes into its row and variant
    (the suite goes on); Dynamo's caches and the allocator's are emptied after it."""
    try:
        yield
    except Exception as e:  # noqa: BLE001
        row["error"] = v["error"] = f"{type(e).__name__}: {e}"[:1000]
        v["status"] = "error"
        traceback.print_exc()
    finally:
        torch._dynamo.reset()
        if bench.is_cuda(device):
            torch.cuda.empty_cache()


def _check_cell(results: list, rounds: int) -> dict:
    """The row's ``check`` from ``grad_check`` results, one per round."""
    return {"passed": all(ok for ok, _ in results), "min_frac": min(f for _, f in results),
            "rounds": rounds, "rule": "grad"}


def measure_step(row: dict, step: Callable[[], object], forward: Callable[[], object], args,
                 device) -> None:
    """The timings and memory of ``step`` (forward: the step's forward alone) into ``row``."""
    try:
        info = {}
        gpu, meds, spread = bench.device_time_us(step, device, args.replays, args.blocks,
                                                 info=info)
        row.update(gpu_us=gpu, block_medians=meds, spread=spread, **info)
    except Exception as e:  # noqa: BLE001  (e.g. a step that cannot be captured)
        row["graph_error"] = f"{type(e).__name__}: {e}"[:500]
        bench.sync(device)
    row["plain_us"], row["plain_spread"] = bench.plain_time_us(step, args.plain_runs, device)
    if bench.is_cuda(device):
        with bench.peak_memory(row, device):
            step()
        out = forward()
        bench.sync(device)
        row["saved_mib"] = torch.cuda.memory_allocated() / 2**20 - row["held_mib"]
        del out


def forward_costs(row: dict, call, leaves: dict, args, device) -> None:
    """The forward alone with grad enabled and under ``no_grad``: blocks of each taken in turn
    (medians over all), so that a drift of the machine's clocks falls on both alike."""
    detached = {k: t.detach() for k, t in leaves.items()}
    times = {"fwd_grad_us": [], "fwd_nograd_us": []}
    for _ in range(max(1, args.blocks)):
        with torch.no_grad():
            times["fwd_nograd_us"].append(bench.device_time_us(
                lambda: call(**detached), device, args.replays, 1)[0])
        times["fwd_grad_us"].append(bench.device_time_us(
            lambda: call(**leaves), device, args.replays, 1)[0])
    row.update({k: statistics.median(v) for k, v in times.items()})


def run_blocks(args, rows: list, variants: list, device, over_deadline, log, save) -> None:
    """W092's block: one ``kind: "train_block"`` row per (case, implementation)."""
    from torch._dynamo.utils import counters

    from inductor_gqa import workloads as wl

    workload = wl.W092
    dims = bench.SMOKE_DIMS if args.smoke else None
    fn = bench.block_fn(workload, dims)
    for s, b in args.train_cases_list:
        cid = list(workload.cases).index((s, b)) if (s, b) in workload.cases else 0
        seed = args.seed * 100003 + cid

        def fresh(r):
            inputs = bench.make_inputs(workload, s, b, device, seed=seed + 1000 * r, dims=dims)
            leaves = {k: v.requires_grad_(v.is_floating_point() and k not in NO_GRAD_INPUTS)
                      for k, v in inputs.items()}
            g = torch.Generator(device=device)
            g.manual_seed(seed + 7 + 1000 * r)
            width = inputs["o_proj_weight"].shape[0]
            cot = torch.randn(b, s, width, generator=g, device=device).to(workload.dtype)
            return leaves, cot

        def make_step(call, leaves, cot):
            wanted = [v for v in leaves.values() if v.requires_grad]

            def step():
                return torch.autograd.grad(call(**leaves), wanted, cot)
            return step

        checks = [fresh(r + 1) for r in range(args.check_rounds)]
        refs = [make_step(fn, *c)() for c in checks]
        for impl in args.train_impls_list:
            row = {"kind": "train_block", "workload": workload.name, "impl": impl, "seq": s,
                   "batch": b, "status": "error"}
            rows.append(row)
            if over_deadline(EST_COMPILE_S + EST_ROW_S if impl != "eager" else EST_ROW_S):
                row["status"] = "skipped"
                continue
            v = {"workload": workload.name, "task": "train", "impl": impl, "seq": s,
                 "batch": b, "status": "ok", "compile_s": None, "error": None}
            variants.append(v)
            torch._dynamo.reset()
            counters["inductor_gqa"].clear()
            with _variant(row, v, device):
                call = compile_for_training(impl, fn, args.train_options_dict)
                leaves, cot = fresh(0)
                step = make_step(call, leaves, cot)
                _, v["compile_s"] = bench.wall(step, device)
                row["inproc_first_s"] = v["compile_s"]
                row["fused"] = counters["inductor_gqa"].get("blocks_fused", 0) > 0
                if args.check_rounds:
                    row["check"] = _check_cell([grad_check(make_step(call, *c)(), ref)
                                                for c, ref in zip(checks, refs)],
                                               args.check_rounds)
                measure_step(row, step, lambda: call(**leaves), args, device)
                forward_costs(row, call, leaves, args, device)
                row["status"] = "ok" if row.get("gpu_us") or row.get("plain_us") else "error"
            log(f"train W092 {stats.case_label(s, b)} {impl}: {row['status']} step gpu "
                f"{row.get('gpu_us', float('nan')):.1f} us plain "
                f"{row.get('plain_us', float('nan')):.1f} us peak "
                f"{row.get('peak_mib', float('nan')):.0f} MiB saved "
                f"{row.get('saved_mib', float('nan')):.0f} MiB fwd grad/no_grad "
                f"{row.get('fwd_grad_us', float('nan')):.1f}/"
                f"{row.get('fwd_nograd_us', float('nan')):.1f} us fused {row.get('fused')} "
                f"check {stats.check_cell(row)} first {row.get('inproc_first_s') or 0:.1f}s"
                + (f" ERROR {row['error'][:200]}" if row.get("error") else "")
                + (f" (no graph replay: {row['graph_error'][:160]})"
                   if row.get("graph_error") else ""))
            save()
        del checks, refs


def estimate_s(n_cases: int, impls) -> float:
    compiled = sum(1 for i in impls if i != "eager")
    return n_cases * (compiled * EST_COMPILE_S + len(impls) * EST_ROW_S)


def run_model_shape(args, model, base, extra, b, s, impls, rows, variants, device,
                    over_deadline, log) -> None:
    """One ``kind: "model"``, ``task: "train"`` row per implementation: the LM loss of
    ``model`` (B, S) differentiated against every parameter."""
    from torch._dynamo.utils import counters

    vocab = model.config.vocab_size
    seed0 = args.seed * 100003 + 7919 * s + b + 17
    params = [p for p in model.parameters()]
    trainable = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(True)
    was_training = model.training
    model.train()
    ids = token_ids(vocab, b, s, device, seed0)
    checks = [token_ids(vocab, b, s, device, seed0 + 1000 * (r + 1))
              for r in range(args.check_rounds)]

    def make_step(target, x, wrt=None):
        def step():
            loss = target(input_ids=x, labels=x, use_cache=False).loss
            return torch.autograd.grad(loss, params if wrt is None else wrt)
        return step

    try:
        refs = [make_step(model, x)() for x in checks]
        exact = (float32_grads(model, lambda m, x: make_step(m, x, list(m.parameters())),
                               checks) if model.dtype != torch.float32 else None)
        for impl in impls:
            row, v = open_row(rows, variants, base, extra, impl, s, b, over_deadline,
                              EST_COMPILE_S, EST_ROW_S)
            if v is None:
                continue
            torch._dynamo.reset()
            counters["inductor_gqa"].clear()
            with _variant(row, v, device):
                target = compile_for_training(impl, model, getattr(args, "train_options_dict",
                                                                   None))
                step = make_step(target, ids)
                _, v["compile_s"] = bench.wall(step, device)
                row["inproc_first_s"] = v["compile_s"]
                if impl != "eager":
                    row.update(fusion_counts(counters["inductor_gqa"]))
                if args.check_rounds and impl != "eager" and exact is not None:
                    row["check"] = dict(_check_cell(
                        [grad_check_vs_float32(make_step(target, x)(), ref, ex)
                         for x, ref, ex in zip(checks, refs, exact)], args.check_rounds),
                        rule="grad_vs_float32")
                elif args.check_rounds and impl != "eager":
                    row["check"] = _check_cell([grad_check(make_step(target, x)(), ref)
                                                for x, ref in zip(checks, refs)],
                                               args.check_rounds)
                measure_step(row, step, lambda: target(input_ids=ids, labels=ids,
                                                       use_cache=False).loss, args, device)
                row["status"] = "ok" if row.get("gpu_us") or row.get("plain_us") else "error"
            log(f"model {base['model']}/{base['attn']} train {stats.case_label(s, b)} {impl}: "
                f"{row['status']} step gpu {row.get('gpu_us', float('nan')):.1f} us plain "
                f"{row.get('plain_us', float('nan')):.1f} us peak "
                f"{row.get('peak_mib', float('nan')):.0f} MiB fused "
                f"{row.get('fused_layers', '-')}/{row.get('layers')} check "
                f"{stats.check_cell(row)} first {row.get('inproc_first_s') or 0:.1f}s"
                + (f" rejected {row['rejected']}" if row.get("rejected") else "")
                + (f" ERROR {row['error'][:200]}" if row.get("error") else ""))
    finally:
        for p, t in zip(params, trainable):
            p.requires_grad_(t)
        model.train(was_training)
