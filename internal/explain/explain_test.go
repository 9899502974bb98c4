package explain

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/status"
)

// fakeProc writes a procfs with the given processes' maps and comm.
func fakeProc(t *testing.T, procs map[string][2]string) string {
	t.Helper()
	root := t.TempDir()
	for pid, p := range procs {
		dir := filepath.Join(root, pid)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "maps"), []byte(p[0]), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "comm"), []byte(p[1]+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

const cudartLine = "7f0000000000-7f0000100000 r-xp 00001000 08:01 500 /opt/app/lib/libcudart.so.12\n"
const ncclLine = "7f1000000000-7f1000100000 r-xp 00001000 08:01 600 /opt/app/lib/libnccl.so.2\n"
const libcLine = "7f2000000000-7f2000100000 r-xp 00001000 08:01 700 /usr/lib/x86_64-linux-gnu/libc.so.6\n"

func doc() *status.Doc {
	return &status.Doc{
		Version: "dev", KernelMode: "anonymous", LastDiscovery: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		AttachedLibraries: []status.LibraryView{{LibraryStatus: status.LibraryStatus{
			Library: "libcudart.so", Path: "/opt/app/lib/libcudart.so.12", File: "8:1/500", PIDs: []int{10, 30},
			Probes:  []status.ProbeStatus{{Symbol: "cudaMalloc", Offset: 4}, {Symbol: "cudaMalloc", Return: true}},
			Missing: []string{"cudaGraphLaunch"},
		}, Pods: []string{"ml/llm-0"}}},
		AttachFailures: []status.FailureView{{FailureStatus: status.FailureStatus{
			Library: "libnccl.so", Path: "/opt/app/lib/libnccl.so.2", File: "8:1/600", PIDs: []int{30}, Reason: "open_failed", Error: "permission denied", Attempts: 3,
		}}},
		TrackedPIDs: []int{10, 30},
		Processes: []status.ProcessStatus{
			{PID: 10, Comm: "infer", Namespace: "ml", Pod: "llm-0", PodSource: "cgroup+pod-watch", Calls: map[string]uint64{"cudaMalloc": 3}, Launches: 7},
			{PID: 30, Comm: "train", Namespace: "ml", Pod: "train-0", PodSource: "cgroup+pod-watch", Layers: []status.Layer{
				{Layer: "runtime", State: "partial", Path: "/opt/app/lib/libcudart.so.12", Detail: "missing cudaGraphLaunch"},
				{Layer: "driver", State: "absent"},
				{Layer: "nccl", State: "blind", Path: "/opt/app/lib/libnccl.so.2", Detail: "attach failed: open_failed"},
				{Layer: "nvtx", State: "absent"},
			}},
		},
		Kubernetes: &status.Kubernetes{},
	}
}

func TestExplain(t *testing.T) {
	t.Parallel()
	root := fakeProc(t, map[string][2]string{
		"10": {cudartLine + libcLine, "infer"},
		"20": {cudartLine, "late"},
		"30": {cudartLine + ncclLine, "train"},
		"40": {libcLine, "bash"},
	})
	d := doc()
	filtered := doc()
	filtered.PIDFilter = 10
	tests := []struct {
		name, target string
		doc          *status.Doc
		verdicts     []string
		why          string
	}{
		{"attached", "10", d, []string{VerdictAttached}, "every CUDA/NCCL library it maps has probes"},
		{"partial", "30", d, []string{VerdictPartial}, "some libraries it maps are not attached"},
		{"not seen yet", "20", d, []string{VerdictNotAttached}, "the agent has not seen yet (last discovery 2026-01-01T00:00:00Z)"},
		{"excluded by --pid", "20", filtered, []string{VerdictFiltered}, "the agent runs with --pid 10"},
		{"not CUDA", "40", d, []string{VerdictNotCUDA}, "maps no CUDA runtime, driver or NCCL library"},
		{"elsewhere", "99", d, []string{VerdictUnknown}, "does not run on this machine"},
		{"pod", "ml/llm-0", d, []string{VerdictAttached}, ""},
		{"pod without namespace", "train-0", d, []string{VerdictPartial}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			procs, err := Explain(tc.doc, tc.target, Local{Root: root})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, p := range procs {
				got = append(got, p.Verdict)
			}
			if strings.Join(got, ",") != strings.Join(tc.verdicts, ",") || !strings.Contains(procs[0].Why, tc.why) {
				t.Errorf("verdicts %v (%s), want %v with %q", got, procs[0].Why, tc.verdicts, tc.why)
			}
		})
	}

	t.Run("details", func(t *testing.T) {
		t.Parallel()
		procs, err := Explain(d, "30", Local{Root: root})
		if err != nil {
			t.Fatal(err)
		}
		p := procs[0]
		if len(p.Libraries) != 2 {
			t.Fatalf("libraries %+v", p.Libraries)
		}
		cudart, nccl := p.Libraries[0], p.Libraries[1]
		if !cudart.Attached || strings.Join(cudart.Probes, ",") != "cudaMalloc+0 (+return),cudaMalloc+4" || strings.Join(cudart.Missing, ",") != "cudaGraphLaunch" || !cudart.LocalMapped {
			t.Errorf("libcudart %+v", cudart)
		}
		if nccl.Attached || nccl.Reason != "open_failed" || nccl.Error != "permission denied" || nccl.Attempts != 3 {
			t.Errorf("libnccl %+v", nccl)
		}
		var b bytes.Buffer
		Write(&b, procs, d)
		for _, want := range []string{
			"PID 30 (train): PARTIAL",
			"pod: ml/train-0 container - (source: cgroup+pod-watch)",
			"libcudart.so /opt/app/lib/libcudart.so.12 [8:1/500]: attached, 2 functions probed (classic uprobes)",
			"missing symbols: cudaGraphLaunch",
			"libnccl.so /opt/app/lib/libnccl.so.2 [8:1/600]: NOT attached: open_failed (3 attempts",
			"last error: permission denied",
			"coverage: runtime partial, driver absent, nccl blind, nvtx absent",
			"runtime (/opt/app/lib/libcudart.so.12): missing cudaGraphLaunch",
			"nccl (/opt/app/lib/libnccl.so.2): attach failed: open_failed",
		} {
			if !strings.Contains(b.String(), want) {
				t.Errorf("text lacks %q:\n%s", want, b.String())
			}
		}
	})

	// Issue 17 item 2: a library attached without a function the kernel
	// refuses a uprobe on, and one probed past such an instruction.
	t.Run("refused probe", func(t *testing.T) {
		t.Parallel()
		r := doc()
		r.AttachedLibraries[0].Missing = nil
		r.AttachedLibraries[0].Probes = append(r.AttachedLibraries[0].Probes,
			status.ProbeStatus{Symbol: "cudaMemcpy", Offset: 7, Placement: status.PlacementPastRefused})
		r.AttachedLibraries[0].Refused = []status.RefusedProbe{{
			Symbol: "cudaGraphLaunch", Operation: "cudaGraphLaunch", Reason: status.RefusedLockPrefix, Offset: 0, FileOffset: 0x2ff0, Code: "f00fc10da8300000",
		}}
		procs, err := Explain(r, "10", Local{Root: root})
		if err != nil {
			t.Fatal(err)
		}
		p := procs[0]
		if p.Verdict != VerdictPartial || !strings.Contains(p.Why, "the kernel refuses a uprobe on some probed functions") {
			t.Errorf("verdict %s (%s), want partial: refused probes", p.Verdict, p.Why)
		}
		if got := strings.Join(p.Libraries[0].Refused, ","); got != "cudaGraphLaunch+0 (lock_prefix, file offset 0x2ff0)" {
			t.Errorf("refused %q", got)
		}
		var b bytes.Buffer
		Write(&b, procs, r)
		for _, want := range []string{
			"PID 10 (infer): PARTIAL",
			"cudaMemcpy+7 (past a first instruction the kernel refuses)",
			"refused by the kernel, not counted: cudaGraphLaunch+0 (lock_prefix, file offset 0x2ff0)",
		} {
			if !strings.Contains(b.String(), want) {
				t.Errorf("text lacks %q:\n%s", want, b.String())
			}
		}
	})

	t.Run("unknown pod", func(t *testing.T) {
		t.Parallel()
		noK8s := doc()
		noK8s.Kubernetes = nil
		if _, err := Explain(noK8s, "ml/none", Local{Root: root}); err == nil || !strings.Contains(err.Error(), "pod enrichment is off") {
			t.Errorf("error %v, want one saying pod enrichment is off", err)
		}
	})
}

// TestExplainGraphs checks the whole text answer for a process that runs
// kernels through CUDA graphs on two GPUs, one replaying graphs built
// before attach, and the share printed at its edges.
func TestExplainGraphs(t *testing.T) {
	t.Parallel()
	root := fakeProc(t, map[string][2]string{"50": {cudartLine, "infer"}})
	share, early, idle := 0.75, 0.004, 1860.0
	d := &status.Doc{
		Version: "dev", KernelMode: "anonymous", ProbeProfile: "lean", UptimeSeconds: 90, LastDiscovery: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		AttachedLibraries: []status.LibraryView{{LibraryStatus: status.LibraryStatus{
			Library: "libcudart.so", Path: "/opt/app/lib/libcudart.so.12", File: "8:1/500", PIDs: []int{50, 51},
			Probes: []status.ProbeStatus{{Symbol: "cudaGraphLaunch"}},
		}}},
		TrackedPIDs: []int{50, 51},
		Processes: []status.ProcessStatus{
			{PID: 50, Comm: "infer", GPU: "0", GPUUUID: "GPU-a", PodSource: "none: no --node-name (pod enrichment off)", GPUSource: "device 0: nvml",
				Launches: 100, GraphKernelLaunches: 300, CapturedLaunches: 12,
				Graphs: &status.Graphs{Graphs: 5, Execs: 4, Replays: 1200, UnknownReplays: 200, GraphKernelShare: &share}},
			{PID: 50, Comm: "infer", GPU: "1", GPUUUID: "GPU-b", GPUSource: "device 1: nvml", Launches: 50, GraphKernelLaunches: 150,
				ActiveMemoryBytes: 1 << 30, HeldIdleSeconds: &idle},
			{PID: 51, Comm: "early", Launches: 996, GraphKernelLaunches: 4,
				Graphs: &status.Graphs{Graphs: 1, Execs: 1, Replays: 9, GraphKernelShare: &early}},
			{PID: 52, Comm: "old", Graphs: &status.Graphs{Replays: 7, UnknownReplays: 7}},
		},
	}
	procs, err := Explain(d, "50", Local{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	Write(&b, procs, d)
	want := `PID 50 (infer): ATTACHED
  why: every CUDA/NCCL library it maps has probes; its calls are counted
  pod: - (source: none: no --node-name (pod enrichment off))
  libraries (paths inside the process's container):
    libcudart.so /opt/app/lib/libcudart.so.12 [8:1/500]: attached, 1 functions probed (classic uprobes)
      probes: cudaGraphLaunch+0
  gpu 0 GPU-a (source: device 0: nvml)
    counters: launches 100, active device memory 0 B, memset 0 B
    kernels that ran: 400 (100 direct launches, 300 through graph replays); 12 launch calls captured into graphs (they ran nothing then)
    graphs: 5 built (4 executable alive), 1200 replays (200 of them ran graphs built before profi attached or past its caps: their kernels are not counted), 75% of the process's counted kernels ran through graphs
  gpu 1 GPU-b (source: device 1: nvml)
    counters: launches 50, active device memory 1073741824 B, memset 0 B
    held idle: holds 1073741824 B of device memory here and has launched no kernel here for 1860s
    kernels that ran: 200 (50 direct launches, 150 through graph replays)

agent dev, kernel mode anonymous, probe profile lean, up 90s, last discovery 2026-01-01T00:00:00Z
`
	if b.String() != want {
		t.Errorf("text answer:\n%s\nwant\n%s", b.String(), want)
	}

	for _, tc := range []struct {
		pid  int
		want string
	}{
		// 4 of 1000 kernels: not rounded down to 0 %.
		{51, "    kernels that ran: 1000 (996 direct launches, 4 through graph replays)\n    graphs: 1 built (1 executable alive), 9 replays, <1% of the process's counted kernels ran through graphs\n"},
		// Only replays of graphs built before attach: no kernel, no share.
		{52, "    graphs: 0 built (0 executable alive), 7 replays (7 of them ran graphs built before profi attached or past its caps: their kernels are not counted)\n"},
	} {
		var b bytes.Buffer
		writeGraphs(&b, d.Processes[tc.pid-49])
		if got := b.String(); got != tc.want {
			t.Errorf("pid %d:\n%q\nwant\n%q", tc.pid, got, tc.want)
		}
	}
	if got := percent(0.996); got != ">99%" {
		t.Errorf("percent(0.996) = %q, want >99%%", got)
	}
	// A process without graphs: no graph line.
	var none bytes.Buffer
	writeGraphs(&none, status.ProcessStatus{PID: 1, Launches: 5})
	if none.Len() != 0 {
		t.Errorf("graph lines for a process without graphs: %q", none.String())
	}
}

// TestExplainQuarantined: a process that maps a quarantined file (listed
// with it, or seen in its maps here) gets the quarantined verdict and the
// file's reason; the others are untouched.
func TestExplainQuarantined(t *testing.T) {
	at := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	doc := &status.Doc{
		AttachedLibraries: []status.LibraryView{{LibraryStatus: status.LibraryStatus{Library: "libcuda.so", Path: "/l/libcuda.so.1", PIDs: []int{10, 11}}}},
		Quarantined: []status.Quarantine{{Library: "libcudart.so", Path: "/l/libcudart.so.12", File: "8:1/7", Reason: "sigsegv", PID: 10,
			Comm: "train", Signal: "SIGSEGV", Time: at, SinceHitSeconds: 0.0002, PIDs: []int{10, 11}}},
	}
	procs, err := Explain(doc, "11", Local{})
	if err != nil {
		t.Fatal(err)
	}
	p := procs[0]
	if p.Verdict != VerdictQuarantined || !strings.Contains(p.Why, "/l/libcudart.so.12") || !strings.Contains(p.Why, "process 10 (train) died of SIGSEGV") {
		t.Errorf("verdict %s: %s", p.Verdict, p.Why)
	}
	var q *Library
	for i := range p.Libraries {
		if p.Libraries[i].Path == "/l/libcudart.so.12" {
			q = &p.Libraries[i]
		}
	}
	if q == nil || q.Reason != ReasonQuarantined || q.Attached || q.File != "8:1/7" {
		t.Errorf("libraries %+v; want the quarantined runtime", p.Libraries)
	}
	if procs, _ := Explain(doc, "12", Local{}); procs[0].Verdict == VerdictQuarantined {
		t.Errorf("pid 12 maps nothing quarantined, got %s", procs[0].Verdict)
	}
}

// TestExplainStopAll: a node-wide stop gives every process the
// quarantined verdict with the reason and the kernel's line, and adds no
// library of an empty path.
func TestExplainStopAll(t *testing.T) {
	at := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	doc := &status.Doc{Quarantined: []status.Quarantine{{Library: "all", Reason: "kernel_warning", Time: at,
		KernelLog: "WARNING: CPU: 1 PID: 9 at kernel/events/uprobes.c:1 handle_swbp+0x1/0x2", PIDs: []int{9}}}}
	procs, err := Explain(doc, "12", Local{})
	if err != nil {
		t.Fatal(err)
	}
	p := procs[0]
	if p.Verdict != VerdictQuarantined || !strings.Contains(p.Why, "every probe on this node is off since 2026-12-05T12:00:00Z (kernel_warning: WARNING: CPU: 1") {
		t.Errorf("verdict %s: %s", p.Verdict, p.Why)
	}
	for _, l := range p.Libraries {
		if l.Path == "" {
			t.Errorf("a library of no path: %+v", l)
		}
	}
}

// TestExplainUnprobed: a traced process left unprobed gets the unprobed
// verdict with its tracer; another process of the same file stays attached.
func TestExplainUnprobed(t *testing.T) {
	doc := &status.Doc{
		AttachedLibraries: []status.LibraryView{{LibraryStatus: status.LibraryStatus{Library: "libcuda.so", Path: "/l/libcuda.so.1", PIDs: []int{10, 11},
			ProbedPIDs: []int{10}, Unprobed: []status.Unprobed{{PID: 11, Reason: "traced", TracerPID: 99}}}}},
	}
	for _, tc := range []struct {
		pid, verdict, why string
	}{
		{"11", VerdictUnprobed, "tracer (pid 99"},
		{"10", VerdictAttached, "its calls are counted"},
	} {
		procs, err := Explain(doc, tc.pid, Local{})
		if err != nil {
			t.Fatal(err)
		}
		if p := procs[0]; p.Verdict != tc.verdict || !strings.Contains(p.Why, tc.why) {
			t.Errorf("pid %s: verdict %s: %s; want %s, %q", tc.pid, p.Verdict, p.Why, tc.verdict, tc.why)
		}
	}
}
