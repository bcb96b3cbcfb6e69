"""Guarded fallbacks as a conditional node of the CUDA graph being captured.

The fp16-copies plans launch a float32 twin of their fp16 kernels that exits at once unless the
range flag is raised (docs/kernels.md notes 12-16). Under CUDA-graph replay those early-exit
launches and the side stream's fork and join cost ~2 us per call (note 58). CUDA 12.3+ graphs
have conditional nodes: a body graph that runs only when a handle, set on the device by a kernel
upstream, is nonzero. Here a one-thread kernel copies "flag != 0" into the handle and the
fallback launches are captured into the body, so a replay with the flag clear skips them.

torch (2.11 on our H200) has no API for this, so the driver is called through ctypes: the set
kernel is PTX that calls the device runtime's ``cudaGraphSetConditional`` (the driver's JIT links
it); the node is added to the graph the stream is capturing, and the body is captured from a
stream of its own (``cuStreamBeginCaptureToGraph``). Only used while a graph is captured; plain
launches keep the guarded twins (their host time, not the GPU, is the limit there).
``INDUCTOR_GQA_GRAPH_BRANCH=0`` turns it off.

Body launches must not allocate: the caching allocator knows nothing of the body's capture.
"""

from __future__ import annotations

import contextlib
import ctypes
import os

import torch

from .tuning import interpreting

_PTX = rb"""
.version 7.8
.target sm_70
.address_size 64

.extern .func cudaGraphSetConditional
(
    .param .b64 set_handle,
    .param .b32 set_value
);

.visible .entry inductor_gqa_branch_on_flag(
    .param .u64 arg_handle,
    .param .u64 arg_flag
)
{
    .reg .pred %p1;
    .reg .b32 %r<3>;
    .reg .b64 %rd<4>;

    ld.param.u64 %rd1, [arg_handle];
    ld.param.u64 %rd2, [arg_flag];
    cvta.to.global.u64 %rd3, %rd2;
    ld.global.u32 %r1, [%rd3];
    setp.ne.s32 %p1, %r1, 0;
    selp.b32 %r2, 1, 0, %p1;
    {
        .param .b64 call_handle;
        .param .b32 call_value;
        st.param.b64 [call_handle], %rd1;
        st.param.b32 [call_value], %r2;
        call.uni cudaGraphSetConditional, (call_handle, call_value);
    }
    ret;
}
"""

_c = ctypes
_NODE_CONDITIONAL = 13          # CU_GRAPH_NODE_TYPE_CONDITIONAL
_COND_IF = 0                    # CU_GRAPH_COND_TYPE_IF
_COND_ASSIGN_DEFAULT = 1        # the handle is reset to its default (0) at every graph launch
_SET_DEPENDENCIES = 1           # CU_STREAM_SET_CAPTURE_DEPENDENCIES
_CAPTURE_RELAXED = 2            # CU_STREAM_CAPTURE_MODE_RELAXED
_CAPTURE_ACTIVE = 1


class _CondParams(_c.Structure):        # CUDA_CONDITIONAL_NODE_PARAMS
    _fields_ = [("handle", _c.c_uint64), ("type", _c.c_int), ("size", _c.c_uint),
                ("phGraph_out", _c.POINTER(_c.c_void_p)), ("ctx", _c.c_void_p)]


class _NodeParams(_c.Structure):        # CUgraphNodeParams: 16 bytes, a 232-byte union, 8
    _fields_ = [("type", _c.c_int), ("reserved0", _c.c_int * 3), ("conditional", _CondParams),
                ("rest", _c.c_byte * (232 - _c.sizeof(_CondParams))),
                ("reserved2", _c.c_longlong)]


class _Driver:
    """The driver entry points, each at the ABI of the CUDA version given (cuGetProcAddress),
    so that a newer driver's changed signatures (edge data since 12.3/13.0) do not apply."""

    def __init__(self):
        lib = _c.CDLL("libcuda.so.1")
        get = lib.cuGetProcAddress_v2
        get.argtypes = [_c.c_char_p, _c.POINTER(_c.c_void_p), _c.c_int, _c.c_uint64,
                        _c.POINTER(_c.c_int)]
        get.restype = _c.c_int
        vp, u64, sz = _c.c_void_p, _c.c_uint64, _c.c_size_t
        P = _c.POINTER

        def fn(name, version, *args):
            ptr, status = _c.c_void_p(), _c.c_int()
            r = get(name.encode(), _c.byref(ptr), version, 0, _c.byref(status))
            if r != 0 or not ptr.value:
                raise RuntimeError(f"graph_branch: no driver entry {name} (CUDA {version}): "
                                   f"error {r}, status {status.value}")
            return _c.CFUNCTYPE(_c.c_int, *args)(ptr.value)

        self.capture_info = fn("cuStreamGetCaptureInfo", 12000, vp, P(_c.c_int), P(u64), P(vp),
                               P(P(vp)), P(sz))
        self.handle_create = fn("cuGraphConditionalHandleCreate", 12030, P(u64), vp, vp,
                                _c.c_uint, _c.c_uint)
        # 12.3's form: dependencies with (here no) edge data
        self.add_node = fn("cuGraphAddNode", 12030, P(vp), vp, P(vp), vp, sz, P(_NodeParams))
        self.update_deps = fn("cuStreamUpdateCaptureDependencies", 12000, vp, P(vp), sz,
                              _c.c_uint)
        self.begin_to_graph = fn("cuStreamBeginCaptureToGraph", 12030, vp, vp, P(vp), vp, sz,
                                 _c.c_int)
        self.end_capture = fn("cuStreamEndCapture", 10000, vp, P(vp))
        self.ctx_current = fn("cuCtxGetCurrent", 4000, P(vp))
        self.module_load = fn("cuModuleLoadData", 2000, P(vp), _c.c_char_p)
        self.get_function = fn("cuModuleGetFunction", 2000, P(vp), vp, _c.c_char_p)
        self.launch = fn("cuLaunchKernel", 4000, vp, _c.c_uint, _c.c_uint, _c.c_uint,
                         _c.c_uint, _c.c_uint, _c.c_uint, _c.c_uint, vp, P(vp), P(vp))

    @staticmethod
    def check(r, what):
        if r != 0:
            raise RuntimeError(f"graph_branch: {what} failed with CUDA driver error {r}")


_DRIVER = None
_READY: dict = {}       # device index -> (set kernel, context, body stream), or an error text


def _driver() -> _Driver:
    global _DRIVER
    if _DRIVER is None:
        _DRIVER = _Driver()
    return _DRIVER


def prepare(device) -> bool:
    """Loads the set kernel for ``device`` (outside any capture: loading a module is not
    allowed while a stream captures). True when branches can be used there."""
    if os.environ.get("INDUCTOR_GQA_GRAPH_BRANCH", "1") == "0" or interpreting():
        return False
    idx = device.index if device.index is not None else torch.cuda.current_device()
    got = _READY.get(idx)
    if got is None:
        try:
            with torch.cuda.device(idx):
                torch.cuda.current_stream()      # the primary context made current
                drv = _driver()
                ctx, mod, func = _c.c_void_p(), _c.c_void_p(), _c.c_void_p()
                drv.check(drv.ctx_current(_c.byref(ctx)), "cuCtxGetCurrent")
                drv.check(drv.module_load(_c.byref(mod), _PTX), "loading the set kernel")
                drv.check(drv.get_function(_c.byref(func), mod, b"inductor_gqa_branch_on_flag"),
                          "cuModuleGetFunction")
                got = (func, ctx, torch.cuda.Stream(device=idx))
        except (OSError, RuntimeError, AttributeError) as e:
            got = str(e)
        _READY[idx] = got
    return not isinstance(got, str)


def ready(device) -> bool:
    """Whether ``prepare`` succeeded for ``device`` (never loads anything: safe under capture)."""
    if os.environ.get("INDUCTOR_GQA_GRAPH_BRANCH", "1") == "0" or interpreting():
        return False
    idx = device.index if device.index is not None else torch.cuda.current_device()
    return not isinstance(_READY.get(idx, ""), str)


def _capture(drv, stream):
    status, cid, graph = _c.c_int(), _c.c_uint64(), _c.c_void_p()
    deps, n = _c.POINTER(_c.c_void_p)(), _c.c_size_t()
    drv.check(drv.capture_info(stream, _c.byref(status), _c.byref(cid), _c.byref(graph),
                               _c.byref(deps), _c.byref(n)), "cuStreamGetCaptureInfo")
    if status.value != _CAPTURE_ACTIVE:
        raise RuntimeError("graph_branch: the stream is not capturing a graph")
    return graph, deps, n.value


class Branch:
    """A conditional node's handle, set from ``flag`` by a kernel launched on the current
    stream when this is made (launch it where the flag is final), and the node, added where
    ``body`` is entered."""

    def __init__(self, flag: torch.Tensor):
        drv = _driver()
        self.device = flag.device
        func, ctx, self._stream = _READY[self.device.index]
        self._ctx = ctx
        stream = _c.c_void_p(torch.cuda.current_stream(self.device).cuda_stream)
        graph, _, _ = _capture(drv, stream)
        self.handle = _c.c_uint64()
        drv.check(drv.handle_create(_c.byref(self.handle), graph, ctx, 0, _COND_ASSIGN_DEFAULT),
                  "cuGraphConditionalHandleCreate")
        flag_ptr = _c.c_void_p(flag.data_ptr())
        args = (_c.c_void_p * 2)(_c.cast(_c.byref(self.handle), _c.c_void_p),
                                 _c.cast(_c.byref(flag_ptr), _c.c_void_p))
        drv.check(drv.launch(func, 1, 1, 1, 1, 1, 1, 0, stream, args, None),
                  "launching the set kernel")

    @contextlib.contextmanager
    def body(self):
        """Adds the conditional node after everything issued so far on the current stream, and
        captures what runs inside into its body (on a stream of its own, made current)."""
        drv = _driver()
        main = _c.c_void_p(torch.cuda.current_stream(self.device).cuda_stream)
        graph, deps, n = _capture(drv, main)
        params = _NodeParams()
        params.type = _NODE_CONDITIONAL
        params.conditional.handle = self.handle.value
        params.conditional.type = _COND_IF
        params.conditional.size = 1
        params.conditional.ctx = self._ctx
        node = _c.c_void_p()
        drv.check(drv.add_node(_c.byref(node), graph, deps, None, n, _c.byref(params)),
                  "adding the conditional node")
        drv.check(drv.update_deps(main, _c.byref(node), 1, _SET_DEPENDENCIES),
                  "cuStreamUpdateCaptureDependencies")
        body_graph = params.conditional.phGraph_out[0]
        side = _c.c_void_p(self._stream.cuda_stream)
        drv.check(drv.begin_to_graph(side, body_graph, None, None, 0, _CAPTURE_RELAXED),
                  "cuStreamBeginCaptureToGraph")
        try:
            with torch.cuda.stream(self._stream):
                yield
        finally:
            done = _c.c_void_p()
            drv.check(drv.end_capture(side, _c.byref(done)), "ending the body's capture")
