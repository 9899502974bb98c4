#!/usr/bin/env python3
"""Workload of the real-GPU proof (test/gpu/prove.sh): a fixed amount of inference-like
work per "phase", and its own ground truth.

Backends:
- torch: PyTorch on the GPU. Per phase: `steps` decoder-like steps of eager matmuls and
  elementwise ops with a torch.cuda.synchronize() every `sync_every` steps, host<->device
  copies of known sizes (pinned and pageable, both directions, and device to device),
  `graph_replays` replays of a CUDA graph captured at start-up (before profi attaches:
  "unknown" to profi), a new CUDA graph captured the way PyTorch and vLLM capture
  (torch.cuda.graph on a side stream, a second stream forked and joined inside the
  capture through events, a few kernels and a device-to-device copy), replayed
  `capture_replays` times and reset, and `allreduces` single-rank NCCL all_reduce calls
  (torch.distributed, backend nccl, world size 1). The new graph's kernel and copy nodes
  are read from the CUDA runtime itself (cudaGraphGetNodes on g.raw_cuda_graph(), ctypes
  on the libcudart.so PyTorch mapped): that, not profi, is the graph ground truth.
- stub: the same orchestration against profi's stub libcudart.so.12, libcuda.so.1 and
  libnccl.so.2 (test/fixtures), called through ctypes with known counts; it writes the
  same chrome-trace format as torch.profiler, so the same ground-truth code reads it.
  This is the CPU dry run of the proof's logic.

Start-up (before profi attaches): libraries load, `warmup` unprofiled phases run (caching
allocator, cuBLAS workspaces, NCCL communicator, CUDA graph), then `profiled` phases run
under one torch.profiler session, each in its own record_function range; the ground truth
of one phase comes from its range of the trace, and they must agree with each other (the
phase is deterministic). One session, not one per phase: CUPTI started and stopped around
CUDA graph captures has lost later sessions' GPU activity (and graph replays' records) on
some releases. The profiler is never active while profi counts: it makes CUDA calls of
its own when it stops.

Protocol: one JSON line per event on the original stdout (C libraries' stdout is sent to
stderr). First {"event": "ready", ...ground truth...}; then, per command line on stdin:
"run N" -> N measured phases, {"event": "ran", "seconds": [...], "graphs": [...]} (graphs:
the graph-API summary of the graph each phase captured); "quit" -> {"event": "bye"}.
"""

import argparse
import ctypes
import json
import os
import socket
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402  (ground_truth_from_trace, same_ground_truth)

LIB_PREFIXES = ("libcudart.so", "libcuda.so", "libnccl.so")


def mapped_libraries():
    """CUDA, NCCL libraries this process maps (paths from /proc/self/maps)."""
    out = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6:
                path = parts[5].strip()
                if os.path.basename(path).startswith(LIB_PREFIXES):
                    out.add(path)
    return sorted(out)


# ---------------------------------------------------------------- graph API ground truth

class CudaPos(ctypes.Structure):
    _fields_ = [("x", ctypes.c_size_t), ("y", ctypes.c_size_t), ("z", ctypes.c_size_t)]


class CudaPitchedPtr(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_void_p), ("pitch", ctypes.c_size_t), ("xsize", ctypes.c_size_t),
                ("ysize", ctypes.c_size_t)]


class CudaExtent(ctypes.Structure):
    _fields_ = [("width", ctypes.c_size_t), ("height", ctypes.c_size_t), ("depth", ctypes.c_size_t)]


class CudaMemcpy3DParms(ctypes.Structure):  # driver_types.h, unchanged from CUDA 10 to 13
    _fields_ = [("srcArray", ctypes.c_void_p), ("srcPos", CudaPos), ("srcPtr", CudaPitchedPtr),
                ("dstArray", ctypes.c_void_p), ("dstPos", CudaPos), ("dstPtr", CudaPitchedPtr),
                ("extent", CudaExtent), ("kind", ctypes.c_int)]


class CudaMemsetParams(ctypes.Structure):
    _fields_ = [("dst", ctypes.c_void_p), ("pitch", ctypes.c_size_t), ("value", ctypes.c_uint),
                ("elementSize", ctypes.c_uint), ("width", ctypes.c_size_t), ("height", ctypes.c_size_t)]


class CudaPointerAttributes(ctypes.Structure):  # room to spare for fields newer releases add
    _fields_ = [("type", ctypes.c_int), ("device", ctypes.c_int), ("devicePointer", ctypes.c_void_p),
                ("hostPointer", ctypes.c_void_p), ("reserved", ctypes.c_long * 16)]


assert CudaMemcpy3DParms.extent.offset == 128 and CudaMemcpy3DParms.kind.offset == 152
assert ctypes.sizeof(CudaMemcpy3DParms) == 160 and ctypes.sizeof(CudaMemsetParams) == 40

# cudaGraphNodeType (driver_types.h)
NODE_KERNEL, NODE_MEMCPY, NODE_MEMSET, NODE_CHILD = 0, 1, 2, 4
NODE_NAMES = {3: "host", 4: "graph", 5: "empty", 6: "wait_event", 7: "event_record", 8: "ext_semas_signal",
              9: "ext_semas_wait", 10: "mem_alloc", 11: "mem_free", 12: "batch_mem_op", 13: "conditional"}
MEMCPY_KINDS = {0: "h2h", 1: "h2d", 2: "d2h", 3: "d2d"}
MEMORY_DEVICE = (2, 3)  # cudaMemoryTypeDevice, cudaMemoryTypeManaged


class GraphInspector:
    """What a cudaGraph_t runs, read from the CUDA runtime (cudaGraphGetNodes,
    cudaGraphNodeGetType, cudaGraphMemcpyNodeGetParams, cudaGraphMemsetNodeGetParams,
    cudaGraphChildGraphNodeGetGraph): kernel nodes, copy and set nodes with their bytes,
    child graphs expanded. lib is the runtime the graph's owner uses (ctypes.CDLL), or any
    object with those functions (tests)."""

    MAX_DEPTH = 8

    def __init__(self, lib, source):
        self.lib, self.source = lib, source
        vp, P = ctypes.c_void_p, ctypes.POINTER
        for name, argtypes in (("cudaGraphGetNodes", [vp, vp, P(ctypes.c_size_t)]),
                               ("cudaGraphNodeGetType", [vp, P(ctypes.c_int)]),
                               ("cudaGraphMemcpyNodeGetParams", [vp, P(CudaMemcpy3DParms)]),
                               ("cudaGraphMemsetNodeGetParams", [vp, P(CudaMemsetParams)]),
                               ("cudaGraphChildGraphNodeGetGraph", [vp, P(vp)])):
            f = getattr(lib, name)  # AttributeError: a runtime without it
            f.argtypes, f.restype = argtypes, ctypes.c_int
        self.attrs = getattr(lib, "cudaPointerGetAttributes", None)
        if self.attrs is not None:
            self.attrs.argtypes, self.attrs.restype = [P(CudaPointerAttributes), vp], ctypes.c_int

    def _call(self, name, *args):
        rc = getattr(self.lib, name)(*args)
        if rc != 0:
            raise RuntimeError("%s returned %d" % (name, rc))

    def summary(self, graph):
        """Node counts by type, copied and set bytes (None, with param_errors, when a copy or
        set node's parameters could not be read: its counts still stand)."""
        out = {"source": self.source, "nodes": 0, "kernel_nodes": 0, "memcpy_nodes": 0, "memcpy_bytes": {},
               "memcpy_kinds": {}, "memset_nodes": 0, "memset_bytes": 0, "other_nodes": {}}
        errors = []
        self._walk(graph, out, 0, errors)
        if errors:
            out["memcpy_bytes"] = out["memset_bytes"] = None
            out["param_errors"] = sorted(set(errors))
        return out

    def _walk(self, graph, out, depth, errors):
        if depth > self.MAX_DEPTH:
            raise RuntimeError("child graphs nested deeper than %d" % self.MAX_DEPTH)
        n = ctypes.c_size_t(0)
        self._call("cudaGraphGetNodes", ctypes.c_void_p(graph), None, ctypes.byref(n))
        nodes = (ctypes.c_void_p * max(n.value, 1))()
        if n.value:
            self._call("cudaGraphGetNodes", ctypes.c_void_p(graph), nodes, ctypes.byref(n))
        for node in list(nodes)[:n.value]:
            t = ctypes.c_int(-1)
            self._call("cudaGraphNodeGetType", ctypes.c_void_p(node), ctypes.byref(t))
            out["nodes"] += 1
            if t.value == NODE_KERNEL:
                out["kernel_nodes"] += 1
            elif t.value == NODE_MEMCPY:
                out["memcpy_nodes"] += 1
                p = CudaMemcpy3DParms()
                try:
                    self._call("cudaGraphMemcpyNodeGetParams", ctypes.c_void_p(node), ctypes.byref(p))
                except RuntimeError as err:
                    errors.append(str(err))
                    continue
                e = p.extent
                d = self._direction(p)
                out["memcpy_bytes"][d] = out["memcpy_bytes"].get(d, 0) + e.width * max(e.height, 1) * max(e.depth, 1)
                k = str(p.kind)
                out["memcpy_kinds"][k] = out["memcpy_kinds"].get(k, 0) + 1
            elif t.value == NODE_MEMSET:
                out["memset_nodes"] += 1
                p = CudaMemsetParams()
                try:
                    self._call("cudaGraphMemsetNodeGetParams", ctypes.c_void_p(node), ctypes.byref(p))
                except RuntimeError as err:
                    errors.append(str(err))
                    continue
                out["memset_bytes"] += p.elementSize * p.width * max(p.height, 1)
            else:
                name = NODE_NAMES.get(t.value, "type_%d" % t.value)
                out["other_nodes"][name] = out["other_nodes"].get(name, 0) + 1
                if t.value == NODE_CHILD:
                    child = ctypes.c_void_p()
                    self._call("cudaGraphChildGraphNodeGetGraph", ctypes.c_void_p(node), ctypes.byref(child))
                    self._walk(child.value, out, depth + 1, errors)

    def _direction(self, p):
        """A copy node's direction: its kind, or for cudaMemcpyDefault the memory types of its
        ends (what profi labels is the kind the capturing call passed)."""
        if p.kind in MEMCPY_KINDS:
            return MEMCPY_KINDS[p.kind]
        ends = []
        for arr, ptr in ((p.srcArray, p.srcPtr.ptr), (p.dstArray, p.dstPtr.ptr)):
            if arr:
                ends.append("d")
                continue
            a = CudaPointerAttributes()
            if self.attrs is None or self.attrs(ctypes.byref(a), ctypes.c_void_p(ptr)) != 0:
                return "default"
            ends.append("d" if a.type in MEMORY_DEVICE else "h")
        return "%s2%s" % tuple(ends)


def runtime_inspector(major=None):
    """A GraphInspector on the libcudart.so this process mapped (the one PyTorch uses; with
    several, the one of CUDA major release `major`), or None and why not."""
    libs = [p for p in mapped_libraries() if os.path.basename(p).startswith("libcudart.so")]
    if major:
        libs = sorted(libs, key=lambda p: not os.path.basename(p).startswith("libcudart.so.%s" % major))
    if not libs:
        return None, "this process maps no libcudart.so"
    try:
        return GraphInspector(ctypes.CDLL(libs[0]), "graph API, %s" % os.path.basename(libs[0])), None
    except (OSError, AttributeError) as e:
        return None, "%s: %s" % (type(e).__name__, e)


def graph_handle(g):
    """torch.cuda.CUDAGraph.raw_cuda_graph() as an integer handle (an int in PyTorch; a
    cuda-python object would have getPtr)."""
    h = g.raw_cuda_graph()
    if not isinstance(h, int):
        h = h.getPtr() if hasattr(h, "getPtr") else int(h)
    if not h:
        raise RuntimeError("raw_cuda_graph() is NULL")
    return h


# ---------------------------------------------------------------- torch backend

class TorchBackend:
    name = "torch"

    def __init__(self, a):
        import torch
        import torch.distributed as dist
        import torch.nn.functional as F
        self.torch, self.dist, self.F, self.a = torch, dist, F, a
        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False")
        self.dev = torch.device("cuda", 0)
        torch.cuda.set_device(self.dev)
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        try:  # device_id (torch >= 2.3) makes the communicator eagerly
            dist.init_process_group("nccl", rank=0, world_size=1, device_id=self.dev)
        except TypeError:
            dist.init_process_group("nccl", rank=0, world_size=1)
        h, t, dt = a.hidden, a.tokens, torch.bfloat16
        g = torch.Generator(device=self.dev).manual_seed(0)
        self.x0 = torch.randn(t, h, device=self.dev, dtype=dt, generator=g)
        self.w1 = torch.randn(h, 4 * h, device=self.dev, dtype=dt, generator=g) / h ** 0.5
        self.w2 = torch.randn(4 * h, h, device=self.dev, dtype=dt, generator=g) / (4 * h) ** 0.5
        n = a.copy_elems  # float32 elements per copy
        self.h_pinned = torch.ones(n, dtype=torch.float32).pin_memory()
        self.h_pageable = torch.ones(n, dtype=torch.float32)
        self.d_a = torch.ones(n, device=self.dev, dtype=torch.float32)
        self.d_b = torch.empty(n, device=self.dev, dtype=torch.float32)
        self.ar = torch.ones(a.allreduce_elems, device=self.dev, dtype=torch.float32)
        # CUDA graph of a few small ops, captured once (warm-up on a side stream first,
        # as torch.cuda.graph requires).
        self.g_in = torch.randn(t, h, device=self.dev, dtype=dt, generator=g)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                self._graph_body()
        torch.cuda.current_stream().wait_stream(s)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, **self._capture_mode()):
            self.g_out = self._graph_body()
        torch.cuda.synchronize()
        self.dist.all_reduce(self.ar)  # communicator, if not made eagerly
        torch.cuda.synchronize()

        # The graph each phase captures, the way PyTorch and vLLM capture: torch.cuda.graph
        # on a side stream (cap_stream), a second stream (fork_stream) forked and joined
        # inside the capture through events (Stream.wait_stream). Its memory comes from the
        # start-up graph's pool, which that graph keeps alive, so captures after the first
        # allocate nothing new. Warmed up eagerly on those streams first (cuBLAS workspaces).
        self.cap_stream, self.fork_stream = torch.cuda.Stream(), torch.cuda.Stream()
        self.cg_src = torch.ones(n, device=self.dev, dtype=torch.float32)
        self.cg_dst = torch.empty(n, device=self.dev, dtype=torch.float32)
        self.cap_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.cap_stream):
            for _ in range(3):
                self._capture_body()
        torch.cuda.current_stream().wait_stream(self.cap_stream)
        torch.cuda.synchronize()
        from torch.profiler import record_function
        self.record_function = record_function
        try:
            torch.cuda.CUDAGraph(keep_graph=True)  # PyTorch 2.8+: capture keeps its cudaGraph_t
            self.keep_graph = hasattr(torch.cuda.CUDAGraph, "raw_cuda_graph")
            why = None if self.keep_graph else "torch.cuda.CUDAGraph has no raw_cuda_graph()"
        except TypeError as e:
            self.keep_graph, why = False, "torch.cuda.CUDAGraph(keep_graph=True): %s" % e
        self.inspector = None
        if self.keep_graph:
            self.inspector, why = runtime_inspector(str(torch.version.cuda).split(".")[0])
        self.graph_api_error = why  # why the graph API gives no ground truth, or None
        self.capture_error = None  # set when the first capture (a warm-up phase) failed
        self.captured = None  # whether the phases capture a graph: decided by the first one
        self.phase_graph = None  # graph-API summary of the last phase's graph

    def _capture_mode(self):
        """capture_error_mode="thread_local" (PyTorch 2.1+): another thread's CUDA calls
        (ProcessGroupNCCL's watchdog queries events) cannot invalidate the capture."""
        import inspect
        try:
            ok = "capture_error_mode" in inspect.signature(self.torch.cuda.graph).parameters
        except (TypeError, ValueError):
            ok = False
        return {"capture_error_mode": "thread_local"} if ok else {}

    def _graph_body(self):
        y = self.F.gelu(self.g_in @ self.w1)
        return self.F.layer_norm(y @ self.w2 + self.g_in, (self.a.hidden,))

    def _capture_body(self):
        """Kernels on the capturing stream, a fork to fork_stream (a kernel and a
        device-to-device copy there), a join, then kernels after the join."""
        torch, F = self.torch, self.F
        cur = torch.cuda.current_stream()
        h = self.g_in @ self.w1                 # cuBLAS, capturing stream
        self.fork_stream.wait_stream(cur)       # fork: cudaEventRecord(cur), cudaStreamWaitEvent(fork)
        with torch.cuda.stream(self.fork_stream):
            side = F.gelu(self.g_in)            # a kernel on the forked stream
            self.cg_dst.copy_(self.cg_src)      # cudaMemcpyAsync device to device, forked stream
        h = F.gelu(h)
        cur.wait_stream(self.fork_stream)       # join: cudaEventRecord(fork), cudaStreamWaitEvent(cur)
        return h @ self.w2 + side               # cuBLAS and an add, after the join

    def _new_graph(self):
        """Capture, instantiate, inspect, replay and reset the phase's new graph."""
        import unittest.mock
        torch, a = self.torch, self.a
        g = torch.cuda.CUDAGraph(keep_graph=True) if self.keep_graph else torch.cuda.CUDAGraph()
        # torch.cuda.graph frees the allocator's cache before each capture; vLLM turns that
        # (and gc.collect) off for its captures, and so do we: the phase's other work then
        # finds its memory cached, as in every other phase.
        with unittest.mock.patch("torch.cuda.empty_cache", lambda: None), \
                unittest.mock.patch("gc.collect", lambda *args, **kwargs: 0):
            with torch.cuda.graph(g, pool=self.graph.pool(), stream=self.cap_stream, **self._capture_mode()):
                out = self._capture_body()
        summary = None
        if self.keep_graph:
            if hasattr(g, "instantiate"):
                g.instantiate()  # else the first replay instantiates
            if self.inspector is not None:
                try:
                    summary = self.inspector.summary(graph_handle(g))
                except Exception as e:  # noqa: BLE001 (ctypes.ArgumentError too: reported, the phase goes on)
                    summary = {"source": self.inspector.source, "kernel_nodes": None,
                               "error": "%s: %s" % (type(e).__name__, e)}
        for _ in range(a.capture_replays):
            g.replay()
        g.reset()
        del out, g
        return summary

    def _graphs(self):
        torch, a = self.torch, self.a
        with self.record_function(compare.GRAPH_UNKNOWN_MARK):
            for _ in range(a.graph_replays):
                self.graph.replay()
        if self.captured is False or a.capture_replays <= 0:
            return
        with self.record_function(compare.GRAPH_NEW_MARK):
            if self.captured is None:  # the first warm-up phase decides, for every phase after it
                try:
                    self.phase_graph = self._new_graph()
                    self.captured = True
                except Exception as e:  # noqa: BLE001 (reported in the results; phases go on without)
                    self.captured, self.capture_error = False, "%s: %s" % (type(e).__name__, e)
                    torch.cuda.synchronize()
                return
            self.phase_graph = self._new_graph()

    def constructed(self):
        """What one phase copies and reduces, from the tensors it uses."""
        b = self.a.copy_elems * 4
        c = self.a.copies
        return {"memcpy_bytes": {"h2d": 2 * c * b, "d2h": 2 * c * b, "d2d": c * b},
                "nccl_calls": {"ncclAllReduce": self.a.allreduces},
                "nccl_bytes": {"ncclAllReduce": self.a.allreduces * self.a.allreduce_elems * 4},
                "graph_replays": self.a.graph_replays,
                "graph": {"replays_unknown": self.a.graph_replays,
                          "replays_new": self.a.capture_replays if self.captured else 0,
                          "capture_memcpy_bytes": {"d2d": b} if self.captured else {},
                          "capture_error": self.capture_error}}

    def phase(self):
        torch, F, a = self.torch, self.F, self.a
        x = self.x0
        for i in range(a.steps):
            h = x @ self.w1                 # matmul
            h = F.gelu(h)                   # elementwise
            h = h @ self.w2                 # matmul
            x = x + h                       # elementwise
            x = F.layer_norm(x, (a.hidden,))
            x = x * 0.5                     # elementwise
            if (i + 1) % a.sync_every == 0:
                torch.cuda.synchronize()
        for _ in range(a.copies):
            self.d_a.copy_(self.h_pinned, non_blocking=True)    # h2d, pinned
            self.d_a.copy_(self.h_pageable)                     # h2d, pageable
            self.h_pinned.copy_(self.d_a, non_blocking=True)    # d2h, pinned
            self.h_pageable.copy_(self.d_a)                     # d2h, pageable
            self.d_b.copy_(self.d_a)                            # d2d
        self._graphs()
        for _ in range(a.allreduces):
            self.dist.all_reduce(self.ar)
        torch.cuda.synchronize()

    def profiled_phases(self, n, trace_path):
        """n phases in one profiler session, each in a PHASE_MARK range; the graph-API
        summary of the graph each captured."""
        from torch.profiler import ProfilerActivity, profile, record_function
        graphs = []
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(n):
                self.phase_graph = None
                with record_function(compare.PHASE_MARK):
                    # Margins without CUDA calls keep every event of the phase well inside
                    # the range, whatever the skew between CPU and CUPTI timestamps.
                    time.sleep(0.005)
                    self.phase()
                    time.sleep(0.005)
                graphs.append(self.phase_graph)
                time.sleep(0.005)
        prof.export_chrome_trace(trace_path)
        return graphs

    def versions(self):
        torch = self.torch
        v = {"torch": torch.__version__, "cuda": str(torch.version.cuda),
             "gpu": torch.cuda.get_device_name(self.dev), "python": sys.version.split()[0],
             "graph_api": self.inspector.source if self.inspector else "unavailable: %s" % self.graph_api_error}
        try:
            nv = torch.cuda.nccl.version()
            v["nccl"] = ".".join(str(x) for x in nv) if isinstance(nv, tuple) else str(nv)
        except Exception as e:  # noqa: BLE001 (version is informational)
            v["nccl"] = "unknown (%s)" % e
        return v

    def close(self):
        try:
            self.dist.destroy_process_group()
        except Exception:  # noqa: BLE001 (exit anyway)
            pass


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# ---------------------------------------------------------------- stub backend

class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


class CULaunchConfig(ctypes.Structure):  # test/stubs/cuda_drv_stub.h, real cuda.h layout
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.c_void_p), ("numAttrs", ctypes.c_uint)]


class NcclUniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


H2D, D2H, D2D = 1, 2, 3
NCCL_FLOAT32, NCCL_SUM = 7, 0


class StubBackend:
    """The stub libraries through ctypes. Each call is tallied into a chrome trace of the
    shape Kineto writes (cuda_runtime / cuda_driver events with a correlation id and the
    calling thread, kernel / gpu_memcpy / gpu_memset activities tied to their call by
    correlation, user_annotation nccl:all_reduce), with the same blind spots: cudaSetDevice
    is left out, as Kineto's blocklist does, and NCCL group calls have no event.

    Where the stub runtime has stream capture (cudaStreamBeginCapture and the event and
    graph calls around it), each phase also captures a graph as PyTorch does (kernels on a
    capturing stream, a second stream forked and joined through events, a device-to-device
    copy there), replays it and destroys it, and the start-up graph is captured too;
    otherwise the start-up "graph" is an executable graph of a made-up handle and phases
    capture nothing."""
    name = "stub"
    CAPTURE_FUNCS = ("cudaStreamBeginCapture", "cudaStreamEndCapture", "cudaEventCreateWithFlags",
                     "cudaEventRecord", "cudaStreamWaitEvent", "cudaGraphInstantiateWithFlags",
                     "cudaGraphExecDestroy", "cudaGraphDestroy")
    # The captured graph: launches on the capturing stream, on the forked stream, after the join.
    CAPTURE_PLAN = ("cudaLaunchKernel", "cudaLaunchKernel", "fork", "cudaLaunchKernel", "cuLaunchKernel",
                    "copy", "join", "cuLaunchKernelEx")

    def __init__(self, a):
        self.a = a
        d = a.fixtures
        rt = ctypes.CDLL(os.path.join(d, "libcudart.so.12"))  # NEEDED libcuda.so.1, RUNPATH d
        drv = ctypes.CDLL(os.path.join(d, "libcuda.so.1"))
        nccl = ctypes.CDLL(os.path.join(d, "libnccl.so.2"))
        vp, sz, ui, i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int
        P = ctypes.POINTER
        sig = {
            (rt, "cudaMalloc"): [P(vp), sz],
            (rt, "cudaStreamCreate"): [P(vp)],
            (rt, "cudaLaunchKernel"): [vp, Dim3, Dim3, vp, sz, vp],
            (rt, "cudaMemcpyAsync"): [vp, vp, sz, i, vp],
            (rt, "cudaMemsetAsync"): [vp, i, sz, vp],
            (rt, "cudaStreamSynchronize"): [vp],
            (rt, "cudaDeviceSynchronize"): [],
            (rt, "cudaSetDevice"): [i],
            (rt, "cudaGraphInstantiate"): [P(vp), vp, ctypes.c_ulonglong],
            (rt, "cudaGraphLaunch"): [vp, vp],
            (drv, "cuLaunchKernel"): [vp, ui, ui, ui, ui, ui, ui, ui, vp, vp, vp],
            (drv, "cuLaunchKernelEx"): [P(CULaunchConfig), vp, vp, vp],
            (nccl, "ncclGetUniqueId"): [P(NcclUniqueId)],
            (nccl, "ncclCommInitRank"): [P(vp), i, NcclUniqueId, i],
            (nccl, "ncclAllReduce"): [vp, vp, sz, i, i, vp, vp],
            (nccl, "ncclGroupStart"): [],
            (nccl, "ncclGroupEnd"): [],
        }
        self.capture = all(hasattr(rt, f) for f in self.CAPTURE_FUNCS)
        if self.capture:
            sig.update({
                (rt, "cudaStreamBeginCapture"): [vp, i],
                (rt, "cudaStreamEndCapture"): [vp, P(vp)],
                (rt, "cudaEventCreateWithFlags"): [P(vp), ui],
                (rt, "cudaEventRecord"): [vp, vp],
                (rt, "cudaStreamWaitEvent"): [vp, vp, ui],
                (rt, "cudaGraphInstantiateWithFlags"): [P(vp), vp, ctypes.c_ulonglong],
                (rt, "cudaGraphExecDestroy"): [vp],
                (rt, "cudaGraphDestroy"): [vp],
            })
        self.fn = {}
        for (lib, name), argtypes in sig.items():
            f = getattr(lib, name)
            f.argtypes, f.restype = argtypes, ctypes.c_int
            self.fn[name] = f
        self.trace = None
        self.corr = 0

        def alloc(n):
            p = vp()
            self.call("cudaMalloc", ctypes.byref(p), n)
            return p

        def stream():
            s = vp()
            self.call("cudaStreamCreate", ctypes.byref(s))
            return s
        self.stream = stream()
        self.dev_a, self.dev_b = alloc(a.copy_elems * 4), alloc(a.copy_elems * 4)
        self.host = ctypes.create_string_buffer(a.copy_elems * 4)  # stub copies touch nothing
        self.ar = alloc(a.allreduce_elems * 4)
        self.kernel = ctypes.cast(ctypes.pointer(ctypes.c_int(0)), vp)  # a host "function" address
        self.cfg = CULaunchConfig(8, 1, 1, 128, 1, 1, 0, self.stream, None, 0)
        self.exec = vp()
        if self.capture:
            self.cap_stream, self.fork_stream = stream(), stream()
            self.events = []
            for _ in range(2):
                e = vp()
                self.call("cudaEventCreateWithFlags", ctypes.byref(e), 2)  # cudaEventDisableTiming
                self.events.append(e)
            self.cap_cfg = CULaunchConfig(8, 1, 1, 128, 1, 1, 0, self.cap_stream, None, 0)
            graph = self._capture([("cudaLaunchKernel", None), ("cuLaunchKernel", None)])
            self.call("cudaGraphInstantiate", ctypes.byref(self.exec), graph, 0)
        else:
            self.call("cudaGraphInstantiate", ctypes.byref(self.exec), ctypes.c_void_p(0x4000), 0)
        uid = NcclUniqueId()
        self.call("ncclGetUniqueId", ctypes.byref(uid))
        self.comm = vp()
        self.call("ncclCommInitRank", ctypes.byref(self.comm), 1, uid, 0)
        self.phase_graph = None
        self.graph_api_error = None if self.capture else \
            "the stub libcudart.so.12 has no stream capture (%s)" % ", ".join(
                f for f in self.CAPTURE_FUNCS if not hasattr(rt, f))

    def now(self):
        return len(self.trace["traceEvents"]) + 1000

    def call(self, name, *args, cat=None, gpu=None):
        rc = self.fn[name](*args)
        if rc != 0:
            raise RuntimeError("%s returned %d" % (name, rc))
        if self.trace is not None and cat is not None:
            self.corr += 1
            ts = self.now()
            self.trace["traceEvents"].append({"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": 1, "tid": 1,
                                              "args": {"correlation": self.corr}})
            for g in (gpu if isinstance(gpu, list) else [gpu] if gpu else []):
                ev = dict(g)
                ev.update({"ph": "X", "ts": ts, "dur": 1})
                ev["args"] = dict(ev.get("args", {}), correlation=self.corr)
                self.trace["traceEvents"].append(ev)

    def mark(self, name, start):
        if self.trace is not None:
            self.trace["traceEvents"].append({"ph": "X", "cat": "user_annotation", "name": name, "ts": start,
                                              "dur": self.now() - start, "tid": 1})

    def launch(self, api, stream, cfg, cat_rt="cuda_runtime", gpu=None):
        g, blk = Dim3(8, 1, 1), Dim3(128, 1, 1)
        if api == "cudaLaunchKernel":
            self.call("cudaLaunchKernel", self.kernel, g, blk, None, 0, stream, cat=cat_rt, gpu=gpu)
        elif api == "cuLaunchKernel":
            self.call("cuLaunchKernel", self.kernel, 8, 1, 1, 128, 1, 1, 0, stream, None, None,
                      cat="cuda_driver", gpu=gpu)
        else:
            self.call("cuLaunchKernelEx", ctypes.byref(cfg), self.kernel, None, None, cat="cuda_driver", gpu=gpu)

    def _capture(self, plan):
        """Captures plan on cap_stream: (launch API, None), ("fork"|"join"|"copy", None).
        Returns the graph; its nodes are the plan's launches and copies."""
        rt, cap, fork = "cuda_runtime", self.cap_stream, self.fork_stream
        b = self.a.copy_elems * 4
        self.call("cudaStreamBeginCapture", cap, 1, cat=rt)  # cudaStreamCaptureModeThreadLocal
        on, cfg = cap, self.cap_cfg
        for step, _ in plan:
            if step == "fork":
                self.call("cudaEventRecord", self.events[0], cap, cat=rt)
                self.call("cudaStreamWaitEvent", fork, self.events[0], 0, cat=rt)
                on, cfg = fork, CULaunchConfig(8, 1, 1, 128, 1, 1, 0, fork, None, 0)
            elif step == "join":
                self.call("cudaEventRecord", self.events[1], fork, cat=rt)
                self.call("cudaStreamWaitEvent", cap, self.events[1], 0, cat=rt)
                on, cfg = cap, self.cap_cfg
            elif step == "copy":  # recorded, not run: no GPU activity
                self.call("cudaMemcpyAsync", self.dev_b, self.dev_a, b, D2D, on, cat=rt)
            else:
                self.launch(step, on, cfg)
        graph = ctypes.c_void_p()
        self.call("cudaStreamEndCapture", cap, ctypes.byref(graph), cat=rt)
        return graph

    def plan_summary(self):
        """The graph CAPTURE_PLAN builds, in GraphInspector.summary's form."""
        k = sum(1 for s in self.CAPTURE_PLAN if s not in ("fork", "join", "copy"))
        c = self.CAPTURE_PLAN.count("copy")
        return {"source": "workload (stub libraries: the captured plan)", "nodes": k + c, "kernel_nodes": k,
                "memcpy_nodes": c, "memcpy_bytes": {"d2d": c * self.a.copy_elems * 4} if c else {},
                "memcpy_kinds": {str(D2D): c} if c else {}, "memset_nodes": 0, "memset_bytes": 0, "other_nodes": {}}

    def _graphs(self):
        a, s, rt = self.a, self.stream, "cuda_runtime"
        start = self.now() if self.trace is not None else 0
        for _ in range(a.graph_replays):
            self.call("cudaGraphLaunch", self.exec, s, cat=rt)  # no GPU activity: not seen built
        self.mark(compare.GRAPH_UNKNOWN_MARK, start)
        if not self.capture or a.capture_replays <= 0:
            return
        start = self.now() if self.trace is not None else 0
        graph = self._capture([(step, None) for step in self.CAPTURE_PLAN])
        exe = ctypes.c_void_p()
        self.call("cudaGraphInstantiateWithFlags", ctypes.byref(exe), graph, 1, cat=rt)
        summary = self.plan_summary()
        b = a.copy_elems * 4
        gpu = [{"cat": "kernel", "name": "stub_kernel"}] * summary["kernel_nodes"] + \
              [{"cat": "gpu_memcpy", "name": "Memcpy DtoD (Device -> Device)", "args": {"bytes": b}}] * \
              summary["memcpy_nodes"]
        for _ in range(a.capture_replays):
            self.call("cudaGraphLaunch", exe, s, cat=rt, gpu=gpu)
        self.call("cudaGraphExecDestroy", exe, cat=rt)
        self.call("cudaGraphDestroy", graph, cat=rt)
        self.mark(compare.GRAPH_NEW_MARK, start)
        self.phase_graph = summary

    def constructed(self):
        b, c = self.a.copy_elems * 4, self.a.copies
        cap = self.capture and self.a.capture_replays > 0
        return {"memcpy_bytes": {"h2d": c * b, "d2h": c * b, "d2d": c * b},
                "nccl_calls": {"ncclAllReduce": self.a.allreduces},
                "nccl_bytes": {"ncclAllReduce": self.a.allreduces * self.a.allreduce_elems * 4},
                "graph_replays": self.a.graph_replays,
                "graph": {"replays_unknown": self.a.graph_replays,
                          "replays_new": self.a.capture_replays if cap else 0,
                          "capture_memcpy_bytes": self.plan_summary()["memcpy_bytes"] if cap else {},
                          "kernel_nodes": self.plan_summary()["kernel_nodes"] if cap else 0,
                          "capture_error": None}}

    def phase(self):
        a, s, rt, drv = self.a, self.stream, "cuda_runtime", "cuda_driver"
        b = a.copy_elems * 4
        host = ctypes.cast(self.host, ctypes.c_void_p)
        self.call("cudaSetDevice", 0)  # no trace event: Kineto drops it
        for i in range(a.steps):
            # eager ops: runtime launches; a cuBLASLt-like driver launch and a Triton-like
            # one, no runtime above them. Each runs a kernel.
            k = [{"cat": "kernel", "name": "stub_kernel"}]
            for _ in range(4):
                self.launch("cudaLaunchKernel", s, self.cfg, gpu=k)
            self.launch("cuLaunchKernelEx", s, self.cfg, gpu=k)
            self.launch("cuLaunchKernel", s, self.cfg, gpu=k)
            if (i + 1) % a.sync_every == 0:
                self.call("cudaDeviceSynchronize", cat=rt)
        for _ in range(a.copies):
            self.call("cudaMemcpyAsync", self.dev_a, host, b, H2D, s, cat=rt,
                      gpu={"cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "args": {"bytes": b}})
            self.call("cudaMemcpyAsync", host, self.dev_a, b, D2H, s, cat=rt,
                      gpu={"cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "args": {"bytes": b}})
            self.call("cudaMemcpyAsync", self.dev_b, self.dev_a, b, D2D, s, cat=rt,
                      gpu={"cat": "gpu_memcpy", "name": "Memcpy DtoD (Device -> Device)", "args": {"bytes": b}})
            self.call("cudaMemsetAsync", self.dev_b, 0, b, s, cat=rt,
                      gpu={"cat": "gpu_memset", "name": "Memset (Device)", "args": {"bytes": b}})
            self.call("cudaStreamSynchronize", s, cat=rt)
        self._graphs()
        self.call("ncclGroupStart")
        for _ in range(a.allreduces):
            self.call("ncclAllReduce", self.ar, self.ar, a.allreduce_elems, NCCL_FLOAT32, NCCL_SUM,
                      self.comm, s)
            if self.trace is not None:
                self.trace["traceEvents"].append({"ph": "X", "cat": "user_annotation", "name": "nccl:all_reduce",
                                                  "ts": self.now(), "dur": 1, "tid": 1})
        self.call("ncclGroupEnd")
        self.call("cudaDeviceSynchronize", cat="cuda_runtime")

    def profiled_phases(self, n, trace_path):
        self.trace = {"traceEvents": [{"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize",
                                       "ts": 1, "dur": 1, "tid": 1}]}  # before the windows: not counted
        graphs = []
        for _ in range(n):
            self.phase_graph = None
            start = self.now()
            self.phase()
            self.mark(compare.PHASE_MARK, start)
            graphs.append(self.phase_graph)
        end = self.now()
        # the profiler's own synchronize when it stops, after the window
        self.call("cudaDeviceSynchronize")
        self.trace["traceEvents"].append({"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize",
                                          "ts": end + 10, "dur": 1, "tid": 1})
        with open(trace_path, "w") as f:
            json.dump(self.trace, f)
        self.trace = None
        return graphs

    def versions(self):
        return {"gpu": "none (stub libraries)", "python": sys.version.split()[0],
                "graph_api": "stub: the captured plan" if self.capture else "unavailable: %s" % self.graph_api_error}

    def close(self):
        pass


# ---------------------------------------------------------------- main

def describe(a):
    if a.backend == "stub":
        return ("%d steps x (4 cudaLaunchKernel, cuLaunchKernelEx, cuLaunchKernel), cudaDeviceSynchronize "
                "every %d steps; %d x (h2d, d2h, d2d cudaMemcpyAsync of %d bytes, cudaMemsetAsync, "
                "cudaStreamSynchronize); %d cudaGraphLaunch of a graph built before attach; where the stub "
                "runtime captures: a graph captured (3 runtime and 2 driver launches, a fork to a second stream "
                "and a join through events, a d2d copy), %d replays, destroyed; ncclGroupStart, %d ncclAllReduce "
                "of %d float32, ncclGroupEnd; cudaSetDevice and cudaDeviceSynchronize once (stub libraries, ctypes)"
                % (a.steps, a.sync_every, a.copies, a.copy_elems * 4, a.graph_replays, a.capture_replays,
                   a.allreduces, a.allreduce_elems))
    return ("%d steps x (2 matmuls, gelu, add, layer_norm, mul), synchronize every %d steps; "
            "%d x (pinned h2d, pageable h2d, pinned d2h, pageable d2h, d2d) copies of %d bytes; "
            "%d replays of a CUDA graph captured at start-up; a CUDA graph captured (torch.cuda.graph on a "
            "side stream: matmul, a fork to a second stream with gelu and a d2d copy of %d bytes, gelu, join, "
            "matmul, add), %d replays, reset; %d all_reduce of %d float32 (NCCL, world size 1); synchronize"
            % (a.steps, a.sync_every, a.copies, a.copy_elems * 4, a.graph_replays, a.copy_elems * 4,
               a.capture_replays, a.allreduces, a.allreduce_elems))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=("torch", "stub"), required=True)
    p.add_argument("--fixtures", help="stub backend: directory of testutil.BuildFixtures")
    p.add_argument("--trace-dir", default=tempfile.gettempdir())
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--sync-every", type=int, default=25)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--copies", type=int, default=8)
    p.add_argument("--copy-elems", type=int, default=1 << 18)
    p.add_argument("--graph-replays", type=int, default=20, help="replays of the start-up graph a phase")
    p.add_argument("--capture-replays", type=int, default=20,
                   help="replays of the graph each phase captures (0: capture none)")
    p.add_argument("--allreduces", type=int, default=20)
    p.add_argument("--allreduce-elems", type=int, default=1 << 20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--profiled", type=int, default=2)
    a = p.parse_args()
    if a.backend == "stub" and not a.fixtures:
        p.error("--backend stub needs --fixtures")

    # Protocol on a private copy of stdout; anything C libraries print goes to stderr.
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def send(**kw):
        proto.write(json.dumps(kw) + "\n")
        proto.flush()

    try:
        t0 = time.monotonic()
        be = TorchBackend(a) if a.backend == "torch" else StubBackend(a)
        for _ in range(a.warmup):
            be.phase_graph = None
            be.phase()
        path = os.path.join(a.trace_dir, "profi-gpu-trace-%d.json" % os.getpid())
        graphs = be.profiled_phases(a.profiled, path)
        with open(path) as f:
            trace = json.load(f)
        os.remove(path)
        gts = []
        for k in range(a.profiled):
            gt = compare.ground_truth_from_trace(trace, index=k)
            # What the phase's captured graph runs, from the CUDA runtime (not from profi).
            gt["graph_api"] = graphs[k]
            gt["graph_api_error"] = getattr(be, "capture_error", None) or be.graph_api_error
            gts.append(gt)
        del trace
        diffs = []
        for g in gts[1:]:
            diffs += compare.same_ground_truth(gts[0], g)
        send(event="ready", pid=os.getpid(), backend=be.name, versions=be.versions(),
             libraries=mapped_libraries(), ground_truth=gts[0], profiled_phases=len(gts),
             nondeterministic=diffs, constructed=be.constructed(), description=describe(a),
             plan=vars(a), startup_seconds=time.monotonic() - t0)
        for line in sys.stdin:
            cmd = line.split()
            if not cmd:
                continue
            if cmd[0] == "run":
                secs, graphs = [], []
                for _ in range(int(cmd[1])):
                    be.phase_graph = None
                    t = time.perf_counter()
                    be.phase()
                    secs.append(time.perf_counter() - t)
                    graphs.append(be.phase_graph)
                send(event="ran", seconds=secs, graphs=graphs)
            elif cmd[0] == "quit":
                break
            else:
                raise ValueError("unknown command %r" % line)
        be.close()
        send(event="bye")
        return 0
    except Exception as e:  # noqa: BLE001 (reported to the orchestrator, then exit 1)
        import traceback
        traceback.print_exc()
        send(event="error", error="%s: %s" % (type(e).__name__, e))
        return 1


if __name__ == "__main__":
    sys.exit(main())
