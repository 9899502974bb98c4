package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// The workload's default mix: 2 threads, 200 iterations, ~18k probed calls.
var defaultArgs = []string{}

func runPhase(t *testing.T, w *testutil.Workload) *testutil.GroundTruth {
	t.Helper()
	gt, err := w.Run()
	if err != nil {
		t.Fatalf("workload run: %v\n%s", err, w.Stderr())
	}
	return gt
}

// A workload that was already running when the agent started is found by
// the /proc scan and counted exactly from the moment it is attached.
func TestWorkloadStartedBeforeAgent(t *testing.T) {
	testutil.RequireBPF(t)
	w := startWorkload(t, fixtures.Workload, defaultArgs)
	a := startAgent(t)
	waitAttached(t, a, w.PID)
	gt := runPhase(t, w)
	requireExact(t, a, expected([]*testutil.GroundTruth{gt}), w.PID)
}

// A workload started after the agent is found by the next scan.
func TestWorkloadStartedAfterAgent(t *testing.T) {
	a := startAgent(t)
	w := startWorkload(t, fixtures.Workload, defaultArgs)
	waitAttached(t, a, w.PID)
	gt := runPhase(t, w)
	requireExact(t, a, expected([]*testutil.GroundTruth{gt}), w.PID)

	// A second phase: counters are cumulative and stay exact.
	gt = runPhase(t, w)
	requireExact(t, a, expected([]*testutil.GroundTruth{gt}), w.PID)
}

// A process that dlopens libcudart long after it started is attached once
// the library shows up in its maps.
func TestDlopenLater(t *testing.T) {
	a := startAgent(t)
	w := startWorkload(t, fixtures.WorkloadDlopen, []string{"--lib", fixtures.Cudart})
	// Give discovery a few passes: without the library the process is not tracked.
	time.Sleep(2500 * time.Millisecond)
	var st status
	if err := a.Status(&st); err != nil {
		t.Fatal(err)
	}
	for _, p := range st.TrackedPIDs {
		if p == w.PID {
			t.Fatalf("pid %d tracked before it loaded libcudart: %+v", w.PID, st)
		}
	}
	if err := w.Load(); err != nil {
		t.Fatal(err)
	}
	waitAttached(t, a, w.PID)
	gt := runPhase(t, w)
	requireExact(t, a, expected([]*testutil.GroundTruth{gt}), w.PID)
}

// A library that exists only inside the workload's mount namespace is
// opened through /proc/PID/root, so containers need nothing special.
func TestLibraryInOtherMountNamespace(t *testing.T) {
	a := startAgent(t)
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Fatal("unshare (util-linux) is required")
	}
	// A copy, so that the file (inode) is not one another test attached.
	src := t.TempDir()
	data, err := os.ReadFile(fixtures.Cudart)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "libcudart.so.12"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	inside := "/mnt/profi-e2e-ns/lib"
	if _, err := os.Stat(inside); err == nil {
		t.Fatalf("%s exists outside the namespace; the test needs it not to", inside)
	}
	script := fmt.Sprintf("set -e; mount -t tmpfs tmpfs /mnt; mkdir -p %s; mount --bind %s %s; exec %s --lib %s/libcudart.so.12",
		inside, src, inside, fixtures.WorkloadDlopen, inside)
	w := startWorkload(t, "unshare", []string{"--mount", "--propagation", "private", "sh", "-c", script})
	if err := w.Load(); err != nil {
		t.Fatalf("load: %v\n%s", err, w.Stderr())
	}
	waitAttached(t, a, w.PID)
	gt := runPhase(t, w)
	requireExact(t, a, expected([]*testutil.GroundTruth{gt}), w.PID)

	var st status
	if err := a.Status(&st); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, l := range st.AttachedLibraries {
		found = found || l.Path == inside+"/libcudart.so.12"
	}
	if !found {
		t.Fatalf("status does not list the library at its in-namespace path %s: %+v", inside, st.AttachedLibraries)
	}
}

// When a process exits its per-PID counters stay, with its final values
// (Prometheus scrapes every 15-60 s: nothing it did is lost), while another
// process of its container lives (no pod here: the same comm); once the
// last one has exited, --gc-interval later, both fold into series with
// pid="" that keep their counts exactly. The latency histograms keep every
// call (they carry no pid).
func TestProcessExit(t *testing.T) {
	const gc = 3 * time.Second
	a := startAgent(t, "--gc-interval", "3")
	w1 := startWorkload(t, fixtures.Workload, defaultArgs)
	w2 := startWorkload(t, fixtures.Workload, []string{"--threads", "1", "--iters", "100"})
	waitAttached(t, a, w1.PID)
	waitAttached(t, a, w2.PID)
	gt1 := runPhase(t, w1)
	gt2 := runPhase(t, w2)
	requireExact(t, a, expected([]*testutil.GroundTruth{gt1, gt2}), w1.PID, w2.PID)

	// w1's last phase, then its exit: everything counted, and kept past
	// --gc-interval while w2 runs.
	gt1 = runPhase(t, w1)
	if err := w1.Stop(); err != nil {
		t.Fatal(err)
	}
	gt2 = runPhase(t, w2)
	// The exited processes' expectation: their counters, not the gauge of
	// a live process.
	final := func(gts []*testutil.GroundTruth, exited ...*testutil.GroundTruth) values {
		v := expected(gts)
		for _, g := range exited {
			delete(v, key("profi_cuda_active_memory_bytes", "pid="+strconv.Itoa(g.PID)))
		}
		return v
	}
	both := []*testutil.GroundTruth{gt1, gt2}
	requireExact(t, a, final(both, gt1), w1.PID, w2.PID)
	time.Sleep(gc + 2*time.Second)
	requireExact(t, a, final(both, gt1), w1.PID, w2.PID)

	// w2 exits: --gc-interval later both fold.
	if err := w2.Stop(); err != nil {
		t.Fatal(err)
	}
	want := values{}
	for _, g := range both {
		pid := "pid=" + strconv.Itoa(g.PID)
		for k, v := range final([]*testutil.GroundTruth{g}, g) {
			if strings.Contains(k, pid) {
				want[strings.Replace(k, pid, "pid=", 1)] += v
			}
		}
	}
	err := testenv.Eventually(gc+15*time.Second, func() error {
		mfs, err := a.Metrics()
		if err != nil {
			return err
		}
		if left := observed(mfs, w1.PID, w2.PID); len(left) > 0 {
			for k := range left {
				if strings.Contains(k, "pid=") {
					return fmt.Errorf("pids %d, %d still have series (%s)", w1.PID, w2.PID, k)
				}
			}
		}
		got := observedPIDs(mfs, "")
		for k := range got {
			if !strings.Contains(k, "pid=") {
				delete(got, k) // the histograms, checked below
			}
		}
		if d := diff(want, got); d != "" {
			return fmt.Errorf("folded series differ from pids %d and %d's ground truth:\n%s", w1.PID, w2.PID, d)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	hists := expected(nil, gt1, gt2)
	requireExactOf(t, a, hists, nil, func(v values) {
		for k := range v {
			if strings.Contains(k, "pid=") {
				delete(v, k)
			}
		}
	})
}

// --pid attaches only to that process: the other one is never counted.
func TestPIDFilter(t *testing.T) {
	w1 := startWorkload(t, fixtures.Workload, defaultArgs)
	w2 := startWorkload(t, fixtures.Workload, defaultArgs)
	a := startAgent(t, "--pid", strconv.Itoa(w1.PID))
	waitAttached(t, a, w1.PID)
	gt1 := runPhase(t, w1)
	runPhase(t, w2)
	mfs := requireExact(t, a, expected([]*testutil.GroundTruth{gt1}), w1.PID, w2.PID)
	for name, mf := range mfs {
		for _, s := range testutil.Samples(mf) {
			if s.Labels["pid"] == strconv.Itoa(w2.PID) {
				t.Errorf("%s has a series of filtered-out pid %d: %v", name, w2.PID, s.Labels)
			}
		}
	}
	var st status
	if err := a.Status(&st); err != nil {
		t.Fatal(err)
	}
	if len(st.TrackedPIDs) != 1 || st.TrackedPIDs[0] != w1.PID {
		t.Fatalf("tracked pids = %v, want only %d", st.TrackedPIDs, w1.PID)
	}
}

// A library without some probed symbols is attached for the rest; the
// missing ones are reported in /status and counted.
func TestLibraryMissingSymbols(t *testing.T) {
	a := startAgent(t)
	w := startWorkload(t, fixtures.WorkloadDlopen, []string{"--lib", fixtures.CudartMissing})
	if err := w.Load(); err != nil {
		t.Fatal(err)
	}
	waitAttached(t, a, w.PID)
	gt := runPhase(t, w)
	requireExact(t, a, expected([]*testutil.GroundTruth{gt}), w.PID)

	var st status
	if err := a.Status(&st); err != nil {
		t.Fatal(err)
	}
	var missing []string
	for _, l := range st.AttachedLibraries {
		if l.Path == fixtures.CudartMissing {
			missing = l.Missing
		}
	}
	if strings.Join(missing, ",") != "cudaGraphLaunch,cudaGraphInstantiate" {
		t.Fatalf("missing symbols = %v, want [cudaGraphLaunch cudaGraphInstantiate]", missing)
	}
	mfs, err := a.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	got := 0.0
	for _, s := range testutil.Samples(mfs["profi_system_attach_failures_total"]) {
		if s.Labels["library"] == "libcudart.so" && s.Labels["reason"] == "symbol_not_found" {
			got = s.Value
		}
	}
	if got != 2 {
		t.Fatalf("attach failures{reason=symbol_not_found} = %v, want 2", got)
	}
}

// A file named like libcudart that is not ELF is reported as not_elf and
// retried with backoff; the agent keeps running.
func TestLibraryNotELF(t *testing.T) {
	a := startAgent(t)
	// python maps the file read-only, as a loader would before failing.
	script := fmt.Sprintf("import mmap,sys\nf=open(%q,'rb')\nm=mmap.mmap(f.fileno(),0,prot=mmap.PROT_READ)\nimport os\nprint('ready',os.getpid(),flush=True)\nsys.stdin.read()\n", fixtures.CudartNotELF)
	w := startWorkload(t, "python3", []string{"-c", script})
	err := testenv.Eventually(15*time.Second, func() error {
		var st status
		if err := a.Status(&st); err != nil {
			return err
		}
		for _, f := range st.AttachFailures {
			if f.Path == fixtures.CudartNotELF && f.Reason == "not_elf" {
				return nil
			}
		}
		return fmt.Errorf("no not_elf failure for %s in %+v", fixtures.CudartNotELF, st.AttachFailures)
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = w
	if a.Exited() {
		t.Fatal("agent exited")
	}
}

// Draining while the workload calls: no increment may be lost between
// reads, and no counter may ever go backwards (the Rust exporter's racy
// lookup-then-delete lost increments here).
func TestDrainWhileCalling(t *testing.T) {
	a := startAgent(t)
	w := startWorkload(t, fixtures.Workload, []string{"--threads", "2", "--iters", "1500"})
	waitAttached(t, a, w.PID)

	done := make(chan struct{})
	errs := make(chan error, 1)
	go func() {
		defer close(errs)
		prev := values{}
		for {
			select {
			case <-done:
				return
			default:
			}
			mfs, err := a.Metrics()
			if err != nil {
				errs <- err
				return
			}
			cur := observed(mfs, w.PID)
			for k, v := range prev {
				if strings.HasPrefix(k, "profi_cuda_active_memory_bytes") {
					continue // a gauge
				}
				if cur[k] < v {
					errs <- fmt.Errorf("%s went backwards: %v then %v", k, v, cur[k])
					return
				}
			}
			prev = cur
			time.Sleep(20 * time.Millisecond)
		}
	}()
	gt := runPhase(t, w)
	requireExact(t, a, expected([]*testutil.GroundTruth{gt}), w.PID)
	close(done)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
}

// waitLoaderHooked waits until the agent's first pass, at start-up, has
// hooked this host's ld.so: from then on a library load triggers a pass.
func waitLoaderHooked(t *testing.T, a *testutil.Agent) {
	t.Helper()
	err := testenv.Eventually(15*time.Second, func() error {
		var st struct {
			Hooks []struct{ Path string } `json:"loader_hooks"`
		}
		if err := a.Status(&st); err != nil {
			return err
		}
		if len(st.Hooks) == 0 {
			return fmt.Errorf("no loader hooked: %+v", st)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A library that a running process dlopens is attached at once: the
// loader's _dl_debug_state hook triggers a pass; the periodic rescan is
// set to an hour here, so it cannot be what finds it.
func TestEventDrivenAttach(t *testing.T) {
	w := startWorkload(t, fixtures.WorkloadDlopen, []string{"--lib", fixtures.Cudart})
	a := startAgent(t, "--refresh-interval", "3600")
	waitLoaderHooked(t, a)
	if err := w.Load(); err != nil {
		t.Fatal(err)
	}
	waitAttached(t, a, w.PID)
	gt := runPhase(t, w)
	requireExact(t, a, expected([]*testutil.GroundTruth{gt}), w.PID)
}
