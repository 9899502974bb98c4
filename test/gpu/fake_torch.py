"""A stand-in for the part of PyTorch workload.py's torch backend uses, for its unit tests
(workload_test.py): no GPU, no torch. Every CUDA-side effect is logged as the chrome-trace
events torch.profiler would write while a profile() is active (runtime calls with a
correlation id and thread, kernels and copies they ran, record_function ranges), so the
backend's phases go through compare.ground_truth_from_trace as on a GPU. Stream capture
is modelled: a launch or copy on a capturing stream (or one that waited on an event
recorded on one) runs nothing; a replay runs the captured kernels and copies again.

build(module) fills module (named torch) and registers its submodules in sys.modules."""

import json
import sys
import types

LOG = {"ts": 0, "corr": 0, "events": None, "calls": {}}


def _tick():
    LOG["ts"] += 1
    return LOG["ts"]


def _count(name):
    LOG["calls"][name] = LOG["calls"].get(name, 0) + 1


def api(name, gpu=()):
    """A runtime call, and what it ran on the GPU (kernel / gpu_memcpy events)."""
    _count(name)
    ts = _tick()
    if LOG["events"] is None:
        return
    LOG["corr"] += 1
    LOG["events"].append({"ph": "X", "cat": "cuda_runtime", "name": name, "ts": ts, "dur": 1, "tid": 7,
                          "args": {"correlation": LOG["corr"]}})
    for g in gpu:
        LOG["events"].append(dict(g, ph="X", ts=ts + 100000, dur=1, args=dict(g.get("args", {}),
                                                                              correlation=LOG["corr"])))


class Stream:
    def __init__(self, handle):
        self.handle, self.capture = handle, None

    def wait_stream(self, other):
        api("cudaEventRecord")
        api("cudaStreamWaitEvent")
        if other.capture is not None:
            self.capture = other.capture


_STATE = {"current": Stream(0), "next_stream": 1, "next_graph": 1, "pools": 0}


def current_stream():
    return _STATE["current"]


class _StreamCtx:
    def __init__(self, s):
        self.s = s

    def __enter__(self):
        self.prev, _STATE["current"] = _STATE["current"], self.s

    def __exit__(self, *args):
        _STATE["current"] = self.prev


def _launch(n=1):
    cap = current_stream().capture
    for _ in range(n):
        if cap is not None:
            api("cudaLaunchKernel")
            cap.nodes.append({"cat": "kernel", "name": "k"})
        else:
            api("cudaLaunchKernel", [{"cat": "kernel", "name": "k"}])


class Tensor:
    def __init__(self, n=1):
        self.n = n

    def _op(self, *args):
        _launch()
        return Tensor(self.n)

    __matmul__ = __add__ = __mul__ = __truediv__ = _op

    def pin_memory(self):
        return self

    def copy_(self, src, non_blocking=False):
        cap = current_stream().capture
        gpu = {"cat": "gpu_memcpy", "name": "Memcpy DtoD (Device -> Device)", "args": {"bytes": 4 * self.n}}
        if cap is not None:
            api("cudaMemcpyAsync")
            cap.nodes.append(gpu)
        else:
            api("cudaMemcpyAsync", [gpu])
        return self


def _tensor(*shape, **kw):
    n = 1
    for s in shape:
        n *= s
    return Tensor(n)


class Generator:
    def __init__(self, device=None):
        pass

    def manual_seed(self, seed):
        return self


class _Capture:
    def __init__(self):
        self.nodes = []


class CUDAGraph:
    """torch.cuda.CUDAGraph of PyTorch 2.8+ (keep_graph, instantiate, raw_cuda_graph)."""

    def __init__(self, keep_graph=False):
        self.keep_graph, self.cap, self.execd, self.handle = keep_graph, None, False, 0
        self._pool = None

    def capture_begin(self, pool=None, capture_error_mode="global"):
        api("cudaStreamBeginCapture")
        self.cap = _Capture()
        self.capture_error_mode = capture_error_mode
        self._pool = pool if pool is not None else ("pool", _STATE["next_graph"])
        current_stream().capture = self.cap

    def capture_end(self):
        api("cudaStreamEndCapture")
        for s in list(_STREAMS):
            if s.capture is self.cap:
                s.capture = None
        self.handle = _STATE["next_graph"]
        _STATE["next_graph"] += 1
        GRAPHS[self.handle] = self.cap.nodes
        if not self.keep_graph:
            self.instantiate()

    def instantiate(self):
        api("cudaGraphInstantiateWithFlags")
        self.execd = True

    def raw_cuda_graph(self):
        if not self.keep_graph:
            raise RuntimeError("keep_graph=False")
        return self.handle

    def replay(self):
        if not self.execd:
            self.instantiate()
        api("cudaGraphLaunch", self.cap.nodes)

    def reset(self):
        if self.keep_graph:
            api("cudaGraphDestroy")
        api("cudaGraphExecDestroy")
        GRAPHS.pop(self.handle, None)

    def pool(self):
        return self._pool


GRAPHS = {}  # graph handle -> captured nodes
_STREAMS = []


def Stream_():  # noqa: N802 (torch.cuda.Stream)
    s = Stream(_STATE["next_stream"])
    _STATE["next_stream"] += 1
    _STREAMS.append(s)
    return s


def empty_cache():
    _count("empty_cache")


def synchronize():
    api("cudaDeviceSynchronize")


class graph:  # noqa: N801 (torch.cuda.graph)
    def __init__(self, cuda_graph, pool=None, stream=None, capture_error_mode="global"):
        self.g, self.pool, self.mode = cuda_graph, pool, capture_error_mode
        self.stream = stream or Stream_()
        CAPTURES.append({"pool": pool, "stream": stream, "mode": capture_error_mode})

    def __enter__(self):
        sys.modules["torch"].cuda.synchronize()
        sys.modules["torch"].cuda.empty_cache()
        self.ctx = _StreamCtx(self.stream)
        self.ctx.__enter__()
        self.g.capture_begin(self.pool, capture_error_mode=self.mode)

    def __exit__(self, *args):
        self.g.capture_end()
        self.ctx.__exit__(*args)


CAPTURES = []


class record_function:  # noqa: N801
    def __init__(self, name):
        self.name = name

    def __enter__(self):
        self.ts = _tick()

    def __exit__(self, *args):
        end = _tick()
        if LOG["events"] is not None:
            LOG["events"].append({"ph": "X", "cat": "user_annotation", "name": self.name, "ts": self.ts,
                                  "dur": end - self.ts, "tid": 7})


class profile:  # noqa: N801
    def __init__(self, activities=()):
        pass

    def __enter__(self):
        LOG["events"] = []
        return self

    def __exit__(self, *args):
        self.events, LOG["events"] = LOG["events"], None
        synchronize()  # the profiler's own, after every range

    def export_chrome_trace(self, path):
        with open(path, "w") as f:
            json.dump({"traceEvents": self.events}, f)


def all_reduce(t):
    _count("all_reduce")
    with record_function("nccl:all_reduce"):
        _launch()


def build(torch):
    """Fills module torch and registers torch.cuda, torch.distributed, torch.nn(.functional)
    and torch.profiler."""
    cuda = types.ModuleType("torch.cuda")
    cuda.is_available = lambda: True
    cuda.set_device = lambda dev: None
    cuda.Stream, cuda.stream, cuda.current_stream = Stream_, _StreamCtx, current_stream
    cuda.CUDAGraph, cuda.graph, cuda.synchronize, cuda.empty_cache = CUDAGraph, graph, synchronize, empty_cache
    cuda.get_device_name = lambda dev: "fake GPU"
    cuda.nccl = types.SimpleNamespace(version=lambda: (2, 27, 7))
    dist = types.ModuleType("torch.distributed")
    dist.init_process_group = lambda *args, **kw: None
    dist.all_reduce, dist.destroy_process_group = all_reduce, lambda: None
    nn = types.ModuleType("torch.nn")
    functional = types.ModuleType("torch.nn.functional")
    functional.gelu = lambda x: x._op()
    functional.layer_norm = lambda x, shape: x._op()
    nn.functional = functional
    profiler = types.ModuleType("torch.profiler")
    profiler.record_function, profiler.profile = record_function, profile
    profiler.ProfilerActivity = types.SimpleNamespace(CPU="cpu", CUDA="cuda")
    torch.cuda, torch.distributed, torch.nn, torch.profiler = cuda, dist, nn, profiler
    torch.__version__, torch.version = "0.0-fake", types.SimpleNamespace(cuda="13.0")
    torch.device = lambda *args: ("cuda", 0)
    torch.bfloat16, torch.float32 = "bfloat16", "float32"
    torch.randn = torch.ones = torch.empty = _tensor
    torch.Generator = Generator
    for name, mod in (("torch.cuda", cuda), ("torch.distributed", dist), ("torch.nn", nn),
                      ("torch.nn.functional", functional), ("torch.profiler", profiler)):
        sys.modules[name] = mod
    return torch
