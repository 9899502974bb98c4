"""Unit tests of workload.py's graph-API ground truth (GraphInspector) against a fake CUDA
runtime: what the real one returns through the same ctypes calls (python3 -m unittest
discover -s test/gpu -p '*_test.py')."""

import ctypes
import os
import sys
import unittest

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workload  # noqa: E402

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

    def test_errors_raise(self):
        rt = FakeRuntime({1: [copy(10)]}, fail={"cudaGraphMemcpyNodeGetParams": 400})
        with self.assertRaisesRegex(RuntimeError, "cudaGraphMemcpyNodeGetParams returned 400"):
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


if __name__ == "__main__":
    unittest.main()
