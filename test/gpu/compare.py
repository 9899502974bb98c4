#!/usr/bin/env python3
"""Compare logic of the real-GPU proof (test/gpu/prove.sh); standard library only.

Three inputs meet here:
- the workload's ground truth for ONE measured phase, taken from a torch.profiler
  (Kineto/CUPTI) chrome trace of an identical phase (`ground_truth_from_trace`);
- profi's /metrics before and after `reps` unprofiled phases (`parse_prometheus`,
  `delta`, `observe`: counters are cumulative, so calls made before the first scrape,
  attach included, drop out);
- the probe table of profi (`CUDA_OPS`, `NCCL_OPS`, from README.md's trap table).

`compare` turns them into rows (expected = reps x per-phase ground truth, observed =
profi's delta) with a status each: match, explained (a rule below checked the
difference against the data), no_ground_truth (torch.profiler cannot see the call),
info, or mismatch. Any mismatch fails the proof.

Run as a program, it re-renders the markdown of a results.json: compare.py results.json
"""

import json
import re
import statistics
import sys

# Operation labels of profi (internal/bpfobj/ops.go) that torch.profiler names differently:
# CUPTI names the C function, profi keeps the Rust exporter's historical labels.
PROFILER_TO_PROFI = {
    "cudaStreamSynchronize": "cudaStreamSync",
    "cudaEventSynchronize": "cudaEventSync",
}

# profi's CUDA probes: operation label -> (probe profile, kind). kind: "timed" (entry and
# return in every kernel mode), "launch" (probed in anonymous and full mode) or "name"
# (a kernel-name source, probed in full mode only). README.md's trap table.
CUDA_OPS = {}
for _op in ("cudaMalloc cudaFree cudaMemcpy cudaMemcpyAsync cudaMallocAsync cudaFreeAsync "
            "cudaGraphLaunch cudaGraphInstantiate cudaMemcpyAsync_ptsz cudaMemcpyPeer "
            "cudaMemcpyPeerAsync cudaMemcpy2D cudaMemcpy2DAsync cudaMallocManaged cudaSetDevice "
            "cudaMemcpy_ptds cudaMemcpy2D_ptds cudaMemcpy2DAsync_ptsz cudaGraphLaunch_ptsz "
            "cudaMallocAsync_ptsz cudaFreeAsync_ptsz cuGraphLaunch cuModuleLoadData").split():
    CUDA_OPS[_op] = ("lean", "timed")
for _op in ("cudaLaunchKernel cudaLaunchKernel_ptsz cudaLaunchKernelExC cudaLaunchCooperativeKernel "
            "cudaLaunchKernelExC_ptsz cudaLaunchCooperativeKernel_ptsz cuLaunchKernel "
            "cuLaunchKernel_ptsz cuLaunchKernelEx cuLaunchCooperativeKernel").split():
    CUDA_OPS[_op] = ("lean", "launch")
for _op in "cuModuleGetFunction cuLibraryGetKernel cuKernelGetFunction".split():
    CUDA_OPS[_op] = ("lean", "name")
for _op in ("cudaStreamSync cudaEventSync cudaMemset cudaMemsetAsync cudaMallocHost cudaFreeHost "
            "cudaDeviceSynchronize cudaStreamSynchronize_ptsz cudaMemset_ptds "
            "cudaMemsetAsync_ptsz").split():
    CUDA_OPS[_op] = ("full", "timed")

NCCL_OPS = ("ncclAllReduce ncclAllGather ncclReduceScatter ncclBroadcast ncclReduce ncclSend "
            "ncclRecv ncclAlltoAll ncclGroupStart ncclGroupEnd ncclCommInitRank "
            "ncclCommInitRankConfig ncclCommInitAll ncclCommDestroy ncclCommAbort").split()

# torch.profiler record_function names of ProcessGroupNCCL ("nccl:" + op) -> NCCL C function.
PROFILER_NCCL = {
    "nccl:all_reduce": "ncclAllReduce",
    "nccl:all_gather": "ncclAllGather",
    "nccl:_allgather_base": "ncclAllGather",
    "nccl:reduce_scatter": "ncclReduceScatter",
    "nccl:_reduce_scatter_base": "ncclReduceScatter",
    "nccl:broadcast": "ncclBroadcast",
    "nccl:reduce": "ncclReduce",
    "nccl:all_to_all": "ncclAlltoAll",
}

# Calls torch.profiler cannot count: Kineto drops these runtime callbacks before they reach
# the trace (isBlockListedRuntimeCbid), and NCCL calls other than the collectives have no
# record_function. profi's counts of them are shown, not compared.
PROFILER_BLIND = {
    "cudaSetDevice": "Kineto drops cudaSetDevice/cudaGetDevice callbacks (isBlockListedRuntimeCbid)",
    "ncclGroupStart": "torch.profiler records no event for NCCL group calls",
    "ncclGroupEnd": "torch.profiler records no event for NCCL group calls",
    "ncclCommInitRank": "communicator set-up is not profiled",
    "ncclCommInitRankConfig": "communicator set-up is not profiled",
    "ncclCommInitAll": "communicator set-up is not profiled",
    "ncclCommDestroy": "communicator set-up is not profiled",
    "ncclCommAbort": "communicator set-up is not profiled",
}

DIRECTIONS = ("h2h", "h2d", "d2h", "d2d", "default", "p2p", "unknown")
_MEMCPY_DIR = re.compile(r"\b(HtoH|HtoD|DtoH|DtoD|PtoP)\b")
_DIR_LABEL = {"HtoH": "h2h", "HtoD": "h2d", "DtoH": "d2h", "DtoD": "d2d", "PtoP": "p2p"}

PHASE_MARK = "profi_phase"  # record_function around the profiled phase


def probed(op, kernel_mode, probe_profile):
    """Whether profi probes (and counts) operation label op in this configuration."""
    if op in NCCL_OPS:
        return True
    info = CUDA_OPS.get(op)
    if info is None:
        return False
    profile, kind = info
    if profile == "full" and probe_profile != "full":
        return False
    if kind == "launch":
        return kernel_mode != "off"
    if kind == "name":
        return kernel_mode == "full"
    return True


# ---------------------------------------------------------------- ground truth

def ground_truth_from_trace(trace, mark=PHASE_MARK):
    """Per-phase ground truth from a chrome trace of torch.profiler (Kineto).

    Only events inside the `mark` record_function count: the profiler's own calls
    (a torch.cuda.synchronize() when it stops) fall outside. Runtime and driver API
    events (cat cuda_runtime / cuda_driver) are counted by name; GPU copies and sets
    (gpu_memcpy / gpu_memset, args.bytes) are taken when their API call (same
    args.correlation) is in the window; NCCL collectives from ProcessGroupNCCL's
    record_function names ("nccl:all_reduce"), CPU side only (not gpu_user_annotation).
    """
    events = trace.get("traceEvents", trace) if isinstance(trace, dict) else trace
    windows = [(e["ts"], e["ts"] + e.get("dur", 0)) for e in events
               if e.get("name") == mark and e.get("cat") in ("user_annotation", "cpu_op")]
    if len(windows) != 1:
        raise ValueError("trace has %d %r ranges, want 1" % (len(windows), mark))
    lo, hi = windows[0]

    def inside(e):
        return lo <= e.get("ts", -1) <= hi

    api, cats, corr = {}, {}, set()
    nccl, annotations, comms = {}, {}, {}
    for e in events:
        cat, name = e.get("cat"), e.get("name", "")
        if cat in ("cuda_runtime", "cuda_driver") and inside(e):
            api[name] = api.get(name, 0) + 1
            cats[name] = cat
            c = (e.get("args") or {}).get("correlation")
            if c is not None:
                corr.add(c)
        elif cat in ("user_annotation", "cpu_op") and inside(e) and name.startswith("nccl:"):
            annotations[name] = annotations.get(name, 0) + 1
            op = PROFILER_NCCL.get(name)
            if op:
                nccl[op] = nccl.get(op, 0) + 1
        elif cat == "cpu_op" and inside(e) and name == "record_param_comms":
            # c10d's other record of each collective, with its name in the arguments
            coll = str((e.get("args") or {}).get("Collective name", ""))
            op = PROFILER_NCCL.get("nccl:" + {"allreduce": "all_reduce"}.get(coll, coll))
            if op:
                comms[op] = comms.get(op, 0) + 1
    source = "nccl:* record_function"
    if not nccl and comms:
        nccl, source = comms, "record_param_comms"
    mc_bytes, mc_calls, ms_bytes, ms_calls = {}, {}, 0, 0
    for e in events:
        cat = e.get("cat")
        if cat not in ("gpu_memcpy", "gpu_memset"):
            continue
        args = e.get("args") or {}
        c = args.get("correlation")
        if not (c in corr if c is not None else inside(e)):
            continue
        n = int(args.get("bytes", 0))
        if cat == "gpu_memset":
            ms_bytes += n
            ms_calls += 1
            continue
        m = _MEMCPY_DIR.search(e.get("name", ""))
        d = _DIR_LABEL[m.group(1)] if m else "unknown"
        mc_bytes[d] = mc_bytes.get(d, 0) + n
        mc_calls[d] = mc_calls.get(d, 0) + 1
    return {
        "api_calls": api,
        "api_category": cats,
        "memcpy_bytes": mc_bytes,
        "memcpy_calls": mc_calls,
        "memset_bytes": ms_bytes,
        "memset_calls": ms_calls,
        "nccl_calls": nccl,
        "nccl_source": source,
        "nccl_annotations": annotations,
        "nccl_param_comms": comms,
    }


def same_ground_truth(a, b):
    """Names whose per-phase counts differ between two profiled phases (empty: deterministic)."""
    diff = []
    for field in ("api_calls", "memcpy_bytes", "memset_bytes", "nccl_calls"):
        x, y = a.get(field), b.get(field)
        if isinstance(x, dict):
            for k in sorted(set(x) | set(y or {})):
                if x.get(k, 0) != (y or {}).get(k, 0):
                    diff.append("%s[%s]: %s vs %s" % (field, k, x.get(k, 0), (y or {}).get(k, 0)))
        elif x != y:
            diff.append("%s: %s vs %s" % (field, x, y))
    return diff


# ---------------------------------------------------------------- profi's side

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?$')
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?')


def _unescape(v):
    return re.sub(r'\\(.)', lambda m: "\n" if m.group(1) == "n" else m.group(1), v)


def parse_prometheus(text):
    """Prometheus text exposition -> {(name, ((label, value), ...)): value}."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            raise ValueError("unparsable metrics line: %r" % line)
        labels, rest = [], m.group(3) or ""
        pos = 0
        while pos < len(rest):
            lm = _LABEL.match(rest, pos)
            if not lm:
                raise ValueError("unparsable labels: %r" % line)
            labels.append((lm.group(1), _unescape(lm.group(2))))
            pos = lm.end()
        out[(m.group(1), tuple(sorted(labels)))] = float(m.group(4))
    return out


def delta(before, after):
    """after - before per series; a series absent before counts from 0."""
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0) != 0}


def _num(v):
    return int(v) if float(v).is_integer() else v


def observe(series, pid):
    """profi's counts for one process (pid) from a delta of parse_prometheus outputs."""
    pid = str(pid)
    o = {"calls": {}, "errors": {}, "launches": 0, "kernels": {}, "memcpy_bytes": {},
         "memset_bytes": 0, "nccl_calls": {}, "nccl_bytes": {}, "drops": {}, "misses": {}}

    def add(d, k, v):
        d[k] = _num(d.get(k, 0) + v)

    for (name, labels), v in sorted(series.items()):
        lab = dict(labels)
        if name == "profi_system_bpf_map_drops_total":
            add(o["drops"], "bpf_map_drops{map=%s}" % lab.get("map", ""), v)
        elif name in ("profi_system_launch_agg_drops_total", "profi_cardinality_limit_drops_total",
                      "profi_dropped_events_total"):
            add(o["drops"], name[len("profi_"):-len("_total")], v)
        elif name == "profi_system_bpf_probe_misses_total":
            add(o["misses"], lab.get("reason", ""), v)
        if lab.get("pid") != pid:
            continue
        if name == "profi_cuda_calls_total":
            add(o["calls"], lab["operation"], v)
        elif name == "profi_cuda_errors_total":
            o["errors"].setdefault(lab["operation"], {})
            add(o["errors"][lab["operation"]], lab.get("error_code", ""), v)
        elif name == "profi_cuda_kernel_launches_total":
            o["launches"] = _num(o["launches"] + v)
            add(o["kernels"], lab.get("kernel", ""), v)
        elif name == "profi_cuda_memcpy_bytes_total":
            add(o["memcpy_bytes"], lab["direction"], v)
        elif name == "profi_cuda_memset_bytes_total":
            o["memset_bytes"] = _num(o["memset_bytes"] + v)
        elif name == "profi_nccl_calls_total":
            add(o["nccl_calls"], lab["operation"], v)
        elif name == "profi_nccl_bytes_total":
            add(o["nccl_bytes"], lab["operation"], v)
    return o


# ---------------------------------------------------------------- comparison

def _row(what, series, expected, observed, status=None, note=""):
    if status is None:
        status = "match" if expected == observed else "mismatch"
    return {"what": what, "series": series, "expected": expected, "observed": observed,
            "status": status, "note": note}


def compare(gt, constructed, reps, obs, kernel_mode, probe_profile):
    """Rows comparing reps phases of ground truth with profi's observation obs."""
    rows = []
    api = {}
    for name, n in gt.get("api_calls", {}).items():
        op = PROFILER_TO_PROFI.get(name, name)
        api[op] = api.get(op, 0) + n
    not_probed = sorted(op for op in api if op not in CUDA_OPS)

    # CUDA API calls, per operation.
    for op in sorted((set(api) | set(obs["calls"])) & set(CUDA_OPS)):
        series = 'profi_cuda_calls_total{operation="%s"}' % op
        exp, got = reps * api.get(op, 0), obs["calls"].get(op, 0)
        if not probed(op, kernel_mode, probe_profile):
            rows.append(_row(op, series, 0, got, "info" if got == 0 else "mismatch",
                             "not probed with --kernel-mode %s --probe-profile %s (the profiler saw %d)"
                             % (kernel_mode, probe_profile, exp)))
        elif op in PROFILER_BLIND:
            rows.append(_row(op, series, None, got, "no_ground_truth", PROFILER_BLIND[op]))
        else:
            rows.append(_row(op, series, exp, got))

    # Kernel launches from every API, each once.
    launch_ops = [op for op in CUDA_OPS if CUDA_OPS[op][1] == "launch"]
    if kernel_mode != "off":
        exp = reps * sum(api.get(op, 0) for op in launch_ops)
        rows.append(_row("kernel launches, all APIs", "profi_cuda_kernel_launches_total", exp,
                         obs["launches"], note="sum over kernel labels"))

    if kernel_mode == "full" and obs["kernels"]:
        unknown = sum(n for k, n in obs["kernels"].items() if k.startswith("unknown_"))
        rows.append(_row("kernel names", 'profi_cuda_kernel_launches_total{kernel}', None, len(obs["kernels"]),
                         "info", "distinct kernel labels; %d launches still unknown_..." % unknown))

    # Bytes copied, by direction.
    want = {d: reps * n for d, n in gt.get("memcpy_bytes", {}).items()}
    for d in DIRECTIONS:
        if want.get(d, 0) or obs["memcpy_bytes"].get(d, 0):
            rows.append(_row("memcpy bytes " + d, 'profi_cuda_memcpy_bytes_total{direction="%s"}' % d,
                             want.get(d, 0), obs["memcpy_bytes"].get(d, 0)))
    if probe_profile == "full" and (gt.get("memset_bytes") or obs["memset_bytes"]):
        rows.append(_row("memset bytes", "profi_cuda_memset_bytes_total",
                         reps * gt.get("memset_bytes", 0), obs["memset_bytes"]))

    # NCCL: calls from the profiler's collectives, bytes from the workload's tensors.
    nccl = gt.get("nccl_calls", {})
    nbytes = constructed.get("nccl_bytes", {})
    for op in sorted(set(nccl) | set(obs["nccl_calls"]) | set(constructed.get("nccl_calls", {}))):
        series = 'profi_nccl_calls_total{operation="%s"}' % op
        got = obs["nccl_calls"].get(op, 0)
        if op in PROFILER_BLIND:
            rows.append(_row(op, series, None, got, "no_ground_truth", PROFILER_BLIND[op]))
            continue
        rows.append(_row(op, series, reps * nccl.get(op, 0), got))
        made = constructed.get("nccl_calls", {}).get(op)
        if made is not None and made != nccl.get(op, 0):
            rows.append(_row(op + " (profiler vs workload)", "ground truth cross-check", made,
                             nccl.get(op, 0), "mismatch",
                             "the workload made %d calls a phase, the profiler saw %d" % (made, nccl.get(op, 0))))
        if op in nbytes or obs["nccl_bytes"].get(op):
            rows.append(_row(op + " bytes", 'profi_nccl_bytes_total{operation="%s"}' % op,
                             reps * nbytes.get(op, 0), obs["nccl_bytes"].get(op, 0),
                             note="count x datatype size, from the workload's tensors"))

    # The workload's own copies must be part of what the profiler saw.
    for d, n in sorted(constructed.get("memcpy_bytes", {}).items()):
        if n > gt.get("memcpy_bytes", {}).get(d, 0):
            rows.append(_row("memcpy bytes %s (profiler vs workload)" % d, "ground truth cross-check",
                             n, gt.get("memcpy_bytes", {}).get(d, 0), "mismatch",
                             "the profiler saw fewer bytes than the workload's own copies"))

    # Losses: every drop is a count profi did not make (absent series: none).
    maps = {k: v for k, v in obs["drops"].items() if k.startswith("bpf_map_drops")}
    rows.append(_row("BPF map drops, all maps", "profi_system_bpf_map_drops_total", 0, sum(maps.values()),
                     note=", ".join("%s %s" % (k, v) for k, v in sorted(maps.items()) if v)))
    for k in ("system_launch_agg_drops", "cardinality_limit_drops", "dropped_events"):
        rows.append(_row(k.replace("_", " "), "profi_%s_total" % k, 0, obs["drops"].get(k, 0)))

    _explain_launch_split(rows, api, obs, launch_ops)
    _explain_default_kind(rows, gt, reps, obs)
    for reason, v in sorted(obs["misses"].items()):
        rows.append(_row("probe misses " + reason, 'profi_system_bpf_probe_misses_total{reason="%s"}' % reason,
                         None, v, "info", _MISS_NOTES.get(reason, "")))
    for op, codes in sorted(obs["errors"].items()):
        rows.append(_row("errors " + op, 'profi_cuda_errors_total{operation="%s"}' % op, None,
                         sum(codes.values()), "info", "codes: " + json.dumps(codes, sort_keys=True)))
    if not_probed:
        rows.append(_row("calls profi does not probe", "-", None, None, "info",
                         ", ".join("%s %d" % (n, reps * api[n]) for n in not_probed)))
    return rows


_MISS_NOTES = {
    "runtime_to_driver": "driver launches made inside a runtime launch, counted once as the runtime launch",
    "nested": "probed calls inside another probed call on the same thread, counted once as the outer call",
    "orphan_return": "returns without an entry (attached mid-call)",
}


def _explain_launch_split(rows, api, obs, launch_ops):
    """Per-API launch counts may differ while the total matches: CUPTI names the API the
    caller used, and a library with its own statically linked runtime (cuBLAS, cuDNN,
    NCCL) enters libcuda's exported launch function, which profi counts as a driver
    launch (its return address is outside libcudart.so)."""
    total = [r for r in rows if r["what"] == "kernel launches, all APIs"]
    if not total or total[0]["status"] != "match":
        return
    bad = [r for r in rows if r["status"] == "mismatch" and r["what"] in launch_ops]
    if not bad:
        return
    for r in bad:
        r["status"] = "explained"
        r["note"] = ("launch API split differs, total launches match: launches through a statically "
                     "linked runtime (cuBLAS, NCCL) reach profi at libcuda's exported entry")


def _explain_default_kind(rows, gt, reps, obs):
    """A copy made with cudaMemcpyDefault is `direction="default"` for profi, while CUPTI
    reports the direction the driver resolved. Explained when the total matches and the
    default bytes cover exactly the directions that fall short."""
    want = {d: reps * n for d, n in gt.get("memcpy_bytes", {}).items()}
    got = obs["memcpy_bytes"]
    if sum(want.values()) != sum(got.values()) or not got.get("default"):
        return
    short = sum(want.get(d, 0) - got.get(d, 0) for d in want if want.get(d, 0) > got.get(d, 0))
    if short != got.get("default", 0) - want.get("default", 0):
        return
    for r in rows:
        if r["status"] == "mismatch" and r["what"].startswith("memcpy bytes ") and "(" not in r["what"]:
            r["status"] = "explained"
            r["note"] = "cudaMemcpyDefault copies: profi labels them default, CUPTI by resolved direction"


def overhead(off, on):
    """Wall time of the measured phase: medians of the unattached (off) and attached (on)
    phases, and their ratio."""
    if not off or not on:
        return None
    m_off, m_on = statistics.median(off), statistics.median(on)
    return {"off_median_s": m_off, "on_median_s": m_on, "ratio": m_on / m_off if m_off else None,
            "off_n": len(off), "on_n": len(on), "off_min_s": min(off), "on_min_s": min(on)}


def verdict(modes):
    """pass when no row of any mode is a mismatch."""
    bad = []
    for name, m in modes.items():
        if m.get("error"):
            bad.append("%s: %s" % (name, m["error"]))
        for r in m.get("rows", []):
            if r["status"] == "mismatch":
                bad.append("%s: %s expected %s observed %s" % (name, r["what"], r["expected"], r["observed"]))
    return ("pass" if not bad else "fail"), bad


# ---------------------------------------------------------------- report

def _cell(v):
    if v is None:
        return "-"
    if isinstance(v, float):
        return "%.4g" % v
    return str(v)


def render_markdown(res):
    """The report: machine, workload, per-mode tables, overhead."""
    out = ["# profi on a real GPU: PyTorch and NCCL", ""]
    m = res.get("machine", {})
    out += ["| | |", "|---|---|"]
    for k in ("gpu", "driver", "cuda", "torch", "nccl", "python", "kernel", "backend", "profi"):
        if m.get(k):
            out.append("| %s | %s |" % (k, m[k]))
    out.append("")
    w = res.get("workload", {})
    if w.get("description"):
        out += ["Workload, one phase: " + w["description"], ""]
    if w.get("libraries"):
        out += ["Libraries the workload mapped: " + ", ".join("`%s`" % p for p in w["libraries"]), ""]
    out += ["Verdict: **%s**" % res.get("verdict", "?").upper(), ""]
    for f in res.get("failures", []):
        out.append("- " + f)
    if res.get("failures"):
        out.append("")
    for name, mode in res.get("modes", {}).items():
        out += ["## --kernel-mode %s --probe-profile %s" % (mode.get("kernel_mode", name),
                                                            mode.get("probe_profile", "?")), ""]
        if mode.get("error"):
            out += ["Error: " + mode["error"], ""]
        reps = mode.get("reps", "?")
        out += ["| What | profi series | Expected (torch.profiler, %s phases) | Observed (profi delta) | Status | Note |"
                % reps, "|---|---|---:|---:|---|---|"]
        for r in mode.get("rows", []):
            out.append("| %s | `%s` | %s | %s | %s | %s |" % (r["what"], r["series"], _cell(r["expected"]),
                                                             _cell(r["observed"]), r["status"], r["note"]))
        out.append("")
    ov = res.get("overhead", {})
    if ov:
        out += ["## Overhead (wall time of one measured phase, same process)", "",
                "| Mode | Not attached, median (n) | Attached, median (n) | Ratio |", "|---|---:|---:|---:|"]
        for name, o in ov.items():
            if o:
                out.append("| %s | %.4f s (%d) | %.4f s (%d) | %s |" % (name, o["off_median_s"], o["off_n"],
                                                                   o["on_median_s"], o["on_n"], _cell(o["ratio"])))
        out.append("")
    return "\n".join(out)


def main(argv):
    if len(argv) != 2:
        print("usage: compare.py results.json", file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        res = json.load(f)
    print(render_markdown(res))
    return 0 if res.get("verdict") == "pass" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
