"""Unit tests of workload.py's graph-API ground truth (GraphInspector) against a fake CUDA
runtime: what the real one returns through the same ctypes calls (python3 -m unittest
discover -s test/gpu -p '*_test.py')."""

import argparse
import ctypes
import importlib
import json
import os
import subprocess
import sys
import tempfile
import types
import unittest

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402
import fake_torch  # noqa: E402
import workload  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

DEV, HOST = 0x7000_0000, 0x1000  # pointers the fake's cudaPointerGetAttributes knows


class Fn:
    """A fake C function: callable, with the argtypes and restype ctypes would set."""

    def __init__(self, f):
        self.f, self.argtypes, self.restype = f, None, None

    def __call__(self, *args):
        return self.f(*args)


class FakeRuntime:
    """cudaGraph* calls over graphs {handle: [node]}; a node is (type, params dict)."""

    FUNCS = ("cudaGraphGetNodes", "cudaGraphNodeGetType", "cudaGraphMemcpyNodeGetParams",
             "cudaGraphMemsetNodeGetParams", "cudaGraphChildGraphNodeGetGraph", "cudaPointerGetAttributes")

    def __init__(self, graphs, fail=None):
        self.graphs, self.fail = graphs, fail or {}
        self.nodes = {}  # node handle -> (type, params)
        for g, nodes in graphs.items():
            for i, n in enumerate(nodes):
                self.nodes[g * 100 + i + 1] = n
        for name in self.FUNCS:
            setattr(self, name, Fn(getattr(self, name)))

    def _rc(self, name):
        return self.fail.get(name, 0)

    def cudaGraphGetNodes(self, graph, nodes, num):
        g = graph.value
        handles = [h for h in sorted(self.nodes) if h // 100 == g]
        if nodes is not None:
            for i, h in enumerate(handles[:num._obj.value]):
                nodes[i] = h
        num._obj.value = len(handles)
        return self._rc("cudaGraphGetNodes")

    def cudaGraphNodeGetType(self, node, t):
        t._obj.value = self.nodes[node.value][0]
        return self._rc("cudaGraphNodeGetType")

    def cudaGraphMemcpyNodeGetParams(self, node, p):
        q = self.nodes[node.value][1]
        p = p._obj
        p.extent.width, p.extent.height, p.extent.depth = q["extent"]
        p.kind = q["kind"]
        p.srcPtr.ptr, p.dstPtr.ptr = q.get("src", DEV), q.get("dst", DEV)
        return self._rc("cudaGraphMemcpyNodeGetParams")

    def cudaGraphMemsetNodeGetParams(self, node, p):
        q = self.nodes[node.value][1]
        p = p._obj
        p.elementSize, p.width, p.height = q["elementSize"], q["width"], q["height"]
        return self._rc("cudaGraphMemsetNodeGetParams")

    def cudaGraphChildGraphNodeGetGraph(self, node, child):
        child._obj.value = self.nodes[node.value][1]["graph"]
        return self._rc("cudaGraphChildGraphNodeGetGraph")

    def cudaPointerGetAttributes(self, attrs, ptr):
        attrs._obj.type = 2 if ptr.value == DEV else 1
        return 0


def k():
    return (workload.NODE_KERNEL, {})


def copy(n, kind=3, height=1, depth=1, **ends):
    return (workload.NODE_MEMCPY, dict(extent=(n, height, depth), kind=kind, **ends))


def memset(elems, size=4, height=1):
    return (workload.NODE_MEMSET, {"elementSize": size, "width": elems, "height": height})


class GraphInspectorTest(unittest.TestCase):
    def test_captured_graph(self):
        # what torch.cuda.graph records for the workload's body: kernels, a d2d copy, an empty join node
        rt = FakeRuntime({1: [k(), k(), copy(4096), k(), (5, {}), k(), k()]})
        s = workload.GraphInspector(rt, "fake").summary(1)
        self.assertEqual(s, {"source": "fake", "nodes": 7, "kernel_nodes": 5, "memcpy_nodes": 1,
                             "memcpy_bytes": {"d2d": 4096}, "memcpy_kinds": {"3": 1}, "memset_nodes": 0,
                             "memset_bytes": 0, "other_nodes": {"empty": 1}})

    def test_bytes_directions_child_graphs(self):
        rt = FakeRuntime({
            1: [k(), copy(100, kind=1), copy(10, kind=4, src=HOST, dst=DEV), copy(8, height=2, depth=3),
                memset(16, size=2, height=3), (workload.NODE_CHILD, {"graph": 2})],
            2: [k(), k(), copy(5, kind=2), memset(4)],
        })
        s = workload.GraphInspector(rt, "fake").summary(1)
        self.assertEqual(s["kernel_nodes"], 3)
        self.assertEqual(s["memcpy_bytes"], {"h2d": 110, "d2d": 48, "d2h": 5})
        self.assertEqual(s["memcpy_kinds"], {"1": 1, "4": 1, "3": 1, "2": 1})
        self.assertEqual((s["memset_nodes"], s["memset_bytes"]), (2, 16 * 2 * 3 + 16))
        self.assertEqual((s["nodes"], s["other_nodes"]), (10, {"graph": 1}))

    def test_default_kind_without_attributes(self):
        rt = FakeRuntime({1: [copy(10, kind=4)]})
        rt.cudaPointerGetAttributes = None
        ins = workload.GraphInspector(rt, "fake")
        ins.attrs = None
        self.assertEqual(ins.summary(1)["memcpy_bytes"], {"default": 10})

    def test_errors(self):
        # unreadable copy parameters: the node counts stand, the bytes are unknown
        rt = FakeRuntime({1: [k(), copy(10), memset(4)]}, fail={"cudaGraphMemcpyNodeGetParams": 400})
        s = workload.GraphInspector(rt, "fake").summary(1)
        self.assertEqual((s["kernel_nodes"], s["memcpy_nodes"], s["memset_nodes"]), (1, 1, 1))
        self.assertEqual((s["memcpy_bytes"], s["memset_bytes"]), (None, None))
        self.assertEqual(s["param_errors"], ["cudaGraphMemcpyNodeGetParams returned 400"])
        rt = FakeRuntime({1: [copy(10)]}, fail={"cudaGraphNodeGetType": 1})
        with self.assertRaisesRegex(RuntimeError, "cudaGraphNodeGetType returned 1"):
            workload.GraphInspector(rt, "fake").summary(1)
        rt = FakeRuntime({1: [(workload.NODE_CHILD, {"graph": 1})]})  # a cycle only a forged graph has
        with self.assertRaisesRegex(RuntimeError, "nested deeper"):
            workload.GraphInspector(rt, "fake").summary(1)

    def test_runtime_without_graph_api(self):
        class Old:  # a runtime with cudaGraphGetNodes only
            cudaGraphGetNodes = Fn(lambda *args: 0)
        with self.assertRaisesRegex(AttributeError, "cudaGraphNodeGetType"):
            workload.GraphInspector(Old(), "old")

    def test_real_struct_layouts(self):
        self.assertEqual(ctypes.sizeof(workload.CudaMemcpy3DParms), 160)
        self.assertEqual(workload.CudaMemsetParams.elementSize.offset, 20)
        self.assertEqual(workload.CudaMemsetParams.height.offset, 32)

    def test_graph_handle(self):
        class G:
            def __init__(self, h):
                self.h = h

            def raw_cuda_graph(self):
                return self.h

        class CudaPython:
            def getPtr(self):
                return 0x55

        self.assertEqual(workload.graph_handle(G(0x42)), 0x42)
        self.assertEqual(workload.graph_handle(G(CudaPython())), 0x55)
        with self.assertRaises(RuntimeError):
            workload.graph_handle(G(0))


class LiveRuntime(FakeRuntime):
    """The fake runtime over the graphs fake_torch captured."""

    def __init__(self):
        super().__init__({})

    def cudaGraphGetNodes(self, graph, nodes, num):
        self.nodes = {}
        for g, ns in fake_torch.GRAPHS.items():
            for i, n in enumerate(ns):
                self.nodes[g * 100 + i + 1] = (k() if n["cat"] == "kernel"
                                               else copy(n["args"]["bytes"]))
        return FakeRuntime.cudaGraphGetNodes(self, graph, nodes, num)


def plan(**over):
    a = dict(steps=4, sync_every=2, hidden=8, tokens=2, copies=1, copy_elems=16, graph_replays=3,
             capture_replays=2, allreduces=2, allreduce_elems=4, warmup=1, profiled=2)
    a.update(over)
    return argparse.Namespace(**a)


class TorchBackendTest(unittest.TestCase):
    """The torch backend's control flow on fake_torch: what it captures, marks and reads."""

    def setUp(self):
        importlib.reload(fake_torch)
        self.saved = {n: m for n, m in sys.modules.items() if n == "torch" or n.startswith("torch.")}
        sys.modules["torch"] = fake_torch.build(types.ModuleType("torch"))
        self.inspector = workload.runtime_inspector
        workload.runtime_inspector = lambda major: (workload.GraphInspector(LiveRuntime(), "graph API, fake"), None)
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        workload.runtime_inspector = self.inspector
        for n in [n for n in sys.modules if n == "torch" or n.startswith("torch.")]:
            del sys.modules[n]
        sys.modules.update(self.saved)
        self.tmp.cleanup()

    def test_phases(self):
        be = workload.TorchBackend(plan())
        be.phase()  # warm-up: the first capture decides
        self.assertEqual((be.captured, be.capture_error, be.graph_api_error), (True, None, None))
        startup_pool = be.graph.pool()
        graphs = be.profiled_phases(2, os.path.join(self.tmp.name, "t.json"))
        with open(os.path.join(self.tmp.name, "t.json")) as f:
            trace = json.load(f)
        # each capture: the given side stream, the start-up graph's pool, thread_local mode,
        # and the allocator's cache left alone
        for c in fake_torch.CAPTURES[1:]:
            self.assertEqual((c["pool"], c["stream"], c["mode"]), (startup_pool, be.cap_stream, "thread_local"))
        self.assertEqual(fake_torch.CAPTURES[0]["mode"], "thread_local")
        self.assertEqual(fake_torch.LOG["calls"].get("empty_cache", 0), 1)  # the start-up capture's only
        want = {"source": "graph API, fake", "nodes": 6, "kernel_nodes": 5, "memcpy_nodes": 1,
                "memcpy_bytes": {"d2d": 64}, "memcpy_kinds": {"3": 1}, "memset_nodes": 0, "memset_bytes": 0,
                "other_nodes": {}}
        self.assertEqual(graphs, [want, want])
        gts = [compare.ground_truth_from_trace(trace, index=i) for i in (0, 1)]
        self.assertEqual(compare.same_ground_truth(gts[0], gts[1]), [])
        gt = gts[0]
        self.assertEqual(gt["graph_launches"], {"new": 2, "unknown": 3, "other": 0})
        self.assertEqual((gt["captures"], gt["launches"]["captured"]), (1, 5))
        self.assertEqual(gt["launches"]["direct"], 4 * 6 + 2)  # the steps' ops, the all_reduces' kernels
        self.assertEqual(gt["graph_kernels"]["new"], 10)
        self.assertEqual(gt["graph_memcpy_bytes"]["new"], {"d2d": 128})
        self.assertEqual(gt["api_calls"]["cudaGraphDestroy"], 1)
        self.assertEqual(be.constructed()["graph"], {"replays_unknown": 3, "replays_new": 2,
                                                     "capture_memcpy_bytes": {"d2d": 64}, "capture_error": None})
        self.assertEqual(fake_torch.GRAPHS.keys(), {1})  # every phase's graph reset; the start-up one kept
        self.assertEqual(be.versions()["graph_api"], "graph API, fake")

    def test_failed_capture_is_reported(self):
        real = fake_torch.CUDAGraph.capture_begin

        def fail(self, *args, **kw):
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        be = workload.TorchBackend(plan())
        fake_torch.CUDAGraph.capture_begin = fail
        try:
            be.phase()
        finally:
            fake_torch.CUDAGraph.capture_begin = real
        self.assertFalse(be.captured)
        be.phase()  # later phases capture nothing
        self.assertIsNone(be.phase_graph)
        g = be.constructed()["graph"]
        self.assertEqual(g["replays_new"], 0)
        self.assertIn("operation not permitted", g["capture_error"])

    def test_torch_without_keep_graph(self):
        class Old(fake_torch.CUDAGraph):
            def __init__(self):
                super().__init__()
        sys.modules["torch"].cuda.CUDAGraph = Old
        be = workload.TorchBackend(plan())
        self.assertIn("keep_graph", be.graph_api_error)
        be.phase()
        self.assertEqual((be.captured, be.phase_graph), (True, None))


class WorkloadMainTest(unittest.TestCase):
    """workload.py's protocol with the torch backend on fake_torch, as prove.py drives it."""

    def test_protocol(self):
        with tempfile.TemporaryDirectory() as tmp:
            os.mkdir(os.path.join(tmp, "torch"))
            with open(os.path.join(tmp, "torch", "__init__.py"), "w") as f:
                f.write("import sys\nsys.path.insert(0, %r)\nimport fake_torch\n"
                        "fake_torch.build(sys.modules[__name__])\n" % HERE)
            env = dict(os.environ, PYTHONPATH=tmp, PYTHONDONTWRITEBYTECODE="1")
            cmd = [sys.executable, os.path.join(HERE, "workload.py"), "--backend", "torch", "--trace-dir", tmp,
                   "--steps", "4", "--sync-every", "2", "--copies", "1", "--copy-elems", "16",
                   "--graph-replays", "3", "--capture-replays", "2", "--allreduces", "2", "--warmup", "1"]
            p = subprocess.run(cmd, input="run 2\nquit\n", capture_output=True, text=True, env=env, timeout=60)
            self.assertEqual(p.returncode, 0, p.stderr)
            msgs = [json.loads(line) for line in p.stdout.splitlines()]
            self.assertEqual([m["event"] for m in msgs], ["ready", "ran", "bye"], p.stderr)
            ready, ran = msgs[0], msgs[1]
            self.assertEqual(ready["nondeterministic"], [])
            gt = ready["ground_truth"]
            self.assertEqual((gt["graph_launches"]["new"], gt["launches"]["captured"]), (2, 5))
            # no libcudart.so in this process: the graph API is unavailable and says why
            self.assertIsNone(gt["graph_api"])
            self.assertEqual(gt["graph_api_error"], "this process maps no libcudart.so")
            self.assertEqual((len(ran["seconds"]), ran["graphs"]), (2, [None, None]))
            self.assertEqual(os.listdir(tmp), ["torch"])  # the trace is removed


if __name__ == "__main__":
    unittest.main()
