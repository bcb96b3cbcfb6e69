"""Device-side parts of the perf job: inputs, the implementations under test, timing, checks."""

from __future__ import annotations

import contextlib
import math
import time
from typing import Callable, Optional

import torch

from inductor_gqa import workloads as wl

from . import stats


# ----------------------------------------------------------------------------------------- inputs
def make_inputs(workload: wl.Workload, seq: int, batch: int, device, seed: int) -> dict:
    """The workload's inputs, drawn on the device (fast for W092's weights)."""
    return wl.make_inputs(workload, seq, batch, device=device, seed=seed)


ACTIVATIONS = {"W075": ("hidden_states", "position_ids"), "W092": ("hidden_states", "cos", "sin")}


def mark_dynamic(inputs: dict, workload: wl.Workload, mode: str) -> None:
    """Make B and S symbolic for the compile (mode: unbacked | backed | static)."""
    if mode == "static":
        return
    for name in ACTIVATIONS[workload.name]:
        t = inputs[name]
        if mode == "unbacked":
            # B unbacked: no 0/1 specialization, so B=1 cases reuse the one compilation.
            torch._dynamo.decorators.mark_unbacked(t, 0)
        elif t.shape[0] > 1:
            torch._dynamo.mark_dynamic(t, 0)
        if t.shape[1] > 1:
            torch._dynamo.mark_dynamic(t, 1)


# ------------------------------------------------------------------------------------------ forms
def make_module(workload: wl.Workload, device) -> torch.nn.Module:
    cls = wl.W075Attention if workload.name == "W075" else wl.W092Attention
    mod = cls().to(device=device, dtype=workload.dtype)
    if workload.name == "W075":
        mod.rotary_emb.inv_freq = mod.rotary_emb.inv_freq.float()
    for p in mod.parameters():
        p.requires_grad_(False)
    return mod.eval()


@torch.no_grad()
def load_module(mod: torch.nn.Module, workload: wl.Workload, inputs: dict) -> tuple:
    """Copy the function-form weights into the module; return its positional call args."""
    mod.q_proj.weight.copy_(inputs["q_proj_weight"])
    mod.k_proj.weight.copy_(inputs["k_proj_weight"])
    mod.v_proj.weight.copy_(inputs["v_proj_weight"])
    mod.o_proj.weight.copy_(inputs["o_proj_weight"])
    if workload.name == "W075":
        mod.rotary_emb.inv_freq.copy_(inputs["inv_freq"])
        return (inputs["hidden_states"], inputs["position_ids"])
    mod.q_proj.bias.copy_(inputs["q_proj_bias"])
    mod.k_proj.bias.copy_(inputs["k_proj_bias"])
    mod.v_proj.bias.copy_(inputs["v_proj_bias"])
    mod.q_norm.weight.copy_(inputs["q_norm_weight"])
    mod.k_norm.weight.copy_(inputs["k_norm_weight"])
    return (inputs["hidden_states"], inputs["cos"], inputs["sin"])


def as_tuple(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


# ---------------------------------------------------------------------------------- implementations
class Unavailable(RuntimeError):
    """The implementation cannot be built in this checkout (API not there yet)."""


def backend_available() -> Optional[str]:
    """None when the 'inductor_gqa' dynamo backend is registered, else why not."""
    import inductor_gqa  # noqa: F401  (registers the backend)
    try:
        names = torch._dynamo.list_backends(exclude_tags=())
    except TypeError:
        names = torch._dynamo.list_backends()
    if "inductor_gqa" not in names:
        return ("dynamo backend 'inductor_gqa' is not registered after `import inductor_gqa` "
                "(the package must register it on import)")
    return None


def install_api() -> tuple[Callable, Callable]:
    import inductor_gqa
    inst, uninst = getattr(inductor_gqa, "install", None), getattr(inductor_gqa, "uninstall", None)
    if not callable(inst) or not callable(uninst):
        raise Unavailable("inductor_gqa.install()/uninstall() are not defined yet")
    return inst, uninst


@contextlib.contextmanager
def implementation(impl: str):
    """Context for one implementation: yields compile(callable) -> callable under test."""
    if impl == "eager":
        yield lambda f: f
        return
    if impl == "stock":
        yield lambda f: torch.compile(f, backend="inductor")
        return
    if impl == "backend":
        why = backend_available()
        if why:
            raise Unavailable(why)
        yield lambda f: torch.compile(f, backend="inductor_gqa")
        return
    if impl == "install":
        inst, uninst = install_api()
        inst()
        try:
            yield lambda f: torch.compile(f)
        finally:
            uninst()
        return
    raise ValueError(f"unknown implementation {impl!r}")


# ----------------------------------------------------------------------------------------- timing
def _sync():
    torch.cuda.synchronize()


def _capture(call: Callable[[], object], calls: int) -> torch.cuda.CUDAGraph:
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            out = call()
    del out
    return g


def graph_time_us(call: Callable[[], object], replays: int, blocks: int, warmup: int = 2,
                  min_graph_us: float = 200.0, max_calls: int = 32,
                  info: Optional[dict] = None) -> tuple[float, list[float], float]:
    """GPU time of one call from CUDA-graph replays: events around every replay, back to back.

    One graph holds enough calls back to back (up to ``max_calls``) for a replay to take at
    least ``min_graph_us``, and a replay's time is divided by that count. With one call per
    graph, a call shorter than the host's graph launch left the GPU waiting between the two
    events, and small cases read 10-15 us high in some runs and not others (H200: 131x1 read
    31.5 or 45.8 us for the same kernels). ``info`` receives ``calls_per_graph``.

    Returns (median over all replays, per-block medians, relative spread of the block medians).
    """
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            call()
    torch.cuda.current_stream().wait_stream(s)
    _sync()
    g = _capture(call, 1)
    g.replay()
    _sync()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(5):
        g.replay()
    b.record()
    _sync()
    one = max(a.elapsed_time(b) * 1e3 / 5, 1e-3)   # an upper bound: launches may show
    calls = max(1, min(max_calls, math.ceil(min_graph_us / one)))
    if calls > 1:
        del g
        g = _capture(call, calls)
    g.replay()
    g.replay()
    _sync()
    if info is not None:
        info["calls_per_graph"] = calls
    all_blocks = []
    for _ in range(blocks):
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(replays)]
        for a, b in ev:
            a.record()
            g.replay()
            b.record()
        _sync()
        all_blocks.append([a.elapsed_time(b) * 1e3 / calls for a, b in ev])
    del g
    return stats.summarize_blocks(all_blocks)


_flush_buf: Optional[torch.Tensor] = None


def l2_flush() -> None:
    global _flush_buf
    if _flush_buf is None:
        l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 << 20) or (64 << 20)
        _flush_buf = torch.empty(max(4 * l2, 256 << 20) // 4, dtype=torch.int32, device="cuda")
    _flush_buf.zero_()


def plain_time_us(call: Callable[[], object], runs: int) -> float:
    """Median time of one plain call (kernels launched from Python), L2 flushed and the device
    idle before each, so host overhead that the GPU waits for is included."""
    times = []
    for _ in range(runs):
        l2_flush()
        _sync()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        call()
        b.record()
        _sync()
        times.append(a.elapsed_time(b) * 1e3)
    return stats.median(times)


def profile_call(call: Callable[[], object]) -> tuple[Optional[int], Optional[bool]]:
    """(CUDA kernels launched by one call, whether inductor_gqa::attention_block ran)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    _sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        call()
        _sync()
    kernels, fused = 0, False
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            if not e.name.startswith(("Memcpy", "Memset", "memcpy", "memset")):
                kernels += 1
        elif "attention_block" in e.name:
            fused = True
    return kernels, fused


# ----------------------------------------------------------------------------------------- checks
def reference(workload: wl.Workload, inputs: dict) -> tuple:
    """Eager function form; fp32 under 'highest' precision (true fp32 matmuls)."""
    prev = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        with torch.no_grad():
            return as_tuple(workload.fn(**inputs))
    finally:
        torch.set_float32_matmul_precision(prev)


def check_outputs(workload: wl.Workload, seq: int, batch: int, outs: tuple, refs: tuple) -> dict:
    atol = wl.atol(workload, seq, batch)
    fracs, passed = [], True
    for o, r in zip(outs, refs):
        ok, frac = wl.check(o, r, atol, workload.rtol)
        fracs.append(frac)
        passed &= ok
    if len(outs) != len(refs):
        passed = False
    return {"passed": bool(passed), "fracs": fracs, "atol": atol, "rtol": workload.rtol}


def wall(fn: Callable[[], object]) -> tuple[object, float]:
    t = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - t
