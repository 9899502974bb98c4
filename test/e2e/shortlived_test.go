package e2e

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// launchEntryRuns is how often the agent's launch_entry programs have run
// (the kernel's BPF run-time statistics, on while the test runs): every
// trap of a launch probe, runtime's or driver's, is one run. The programs
// are found among the agent's own file descriptors.
func launchEntryRuns(t *testing.T, a *testutil.Agent) uint64 {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fdinfo", a.PID())
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[ebpf.ProgramID]bool{}
	var runs uint64
	for _, e := range ents {
		raw, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		for _, line := range strings.Split(string(raw), "\n") {
			v, ok := strings.CutPrefix(line, "prog_id:")
			if !ok {
				continue
			}
			id, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
			if err != nil || seen[ebpf.ProgramID(id)] {
				continue
			}
			seen[ebpf.ProgramID(id)] = true
			p, err := ebpf.NewProgramFromID(ebpf.ProgramID(id))
			if err != nil {
				t.Fatal(err)
			}
			info, err := p.Info()
			if err == nil && info.Name == "launch_entry" {
				st, err := p.Stats()
				if err != nil {
					t.Fatal(err)
				}
				runs += st.RunCount
			}
			p.Close()
		}
	}
	if len(seen) == 0 {
		t.Fatalf("no BPF program among the agent's file descriptors (%s)", dir)
	}
	return runs
}

// waitReleased waits until the agent has released every runtime file: no
// process maps one any more.
func waitReleased(t *testing.T, a *testutil.Agent) {
	t.Helper()
	err := testenv.Eventually(10*time.Second, func() error {
		var st status
		if err := a.Status(&st); err != nil {
			return err
		}
		if n := countLib(st, string(discover.LibCudart)); n > 0 {
			return fmt.Errorf("%d runtime files still attached", n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

var handedAll = []string{"__cudaLaunchKernel", "__cudaLaunchKernel_ptsz", "cudaLaunchKernel", "cudaLaunchKernel_ptsz"}

// teach runs launch13 once under a (tn + tm launches, exact) and returns
// it, still running.
func teach(t *testing.T, a *testutil.Agent, tn, tm int) *client {
	t.Helper()
	c := startClient(t, nil, fixtures.Launch13, strconv.Itoa(tn), strconv.Itoa(tm))
	waitAttached(t, a, c.PID)
	requireLaunch13(t, a, c.PID, tn, tm, c.Go(t))
	return c
}

// requireLaunch13 requires profi's series of launch13 process pid, which
// made n + m launches (anonymous mode), to equal its ground-truth line.
func requireLaunch13(t *testing.T, a *testutil.Agent, pid, n, m int, line string) {
	t.Helper()
	var gt launch13Truth
	if err := json.Unmarshal([]byte(line), &gt); err != nil {
		t.Fatalf("launch13 output %q: %v", line, err)
	}
	p := "pid=" + strconv.Itoa(pid)
	want := values{key("profi_cuda_malloc_bytes_total", p): 0, key("profi_cuda_active_memory_bytes", p): 0}
	maps.Copy(want, anonymousLaunches(p, n, m, gt))
	requireExact(t, a, want, pid)
}

// Short processes (issue 33): batch jobs and evaluation scripts launch for
// a second or less and exit, and the runtime file is released between
// them. After one process taught profi the runtime file and exited, each
// of five processes started later, each alone (the file released before
// it and attached again for it), launches with one trap per launch from
// its first launch (launch_entry's runs, from the kernel's BPF statistics:
// n + m, where the runtime's probe and the tail jump's would make 2(n + m)
// or 3(n + m)), none counted at the runtime and skipped at the driver, and
// every count exact.
func TestOneTrapPerLaunchShortProcesses(t *testing.T) {
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		t.Skipf("BPF run-time statistics unavailable: %v", err)
	}
	defer stats.Close()
	a := startAgent(t, "--kernel-mode", "anonymous")
	teach(t, a, 2000, 1000).Exit(t)
	waitReleased(t, a)
	const n, m = 3000, 2000
	for i := range 5 {
		c := startClient(t, nil, fixtures.Launch13, strconv.Itoa(n), strconv.Itoa(m))
		waitAttached(t, a, c.PID)
		if counted, _ := handover(t, a); !slices.Equal(counted, handedAll) {
			t.Errorf("process %d: launch probes counted at the driver %v at its first pass, want %v", i, counted, handedAll)
		}
		_, before := handover(t, a)
		runs := launchEntryRuns(t, a)
		began := time.Now()
		line := c.Go(t)
		took := time.Since(began)
		runs = launchEntryRuns(t, a) - runs
		requireLaunch13(t, a, c.PID, n, m, line)
		_, after := handover(t, a)
		c.Exit(t)
		t.Logf("process %d: %d launches in %v, %d launch probe runs", i, n+m, took, runs)
		if runs != n+m {
			t.Errorf("process %d: %d launch probe runs for %d launches, want one per launch", i, runs, n+m)
		}
		if d, tails := after["runtime_to_driver"]-before["runtime_to_driver"], after["nested"]-before["nested"]; d != 0 || tails != 0 {
			t.Errorf("process %d: runtime_to_driver +%d, nested +%d, want 0 and 0", i, d, tails)
		}
		waitReleased(t, a)
	}
}

// waitHandedOver waits until the runtime launch probes counted at the
// driver are want, and returns how long that took.
func waitHandedOver(t *testing.T, a *testutil.Agent, want []string) time.Duration {
	t.Helper()
	began := time.Now()
	err := testenv.Eventually(10*time.Second, func() error {
		if counted, _ := handover(t, a); !slices.Equal(counted, want) {
			return fmt.Errorf("launch probes counted at the driver %v, want %v", counted, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return time.Since(began)
}

// A runtime file profi has not learned yet, in a process that lives a
// second or less (issue 33): it hands its launches over to the driver
// within its first launches, not at the next discovery pass (an hour
// away here; the loader hook attaches the process). The client stops
// after k launches of each API; by then BPF has reported through
// rt_learned that the API's launches reach the driver, and the test waits
// for the handover, which no pass can run (the client loads no library
// after its attach). Between the stops every launch costs exactly one launch_entry
// run (the kernel's BPF statistics), the wake-ups ran the handover once
// per API, and every count is exact.
func TestOneTrapPerLaunchNewFile(t *testing.T) {
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		t.Skipf("BPF run-time statistics unavailable: %v", err)
	}
	defer stats.Close()
	a := startAgent(t, "--kernel-mode", "anonymous", "--refresh-interval", "3600")
	waitLoaderHooked(t, a)
	const n, m, k = 3000, 1000, 100
	c := startClient(t, []string{fmt.Sprintf("LAUNCH13_PAUSE_AT=%d,%d,%d", k, n, n+k)}, fixtures.Launch13, strconv.Itoa(n), strconv.Itoa(m))
	waitAttached(t, a, c.PID)
	if counted, _ := handover(t, a); len(counted) != 0 {
		t.Fatalf("launch probes counted at the driver %v before any launch of a new file", counted)
	}
	// Each stop: the launches since the previous one, the APIs whose
	// handover must have run by then, and whether those launches were all
	// made after a handover (one trap each).
	stops := []struct {
		at      int
		handed  []string
		oneTrap bool
	}{
		{k, []string{"__cudaLaunchKernel", "cudaLaunchKernel"}, false},
		{n, []string{"__cudaLaunchKernel", "cudaLaunchKernel"}, true},
		{n + k, handedAll, false},
		{n + m, handedAll, true},
	}
	from := 0
	for _, s := range stops {
		runs := launchEntryRuns(t, a)
		line := c.Go(t)
		runs = launchEntryRuns(t, a) - runs
		if s.at < n+m && line != fmt.Sprintf("paused %d\n", s.at) {
			t.Fatalf("launch13: %q, want paused %d", line, s.at)
		}
		took := waitHandedOver(t, a, s.handed)
		t.Logf("launches %d..%d: %d launch probe runs; handed over %v %v later", from, s.at, runs, s.handed, took)
		if s.oneTrap && runs != uint64(s.at-from) {
			t.Errorf("launches %d..%d: %d launch probe runs, want one per launch (%d)", from, s.at, runs, s.at-from)
		}
		if s.at == n+m {
			requireLaunch13(t, a, c.PID, n, m, line)
		}
		from = s.at
	}
	mfs, err := a.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	wakeups := series(mfs, "profi_system_handover_wakeups_total", "result")
	if ran, limited := wakeups["ran"], wakeups["rate_limited"]; ran != 2 || limited != 0 {
		t.Errorf("handover wake-ups: %v ran, %v rate-limited; want 2 (one per launch API) and 0", ran, limited)
	}
	c.Exit(t)
}

// A process that maps a runtime file already attached and handed over, and
// launches before any pass registers it (issue 46: a batch step, a
// restarted worker), is counted from its first launch, as the runtime's
// ops, with one trap each: its launches' own mappings tell BPF that the
// runtime made them (unseen_text in bpf/handover.h). No pass can run
// here: the agent is stopped (SIGSTOP; its probes run on) from before the
// process starts until its launches are over. Before this, each launch
// counted as cuLaunchKernel until a pass registered the process. "exited":
// the process also exits before the agent runs again, so no drain ever
// sees it alive: its series are there all the same, under its pid and
// comm, from what BPF noted of it (unseen_procs); before, its launches
// were in no series at all.
func TestUnseenProcessCountedFromFirstLaunch(t *testing.T) {
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		t.Skipf("BPF run-time statistics unavailable: %v", err)
	}
	defer stats.Close()
	a := startAgent(t, "--kernel-mode", "anonymous")
	holder := teach(t, a, 2000, 1000)
	defer holder.Exit(t)
	waitHandedOver(t, a, handedAll)
	for _, exits := range []bool{false, true} {
		name := "alive"
		if exits {
			name = "exited"
		}
		t.Run(name, func(t *testing.T) {
			const n, m = 3000, 2000
			if err := unix.Kill(a.PID(), unix.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			stopped := true
			defer func() {
				if stopped {
					_ = unix.Kill(a.PID(), unix.SIGCONT)
				}
			}()
			c := startClient(t, nil, fixtures.Launch13, strconv.Itoa(n), strconv.Itoa(m))
			runs := launchEntryRuns(t, a)
			line := c.Go(t)
			runs = launchEntryRuns(t, a) - runs
			if exits {
				c.Exit(t)
			}
			if err := unix.Kill(a.PID(), unix.SIGCONT); err != nil {
				t.Fatal(err)
			}
			stopped = false
			requireLaunch13(t, a, c.PID, n, m, line)
			if runs != n+m {
				t.Errorf("%d launch probe runs for %d launches made before any pass, want one per launch", runs, n+m)
			}
			if exits {
				// Under its own comm, as BPF noted it (the executable's name, at most 15 bytes).
				mfs, err := a.Metrics()
				if err != nil {
					t.Fatal(err)
				}
				k := strconv.Itoa(c.PID) + "|" + launch13Comm()
				if got := series(mfs, "profi_cuda_kernel_launches_total", "pid", "comm")[k]; got != n+m {
					t.Errorf("launches under pid|comm %s: %v, want %d", k, got, n+m)
				}
				return
			}
			c.Exit(t)
		})
	}
}

// Issue 46's shape: a long-lived process holds a runtime file; five
// processes map it, make 30,000 launches each at once (no pass has
// registered them: their first launch does not wait) and exit, and a
// longer one (60,000 launches) lives across drains, then exits. A single
// scrape 3 s after the last exit shows every launch of every one of them
// under its own pid, exactly (Prometheus scrapes every 15-60 s: none of it
// may be gone by then). Once the holder has exited too, --gc-interval
// later, all of them fold into pid="" series that keep the sum exactly.
func TestShortProcessesCountedAfterExit(t *testing.T) {
	const gc = 10 * time.Second
	a := startAgent(t, "--kernel-mode", "anonymous", "--gc-interval", strconv.Itoa(int(gc/time.Second)))
	holder := teach(t, a, 2000, 1000)
	waitHandedOver(t, a, handedAll)
	want := values{}
	var pids []int
	total := 3000.0
	add := func(pid, n, m int, line string) {
		var gt launch13Truth
		if err := json.Unmarshal([]byte(line), &gt); err != nil {
			t.Fatalf("launch13 output %q: %v", line, err)
		}
		maps.Copy(want, anonymousLaunches("pid="+strconv.Itoa(pid), n, m, gt))
		pids = append(pids, pid)
		total += float64(n + m)
	}
	for range 5 {
		const n, m = 20000, 10000
		c := startClient(t, nil, fixtures.Launch13, strconv.Itoa(n), strconv.Itoa(m))
		line := c.Go(t)
		c.Exit(t)
		add(c.PID, n, m, line)
	}
	const n, m = 40000, 20000
	long := startClient(t, []string{"LAUNCH13_PAUSE_AT=20000"}, fixtures.Launch13, strconv.Itoa(n), strconv.Itoa(m))
	if line := long.Go(t); line != "paused 20000\n" {
		t.Fatalf("launch13: %q, want paused 20000", line)
	}
	time.Sleep(2 * time.Second) // two drains see it alive
	line := long.Go(t)
	long.Exit(t)
	add(long.PID, n, m, line)

	time.Sleep(3 * time.Second)
	mfs, err := a.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	if d := diff(want, observed(mfs, pids...)); d != "" {
		t.Fatalf("a scrape 3 s after the last exit differs from the ground truth:\n%s%s", d, dropCounters(mfs))
	}

	holder.Exit(t)
	err = testenv.Eventually(gc+15*time.Second, func() error {
		mfs, err := a.Metrics()
		if err != nil {
			return err
		}
		if left := observed(mfs, append(pids, holder.PID)...); len(left) > 0 {
			return fmt.Errorf("%d series of the exited processes not folded yet", len(left))
		}
		folded := series(mfs, "profi_cuda_kernel_launches_total", "pid", "comm")["|"+launch13Comm()]
		if folded != total {
			return fmt.Errorf("folded launches %v, want %v (every process's)", folded, total)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// launch13Comm is launch13's comm: its executable's name, at most 15 bytes.
func launch13Comm() string {
	comm := filepath.Base(fixtures.Launch13)
	return comm[:min(len(comm), 15)]
}

// A runtime file a process holds without launching (so it has learned
// nothing), then processes that launch at once, 30,000 times, and exit
// (issue 46): they learn the file themselves, before any pass registers
// them (their file's facts say PF_RT_MARK, their own mappings give the
// range), so the first hands the file over to the driver within its own
// launches, and every later one costs one trap per launch (launch_entry's
// runs, from the kernel's BPF statistics), every count exact. Before,
// such processes cost two traps per launch, run after run, until one
// lived long enough to be registered and learn.
func TestShortProcessesLearnTheirRuntime(t *testing.T) {
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		t.Skipf("BPF run-time statistics unavailable: %v", err)
	}
	defer stats.Close()
	a := startAgent(t, "--kernel-mode", "anonymous")
	holder := startClient(t, nil, fixtures.Launch13, "1", "1")
	defer holder.Exit(t)
	waitAttached(t, a, holder.PID)
	const n, m = 20000, 10000
	for i := range 4 {
		runs := launchEntryRuns(t, a)
		c := startClient(t, nil, fixtures.Launch13, strconv.Itoa(n), strconv.Itoa(m))
		line := c.Go(t)
		c.Exit(t)
		runs = launchEntryRuns(t, a) - runs
		t.Logf("process %d: %d launch probe runs for %d launches", i, runs, n+m)
		if i > 0 && runs != n+m {
			t.Errorf("process %d: %d launch probe runs for %d launches, want one per launch", i, runs, n+m)
		}
		var gt launch13Truth
		if err := json.Unmarshal([]byte(line), &gt); err != nil {
			t.Fatalf("launch13 output %q: %v", line, err)
		}
		requireExact(t, a, anonymousLaunches("pid="+strconv.Itoa(c.PID), n, m, gt), c.PID)
	}
	if counted, _ := handover(t, a); !slices.Equal(counted, handedAll) {
		t.Errorf("launch probes counted at the driver %v, want %v", counted, handedAll)
	}
}
