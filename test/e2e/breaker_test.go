package e2e

import (
	"fmt"
	"maps"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// breakerArgs: the workload makes runtime calls only (no launches, no
// graphs), whose stubs call no driver function: every probe hit of its
// calls is in libcudart, and once libcudart is quarantined nothing of it
// is counted (the driver's probes stay on: another file).
var breakerArgs = []string{"--launches", "0", "--graphs", "0"}

// quarantineStatus is the crash breaker's part of /status.
type quarantineStatus struct {
	Quarantined []struct {
		Library         string     `json:"library"`
		Path            string     `json:"path"`
		File            string     `json:"file"`
		Reason          string     `json:"reason"`
		Scope           string     `json:"scope"`
		Tenant          uint64     `json:"tenant"`
		Evidence        []string   `json:"evidence"`
		PID             int        `json:"pid"`
		Comm            string     `json:"comm"`
		Signal          string     `json:"signal"`
		Time            time.Time  `json:"time"`
		SinceHitSeconds float64    `json:"seconds_since_probe_hit"`
		DetachSeconds   float64    `json:"detach_seconds"`
		PIDs            []int      `json:"pids"`
		LiftsAt         *time.Time `json:"lifts_at"`
	} `json:"quarantined"`
	Degraded          bool      `json:"degraded"`
	DegradedReasons   []string  `json:"degraded_reasons"`
	LastDrain         time.Time `json:"last_drain"`
	AttachedLibraries []struct {
		Library  string `json:"library"`
		Path     string `json:"path"`
		PIDs     []int  `json:"pids"`
		Unprobed []struct {
			PID    int    `json:"pid"`
			Reason string `json:"reason"`
		} `json:"unprobed_pids"`
	} `json:"attached_libraries"`
}

// pidSeries keeps the per-process series of v (those of the given pids, as
// observed selects them; histogram families sum over every process)
// except the driver's operations: the driver file is not quarantined, and
// once the runtime's probes are off, the driver calls the stub runtime
// makes inside runtime calls (graph instantiation and launches) are no
// longer recognised as the runtime's and count as driver calls, which no
// ground truth lists.
func pidSeries(v values) values {
	out := values{}
	for k, x := range v {
		if strings.Contains(k, "pid=") && !driverOp.MatchString(k) {
			out[k] = x
		}
	}
	return out
}

var driverOp = regexp.MustCompile(`operation=cu[A-Z]`)

// waitDrainAfter waits until the agent drained its maps after t, so a
// scrape shows every call made before t.
func waitDrainAfter(t *testing.T, a *testutil.Agent, after time.Time) {
	t.Helper()
	err := testenv.Eventually(10*time.Second, func() error {
		var st quarantineStatus
		if err := a.Status(&st); err != nil {
			return err
		}
		if !st.LastDrain.After(after) {
			return fmt.Errorf("last drain %v, not after %v", st.LastDrain, after)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// waitQuarantined waits until /status lists n quarantines, the first of
// scope (any if "").
func waitQuarantined(t *testing.T, a *testutil.Agent, n int, scope string) quarantineStatus {
	t.Helper()
	var st quarantineStatus
	// Closing or switching links waits for RCU grace periods: long in an
	// emulated VM (the VM lanes run this).
	err := testenv.Eventually(60*time.Second, func() error {
		st = quarantineStatus{}
		if err := a.Status(&st); err != nil {
			return err
		}
		if len(st.Quarantined) != n {
			return fmt.Errorf("%d quarantines, want %d: %+v", len(st.Quarantined), n, st.Quarantined)
		}
		if n > 0 && scope != "" && st.Quarantined[0].Scope != scope {
			return fmt.Errorf("quarantine of scope %q, want %q: %+v", st.Quarantined[0].Scope, scope, st.Quarantined[0])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// quarantineCount reads profi_system_probe_quarantines_total and
// profi_system_probe_quarantined_files by "library/reason/scope".
func quarantineCount(t *testing.T, a *testutil.Agent) (total, inForce map[string]float64) {
	t.Helper()
	mfs, err := a.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	read := func(name string) map[string]float64 {
		out := map[string]float64{}
		for _, s := range testutil.Samples(mfs[name]) {
			out[s.Labels["library"]+"/"+s.Labels["reason"]+"/"+s.Labels["scope"]] = s.Value
		}
		return out
	}
	return read("profi_system_probe_quarantines_total"), read("profi_system_probe_quarantined_files")
}

// faultCounts reads profi_system_probed_process_faults_total by
// "reason/attributed".
func faultCounts(t *testing.T, a *testutil.Agent) map[string]float64 {
	t.Helper()
	mfs, err := a.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, s := range testutil.Samples(mfs["profi_system_probed_process_faults_total"]) {
		out[s.Labels["reason"]+"/"+s.Labels["attributed"]] = s.Value
	}
	return out
}

// crash is a workload command after which it dies, and of what.
type crash struct {
	cmd    string
	signal syscall.Signal
	name   string
}

// attributedCrashes are the workload's deaths a probe explains (issue 42
// item 3): after a probed call, a jump into the uprobe out-of-line page at
// an offset no copied instruction uses (zeros: x86-64's "add %al,(%rax)"
// with rax 0 faults with SIGSEGV, arm64's udf with SIGILL), and a call of
// the return probe trampoline with no return pending (the kernel's SIGILL).
func attributedCrashes() []crash {
	xol := crash{"xol", syscall.SIGSEGV, "SIGSEGV"}
	if runtime.GOARCH == "arm64" {
		xol = crash{"xol", syscall.SIGILL, "SIGILL"}
	}
	return []crash{xol, {"tramp", syscall.SIGILL, "SIGILL"}}
}

// die sends w a command after which it dies and checks it died of c.
func die(t *testing.T, w *testutil.Workload, c crash) {
	t.Helper()
	ws, err := w.Die(c.cmd)
	if err != nil {
		t.Fatal(err)
	}
	if !ws.Signaled() || ws.Signal() != c.signal {
		t.Fatalf("workload %q: exit status %v, want killed by %v", c.cmd, ws, c.signal)
	}
}

// A probed process that dies of a fault a probe explains (issue 42 items
// 1 to 3) quarantines its runtime file for its tenant (its pod, else its cgroup): a
// process of the same tenant is left unprobed there (its calls stop
// counting, /status says why), a healthy process of another tenant stays
// exact. The same crash in a third tenant takes the file's probes off
// node-wide: then the healthy process's calls stop counting too. /status,
// the metrics and the log lines say so exactly.
func TestCrashBreakerQuarantine(t *testing.T) {
	for _, tc := range attributedCrashes() {
		t.Run(tc.cmd, func(t *testing.T) {
			a := startAgent(t)
			cgA, cgB, cgC := inNewCgroup(t, tc.cmd+"-a"), inNewCgroup(t, tc.cmd+"-b"), inNewCgroup(t, tc.cmd+"-c")
			dying := startWorkload(t, fixtures.Workload, breakerArgs, cgA)
			sibling := startWorkload(t, fixtures.Workload, breakerArgs, cgA)
			other := startWorkload(t, fixtures.Workload, breakerArgs, cgB)
			for _, w := range []*testutil.Workload{dying, sibling, other} {
				waitAttached(t, a, w.PID)
			}
			gtSibling, gtOther := runPhase(t, sibling), runPhase(t, other)
			requireExact(t, a, expected([]*testutil.GroundTruth{gtSibling, gtOther}), sibling.PID, other.PID)

			die(t, dying, tc)
			st := waitQuarantined(t, a, 1, "tenant")
			q := st.Quarantined[0]
			cudart, err := filepath.EvalSymlinks(fixtures.Cudart)
			if err != nil {
				t.Fatal(err)
			}
			// The lift is 600 s after the quarantine took effect: the death
			// plus the time to switch the links (seconds in an emulated VM).
			var lifts time.Duration
			if q.LiftsAt != nil {
				lifts = q.LiftsAt.Sub(q.Time) - time.Duration(q.DetachSeconds*float64(time.Second))
			}
			if q.Library != "libcudart.so" || q.Path != cudart || q.PID != dying.PID || q.Comm != "workload" || q.Signal != tc.name ||
				q.Reason != strings.ToLower(tc.name) || !slices.Contains(q.Evidence, "out_of_line_page") || q.Tenant == 0 ||
				lifts < 599*time.Second || lifts > 601*time.Second {
				t.Errorf("quarantine %+v; want libcudart.so %s for the tenant of pid %d (workload), %s, evidence out_of_line_page, lifting in 600 s", q, cudart, dying.PID, tc.name)
			}
			t.Logf("%s (%s): %.6f s from the probe hit to the fault exit, %.6f s from the exit to the tenant's links switched", tc.cmd, tc.name, q.SinceHitSeconds, q.DetachSeconds)
			if !st.Degraded || len(st.DegradedReasons) != 1 || !strings.Contains(st.DegradedReasons[0], fmt.Sprintf("process %d (workload) died of %s", dying.PID, tc.name)) {
				t.Errorf("degraded %v %q; want one reason naming pid %d and %s", st.Degraded, st.DegradedReasons, dying.PID, tc.name)
			}
			unprobed := map[int]string{}
			for _, l := range st.AttachedLibraries {
				if l.Library == "libcudart.so" && l.Path == cudart {
					for _, u := range l.Unprobed {
						unprobed[u.PID] = u.Reason
					}
				}
			}
			if unprobed[sibling.PID] != "quarantined" || unprobed[other.PID] != "" {
				t.Errorf("unprobed in the runtime file %v; want the sibling (pid %d) quarantined, the other tenant's (pid %d) probed", unprobed, sibling.PID, other.PID)
			}
			// The quarantine shows in /status before its log line is
			// written and read back from the agent's stderr.
			if err := testenv.Eventually(10*time.Second, func() error {
				if lines := a.LogLines("probes quarantined for one tenant"); len(lines) != 1 || !strings.Contains(lines[0], "level=WARN") {
					return fmt.Errorf("log lines about the tenant quarantine %q, want one WARN line", lines)
				}
				return nil
			}); err != nil {
				t.Error(err)
			}

			// The other tenant stays exact; the sibling's calls no longer count.
			gtSibling2, gtOther2 := runPhase(t, sibling), runPhase(t, other)
			if gtSibling2.TotalCalls() <= gtSibling.TotalCalls() {
				t.Fatalf("the sibling's second phase made no calls: %d then %d", gtSibling.TotalCalls(), gtSibling2.TotalCalls())
			}
			requirePerPID(t, a, pidSeries(expected([]*testutil.GroundTruth{gtSibling, gtOther2})), sibling.PID, other.PID)

			// The same crash in a third tenant: node-wide.
			third := startWorkload(t, fixtures.Workload, breakerArgs, cgC)
			waitAttached(t, a, third.PID)
			die(t, third, tc)
			st = waitQuarantined(t, a, 1, "node")
			if q := st.Quarantined[0]; q.PID != third.PID || q.Path != cudart {
				t.Errorf("node-wide quarantine %+v; want pid %d's, of %s", q, third.PID, cudart)
			}
			for _, l := range st.AttachedLibraries {
				if l.Library == "libcudart.so" && l.Path == cudart {
					t.Errorf("the quarantined file is still attached: %+v", l)
				}
			}
			gtOther3 := runPhase(t, other)
			late := startWorkload(t, fixtures.Workload, breakerArgs, cgB)
			gtLate := runPhase(t, late)
			waitDrainAfter(t, a, time.Now())
			mfs, err := a.Metrics()
			if err != nil {
				t.Fatal(err)
			}
			if d := diff(pidSeries(expected([]*testutil.GroundTruth{gtOther2})), pidSeries(observed(mfs, other.PID, late.PID))); d != "" {
				t.Errorf("after the node-wide quarantine, the other process counts only its first two phases (%d calls, not %d) and a late one nothing (%d calls):\n%s",
					gtOther2.TotalCalls(), gtOther3.TotalCalls(), gtLate.TotalCalls(), d)
			}
			if lines := a.LogLines("probes quarantined node-wide"); len(lines) != 1 || !strings.Contains(lines[0], "level=ERROR") {
				t.Errorf("log lines about the node-wide quarantine %q, want one ERROR line", lines)
			}
			reason := strings.ToLower(tc.name)
			total, inForce := quarantineCount(t, a)
			if want := map[string]float64{"libcudart.so/" + reason + "/tenant": 1, "libcudart.so/" + reason + "/node": 1}; !maps.Equal(total, want) {
				t.Errorf("profi_system_probe_quarantines_total %v, want %v", total, want)
			}
			if want := map[string]float64{"libcudart.so/" + reason + "/node": 1}; !maps.Equal(inForce, want) {
				t.Errorf("profi_system_probe_quarantined_files %v, want %v", inForce, want)
			}
			if got, want := faultCounts(t, a), map[string]float64{reason + "/true": 2}; !maps.Equal(got, want) {
				t.Errorf("profi_system_probed_process_faults_total %v, want %v", got, want)
			}
			if err := other.Stop(); err != nil {
				t.Errorf("the other process did not exit cleanly: %v", err)
			}
		})
	}
}

// Deaths no probe explains never quarantine (issue 42 item 3): a fault in
// the process's own code right after a probed call (a NULL store, an
// undefined instruction), every fault signal a process sends itself with
// kill, tgkill and sigqueue, one queued with a kernel fault's code and an
// address in the uprobe page (rt_sigqueueinfo), a fault in the uprobe page
// on a thread that made no probed call, and a crash loop of 100
// processes, all sharing the runtime file with a healthy process, which
// stays exact. Each is counted once, attributed="false"; exit(0), SIGKILL
// and SIGTERM are not fault deaths and are not counted.
func TestCrashBreakerIgnoresUnattributed(t *testing.T) {
	a := startAgent(t)
	other := startWorkload(t, fixtures.Workload, breakerArgs)
	waitAttached(t, a, other.PID)
	gt := runPhase(t, other)

	deaths := []crash{{"segv", syscall.SIGSEGV, "sigsegv"}, {"ill", syscall.SIGILL, "sigill"}}
	for _, how := range []string{"kill", "tgkill", "sigqueue"} {
		for _, sig := range []syscall.Signal{syscall.SIGILL, syscall.SIGTRAP, syscall.SIGBUS, syscall.SIGFPE, syscall.SIGSEGV, syscall.SIGSYS} {
			deaths = append(deaths, crash{fmt.Sprintf("send %s %d", how, sig), sig, strings.ToLower(unix.SignalName(sig))})
		}
	}
	deaths = append(deaths, crash{"send forge 11", syscall.SIGSEGV, "sigsegv"})
	// A fault in the uprobe page on a thread that never hit a probe: the
	// probes cannot have made that thread fault.
	xolThread := crash{"xol-thread", syscall.SIGSEGV, "sigsegv"}
	if runtime.GOARCH == "arm64" {
		xolThread = crash{"xol-thread", syscall.SIGILL, "sigill"}
	}
	deaths = append(deaths, xolThread)
	for range 100 {
		deaths = append(deaths, crash{"segv", syscall.SIGSEGV, "sigsegv"})
	}
	want := map[string]float64{}
	for _, d := range deaths {
		die(t, startWorkload(t, fixtures.Workload, breakerArgs), d)
		want[d.name+"/false"]++
	}
	for _, name := range []string{"exit", "SIGKILL", "SIGTERM"} {
		w := startWorkload(t, fixtures.Workload, breakerArgs)
		runPhase(t, w)
		var err error
		switch name {
		case "exit":
			err = w.Stop()
		case "SIGKILL":
			_, err = w.Signal(syscall.SIGKILL)
		default:
			_, err = w.Signal(syscall.SIGTERM)
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	if err := testenv.Eventually(15*time.Second, func() error {
		if got := faultCounts(t, a); !maps.Equal(got, want) {
			return fmt.Errorf("profi_system_probed_process_faults_total %v, want %v", got, want)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	gt2 := runPhase(t, other)
	if gt2.TotalCalls() <= gt.TotalCalls() {
		t.Fatalf("the second phase made no calls: %d then %d", gt.TotalCalls(), gt2.TotalCalls())
	}
	requirePerPID(t, a, pidSeries(expected([]*testutil.GroundTruth{gt2})), other.PID)
	var st quarantineStatus
	if err := a.Status(&st); err != nil {
		t.Fatal(err)
	}
	if len(st.Quarantined) != 0 || st.Degraded {
		t.Errorf("quarantined %+v, degraded %v %q; want none", st.Quarantined, st.Degraded, st.DegradedReasons)
	}
	if total, _ := quarantineCount(t, a); len(total) != 0 {
		t.Errorf("profi_system_probe_quarantines_total %v, want no series", total)
	}
	if lines := a.LogLines("no probe explains"); len(lines) != len(deaths) {
		t.Errorf("%d log lines about unattributed deaths, want %d", len(lines), len(deaths))
	}
}

// requirePerPID is requireExact for the per-process series only.
func requirePerPID(t *testing.T, a *testutil.Agent, want values, pids ...int) {
	t.Helper()
	err := testenv.Eventually(15*time.Second, func() error {
		mfs, err := a.Metrics()
		if err != nil {
			return err
		}
		if d := diff(want, pidSeries(observed(mfs, pids...))); d != "" {
			return fmt.Errorf("metrics differ from ground truth:\n%s", d)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// With --crash-window 0 the breaker is off: a probed process that dies of
// a fault in the uprobe page quarantines nothing, and the other process
// keeps counting.
func TestCrashBreakerOff(t *testing.T) {
	a := startAgent(t, "--crash-window", "0")
	dying := startWorkload(t, fixtures.Workload, breakerArgs)
	other := startWorkload(t, fixtures.Workload, breakerArgs)
	waitAttached(t, a, dying.PID)
	waitAttached(t, a, other.PID)
	runPhase(t, dying)
	die(t, dying, attributedCrashes()[0])
	gt := runPhase(t, other)
	requirePerPID(t, a, pidSeries(expected([]*testutil.GroundTruth{gt})), other.PID)
	var st quarantineStatus
	if err := a.Status(&st); err != nil {
		t.Fatal(err)
	}
	if len(st.Quarantined) != 0 || st.Degraded {
		t.Errorf("quarantined %+v, degraded %v; want none with the breaker off", st.Quarantined, st.Degraded)
	}
	if total, _ := quarantineCount(t, a); len(total) != 0 {
		t.Errorf("profi_system_probe_quarantines_total %v, want no series", total)
	}
}

// With --quarantine-lift, the quarantine ends on its own: /status and the
// gauge empty, the counter stays, and the file is attached again: a
// process started after the lift is counted exactly.
func TestCrashBreakerLift(t *testing.T) {
	a := startAgent(t, "--quarantine-lift", "2")
	dying := startWorkload(t, fixtures.Workload, breakerArgs)
	waitAttached(t, a, dying.PID)
	runPhase(t, dying)
	die(t, dying, attributedCrashes()[0])
	q := waitQuarantined(t, a, 1, "tenant").Quarantined[0]
	if q.LiftsAt == nil || q.LiftsAt.Sub(q.Time) < 2*time.Second || q.LiftsAt.Sub(q.Time) > 3*time.Second {
		t.Errorf("lifts at %v for a quarantine at %v; want 2 s later", q.LiftsAt, q.Time)
	}
	st := waitQuarantined(t, a, 0, "")
	if st.Degraded {
		t.Errorf("degraded %q after the lift", st.DegradedReasons)
	}
	mfs, err := a.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	if n := len(testutil.Samples(mfs["profi_system_probe_quarantined_files"])); n != 0 {
		t.Errorf("%d profi_system_probe_quarantined_files series after the lift, want none", n)
	}
	total := testutil.Samples(mfs["profi_system_probe_quarantines_total"])
	if len(total) != 1 || total[0].Value != 1 {
		t.Errorf("profi_system_probe_quarantines_total %+v, want one series at 1", total)
	}
	late := startWorkload(t, fixtures.Workload, breakerArgs)
	waitAttached(t, a, late.PID)
	gt := runPhase(t, late)
	requirePerPID(t, a, pidSeries(expected([]*testutil.GroundTruth{gt})), late.PID)
}
