"""Device-side parts of the perf job: inputs, the implementations under test, timing, checks.

Every timer takes the device: on a CUDA device the GPU time is CUDA-graph replay and a plain call
is timed to a synchronize; on a CPU (the smoke run) wall-clock timers of back-to-back calls stand
in for the replays, so every code path runs without a GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import time
from typing import Callable, Optional

import torch

from inductor_gqa import workloads as wl

from . import stats

# reduced sizes of the smoke run: both blocks with these head counts and hidden size (as the
# package's CPU demo runs them)
SMOKE_DIMS = dict(hidden=128, num_heads=4, num_kv_heads=2, head_dim=32)


def is_cuda(device) -> bool:
    return str(device).startswith("cuda")


def sized(workload: wl.Workload, dims: Optional[dict]) -> wl.Workload:
    """The workload with reduced sizes (its SOL and MACs follow them); itself without dims."""
    return dataclasses.replace(workload, **dims) if dims else workload


def block_fn(workload: wl.Workload, dims: Optional[dict]):
    """The function form to compile: the workload's own function at full size, the same code
    with the head counts bound as constants at reduced size."""
    if not dims:
        return workload.fn
    return wl.workload_fn(workload, num_heads=dims["num_heads"],
                          num_kv_heads=dims["num_kv_heads"], head_dim=dims["head_dim"])


# ----------------------------------------------------------------------------------------- inputs
def make_inputs(workload: wl.Workload, seq: int, batch: int, device, seed: int,
                dims: Optional[dict] = None) -> dict:
    """The workload's inputs, drawn on the device (fast for W092's weights)."""
    return wl.make_inputs(workload, seq, batch, device=device, seed=seed, **(dims or {}))


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
def make_module(workload: wl.Workload, device, dims: Optional[dict] = None) -> torch.nn.Module:
    cls = wl.W075Attention if workload.name == "W075" else wl.W092Attention
    mod = cls(**(dims or {})).to(device=device, dtype=workload.dtype)
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


def per_case(impl: str, dynamic: str) -> bool:
    """Whether an implementation compiles once per case (dynamo reset between cases)."""
    return impl == "stock_static" or (impl != "eager" and dynamic == "static")


@contextlib.contextmanager
def implementation(impl: str, mode: Optional[str] = None, dynamic: str = "unbacked"):
    """Context for one implementation: yields compile(callable) -> callable under test.

    stock_static compiles with dynamic=False (so do all compiled implementations when
    ``dynamic`` is "static"); the others leave Dynamo's default and get their symbolic B and S
    from mark_dynamic on the inputs. ``mode``: torch.compile's mode (None: its default).
    """
    impl = stats.IMPL_ALIASES.get(impl, impl)
    kw = {"mode": mode} if mode else {}
    if per_case(impl, dynamic):
        kw["dynamic"] = False
    if impl == "eager":
        yield lambda f: f
        return
    if impl in stats.STOCKS:
        yield lambda f: torch.compile(f, backend="inductor", **kw)
        return
    if impl == "backend":
        why = backend_available()
        if why:
            raise Unavailable(why)
        yield lambda f: torch.compile(f, backend="inductor_gqa", **kw)
        return
    if impl == "install":
        inst, uninst = install_api()
        inst()
        try:
            yield lambda f: torch.compile(f, **kw)
        finally:
            uninst()
        return
    raise ValueError(f"unknown implementation {impl!r}")


# ----------------------------------------------------------------------------------------- timing
def sync(device="cuda"):
    if is_cuda(device):
        torch.cuda.synchronize()


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
        info["timer"] = "cuda_graph"
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


def cpu_time_us(call: Callable[[], object], replays: int, blocks: int, warmup: int = 1,
                info: Optional[dict] = None) -> tuple[float, list[float], float]:
    """The CPU stand-in for graph_time_us: wall time of back-to-back calls, in the same blocks."""
    for _ in range(warmup):
        call()
    if info is not None:
        info["calls_per_graph"] = 1
        info["timer"] = "cpu_wall"
    all_blocks = []
    for _ in range(blocks):
        ts = []
        for _ in range(replays):
            t = time.perf_counter()
            call()
            ts.append((time.perf_counter() - t) * 1e6)
        all_blocks.append(ts)
    return stats.summarize_blocks(all_blocks)


def device_time_us(call: Callable[[], object], device, replays: int, blocks: int,
                   info: Optional[dict] = None) -> tuple[float, list[float], float]:
    """GPU time (graph replay) on a CUDA device, its wall-clock stand-in on a CPU."""
    if is_cuda(device):
        return graph_time_us(call, replays, blocks, info=info)
    return cpu_time_us(call, replays, blocks, info=info)


_flush_buf: Optional[torch.Tensor] = None


def l2_flush() -> None:
    global _flush_buf
    if _flush_buf is None:
        l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 << 20) or (64 << 20)
        _flush_buf = torch.empty(max(4 * l2, 256 << 20) // 4, dtype=torch.int32, device="cuda")
    _flush_buf.zero_()


@contextlib.contextmanager
def peak_memory(row: dict, device):
    """The body's peak allocated memory above what the process held before it into
    ``row["peak_mib"]``, that base into ``row["held_mib"]`` (weights, inputs and earlier rows'
    leftovers, which differ with the rows' order, not with the implementation). No-op off CUDA."""
    if not is_cuda(device):
        yield
        return
    l2_flush()                  # its buffer, made once, is held, not peak
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    yield
    torch.cuda.synchronize()
    row["peak_mib"] = (torch.cuda.max_memory_allocated() - held) / 2**20
    row["held_mib"] = held / 2**20


def plain_time_us(call: Callable[[], object], runs: int, device="cuda") -> tuple[float, float]:
    """A plain call as a user makes it: from an idle device (L2 flushed, synchronized), wall time
    from the call until the device is done (synchronize), host overhead included. Returns (median
    over runs, relative interquartile spread)."""
    times = []
    for _ in range(runs):
        if is_cuda(device):
            l2_flush()
        sync(device)
        t = time.perf_counter()
        call()
        sync(device)
        times.append((time.perf_counter() - t) * 1e6)
    times.sort()
    med = stats.median(times)
    q1, q3 = times[len(times) // 4], times[(3 * len(times)) // 4]
    return med, ((q3 - q1) / med if med > 0 else 0.0)


def _is_launch(name: str) -> bool:
    # runtime and driver kernel launches (cudaLaunchKernel[ExC], cuLaunchKernel[Ex],
    # cudaLaunchCooperativeKernel); not cudaGraphLaunch, memcpy or memset
    return "LaunchKernel" in name or name.startswith("cuLaunch") or "LaunchCooperative" in name


def _outer(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The intervals not nested in an earlier one (an op's dispatcher and Python events nest)."""
    out = []
    for s, e in sorted(intervals):
        if out and s >= out[-1][0] and e <= out[-1][1]:
            continue
        out.append((s, e))
    return out


def _span(starts_ends: list[tuple[float, float]]) -> Optional[float]:
    if not starts_ends:
        return None
    return max(e for _, e in starts_ends) - min(s for s, _ in starts_ends)


# the fields of profile_call that say whether the call ran fused (the rest is timing)
FUSION_FIELDS = ("fused", "fused_by", "fused_ops", "our_kernels")
# the package's launchable kernels, should its modules not import (kernels.*, "*_kernel")
KNOWN_KERNELS = ("gqa_attention_kernel", "bwd_preprocess_kernel", "bwd_dkdv_kernel",
                 "bwd_dq_kernel", "scale_rows_kernel", "linear_kernel", "qkv_kernel",
                 "norm_rope_bwd_kernel", "proj_rope_kernel", "qk_norm_rope_kernel", "wo16_kernel",
                 "rope_table_kernel", "decode_split_kernel", "decode_combine_kernel")


@functools.lru_cache(maxsize=None)
def our_kernels() -> tuple:
    """Names of the Triton kernels the package launches (``inductor_gqa.kernels``, every jit
    function named ``*_kernel``): a lowered block runs them under these names (Inductor adds a
    ``_<n>`` suffix to a user-defined kernel)."""
    import importlib
    import pkgutil
    try:
        import triton
        from inductor_gqa import kernels
        names = set()
        for m in pkgutil.iter_modules(kernels.__path__):
            mod = importlib.import_module(f"{kernels.__name__}.{m.name}")
            names |= {n for n, obj in vars(mod).items() if n.endswith("_kernel")
                      and isinstance(obj, triton.runtime.jit.KernelInterface)}
        return tuple(sorted(names)) or KNOWN_KERNELS
    except Exception:  # noqa: BLE001 - the known names stand in
        return KNOWN_KERNELS


def our_kernel(name: str) -> Optional[str]:
    """The package kernel a device kernel's name is (``qkv_kernel_3`` -> ``qkv_kernel``)."""
    for k in our_kernels():
        if name == k or (name.startswith(k + "_") and name[len(k) + 1:].isdigit()):
            return k
    return None


def profile_call(call: Callable[[], object], device="cuda", calls: int = 3) -> dict:
    """One profiled stretch of ``calls`` plain calls. Returns per call: ``kernels`` (CUDA kernels,
    memcpy/memset excluded; None on a CPU), ``fused_ops`` (inductor_gqa::attention_block calls),
    ``our_kernels`` (the package's kernels that ran), ``fused`` (the op or a kernel of ours ran:
    the call's own compiled code fused the block, whatever compilation or cache served it;
    ``fused_by`` "op" or "kernels"), ``launch_span_us`` (host time from the call's first kernel
    launch to the end of its last; median over calls) and ``block_host_us`` (the same within
    each fused op's range: the block's own host time, median over the op calls; when no op range
    is seen, e.g. once the block is an Inductor lowering, the call's span stands in and
    ``host_scope`` says "call").
    On a CPU the op's child aten ops stand in for launches (``host_timer`` "cpu_ops")."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function
    cuda = is_cuda(device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync(device)
    with profile(activities=acts) as prof:
        for _ in range(calls):
            with record_function("perf.call"):
                call()
            sync(device)
    evs = list(prof.events())
    kernels = 0
    launches, ops, call_ranges, aten, ours = [], [], [], [], set()
    for e in evs:
        tr = (e.time_range.start, e.time_range.end)
        if e.device_type == DeviceType.CUDA:
            if not e.name.startswith(("Memcpy", "Memset", "memcpy", "memset")):
                kernels += 1
                ours.add(our_kernel(e.name))
        elif e.name == "perf.call":
            call_ranges.append(tr)
        elif "attention_block" in e.name:
            ops.append(tr)
        elif _is_launch(e.name):
            launches.append(tr)
        elif e.name.startswith("aten::"):
            aten.append(tr)
    ops = _outer(ops)
    marks = launches if cuda else aten

    def inside(rng):
        return [m for m in marks if rng[0] <= m[0] <= rng[1]]

    call_spans = [s for s in (_span(inside(c)) for c in call_ranges) if s is not None]
    op_spans = [s for s in (_span(inside(o)) for o in ops) if s is not None]
    ours.discard(None)
    out = {"kernels": (kernels // calls) if cuda else None,
           "fused_ops": len(ops) / calls, "fused": bool(ops or ours),
           "fused_by": "op" if ops else "kernels" if ours else None,
           "our_kernels": sorted(ours),
           "launch_span_us": stats.median(call_spans) if call_spans else None,
           "host_timer": "cuda_launches" if cuda else "cpu_ops"}
    if op_spans:
        out["block_host_us"], out["host_scope"] = stats.median(op_spans), "op"
    elif call_spans:
        out["block_host_us"], out["host_scope"] = out["launch_span_us"], "call"
    return out


# ----------------------------------------------------------------------------------------- checks
def reference(workload: wl.Workload, inputs: dict, fn=None) -> tuple:
    """Eager function form; fp32 under 'highest' precision (true fp32 matmuls)."""
    prev = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        with torch.no_grad():
            return as_tuple((fn or workload.fn)(**inputs))
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


def wall(fn: Callable[[], object], device="cuda") -> tuple[object, float]:
    t = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t
