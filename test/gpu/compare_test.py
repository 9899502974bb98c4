"""Unit tests of compare.py (python3 -m unittest discover -s test/gpu -p '*_test.py')."""

import os
import sys
import unittest

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402

PID = 4242


def ev(cat, name, ts, corr=None, **args):
    e = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": 1, "args": dict(args)}
    if corr is not None:
        e["args"]["correlation"] = corr
    return e


TRACE = {"traceEvents": [
    ev("cuda_runtime", "cudaDeviceSynchronize", 5),  # before the window
    ev("user_annotation", compare.PHASE_MARK, 10) | {"dur": 100},
    ev("cuda_runtime", "cudaLaunchKernel", 11, 1),
    ev("cuda_runtime", "cudaLaunchKernel", 12, 2),
    ev("cuda_driver", "cuLaunchKernelEx", 13, 3),
    ev("cuda_runtime", "cudaMemcpyAsync", 14, 4),
    ev("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 500, 4, bytes=4096),  # GPU clock: by correlation
    ev("cuda_runtime", "cudaMemcpyAsync", 15, 5),
    ev("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", 501, 5, bytes=1024),
    ev("cuda_runtime", "cudaStreamSynchronize", 16, 6),
    ev("cuda_runtime", "cudaGraphLaunch", 17, 7),
    ev("cuda_runtime", "cudaStreamQuery", 18, 8),
    ev("user_annotation", "nccl:all_reduce", 19),
    ev("gpu_user_annotation", "nccl:all_reduce", 600),  # GPU-side twin: not a call
    ev("cuda_runtime", "cudaDeviceSynchronize", 20, 9),
    ev("cuda_runtime", "cudaDeviceSynchronize", 200, 10),  # the profiler's own, after the window
    ev("gpu_memcpy", "Memcpy DtoD (Device -> Device)", 700, 99, bytes=7),  # its API call outside
]}

CONSTRUCTED = {"memcpy_bytes": {"h2d": 4096, "d2h": 1024},
               "nccl_calls": {"ncclAllReduce": 1}, "nccl_bytes": {"ncclAllReduce": 400}}


def scrape(calls, launches, h2d, d2h, nccl, nccl_bytes, extra=""):
    lines = ["# TYPE profi_cuda_calls_total counter"]
    for op, n in calls.items():
        lines.append('profi_cuda_calls_total{operation="%s",pid="%d",stream="default"} %d' % (op, PID, n))
    lines.append('profi_cuda_calls_total{operation="cudaLaunchKernel",pid="1",stream="default"} 99')  # other pid
    lines.append('profi_cuda_kernel_launches_total{kernel="anonymous",pid="%d",phase=""} %d' % (PID, launches))
    lines.append('profi_cuda_memcpy_bytes_total{direction="h2d",pid="%d",stream="0x10"} %d' % (PID, h2d))
    lines.append('profi_cuda_memcpy_bytes_total{direction="d2h",pid="%d",stream="0x10"} %d' % (PID, d2h))
    lines.append('profi_nccl_calls_total{operation="ncclAllReduce",pid="%d",comm="py\\"x"} %d' % (PID, nccl))
    lines.append('profi_nccl_bytes_total{operation="ncclAllReduce",pid="%d"} %d' % (PID, nccl_bytes))
    lines.append('profi_system_bpf_map_drops_total{map="aggregated"} 0')
    return "\n".join(lines) + "\n" + extra


class GroundTruthTest(unittest.TestCase):
    def test_window_correlation_and_names(self):
        gt = compare.ground_truth_from_trace(TRACE)
        self.assertEqual(gt["api_calls"], {
            "cudaLaunchKernel": 2, "cuLaunchKernelEx": 1, "cudaMemcpyAsync": 2, "cudaStreamSynchronize": 1,
            "cudaGraphLaunch": 1, "cudaStreamQuery": 1, "cudaDeviceSynchronize": 1})
        self.assertEqual(gt["memcpy_bytes"], {"h2d": 4096, "d2h": 1024})
        self.assertEqual(gt["nccl_calls"], {"ncclAllReduce": 1})

    def test_nccl_from_record_param_comms(self):
        events = [e for e in TRACE["traceEvents"] if e["name"] != "nccl:all_reduce"]
        events.append(ev("cpu_op", "record_param_comms", 19, **{"Collective name": "allreduce"}))
        events.append(ev("cpu_op", "record_param_comms", 300, **{"Collective name": "allreduce"}))  # outside
        gt = compare.ground_truth_from_trace({"traceEvents": events})
        self.assertEqual((gt["nccl_calls"], gt["nccl_source"]), ({"ncclAllReduce": 1}, "record_param_comms"))

    def test_needs_one_window(self):
        with self.assertRaises(ValueError):
            compare.ground_truth_from_trace({"traceEvents": []})

    def test_session_of_several_phases(self):
        # two phases in one profiler session: each range on its own, in time order
        later = [dict(e, ts=e["ts"] + 1000) for e in TRACE["traceEvents"]
                 if e["ts"] < 200 or e["cat"] != "cuda_runtime"]
        later = [dict(e, args=dict(e["args"], correlation=e["args"]["correlation"] + 50))
                 if "correlation" in e["args"] else e for e in later]
        later.append(ev("cuda_runtime", "cudaLaunchKernel", 1050, 500))
        trace = {"traceEvents": later + TRACE["traceEvents"]}
        with self.assertRaises(ValueError):
            compare.ground_truth_from_trace(trace)
        first, second = (compare.ground_truth_from_trace(trace, index=k) for k in (0, 1))
        self.assertEqual(first, compare.ground_truth_from_trace(TRACE))
        self.assertEqual(second["api_calls"]["cudaLaunchKernel"], 3)
        self.assertEqual(second["memcpy_bytes"], {"h2d": 4096, "d2h": 1024})
        with self.assertRaises(ValueError):
            compare.ground_truth_from_trace(trace, index=2)

    def test_determinism(self):
        gt = compare.ground_truth_from_trace(TRACE)
        other = dict(gt, api_calls=dict(gt["api_calls"], cudaLaunchKernel=3))
        self.assertEqual(compare.same_ground_truth(gt, gt), [])
        self.assertEqual(len(compare.same_ground_truth(gt, other)), 1)
        # Calls profi never probes predict nothing it counts (H200: PyTorch's first capture
        # of a profiler session adds cudaEventQuery and cudaThreadExchangeStreamCaptureMode).
        unprobed = dict(gt, api_calls=dict(gt["api_calls"], cudaEventQuery=60, cudaThreadExchangeStreamCaptureMode=40))
        self.assertEqual(compare.same_ground_truth(gt, unprobed), [])


class PrometheusTest(unittest.TestCase):
    def test_parse_and_delta(self):
        before = compare.parse_prometheus('a_total{x="1"} 3\nb 1e3\n')
        after = compare.parse_prometheus('a_total{x="1"} 5\nb 1000\nc{y="q\\"\\\\"} 2 1700000000\n')
        self.assertEqual(compare.delta(before, after), {("a_total", (("x", "1"),)): 2.0,
                                                        ("c", (("y", 'q"\\'),)): 2.0})

    def test_bad_line(self):
        with self.assertRaises(ValueError):
            compare.parse_prometheus("what is this\n")


def rows_by_what(rows):
    return {r["what"]: r for r in rows}


class CompareTest(unittest.TestCase):
    reps = 3

    def observed(self, calls, launches=None, h2d=None, d2h=None, nccl=3, nccl_bytes=1200, extra=""):
        before = compare.parse_prometheus(scrape({op: 1 for op in calls}, 1, 1, 1, 1, 1))  # before attach
        after = compare.parse_prometheus(scrape(
            {op: n + 1 for op, n in calls.items()},
            1 + (launches if launches is not None else 9), 1 + (h2d if h2d is not None else 3 * 4096),
            1 + (d2h if d2h is not None else 3 * 1024), 1 + nccl, 1 + nccl_bytes, extra))
        return compare.observe(compare.delta(before, after), PID)

    def exact_calls(self):
        return {"cudaLaunchKernel": 6, "cuLaunchKernelEx": 3, "cudaMemcpyAsync": 6, "cudaStreamSync": 3,
                "cudaGraphLaunch": 3, "cudaDeviceSynchronize": 3}

    def run_compare(self, obs, mode="anonymous", profile="full"):
        gt = compare.ground_truth_from_trace(TRACE)
        rows = compare.compare(gt, CONSTRUCTED, self.reps, obs, mode, profile)
        return rows_by_what(rows), compare.verdict({mode: {"rows": rows}})

    def test_exact(self):
        rows, (v, bad) = self.run_compare(self.observed(self.exact_calls()))
        self.assertEqual((v, bad), ("pass", []))
        self.assertEqual(rows["BPF map drops, all maps"]["observed"], 0)
        self.assertEqual(rows["cudaLaunchKernel"]["expected"], 6)
        self.assertEqual(rows["cudaStreamSync"]["expected"], 3)  # CUPTI's cudaStreamSynchronize
        self.assertEqual(rows[compare.DIRECT_LAUNCHES]["observed"], 9)
        self.assertEqual(rows["memcpy bytes h2d"]["expected"], 3 * 4096)
        self.assertEqual(rows["ncclAllReduce bytes"]["expected"], 1200)
        self.assertEqual(rows["calls profi does not probe"]["note"], "cudaStreamQuery 3")

    def test_missing_call_fails(self):
        calls = self.exact_calls()
        calls["cudaGraphLaunch"] = 2
        rows, (v, bad) = self.run_compare(self.observed(calls))
        self.assertEqual(v, "fail")
        self.assertEqual(rows["cudaGraphLaunch"]["status"], "mismatch")

    def test_launch_split_explained_only_when_total_matches(self):
        calls = self.exact_calls()
        calls["cudaLaunchKernel"], calls["cuLaunchKernel"] = 4, 2  # static runtime launches via libcuda
        rows, (v, _) = self.run_compare(self.observed(calls))
        self.assertEqual(v, "pass")
        self.assertEqual(rows["cudaLaunchKernel"]["status"], "explained")
        self.assertEqual(rows["cuLaunchKernel"]["status"], "explained")
        rows, (v, _) = self.run_compare(self.observed(calls, launches=8))
        self.assertEqual(v, "fail")
        self.assertEqual(rows["cudaLaunchKernel"]["status"], "mismatch")

    def test_default_kind_explained(self):
        extra = 'profi_cuda_memcpy_bytes_total{direction="default",pid="%d",stream="0x10"} %d\n' % (PID, 1024)
        before_extra = 'profi_cuda_memcpy_bytes_total{direction="default",pid="%d",stream="0x10"} 0\n' % PID
        before = compare.parse_prometheus(scrape({op: 0 for op in self.exact_calls()}, 0, 0, 0, 0, 0, before_extra))
        after = compare.parse_prometheus(scrape(self.exact_calls(), 9, 3 * 4096, 2 * 1024, 3, 1200, extra))
        rows, (v, _) = self.run_compare(compare.observe(compare.delta(before, after), PID))
        self.assertEqual(v, "pass")
        self.assertEqual(rows["memcpy bytes d2h"]["status"], "explained")

    def test_blind_and_unprobed(self):
        calls = self.exact_calls()
        calls["cudaSetDevice"] = 7
        rows, (v, _) = self.run_compare(self.observed(calls), profile="lean")
        self.assertEqual(rows["cudaSetDevice"]["status"], "no_ground_truth")
        # lean profile: synchronize calls are not probed; profi must then show none
        self.assertEqual(rows["cudaDeviceSynchronize"]["status"], "mismatch")
        del calls["cudaDeviceSynchronize"], calls["cudaStreamSync"]
        rows, (v, bad) = self.run_compare(self.observed(calls), profile="lean")
        self.assertEqual((v, bad), ("pass", []))
        self.assertEqual(rows["cudaDeviceSynchronize"]["status"], "info")

    def test_drops_fail(self):
        extra = 'profi_system_bpf_map_drops_total{map="launch_agg"} 2\n'
        rows, (v, _) = self.run_compare(self.observed(self.exact_calls(), extra=extra))
        self.assertEqual(v, "fail")
        self.assertEqual(rows["BPF map drops, all maps"]["status"], "mismatch")
        self.assertEqual(rows["BPF map drops, all maps"]["note"], "bpf_map_drops{map=launch_agg} 2")
        extra = "profi_system_launch_agg_drops_total 1\n"
        rows, (v, _) = self.run_compare(self.observed(self.exact_calls(), extra=extra))
        self.assertEqual(rows["system launch agg drops"]["observed"], 1)
        self.assertEqual(v, "fail")

    def test_nccl_cross_check(self):
        gt = compare.ground_truth_from_trace(TRACE)
        constructed = dict(CONSTRUCTED, nccl_calls={"ncclAllReduce": 2})
        rows = compare.compare(gt, constructed, self.reps, self.observed(self.exact_calls()), "full", "full")
        rows = rows_by_what(rows)
        self.assertEqual(rows["ncclAllReduce (profiler vs workload)"]["status"], "mismatch")
        self.assertEqual((rows["kernel names"]["observed"], rows["kernel names"]["note"]),
                         (1, "distinct kernel labels; 0 launches still unknown_..."))


def cev(cat, name, ts, corr=None, tid=1, **args):
    e = ev(cat, name, ts, corr, **args)
    e["tid"] = tid
    return e


def graph_trace(replays=2, unknown_replays=3, kernels=3, copy=1024, launch_name="cudaLaunchKernel_v7000"):
    """One phase as torch.profiler records it: a direct launch, the start-up graph's replays
    (no GPU activity: captured before profiling), then a capture on thread 1 (launches on the
    capturing stream and a forked one, a copy, event fork/join) while thread 2 launches
    outside it, instantiation, replays (their kernels and copy tied to each cudaGraphLaunch)
    and reset."""
    t = [cev("user_annotation", compare.PHASE_MARK, 10) | {"dur": 900},
         cev("cuda_runtime", launch_name, 11, 1, cbid=211),
         cev("kernel", "k_direct", 500, 1),
         # CUDA 13's __cudaLaunchKernel, a name CUPTI's table may not have: known by its kernel
         cev("cuda_runtime", "INVALID", 12, 2, cbid=999),
         cev("kernel", "k_direct13", 501, 2),
         cev("user_annotation", compare.GRAPH_UNKNOWN_MARK, 20) | {"dur": 20}]
    corr = 100
    for i in range(unknown_replays):
        corr += 1
        t.append(cev("cuda_runtime", "cudaGraphLaunch", 21 + i, corr))
    t += [cev("user_annotation", compare.GRAPH_NEW_MARK, 50) | {"dur": 400},
          cev("cuda_runtime", "cudaStreamBeginCapture", 51, 200),
          cev("cuda_runtime", launch_name, 52, 201, cbid=211),
          cev("cuda_runtime", "cudaEventRecord", 53, 202),
          cev("cuda_runtime", "cudaStreamWaitEvent", 54, 203),
          cev("cuda_runtime", "INVALID", 55, 204, cbid=999),      # the same callback: a launch
          cev("cuda_runtime", "cudaMemcpyAsync", 56, 205),        # recorded: no GPU activity
          cev("cuda_runtime", launch_name, 57, 206, tid=2, cbid=211),  # another thread: not captured
          cev("kernel", "k_other_thread", 600, 206),
          cev("cuda_driver", "cuLaunchKernelEx", 58, 207),
          cev("cuda_runtime", "cudaStreamEndCapture", 60, 208),
          cev("cuda_runtime", "cudaGraphInstantiateWithFlags", 61, 209)]
    for i in range(replays):
        c = 300 + i
        t.append(cev("cuda_runtime", "cudaGraphLaunch", 70 + i, c))
        t += [cev("kernel", "k%d" % j, 700 + i, c) for j in range(kernels)]
        t.append(cev("gpu_memcpy", "Memcpy DtoD (Device -> Device)", 710 + i, c, bytes=copy))
    t += [cev("cuda_runtime", "cudaGraphDestroy", 90, 400), cev("cuda_runtime", "cudaGraphExecDestroy", 91, 401)]
    return {"traceEvents": t}


def graph_api(kernels=3, copy=1024):
    return {"source": "graph API, libcudart.so.13", "nodes": kernels + 1, "kernel_nodes": kernels,
            "memcpy_nodes": 1, "memcpy_bytes": {"d2d": copy}, "memcpy_kinds": {"3": 1}, "memset_nodes": 0,
            "memset_bytes": 0, "other_nodes": {}}


def graph_gt(**kw):
    gt = compare.ground_truth_from_trace(graph_trace(**kw))
    gt["graph_api"] = graph_api()
    gt["graph_api_error"] = None
    return gt


GRAPH_CONSTRUCTED = {"memcpy_bytes": {}, "nccl_calls": {}, "nccl_bytes": {},
                     "graph": {"replays_new": 2, "replays_unknown": 3, "capture_memcpy_bytes": {"d2d": 1024}}}


def graph_scrape(launches, captured, graph_kernels, d2d, calls):
    lines = ['profi_cuda_calls_total{operation="%s",pid="%d",stream="s"} %d' % (op, PID, n) for op, n in calls.items()]
    lines.append('profi_cuda_kernel_launches_total{kernel="anonymous",pid="%d",phase=""} %d' % (PID, launches))
    lines.append('profi_cuda_graph_captured_launches_total{kernel="anonymous",pid="%d",phase=""} %d' % (PID, captured))
    lines.append('profi_cuda_graph_kernel_launches_total{kernel="anonymous",pid="%d",phase=""} %d'
                 % (PID, graph_kernels))
    lines.append('profi_cuda_graph_kernel_launches_total{kernel="anonymous",pid="1",phase=""} 77')  # other pid
    lines.append('profi_cuda_memcpy_bytes_total{direction="d2d",pid="%d",stream="s"} %d' % (PID, d2d))
    return compare.observe(compare.delta({}, compare.parse_prometheus("\n".join(lines) + "\n")), PID)


def status(replays, unknown, pid=PID, extra=()):
    procs = [{"pid": pid, "gpu": "0", "graphs": {"graphs": 4, "execs": 1, "replays": replays,
                                                 "unknown_replays": unknown, "graph_kernel_share": 0.5}}]
    procs += [{"pid": pid, "gpu": "1"}] + list(extra)  # the process's second GPU: no graphs object
    return {"processes": procs}


class GraphTruthTest(unittest.TestCase):
    def test_capture_window_and_launch_classes(self):
        gt = compare.ground_truth_from_trace(graph_trace())
        # direct: the runtime launch, the unnamed CUDA 13 one, the other thread's during the capture
        self.assertEqual(gt["launches"]["direct"], 3)
        self.assertEqual(gt["launches"]["captured"], 3)
        self.assertEqual(gt["launches"]["captured_by_api"],
                         {"cudaLaunchKernel": 1, "INVALID": 1, "cuLaunchKernelEx": 1})
        self.assertEqual(gt["launches"]["named_by_correlation"], ["INVALID"])
        self.assertEqual((gt["captures"], gt["captures_unclosed"]), (1, 0))
        self.assertEqual(gt["api_calls"]["cudaLaunchKernel"], 3)  # CUPTI's _v7000 dropped
        self.assertEqual(gt["graph_launches"], {"new": 2, "unknown": 3, "other": 0})
        self.assertEqual(gt["graph_kernels"], {"new": 6, "unknown": 0, "other": 0})
        self.assertEqual(gt["graph_memcpy_bytes"]["new"], {"d2d": 2048})
        self.assertEqual(gt["memcpy_bytes"], {})  # replayed copies are not the phase's own

    def test_unclosed_capture_runs_to_window_end(self):
        t = graph_trace()
        t["traceEvents"] = [e for e in t["traceEvents"] if e["name"] != "cudaStreamEndCapture"]
        gt = compare.ground_truth_from_trace(t)
        self.assertEqual((gt["captures"], gt["captures_unclosed"]), (1, 1))
        self.assertEqual(gt["launches"]["captured"], 3)

    def test_known_name_never_learned(self):
        # a copy's correlation id on a kernel activity does not make cudaMemcpyAsync a launch
        t = graph_trace()
        t["traceEvents"].append(cev("kernel", "weird", 999, 205))
        gt = compare.ground_truth_from_trace(t)
        self.assertEqual(gt["launches"]["captured"], 3)

    def test_determinism_covers_graphs(self):
        a, b = graph_gt(), graph_gt()
        self.assertEqual(compare.same_ground_truth(a, b), [])
        b["graph_api"] = dict(b["graph_api"], kernel_nodes=4)
        self.assertEqual(compare.same_ground_truth(a, b), ["graph_api[kernel_nodes]: 3 vs 4"])
        c = graph_gt(replays=3)
        self.assertIn("graph_launches[new]: 2 vs 3", compare.same_ground_truth(a, c))

    def test_probes_md(self):
        ops = compare._ops_from_probes_md(compare.PROBES_MD)
        self.assertEqual(ops["cudaStreamSync"], ("full", "timed"))
        self.assertEqual(ops["__cudaLaunchKernel"], ("lean", "launch"))
        self.assertEqual(ops["cuModuleGetFunction"], ("lean", "name"))
        self.assertEqual(ops["cudaStreamBeginCapture"], ("lean", "timed"))
        self.assertNotIn("ncclAllReduce", ops)
        self.assertEqual(compare.CUDA_OPS, ops)


class GraphStatusTest(unittest.TestCase):
    def test_status(self):
        self.assertIsNone(compare.graph_status({"processes": [{"pid": PID}]}, PID))
        self.assertIsNone(compare.graph_status(None, PID))
        self.assertEqual(compare.graph_status(status(5, 2, extra=[{"pid": 9, "graphs": {"replays": 100}}]), PID),
                         {"replays": 5, "unknown_replays": 2, "graphs": 4, "execs": 1})

    def test_delta(self):
        self.assertIsNone(compare.graph_status_delta(status(1, 1), {"processes": [{"pid": PID}]}, PID))
        # no graphs object before: nothing replayed yet
        d = compare.graph_status_delta({"processes": [{"pid": PID}]}, status(5, 2), PID)
        self.assertEqual((d["replays"], d["unknown_replays"]), (5, 2))
        d = compare.graph_status_delta(status(5, 2), status(15, 8), PID)
        self.assertEqual((d["replays"], d["unknown_replays"]), (10, 6))


class GraphCompareTest(unittest.TestCase):
    reps = 2

    def exact(self, **over):
        k = dict(launches=self.reps * 3, captured=self.reps * 3, graph_kernels=self.reps * 2 * 3,
                 d2d=self.reps * 2 * 1024,
                 calls={"cudaLaunchKernel": self.reps * 3, "cuLaunchKernelEx": self.reps, "__cudaLaunchKernel": self.reps * 2,
                        "cudaGraphLaunch": self.reps * 5, "cudaStreamBeginCapture": self.reps,
                        "cudaStreamEndCapture": self.reps, "cudaEventRecord": self.reps,
                        "cudaStreamWaitEvent": self.reps, "cudaMemcpyAsync": self.reps,
                        "cudaGraphInstantiateWithFlags": self.reps, "cudaGraphDestroy": self.reps,
                        "cudaGraphExecDestroy": self.reps})
        k.update(over)
        return graph_scrape(**k)

    def run_compare(self, obs, gt=None, graphs="exact", mode="anonymous", constructed=None, phase_graphs=None):
        gt = gt or graph_gt()
        if graphs == "exact":
            graphs = {"replays": self.reps * 5, "unknown_replays": self.reps * 3, "graphs": 2, "execs": 0}
        rows = compare.compare(gt, constructed or GRAPH_CONSTRUCTED, self.reps, obs, mode, "full",
                               graphs=graphs, phase_graphs=phase_graphs)
        return rows_by_what(rows), compare.verdict({mode: {"rows": rows}})

    def test_exact(self):
        rows, (v, bad) = self.run_compare(self.exact())
        self.assertEqual((v, bad), ("pass", []))
        self.assertEqual(rows[compare.DIRECT_LAUNCHES]["expected"], 6)
        self.assertEqual(rows[compare.CAPTURED_LAUNCHES]["expected"], 6)
        self.assertEqual(rows[compare.GRAPH_KERNELS]["expected"], 12)
        self.assertIn("x its replays (2 a phase)", rows[compare.GRAPH_KERNELS]["note"])
        self.assertEqual(rows["memcpy bytes d2d"]["expected"], 4096)
        self.assertEqual(rows[compare.GRAPH_REPLAYS]["expected"], 10)
        self.assertEqual(rows[compare.UNKNOWN_REPLAYS]["expected"], 6)
        # the API split: CUPTI's INVALID is profi's __cudaLaunchKernel
        self.assertEqual(rows["cudaLaunchKernel"]["status"], "match")
        self.assertEqual(rows["__cudaLaunchKernel"]["status"], "explained")
        self.assertIn("INVALID 4 (launch calls, known by the kernels they ran)",
                      rows["calls profi does not probe"]["note"])
        cross = [r for r in rows.values() if r["series"] == "ground truth cross-check"]
        self.assertEqual(len(cross), 4)
        self.assertTrue(all(r["status"] == "match" for r in cross), cross)

    def test_each_graph_count_fails_alone(self):
        for field, value, what in (("captured", 5, compare.CAPTURED_LAUNCHES),
                                   ("graph_kernels", 11, compare.GRAPH_KERNELS),
                                   ("launches", 7, compare.DIRECT_LAUNCHES),
                                   ("d2d", 2048, "memcpy bytes d2d")):
            rows, (v, _) = self.run_compare(self.exact(**{field: value}))
            self.assertEqual((v, rows[what]["status"]), ("fail", "mismatch"), what)
        rows, (v, _) = self.run_compare(self.exact(), graphs={"replays": 10, "unknown_replays": 5})
        self.assertEqual((v, rows[compare.UNKNOWN_REPLAYS]["status"]), ("fail", "mismatch"))

    def test_unknown_replays_kernels_not_expected(self):
        # counting the start-up graph's replays as graph kernels is a mismatch: profi cannot know them
        rows, (v, _) = self.run_compare(self.exact(graph_kernels=12 + 6 * 3))
        self.assertEqual(v, "fail")

    def test_status_without_graphs(self):
        rows, (v, bad) = self.run_compare(self.exact(), graphs=None)
        self.assertEqual((v, bad), ("pass", []))
        for what in (compare.GRAPH_REPLAYS, compare.UNKNOWN_REPLAYS):
            self.assertEqual((rows[what]["status"], rows[what]["observed"]), ("no_ground_truth", None))
        self.assertEqual(rows[compare.UNKNOWN_REPLAYS]["expected"], 6)

    def test_graph_api_unavailable(self):
        gt = graph_gt()
        gt["graph_api"], gt["graph_api_error"] = None, "torch.cuda.CUDAGraph has no raw_cuda_graph()"
        rows, (v, bad) = self.run_compare(self.exact(), gt=gt)
        self.assertEqual((v, bad), ("pass", []))
        self.assertIn("graph API unavailable", rows[compare.GRAPH_KERNELS]["note"])
        self.assertIn("graph API unavailable", rows["memcpy bytes d2d"]["note"])
        self.assertEqual(rows["graph API"]["status"], "info")

    def test_graph_api_error_in_summary(self):
        gt = graph_gt()
        gt["graph_api"] = {"source": "graph API", "kernel_nodes": None, "error": "RuntimeError: x"}
        rows, (v, _) = self.run_compare(self.exact(), gt=gt)
        self.assertEqual(v, "pass")
        self.assertIn("RuntimeError: x", rows["graph API"]["note"])

    def test_graph_api_without_bytes(self):
        gt = graph_gt()
        gt["graph_api"] = dict(graph_api(), memcpy_bytes=None, memset_bytes=None,
                               param_errors=["cudaGraphMemcpyNodeGetParams returned 1"])
        rows, (v, bad) = self.run_compare(self.exact(), gt=gt)
        self.assertEqual((v, bad), ("pass", []))
        self.assertIn("graph API, libcudart.so.13", rows[compare.GRAPH_KERNELS]["note"])
        self.assertIn("the workload's copies in the capture", rows["memcpy bytes d2d"]["note"])
        self.assertIn("bytes not read (cudaGraphMemcpyNodeGetParams returned 1)", rows["graph API"]["note"])

    def test_cross_checks(self):
        gt = graph_gt()
        gt["graph_api"] = graph_api(kernels=4)  # the graph says 4 kernels, the profiler saw 3 calls
        rows, (v, _) = self.run_compare(self.exact(graph_kernels=16), gt=gt)
        self.assertEqual(v, "fail")
        self.assertEqual(rows["graph kernel nodes (graph API) vs launch calls captured (profiler)"]["status"],
                         "mismatch")
        # a profiler that records no kernel of the replays: info, not a failure
        t = graph_trace()
        t["traceEvents"] = [e for e in t["traceEvents"] if not (e["cat"] == "kernel" and e["name"].startswith("k") and
                                                                e["name"][1:].isdigit())]
        gt = compare.ground_truth_from_trace(t)
        gt["graph_api"] = graph_api()
        rows, (v, bad) = self.run_compare(self.exact(), gt=gt)
        self.assertEqual((v, bad), ("pass", []))
        r = rows["graph replay kernels: kernel nodes x replays vs GPU kernels of the replays (profiler)"]
        self.assertEqual(r["status"], "info")
        cons = dict(GRAPH_CONSTRUCTED, graph=dict(GRAPH_CONSTRUCTED["graph"], replays_new=3))
        rows, (v, _) = self.run_compare(self.exact(), constructed=cons)
        self.assertEqual(rows["graph launches of the new graph (profiler vs workload)"]["status"], "mismatch")

    def test_phase_graphs(self):
        rows, (v, _) = self.run_compare(self.exact(), phase_graphs=[graph_api(), graph_api()])
        self.assertEqual(v, "pass")
        rows, (v, _) = self.run_compare(self.exact(), phase_graphs=[graph_api(), graph_api(kernels=2)])
        r = rows["graphs captured by the attached phases, same as the profiled one's (graph API)"]
        self.assertEqual((v, r["expected"], r["observed"]), ("fail", 2, 1))

    def test_capture_error(self):
        cons = dict(GRAPH_CONSTRUCTED, graph=dict(GRAPH_CONSTRUCTED["graph"], capture_error="RuntimeError: no"))
        rows, (v, _) = self.run_compare(self.exact(), constructed=cons)
        self.assertEqual((v, rows["graph capture (workload)"]["status"]), ("fail", "mismatch"))

    def test_kernel_mode_off(self):
        rows, _ = self.run_compare(self.exact(), mode="off")
        self.assertNotIn(compare.CAPTURED_LAUNCHES, rows)
        self.assertNotIn(compare.GRAPH_KERNELS, rows)
        self.assertEqual(rows[compare.UNKNOWN_REPLAYS]["status"], "match")

    def test_event_split_explained(self):
        # NCCL's static runtime records events through libcuda's exported cuEventRecord
        obs = self.exact()
        obs["calls"]["cudaEventRecord"] = 1
        obs["calls"]["cuEventRecord"] = 1
        rows, (v, bad) = self.run_compare(obs)
        self.assertEqual((v, bad), ("pass", []))
        self.assertEqual((rows["cudaEventRecord"]["status"], rows["cuEventRecord"]["status"]),
                         ("explained", "explained"))
        obs["calls"]["cuEventRecord"] = 2
        rows, (v, _) = self.run_compare(obs)
        self.assertEqual((v, rows["cudaEventRecord"]["status"]), ("fail", "mismatch"))

    def test_api_groups(self):
        for op, g in (("cudaStreamBeginCapture_ptsz", "capture begin"), ("cuStreamBeginCapture_v2", "capture begin"),
                      ("cudaGraphInstantiateWithFlags", "graph instantiate"), ("cuGraphLaunch", "graph launch"),
                      ("__cudaLaunchKernel", "launch"), ("cuMemcpyDtoDAsync_v2", "memcpy"),
                      ("cudaMallocHost", "cudaMallocHost"), ("cuMemAlloc_v2", "alloc"), ("cudaFree", "free")):
            self.assertEqual(compare.api_group(op), g, op)


class OverheadTest(unittest.TestCase):
    def test_ratio(self):
        o = compare.overhead([1.0, 1.2, 1.1], [1.3, 1.32, 1.31])
        self.assertAlmostEqual(o["ratio"], 1.31 / 1.1)
        self.assertIsNone(compare.overhead([], [1.0]))


class RenderTest(unittest.TestCase):
    def test_markdown(self):
        res = {"machine": {"gpu": "H200"}, "verdict": "pass", "failures": [],
               "modes": {"full": {"kernel_mode": "full", "probe_profile": "full", "reps": 3,
                                  "rows": [compare._row("x", "s", 1, 1)]}},
               "overhead": {"full": compare.overhead([1.0], [1.5])}}
        md = compare.render_markdown(res)
        self.assertIn("| x | `s` | 1 | 1 | match |  |", md)
        self.assertIn("| full | 1.0000 s (1) | 1.5000 s (1) | 1.5 |", md)


if __name__ == "__main__":
    unittest.main()
