package e2e

import (
	"bufio"
	"bytes"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/attach"
	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// tracedStatus is the part of /status the traced-process tests read.
type tracedStatus struct {
	AttachedLibraries []struct {
		Library    string `json:"library"`
		Path       string `json:"path"`
		PIDs       []int  `json:"pids"`
		ProbedPIDs []int  `json:"probed_pids"`
		Unprobed   []struct {
			PID       int    `json:"pid"`
			Reason    string `json:"reason"`
			TracerPID int    `json:"tracer_pid"`
		} `json:"unprobed_pids"`
		FilterSwitches uint64 `json:"filter_switches"`
		Probes         []struct {
			Symbol string `json:"symbol"`
			Offset uint64 `json:"offset"`
		} `json:"probes"`
	} `json:"attached_libraries"`
}

// waitTraced waits until /status shows, for the runtime and the driver
// file, exactly the processes of unprobed (pid -> tracer) left unprobed
// with reason traced, and probed as the per-process link sets (none:
// one set for every process). It returns that status.
func waitTraced(t *testing.T, a *testutil.Agent, unprobed map[int]int, probed []int) tracedStatus {
	t.Helper()
	var st tracedStatus
	err := testenv.Eventually(15*time.Second, func() error {
		st = tracedStatus{}
		if err := a.Status(&st); err != nil {
			return err
		}
		seen := 0
		for _, l := range st.AttachedLibraries {
			if l.Library != "libcudart.so" && l.Library != "libcuda.so" {
				continue
			}
			seen++
			got := map[int]int{}
			for _, u := range l.Unprobed {
				if u.Reason != attach.ReasonTraced {
					return fmt.Errorf("%s: unprobed %+v, want reason %s", l.Library, u, attach.ReasonTraced)
				}
				got[u.PID] = u.TracerPID
			}
			if fmt.Sprint(got) != fmt.Sprint(unprobed) || !slices.Equal(l.ProbedPIDs, probed) {
				return fmt.Errorf("%s: unprobed %v, probed_pids %v; want %v, %v", l.Library, got, l.ProbedPIDs, unprobed, probed)
			}
		}
		if seen != 2 {
			return fmt.Errorf("%d of the runtime and driver files attached", seen)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// probeInsn reads the instruction under the probe of sym in library file
// lib (as /status lists it: the symbol plus the probe's offset) from pid's
// memory and from the file.
func probeInsn(t *testing.T, pid int, lib, sym string, off uint64) (mem, file []byte) {
	t.Helper()
	ef, err := elf.Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	syms, err := ef.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	var fileOff uint64
	found := false
	for _, s := range syms {
		if s.Name != sym || elf.ST_TYPE(s.Info) != elf.STT_FUNC || s.Value == 0 {
			continue
		}
		for _, p := range ef.Progs {
			if p.Type == elf.PT_LOAD && p.Flags&elf.PF_X != 0 && s.Value >= p.Vaddr && s.Value < p.Vaddr+p.Filesz {
				fileOff, found = s.Value-p.Vaddr+p.Off+off, true
			}
		}
	}
	if !found {
		t.Fatalf("%s: no code of %s", lib, sym)
	}
	n := 1 // int3
	if runtime.GOARCH == "arm64" {
		n = 4 // BRK #5
	}
	file = make([]byte, n)
	f, err := os.Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.ReadAt(file, int64(fileOff)); err != nil {
		t.Fatal(err)
	}
	want, err := os.Stat(lib)
	if err != nil {
		t.Fatal(err)
	}
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(bytes.NewReader(maps))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[1][2] != 'x' {
			continue
		}
		st, err := os.Stat(fields[5])
		if err != nil || !os.SameFile(st, want) {
			continue
		}
		var start, end uint64
		if _, err := fmt.Sscanf(fields[0], "%x-%x", &start, &end); err != nil {
			t.Fatalf("/proc/%d/maps: %q: %v", pid, fields[0], err)
		}
		mapOff, err := strconv.ParseUint(fields[2], 16, 64)
		if err != nil {
			t.Fatalf("/proc/%d/maps: offset %q: %v", pid, fields[2], err)
		}
		if fileOff < mapOff || fileOff >= mapOff+end-start {
			continue
		}
		m, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		mem = make([]byte, n)
		if _, err := m.ReadAt(mem, int64(start+fileOff-mapOff)); err != nil {
			t.Fatalf("read pid %d's memory at %#x: %v", pid, start+fileOff-mapOff, err)
		}
		return mem, file
	}
	t.Fatalf("pid %d maps no code of %s at file offset %#x", pid, lib, fileOff)
	return nil, nil
}

// isBreakpoint reports whether insn is the kernel's uprobe breakpoint:
// int3 on x86-64, BRK #5 on arm64.
func isBreakpoint(insn []byte) bool {
	if runtime.GOARCH == "arm64" {
		return len(insn) == 4 && binary.LittleEndian.Uint32(insn) == 0xd42000a0
	}
	return len(insn) == 1 && insn[0] == 0xcc
}

// requireBreakpoints checks, with the kernel's own view (the process's
// memory), that the probe of cudaMalloc in the runtime file has its
// breakpoint in the processes of with and not in those of without.
func requireBreakpoints(t *testing.T, st tracedStatus, with, without []int) {
	t.Helper()
	for _, l := range st.AttachedLibraries {
		if l.Library != "libcudart.so" {
			continue
		}
		i := slices.IndexFunc(l.Probes, func(p struct {
			Symbol string `json:"symbol"`
			Offset uint64 `json:"offset"`
		}) bool {
			return p.Symbol == "cudaMalloc"
		})
		if i < 0 {
			t.Fatalf("no probe of cudaMalloc in %s", l.Path)
		}
		for _, pid := range with {
			if mem, file := probeInsn(t, pid, l.Path, "cudaMalloc", l.Probes[i].Offset); !isBreakpoint(mem) || isBreakpoint(file) {
				t.Errorf("pid %d: cudaMalloc+%d is %x in memory, %x in the file; want the uprobe breakpoint", pid, l.Probes[i].Offset, mem, file)
			}
		}
		for _, pid := range without {
			if mem, file := probeInsn(t, pid, l.Path, "cudaMalloc", l.Probes[i].Offset); !bytes.Equal(mem, file) {
				t.Errorf("pid %d: cudaMalloc+%d is %x in memory, %x in the file; want no breakpoint in a traced process", pid, l.Probes[i].Offset, mem, file)
			}
		}
		return
	}
	t.Fatal("the runtime file is not attached")
}

// layerStates are pid's layers by profi_system_process_layers
// ("runtime=probed", ...), in metric order.
func layerStates(t *testing.T, a *testutil.Agent, pid int) []string {
	t.Helper()
	mfs, err := a.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range testutil.Samples(mfs["profi_system_process_layers"]) {
		if s.Labels["pid"] == strconv.Itoa(pid) && s.Value == 1 {
			out = append(out, s.Labels["layer"]+"="+s.Labels["state"])
		}
	}
	slices.Sort(out)
	return out
}

// plus is a + b - c per series (cumulative ground truths of one process:
// the calls of phases a and b-after-c).
func plus(a, b, c values) values {
	out := values{}
	for k, v := range a {
		out[k] += v
	}
	for k, v := range b {
		out[k] += v
	}
	for k, v := range c {
		out[k] -= v
	}
	for k, v := range out {
		if v == 0 {
			delete(out, k)
		}
	}
	return out
}

// A workload run under a tracer (test/workloads/tracer.c, traced from
// before its exec) with --probe-traced-processes never gets no probe: no
// breakpoint in its memory (read at the probed address), none of its calls
// counted, /status says why (reason traced, the tracer's pid), while an
// untraced process of the same library files keeps its breakpoints and its
// exact counts across the switch to per-process links (uprobe_multi and
// classic links). auto on x86-64 and always probe it: exact counts,
// breakpoint present; auto on arm64 is never (the arm64 VM runs this).
func TestTracedProcessPolicy(t *testing.T) {
	for _, tc := range []struct {
		name, policy string
		args         []string
	}{
		{"never", attach.TracedNever, nil},
		// Per-process perf-event uprobes, as on kernels before 6.6.
		{"never-classic", attach.TracedNever, []string{"--no-uprobe-multi"}},
		{"auto", attach.TracedAuto, nil},
		{"always", attach.TracedAlways, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			excluded := attach.ExcludesTraced(tc.policy, runtime.GOARCH)
			a := startAgent(t, append([]string{"--probe-traced-processes=" + tc.policy}, tc.args...)...)
			u := startWorkload(t, fixtures.Workload, defaultArgs)
			waitAttached(t, a, u.PID)
			gtU1 := runPhase(t, u)
			requireExact(t, a, expected([]*testutil.GroundTruth{gtU1}), u.PID)

			tr := startWorkload(t, fixtures.Workload, defaultArgs, testutil.WithWrapper(fixtures.Tracer, "--"))
			tracer := tr.Cmd.Process.Pid
			if got := tracerOf(t, tr.PID); got != tracer {
				t.Fatalf("TracerPid of the traced workload %d, want the tracer %d", got, tracer)
			}
			var st tracedStatus
			if excluded {
				st = waitTraced(t, a, map[int]int{tr.PID: tracer}, []int{u.PID})
				requireBreakpoints(t, st, []int{u.PID}, []int{tr.PID})
				if got := layerStates(t, a, tr.PID); !slices.Equal(got, []string{"driver=unprobed", "nccl=absent", "nvtx=absent", "runtime=unprobed"}) {
					t.Errorf("layers of the traced process %v, want runtime and driver unprobed", got)
				}
			} else {
				waitAttached(t, a, tr.PID)
				st = waitTraced(t, a, map[int]int{}, nil)
				requireBreakpoints(t, st, []int{u.PID, tr.PID}, nil)
			}
			gtT := runPhase(t, tr)
			gtU2 := runPhase(t, u)
			if excluded {
				mfs := requireExact(t, a, expected([]*testutil.GroundTruth{gtU2}), u.PID)
				if d := diff(values{}, pidSeries(observed(mfs, tr.PID))); d != "" {
					t.Errorf("the traced process (%d calls) is counted:\n%s", gtT.TotalCalls(), d)
				}
			} else {
				requireExact(t, a, expected([]*testutil.GroundTruth{gtU2, gtT}), u.PID, tr.PID)
			}
			for _, l := range st.AttachedLibraries {
				want := uint64(0)
				if excluded {
					want = 1
				}
				if (l.Library == "libcudart.so" || l.Library == "libcuda.so") && l.FilterSwitches != want {
					t.Errorf("%s: %d switches to per-process links, want %d", l.Library, l.FilterSwitches, want)
				}
			}
			if err := u.Stop(); err != nil {
				t.Errorf("the untraced workload did not exit cleanly: %v", err)
			}
			if err := tr.Stop(); err != nil {
				t.Errorf("the traced workload did not exit cleanly: %v", err)
			}
		})
	}
}

// tracerOf is pid's TracerPid.
func tracerOf(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "TracerPid:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	t.Fatalf("no TracerPid in /proc/%d/status", pid)
	return 0
}

// startTracer attaches the tracer to pid and waits for "attached".
func startTracer(t *testing.T, pid int) (*exec.Cmd, *bufio.Scanner) {
	t.Helper()
	cmd := exec.Command(fixtures.Tracer, "--attach", strconv.Itoa(pid))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	sc := bufio.NewScanner(out)
	if !sc.Scan() || sc.Text() != fmt.Sprintf("attached %d", pid) {
		t.Fatalf("tracer printed %q, want \"attached %d\"", sc.Text(), pid)
	}
	return cmd, sc
}

// A tracer that attaches to a running, probed workload mid-run takes its
// probes off (no breakpoint left in its memory, its calls meanwhile not
// counted), and when it detaches the probes come back: the workload's
// counts are exactly its phases before and after the trace, an untraced
// process of the same files stays exact throughout, and the files go
// back to one link set for every process (two switches each).
func TestTracerAttachesAndLeaves(t *testing.T) {
	a := startAgent(t, "--probe-traced-processes=never")
	u := startWorkload(t, fixtures.Workload, defaultArgs)
	w := startWorkload(t, fixtures.Workload, defaultArgs)
	waitAttached(t, a, u.PID)
	waitAttached(t, a, w.PID)
	gtW1, gtU1 := runPhase(t, w), runPhase(t, u)
	requireExact(t, a, expected([]*testutil.GroundTruth{gtW1, gtU1}), w.PID, u.PID)
	st := waitTraced(t, a, map[int]int{}, nil)
	requireBreakpoints(t, st, []int{u.PID, w.PID}, nil)

	tracer, out := startTracer(t, w.PID)
	st = waitTraced(t, a, map[int]int{w.PID: tracer.Process.Pid}, []int{u.PID})
	requireBreakpoints(t, st, []int{u.PID}, []int{w.PID})
	gtW2, gtU2 := runPhase(t, w), runPhase(t, u)
	requirePerPID(t, a, pidSeries(expected([]*testutil.GroundTruth{gtU2})), u.PID)
	requirePerPID(t, a, pidSeries(expected([]*testutil.GroundTruth{gtW1})), w.PID)

	left := time.Now()
	if err := tracer.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if !out.Scan() || out.Text() != fmt.Sprintf("detached %d", w.PID) {
		t.Fatalf("tracer printed %q, want \"detached %d\"", out.Text(), w.PID)
	}
	if err := tracer.Wait(); err != nil {
		t.Fatalf("tracer: %v", err)
	}
	st = waitTraced(t, a, map[int]int{}, nil)
	t.Logf("tracer left to probes back: %.3f s", time.Since(left).Seconds())
	requireBreakpoints(t, st, []int{u.PID, w.PID}, nil)
	for _, l := range st.AttachedLibraries {
		if (l.Library == "libcudart.so" || l.Library == "libcuda.so") && l.FilterSwitches != 2 {
			t.Errorf("%s: %d switches, want 2 (to per-process links and back)", l.Library, l.FilterSwitches)
		}
	}
	gtW3, gtU3 := runPhase(t, w), runPhase(t, u)
	e := func(g *testutil.GroundTruth) values { return pidSeries(expected([]*testutil.GroundTruth{g})) }
	requirePerPID(t, a, e(gtU3), u.PID)
	requirePerPID(t, a, plus(e(gtW1), e(gtW3), e(gtW2)), w.PID)
	// The entry-only gap of each switch (docs/OPERATIONS.md, "Traced processes").
	for _, l := range a.LogLines("probe link sets switched") {
		t.Log(l)
	}
	for _, w := range []*testutil.Workload{u, w} {
		if err := w.Stop(); err != nil {
			t.Errorf("workload %d did not exit cleanly: %v", w.PID, err)
		}
	}
}

// The untraced process's timed calls stay exact while its files switch to
// per-process links and back under it: it runs one long phase while a
// tracer attaches to another process of the same files and leaves again
// (docs/OPERATIONS.md, "Traced processes": the new return-probe links
// attach before the old ones close, and a call both see counts once).
// Its launches (entry-only probes) are never counted twice; those that
// enter during a switch's gap are not counted (logged). The phase lasts
// until both switches are over (the workload runs until the test says
// stop), pausing 0.5 ms after each iteration, so that how long the
// switches take bounds how many calls it makes (10^4 to 10^6).
func TestTracedSwitchUnderLoad(t *testing.T) {
	a := startAgent(t, "--probe-traced-processes=never")
	args := append(slices.Clone(breakerArgs), "--iters", "200", "--pause-us", "500")
	u := startWorkload(t, fixtures.Workload, args)
	w := startWorkload(t, fixtures.Workload, breakerArgs)
	waitAttached(t, a, u.PID)
	waitAttached(t, a, w.PID)

	began := time.Now()
	var st tracedStatus
	gt, err := u.RunUntil(func() {
		tracer, out := startTracer(t, w.PID)
		waitTraced(t, a, map[int]int{w.PID: tracer.Process.Pid}, []int{u.PID})
		if err := tracer.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if !out.Scan() || out.Text() != fmt.Sprintf("detached %d", w.PID) {
			t.Fatalf("tracer printed %q, want \"detached %d\"", out.Text(), w.PID)
		}
		_ = tracer.Wait()
		st = waitTraced(t, a, map[int]int{}, nil)
	})
	if err != nil {
		t.Fatalf("workload run: %v\n%s", err, u.Stderr())
	}
	t.Logf("phase of %d calls (%d launches) across both switches", gt.TotalCalls(), gt.Launches)
	for _, l := range st.AttachedLibraries {
		if (l.Library == "libcudart.so" || l.Library == "libcuda.so") && l.FilterSwitches != 2 {
			t.Errorf("%s: %d switches, want 2", l.Library, l.FilterSwitches)
		}
	}
	// Timed calls: exact. Launches (entry-only probes): never more than
	// the ground truth; those entering during a gap are not counted.
	want := pidSeries(expected([]*testutil.GroundTruth{gt}))
	timed, entryOnly := values{}, values{}
	for k, v := range want {
		if launchSeries(k) {
			entryOnly[k] = v
		} else {
			timed[k] = v
		}
	}
	waitDrainAfter(t, a, time.Now())
	mfs, err := a.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	got := pidSeries(observed(mfs, u.PID))
	gotTimed, gotEntry := values{}, values{}
	for k, v := range got {
		if launchSeries(k) {
			gotEntry[k] = v
		} else {
			gotTimed[k] = v
		}
	}
	if d := diff(timed, gotTimed); d != "" {
		t.Errorf("timed calls across the switches differ from the ground truth:\n%s", d)
	}
	var lost float64
	for k, v := range entryOnly {
		if gotEntry[k] > v {
			t.Errorf("%s: %v counted, more than the %v made: a double count", k, gotEntry[k], v)
		}
		if strings.HasPrefix(k, "profi_cuda_kernel_launches_total") {
			lost += v - gotEntry[k]
		}
	}
	for k := range gotEntry {
		if _, ok := entryOnly[k]; !ok {
			t.Errorf("unexpected series %s", k)
		}
	}
	t.Logf("launches (entry-only probes) not counted in the gaps of 4 switches: %v of %v", lost, gt.Launches)
	// The gaps are never silent: each file's two switches, each with a
	// process that stayed probed, are counted, with their length.
	for _, lib := range []string{"libcudart.so", "libcuda.so"} {
		var n, secs float64
		for _, s := range testutil.Samples(mfs["profi_system_probe_switch_gaps_total"]) {
			if s.Labels["library"] == lib {
				n = s.Value
			}
		}
		for _, s := range testutil.Samples(mfs["profi_system_probe_switch_gap_seconds_total"]) {
			if s.Labels["library"] == lib {
				secs = s.Value
			}
		}
		if n != 2 {
			t.Errorf("profi_system_probe_switch_gaps_total{library=%q} = %v, want 2", lib, n)
		}
		if secs <= 0 || secs > time.Since(began).Seconds() {
			t.Errorf("profi_system_probe_switch_gap_seconds_total{library=%q} = %v, want in (0, %v]", lib, secs, time.Since(began).Seconds())
		}
		t.Logf("%s: %v gaps, %.1f ms in all", lib, n, secs*1000)
	}
	for _, w := range []*testutil.Workload{u, w} {
		if err := w.Stop(); err != nil {
			t.Errorf("workload %d did not exit cleanly: %v", w.PID, err)
		}
	}
}

// launchSeries: a series counted by the entry-only launch probe.
func launchSeries(k string) bool {
	return strings.Contains(k, "operation=cudaLaunchKernel") || strings.HasPrefix(k, "profi_cuda_kernel_")
}
