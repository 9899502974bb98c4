#!/usr/bin/env python3
"""Workload of the real-GPU proof (test/gpu/prove.sh): a fixed amount of inference-like
work per "phase", and its own ground truth.

Backends:
- torch: PyTorch on the GPU. Per phase: `steps` decoder-like steps of eager matmuls and
  elementwise ops with a torch.cuda.synchronize() every `sync_every` steps, host<->device
  copies of known sizes (pinned and pageable, both directions, and device to device),
  `graph_replays` replays of a CUDA graph captured at start-up, and `allreduces`
  single-rank NCCL all_reduce calls (torch.distributed, backend nccl, world size 1).
- stub: the same orchestration against profi's stub libcudart.so.12, libcuda.so.1 and
  libnccl.so.2 (test/fixtures), called through ctypes with known counts; it writes the
  same chrome-trace format as torch.profiler, so the same ground-truth code reads it.
  This is the CPU dry run of the proof's logic.

Start-up (before profi attaches): libraries load, `warmup` unprofiled phases run (caching
allocator, cuBLAS workspaces, NCCL communicator, CUDA graph), then `profiled` phases run
under torch.profiler; the ground truth of one phase comes from their traces, and they
must agree with each other (the phase is deterministic). The profiler is never active
while profi counts: it makes CUDA calls of its own when it stops.

Protocol: one JSON line per event on the original stdout (C libraries' stdout is sent to
stderr). First {"event": "ready", ...ground truth...}; then, per command line on stdin:
"run N" -> N measured phases, {"event": "ran", "seconds": [...]}; "quit" -> {"event": "bye"}.
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
        with torch.cuda.graph(self.graph):
            self.g_out = self._graph_body()
        torch.cuda.synchronize()
        self.dist.all_reduce(self.ar)  # communicator, if not made eagerly
        torch.cuda.synchronize()

    def _graph_body(self):
        y = self.F.gelu(self.g_in @ self.w1)
        return self.F.layer_norm(y @ self.w2 + self.g_in, (self.a.hidden,))

    def constructed(self):
        """What one phase copies and reduces, from the tensors it uses."""
        b = self.a.copy_elems * 4
        c = self.a.copies
        return {"memcpy_bytes": {"h2d": 2 * c * b, "d2h": 2 * c * b, "d2d": c * b},
                "nccl_calls": {"ncclAllReduce": self.a.allreduces},
                "nccl_bytes": {"ncclAllReduce": self.a.allreduces * self.a.allreduce_elems * 4},
                "graph_replays": self.a.graph_replays}

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
        for _ in range(a.graph_replays):
            self.graph.replay()
        for _ in range(a.allreduces):
            self.dist.all_reduce(self.ar)
        torch.cuda.synchronize()

    def profiled_phase(self, trace_path):
        from torch.profiler import ProfilerActivity, profile, record_function
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            with record_function(compare.PHASE_MARK):
                # Margins without CUDA calls keep every event of the phase well inside
                # the range, whatever the skew between CPU and CUPTI timestamps.
                time.sleep(0.005)
                self.phase()
                time.sleep(0.005)
        prof.export_chrome_trace(trace_path)

    def versions(self):
        torch = self.torch
        v = {"torch": torch.__version__, "cuda": str(torch.version.cuda),
             "gpu": torch.cuda.get_device_name(self.dev), "python": sys.version.split()[0]}
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
    shape Kineto writes (cuda_runtime / cuda_driver events with a correlation id,
    gpu_memcpy / gpu_memset with bytes, user_annotation nccl:all_reduce), with the same
    blind spots: cudaSetDevice is left out, as Kineto's blocklist does, and NCCL group
    calls have no event."""
    name = "stub"

    def __init__(self, a):
        self.a = a
        d = a.fixtures
        rt = ctypes.CDLL(os.path.join(d, "libcudart.so.12"))  # NEEDED libcuda.so.1, RUNPATH d
        drv = ctypes.CDLL(os.path.join(d, "libcuda.so.1"))
        nccl = ctypes.CDLL(os.path.join(d, "libnccl.so.2"))
        vp, sz, ui, i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int
        sig = {
            (rt, "cudaMalloc"): [ctypes.POINTER(vp), sz],
            (rt, "cudaStreamCreate"): [ctypes.POINTER(vp)],
            (rt, "cudaLaunchKernel"): [vp, Dim3, Dim3, vp, sz, vp],
            (rt, "cudaMemcpyAsync"): [vp, vp, sz, i, vp],
            (rt, "cudaMemsetAsync"): [vp, i, sz, vp],
            (rt, "cudaStreamSynchronize"): [vp],
            (rt, "cudaDeviceSynchronize"): [],
            (rt, "cudaSetDevice"): [i],
            (rt, "cudaGraphInstantiate"): [ctypes.POINTER(vp), vp, ctypes.c_ulonglong],
            (rt, "cudaGraphLaunch"): [vp, vp],
            (drv, "cuLaunchKernel"): [vp, ui, ui, ui, ui, ui, ui, ui, vp, vp, vp],
            (drv, "cuLaunchKernelEx"): [ctypes.POINTER(CULaunchConfig), vp, vp, vp],
            (nccl, "ncclGetUniqueId"): [ctypes.POINTER(NcclUniqueId)],
            (nccl, "ncclCommInitRank"): [ctypes.POINTER(vp), i, NcclUniqueId, i],
            (nccl, "ncclAllReduce"): [vp, vp, sz, i, i, vp, vp],
            (nccl, "ncclGroupStart"): [],
            (nccl, "ncclGroupEnd"): [],
        }
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
        self.stream = vp()
        self.call("cudaStreamCreate", ctypes.byref(self.stream))
        self.dev_a, self.dev_b = alloc(a.copy_elems * 4), alloc(a.copy_elems * 4)
        self.host = ctypes.create_string_buffer(a.copy_elems * 4)  # stub copies touch nothing
        self.ar = alloc(a.allreduce_elems * 4)
        self.exec = vp()
        self.call("cudaGraphInstantiate", ctypes.byref(self.exec), ctypes.c_void_p(0x4000), 0)
        self.kernel = ctypes.cast(ctypes.pointer(ctypes.c_int(0)), vp)  # a host "function" address
        uid = NcclUniqueId()
        self.call("ncclGetUniqueId", ctypes.byref(uid))
        self.comm = vp()
        self.call("ncclCommInitRank", ctypes.byref(self.comm), 1, uid, 0)
        self.cfg = CULaunchConfig(8, 1, 1, 128, 1, 1, 0, self.stream, None, 0)

    def call(self, name, *args, cat=None, gpu=None):
        rc = self.fn[name](*args)
        if rc != 0:
            raise RuntimeError("%s returned %d" % (name, rc))
        if self.trace is not None and cat is not None:
            self.corr += 1
            ts = len(self.trace["traceEvents"]) + 1000
            self.trace["traceEvents"].append({"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": 1,
                                              "args": {"correlation": self.corr}})
            if gpu is not None:
                ev = dict(gpu)
                ev.update({"ph": "X", "ts": ts, "dur": 1})
                ev["args"] = dict(ev.get("args", {}), correlation=self.corr)
                self.trace["traceEvents"].append(ev)

    def constructed(self):
        b, c = self.a.copy_elems * 4, self.a.copies
        return {"memcpy_bytes": {"h2d": c * b, "d2h": c * b, "d2d": c * b},
                "nccl_calls": {"ncclAllReduce": self.a.allreduces},
                "nccl_bytes": {"ncclAllReduce": self.a.allreduces * self.a.allreduce_elems * 4},
                "graph_replays": self.a.graph_replays}

    def phase(self):
        a, s, rt, drv = self.a, self.stream, "cuda_runtime", "cuda_driver"
        g, blk = Dim3(8, 1, 1), Dim3(128, 1, 1)
        b = a.copy_elems * 4
        host = ctypes.cast(self.host, ctypes.c_void_p)
        self.call("cudaSetDevice", 0)  # no trace event: Kineto drops it
        for i in range(a.steps):
            for _ in range(4):  # eager ops: runtime launches
                self.call("cudaLaunchKernel", self.kernel, g, blk, None, 0, s, cat=rt)
            # a cuBLASLt-like driver launch and a Triton-like one, no runtime above them
            self.call("cuLaunchKernelEx", ctypes.byref(self.cfg), self.kernel, None, None, cat=drv)
            self.call("cuLaunchKernel", self.kernel, 8, 1, 1, 128, 1, 1, 0, s, None, None, cat=drv)
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
        for _ in range(a.graph_replays):
            self.call("cudaGraphLaunch", self.exec, s, cat=rt)
        self.call("ncclGroupStart")
        for _ in range(a.allreduces):
            self.call("ncclAllReduce", self.ar, self.ar, a.allreduce_elems, NCCL_FLOAT32, NCCL_SUM,
                      self.comm, s)
            if self.trace is not None:
                self.trace["traceEvents"].append({"ph": "X", "cat": "user_annotation", "name": "nccl:all_reduce",
                                                  "ts": len(self.trace["traceEvents"]) + 1000, "dur": 1})
        self.call("ncclGroupEnd")
        self.call("cudaDeviceSynchronize", cat="cuda_runtime")

    def profiled_phase(self, trace_path):
        self.trace = {"traceEvents": [{"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize",
                                       "ts": 1, "dur": 1}]}  # before the window: not counted
        start = 1000
        self.phase()
        end = len(self.trace["traceEvents"]) + 1000
        self.trace["traceEvents"].append({"ph": "X", "cat": "user_annotation", "name": compare.PHASE_MARK,
                                          "ts": start, "dur": end - start})
        # the profiler's own synchronize when it stops, after the window
        self.call("cudaDeviceSynchronize")
        self.trace["traceEvents"].append({"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize",
                                          "ts": end + 10, "dur": 1})
        with open(trace_path, "w") as f:
            json.dump(self.trace, f)
        self.trace = None

    def versions(self):
        return {"gpu": "none (stub libraries)", "python": sys.version.split()[0]}

    def close(self):
        pass


# ---------------------------------------------------------------- main

def describe(a):
    if a.backend == "stub":
        return ("%d steps x (4 cudaLaunchKernel, cuLaunchKernelEx, cuLaunchKernel), cudaDeviceSynchronize "
                "every %d steps; %d x (h2d, d2h, d2d cudaMemcpyAsync of %d bytes, cudaMemsetAsync, "
                "cudaStreamSynchronize); %d cudaGraphLaunch; ncclGroupStart, %d ncclAllReduce of %d float32, "
                "ncclGroupEnd; cudaSetDevice and cudaDeviceSynchronize once (stub libraries, ctypes)"
                % (a.steps, a.sync_every, a.copies, a.copy_elems * 4, a.graph_replays, a.allreduces,
                   a.allreduce_elems))
    return ("%d steps x (2 matmuls, gelu, add, layer_norm, mul), synchronize every %d steps; "
            "%d x (pinned h2d, pageable h2d, pinned d2h, pageable d2h, d2d) copies of %d bytes; "
            "%d CUDA graph replays; %d all_reduce of %d float32 (NCCL, world size 1); synchronize"
            % (a.steps, a.sync_every, a.copies, a.copy_elems * 4, a.graph_replays, a.allreduces,
               a.allreduce_elems))


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
    p.add_argument("--graph-replays", type=int, default=20)
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
            be.phase()
        gts = []
        for k in range(a.profiled):
            path = os.path.join(a.trace_dir, "profi-gpu-trace-%d-%d.json" % (os.getpid(), k))
            be.profiled_phase(path)
            with open(path) as f:
                gts.append(compare.ground_truth_from_trace(json.load(f)))
            os.remove(path)
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
                secs = []
                for _ in range(int(cmd[1])):
                    t = time.perf_counter()
                    be.phase()
                    secs.append(time.perf_counter() - t)
                send(event="ran", seconds=secs)
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
