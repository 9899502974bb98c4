#!/usr/bin/env python3
"""Orchestration of the real-GPU proof (test/gpu/prove.sh); standard library only.

One workload process (workload.py) for the whole run, started before profi:
  warm-up and profiled phases (inside the workload, before any agent)
  R phases not attached
  for each kernel mode: start profi, wait until /status lists the workload's pid on
  every CUDA/NCCL library it maps, scrape, R phases attached, scrape once the counts
  are stable (profi drains every second), stop profi, R phases not attached
Expected = R x the profiled phase's ground truth; observed = the difference of the two
scrapes for the workload's pid, so nothing made before attach counts. The overhead ratio
of a mode is the median attached phase time over the median of the unattached phases
just before and after it, in the same process.

Writes OUT/results.json, OUT/results.md and OUT/raw.tar.gz (logs of profi and the
workload, /status, scrapes); prints the markdown. Exit 0: every row matches or is
explained; 1: a mismatch or a failed step; 3: this machine cannot run BPF.
"""

import argparse
import io
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, HERE)
import compare  # noqa: E402

LIB_CLASS = (("libcudart.so", "libcudart.so"), ("libcuda.so", "libcuda.so"), ("libnccl.so", "libnccl.so"))


def log(msg):
    print("prove: " + msg, file=sys.stderr, flush=True)


def library_class(path):
    base = os.path.basename(path)
    for prefix, cls in LIB_CLASS:
        if base == prefix or base.startswith(prefix + "."):
            return cls
    return None


def bpf_unavailable():
    """Why this machine cannot load profi's probes, or "" (testutil.BPFUnavailable)."""
    if os.geteuid() != 0:
        return "needs root"
    if not os.path.exists("/sys/kernel/btf/vmlinux"):
        return "no /sys/kernel/btf/vmlinux (kernel %s): no BTF, or not a real Linux kernel (gVisor)" % os.uname().release
    if not os.path.exists("/sys/bus/event_source/devices/uprobe/type"):
        return "no uprobe PMU (/sys/bus/event_source/devices/uprobe/type)"
    return ""


def run_text(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return "unavailable (%s)" % e


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def http_get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode()


class Workload:
    """workload.py with its line protocol."""

    def __init__(self, cmd, logf):
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=logf, text=True)
        self.q = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            try:
                self.q.put(json.loads(line))
            except ValueError:
                log("workload: not a protocol line: %r" % line)
        self.q.put(None)

    def expect(self, event, timeout):
        try:
            msg = self.q.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError("workload: no %r within %d s" % (event, timeout))
        if msg is None:
            raise RuntimeError("workload exited (status %s) waiting for %r; see workload.log" % (self.p.wait(), event))
        if msg.get("event") == "error":
            raise RuntimeError("workload: " + msg.get("error", "?"))
        if msg.get("event") != event:
            raise RuntimeError("workload: got %r, want %r" % (msg.get("event"), event))
        return msg

    def send(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def run(self, n, timeout):
        """Runs n phases: their wall times, and the graph-API summary of the graph each captured."""
        self.send("run %d" % n)
        msg = self.expect("ran", timeout)
        return msg["seconds"], msg.get("graphs")

    def stop(self):
        if self.p.poll() is None and ABORT.is_set():
            self.p.kill()
            self.p.wait()
        if self.p.poll() is None:
            try:
                self.send("quit")
                self.expect("bye", 60)
            except (RuntimeError, OSError) as e:
                log("workload: %s" % e)
        try:
            self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


def counted_at_driver(st, pid):
    """The runtime launch probes of the workload's libraries whose launches profi's driver probe counts."""
    out = []
    for lib in st.get("attached_libraries", []):
        if pid in lib.get("pids", []):
            out += [p["symbol"] for p in lib.get("probes", []) if p.get("counted_at_driver")]
    return sorted(out)


class Agent:
    """A running profi."""

    def __init__(self, profi, args, logf):
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        cmd = [profi, "--listen", "127.0.0.1:%d" % self.port] + args
        log("start: " + " ".join(cmd))
        self.p = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.p.poll() is not None:
                raise RuntimeError("profi exited with status %d before ready; see its log" % self.p.returncode)
            try:
                if http_get(self.url + "/ready", 2)[0] == 200:
                    return
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.1)
        raise RuntimeError("profi: /ready not 200 within %d s" % timeout)

    def status(self):
        return json.loads(http_get(self.url + "/status")[1])

    def wait_attached(self, pid, classes, timeout):
        """Until /status lists pid on a library of every class; returns that /status."""
        deadline = time.monotonic() + timeout
        st = {}
        while time.monotonic() < deadline:
            st = self.status()
            have = {lib.get("library") for lib in st.get("attached_libraries") or [] if pid in (lib.get("pids") or [])}
            if set(classes) <= have:
                return st
            time.sleep(0.25)
        raise RuntimeError("profi: pid %d not attached to all of %s within %d s; failures: %s"
                           % (pid, sorted(classes), timeout, json.dumps(st.get("attach_failures"))))

    def scrape(self):
        code, body = http_get(self.url + "/metrics", 30)
        if code != 200:
            raise RuntimeError("/metrics: HTTP %d" % code)
        return body

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        return self.p.returncode


def stable_scrape(agent, before, pid, timeout):
    """The first scrape equal (for pid) to the one before it, both after a drain, and
    True; or the last one and False when the process keeps making probed calls while
    idle (the rows then show the difference)."""
    prev, text = None, None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # profi drains every second, or up to 5 s apart after slow drains
        # (aggregate.nextDrain): two equal scrapes closer than that can both
        # read one snapshot taken mid-run (seen in full mode on an H200).
        time.sleep(5.5)
        text = agent.scrape()
        obs = compare.observe(compare.delta(before, compare.parse_prometheus(text)), pid)
        if obs == prev:
            return text, True
        prev = obs
    return text, False


def library_report(st, pid):
    out = []
    for lib in st.get("attached_libraries") or []:
        if pid in (lib.get("pids") or []):
            out.append({"library": lib.get("library"), "path": lib.get("path"), "probes": len(lib.get("probes") or []),
                        "missing_symbols": lib.get("missing_symbols") or [],
                        "absent_optional_symbols": lib.get("absent_optional_symbols") or [],
                        "uprobe_multi": bool(lib.get("uprobe_multi"))})
    return out


ABORT = threading.Event()  # set by SIGTERM (prove.sh's timeout): stop at once, keep what was measured


def on_term(signum, frame):
    ABORT.set()
    raise SystemExit(124)


def main():
    signal.signal(signal.SIGTERM, on_term)
    p = argparse.ArgumentParser(description="profi vs torch.profiler on one workload process")
    p.add_argument("--backend", choices=("torch", "stub"), required=True)
    p.add_argument("--profi", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--fixtures", help="stub backend: testutil.BuildFixtures directory")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--modes", default="anonymous,full")
    p.add_argument("--probe-profile", default="full")
    p.add_argument("--reps", type=int, default=5, help="measured phases per step")
    p.add_argument("--agent-arg", action="append", default=[], help="extra profi flag (repeatable)")
    p.add_argument("--workload-arg", action="append", default=[], help="extra workload.py flag (repeatable)")
    p.add_argument("--ready-timeout", type=int, default=300)
    p.add_argument("--phase-timeout", type=int, default=120)
    p.add_argument("--attach-timeout", type=int, default=90)
    a = p.parse_args()

    os.makedirs(a.out, exist_ok=True)
    raw = os.path.join(a.out, "raw")
    os.makedirs(raw, exist_ok=True)
    res = {"machine": {"kernel": os.uname().release, "backend": a.backend,
                       "profi": run_text([a.profi, "--version"])},
           "config": {"modes": a.modes.split(","), "probe_profile": a.probe_profile, "reps": a.reps,
                      "agent_args": a.agent_arg},
           "modes": {}, "overhead": {}}
    if a.backend == "torch":
        q = run_text(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
        res["machine"]["driver"] = q.split(",")[-1].strip() if "," in q else q
        with open(os.path.join(raw, "nvidia-smi.txt"), "w") as f:
            f.write(run_text(["nvidia-smi", "-q"]))

    code = 1
    wl, wlog = None, open(os.path.join(raw, "workload.log"), "w")
    try:
        why = bpf_unavailable()
        if why:
            res["verdict"], res["failures"] = "blocked", ["BPF unavailable: " + why]
            code = 3
            return code
        cmd = [a.python, os.path.join(HERE, "workload.py"), "--backend", a.backend, "--trace-dir", raw]
        if a.fixtures:
            cmd += ["--fixtures", a.fixtures]
        cmd += a.workload_arg
        log("start workload: " + " ".join(cmd))
        wl = Workload(cmd, wlog)
        ready = wl.expect("ready", a.ready_timeout)
        pid = ready["pid"]
        for k in ("gpu", "cuda", "torch", "nccl", "python"):
            if ready["versions"].get(k):
                res["machine"][k] = ready["versions"][k]
        res["workload"] = {k: ready[k] for k in ("pid", "libraries", "description", "plan", "ground_truth",
                                                 "constructed", "nondeterministic", "profiled_phases",
                                                 "startup_seconds")}
        classes = sorted({library_class(x) for x in ready["libraries"]} - {None})
        log("workload pid %d ready in %.1f s; maps %s" % (pid, ready["startup_seconds"], ", ".join(ready["libraries"])))
        if "libcudart.so" not in classes:
            raise RuntimeError("the workload maps no libcudart.so (statically linked runtime?): %s" % ready["libraries"])

        off = [wl.run(a.reps, a.phase_timeout)[0]]
        for mode in a.modes.split(","):
            m = {"kernel_mode": mode, "probe_profile": a.probe_profile, "reps": a.reps}
            res["modes"][mode] = m
            alog = open(os.path.join(raw, "profi-%s.log" % mode), "w")
            agent = Agent(a.profi, ["--kernel-mode", mode, "--probe-profile", a.probe_profile,
                                    "--refresh-interval", "1", "--log-level", "info"] + a.agent_arg, alog)
            try:
                t = time.monotonic()
                agent.wait_ready(60)
                st = agent.wait_attached(pid, classes, a.attach_timeout)
                m["attach_seconds"] = time.monotonic() - t
                m["libraries"] = library_report(st, pid)
                # The steady state: one unmeasured phase, then two discovery
                # passes (--refresh-interval 1), so what profi decides from
                # the launches it saw (a runtime's launches handed to the
                # driver's probe: ARCHITECTURE.md "One trap per launch") is
                # in place before the measured phases; the phases are
                # compared as deltas, so this one is in neither scrape.
                wl.run(1, a.phase_timeout)
                time.sleep(2.2)
                status_before = agent.status()
                before_text = agent.scrape()
                before = compare.parse_prometheus(before_text)
                on, phase_graphs = wl.run(a.reps, a.phase_timeout)
                after_text, stable = stable_scrape(agent, before, pid, 40)
                if not stable:
                    m["error"] = ("profi's counts for pid %d kept changing while the workload was idle "
                                  "(calls between phases?): compared with the last scrape" % pid)
                status_after = agent.status()
                m["counted_at_driver"] = counted_at_driver(status_after, pid)
                for name, doc in (("before", status_before), ("after", status_after)):
                    with open(os.path.join(raw, "status-%s-%s.json" % (mode, name)), "w") as f:
                        json.dump(doc, f, indent=1)
                for name, text in (("before", before_text), ("after", after_text)):
                    with open(os.path.join(raw, "metrics-%s-%s.prom" % (mode, name)), "w") as f:
                        f.write(text)
                obs = compare.observe(compare.delta(before, compare.parse_prometheus(after_text)), pid)
                graphs = compare.graph_status_delta(status_before, status_after, pid)
                m["observed"] = obs
                m["observed_graphs"] = graphs
                m["phase_graphs"] = phase_graphs
                m["rows"] = compare.compare(ready["ground_truth"], ready["constructed"], a.reps, obs,
                                            mode, a.probe_profile, graphs=graphs, phase_graphs=phase_graphs)
                m["phase_seconds_attached"] = on
            except (RuntimeError, OSError, ValueError) as e:
                m["error"] = str(e)
                log("%s: %s" % (mode, e))
            finally:
                rc = agent.stop()
                alog.close()
                m["profi_exit_status"] = rc
                if rc != 0 and not m.get("error"):
                    m["error"] = "profi exited with status %s" % rc
            off.append(wl.run(a.reps, a.phase_timeout)[0])
            if "phase_seconds_attached" in m:
                res["overhead"][mode] = compare.overhead(off[-2] + off[-1], m["phase_seconds_attached"])
        res["phase_seconds_not_attached"] = off
        res["verdict"], res["failures"] = compare.verdict(res["modes"])
        if ready["nondeterministic"]:
            res["verdict"] = "fail"
            res["failures"].append("the profiled phases differ, so one phase's counts do not predict "
                                   "another's: " + "; ".join(ready["nondeterministic"]))
        code = 0 if res["verdict"] == "pass" else 1
    except (RuntimeError, OSError, ValueError, KeyError) as e:
        log(str(e))
        res["verdict"] = "fail"
        res.setdefault("failures", []).append(str(e))
        code = 1
    finally:
        if ABORT.is_set():
            res["verdict"] = "fail"
            res.setdefault("failures", []).append("stopped by TERM (prove.sh --timeout): partial results")
        if wl is not None:
            wl.stop()
        wlog.close()
        finish(a.out, raw, res)
    return code


def finish(out, raw, res):
    """results.json, results.md and raw.tar.gz (the device machine returns at most 8 files)."""
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(res, f, indent=1, sort_keys=True)
    md = compare.render_markdown(res)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(md + "\n")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(raw, arcname="raw")
    with open(os.path.join(out, "raw.tar.gz"), "wb") as f:
        f.write(buf.getvalue())
    shutil.rmtree(raw)
    print(md, flush=True)


if __name__ == "__main__":
    sys.exit(main())
