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
    ev("cuda_runtime", "cudaEventRecord", 18, 8),
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
            "cudaGraphLaunch": 1, "cudaEventRecord": 1, "cudaDeviceSynchronize": 1})
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

    def test_determinism(self):
        gt = compare.ground_truth_from_trace(TRACE)
        other = dict(gt, api_calls=dict(gt["api_calls"], cudaLaunchKernel=3))
        self.assertEqual(compare.same_ground_truth(gt, gt), [])
        self.assertEqual(len(compare.same_ground_truth(gt, other)), 1)


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
        self.assertEqual(rows["kernel launches, all APIs"]["observed"], 9)
        self.assertEqual(rows["memcpy bytes h2d"]["expected"], 3 * 4096)
        self.assertEqual(rows["ncclAllReduce bytes"]["expected"], 1200)
        self.assertEqual(rows["calls profi does not probe"]["note"], "cudaEventRecord 3")

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
