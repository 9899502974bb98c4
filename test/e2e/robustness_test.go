package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/promtest"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// Two overlayfs mounts of one image layer (two pods of one image) show
// the library under two (dev, inode) pairs, so it is attached twice, yet
// the uprobes land on the one real inode beneath. Every call must still
// be counted once, for each process.
func TestOverlayAliasesCountOnce(t *testing.T) {
	a := startAgent(t)
	base := t.TempDir()
	lower := filepath.Join(base, "lower")
	if err := os.MkdirAll(lower, 0o755); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(fixtures.Cudart)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(lower, "libcudart.so.12"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	var workloads []*testutil.Workload
	for i := range 2 {
		dirs := map[string]string{}
		for _, d := range []string{"upper", "work", "merged"} {
			dirs[d] = filepath.Join(base, fmt.Sprintf("%s%d", d, i))
			if err := os.MkdirAll(dirs[d], 0o755); err != nil {
				t.Fatal(err)
			}
		}
		opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, dirs["upper"], dirs["work"])
		if err := syscall.Mount("overlay", dirs["merged"], "overlay", 0, opts); err != nil {
			t.Fatalf("mount overlay: %v", err)
		}
		t.Cleanup(func() { _ = syscall.Unmount(dirs["merged"], syscall.MNT_DETACH) })
		w := startWorkload(t, fixtures.WorkloadDlopen, []string{"--lib", filepath.Join(dirs["merged"], "libcudart.so.12")})
		// Stop before the unmount cleanup runs (cleanups run last-in first-out).
		t.Cleanup(func() { _ = w.Stop() })
		if err := w.Load(); err != nil {
			t.Fatal(err)
		}
		workloads = append(workloads, w)
	}
	for _, w := range workloads {
		waitAttached(t, a, w.PID)
	}
	var st status
	if err := a.Status(&st); err != nil {
		t.Fatal(err)
	}
	if n := countLib(st, "libcudart.so"); n != 2 {
		t.Fatalf("want the layer attached under two keys (the case under test), got %+v", st.AttachedLibraries)
	}
	gt0, gt1 := runPhase(t, workloads[0]), runPhase(t, workloads[1])
	requireExact(t, a, expected([]*testutil.GroundTruth{gt0, gt1}), workloads[0].PID, workloads[1].PID)
}

// With maps far too small, every call that does not fit is counted as a
// drop, never added to another series: exported + dropped = ground truth.
func TestFullMapsCountDrops(t *testing.T) {
	a := startAgent(t, "--aggregated-size", "1", "--launch-agg-size", "1")
	w := startWorkload(t, fixtures.Workload, defaultArgs)
	waitAttached(t, a, w.PID)
	gt := runPhase(t, w)

	var timed uint64
	for fn, n := range gt.Calls {
		if p, ok := defaultMode.probed()[fn]; ok && p.timed {
			timed += n
		}
	}
	err := testenv.Eventually(15e9, func() error {
		mfs, err := a.Metrics()
		if err != nil {
			return err
		}
		var exportedTimed, exportedLaunches, series float64
		for _, s := range testutil.Samples(mfs["profi_cuda_calls_total"]) {
			if s.Labels["pid"] != fmt.Sprint(w.PID) {
				continue
			}
			series++
			if s.Labels["operation"] == "cudaLaunchKernel" {
				exportedLaunches += s.Value
			} else {
				exportedTimed += s.Value
			}
		}
		drops := map[string]float64{}
		for _, s := range testutil.Samples(mfs["profi_system_bpf_map_drops_total"]) {
			drops[s.Labels["map"]] = s.Value
		}
		launchDrops := testutil.Samples(mfs["profi_system_launch_agg_drops_total"])
		switch {
		case series != 2:
			return fmt.Errorf("want exactly one timed and one launch series (maps of size 1), got %v", series)
		case exportedTimed+drops["aggregated"] != float64(timed):
			return fmt.Errorf("timed calls: exported %v + dropped %v != %d", exportedTimed, drops["aggregated"], timed)
		case exportedLaunches+drops["launch_agg"] != float64(gt.Launches):
			return fmt.Errorf("launches: exported %v + dropped %v != %d", exportedLaunches, drops["launch_agg"], gt.Launches)
		case len(launchDrops) != 1 || launchDrops[0].Value != drops["launch_agg"]:
			return fmt.Errorf("profi_system_launch_agg_drops_total %v != map drops %v", launchDrops, drops["launch_agg"])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// promtool (the real Prometheus linter) parses the exposition with data in
// it and finds nothing but the findings the interface forces.
func TestExpositionPassesPromtool(t *testing.T) {
	a := startAgent(t)
	w := startWorkload(t, fixtures.Workload, defaultArgs)
	waitAttached(t, a, w.PID)
	gt := runPhase(t, w)
	requireExact(t, a, expected([]*testutil.GroundTruth{gt}), w.PID)
	_, body, err := a.Get("/metrics")
	if err != nil {
		t.Fatal(err)
	}
	promtest.CheckPromtool(t, body)
}

// A hostile /proc tree: malformed maps lines, a library path that is a
// symlink escaping the process root, a directory where a library should
// be. The agent reports each, attaches the one good library, and lives.
func TestHostileProcTree(t *testing.T) {
	proc := t.TempDir()
	write := func(path, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(fixtures.Cudart)
	if err != nil {
		t.Fatal(err)
	}
	proc1 := func(pid int, maps string) {
		write(filepath.Join(proc, fmt.Sprint(pid), "maps"), maps)
		write(filepath.Join(proc, fmt.Sprint(pid), "comm"), "fake\n")
		write(filepath.Join(proc, fmt.Sprint(pid), "stat"), fmt.Sprintf("%d (fake) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 %d 0 0\n", pid, 1000+pid))
	}
	// pid 100: good library (a real ELF copy) plus garbage lines.
	write(filepath.Join(proc, "100/root/opt/lib/libcudart.so.12"), string(data))
	proc1(100, "7f0000000000-7f0000001000 r-xp 00000000 fd:01 4242 /opt/lib/libcudart.so.12\n"+
		"this is not a maps line\n"+
		"zzzz-yyyy r-xp 00000000 fd:01 1 /lib/libcudart.so.12\n"+
		"7f0000001000-7f0000002000 r-xp 00000000 fd:01\n")
	// pid 200: the library path is a symlink to the host's /etc/passwd.
	if err := os.MkdirAll(filepath.Join(proc, "200/root/usr/lib"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(proc, "200/root/usr/lib/libcudart.so.12")); err != nil {
		t.Fatal(err)
	}
	proc1(200, "7f0000000000-7f0000001000 r-xp 00000000 fd:01 5151 /usr/lib/libcudart.so.12\n")
	// pid 300: a directory where the library should be.
	if err := os.MkdirAll(filepath.Join(proc, "300/root/lib/libcudart.so.12"), 0o755); err != nil {
		t.Fatal(err)
	}
	proc1(300, "7f0000000000-7f0000001000 r-xp 00000000 fd:01 6161 /lib/libcudart.so.12\n")

	a := startAgent(t, "--proc-path", proc)
	err = testenv.Eventually(15e9, func() error {
		var st status
		if err := a.Status(&st); err != nil {
			return err
		}
		if len(st.AttachedLibraries) != 1 || st.AttachedLibraries[0].Path != "/opt/lib/libcudart.so.12" {
			return fmt.Errorf("want only pid 100's library attached, got %+v", st.AttachedLibraries)
		}
		failed := map[string]string{}
		for _, f := range st.AttachFailures {
			failed[f.Path] = f.Reason
		}
		if failed["/usr/lib/libcudart.so.12"] != "open_failed" || failed["/lib/libcudart.so.12"] != "open_failed" {
			return fmt.Errorf("want open_failed for the symlink and the directory, got %+v", st.AttachFailures)
		}
		mfs, err := a.Metrics()
		if err != nil {
			return err
		}
		problems := testutil.Samples(mfs["profi_system_discovery_problems_total"])
		if len(problems) != 1 || problems[0].Value < 3 {
			return fmt.Errorf("want the 3 malformed maps lines counted (per scan), got %v", problems)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if a.Exited() {
		t.Fatal("agent exited on hostile input")
	}
}
