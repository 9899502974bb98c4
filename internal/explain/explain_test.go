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
