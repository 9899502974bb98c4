//go:build linux

package bench

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

var (
	flagAttachProcs    = flag.Int("attach.procs", 100, "short processes per scenario")
	flagAttachParallel = flag.Int("attach.parallel", 4, "processes running their call loop at the same time")
	flagAttachPeriod   = flag.Duration("attach.period", time.Millisecond, "time between two cudaLaunchKernel calls of one process")
	flagAttachDuration = flag.Duration("attach.duration", 2*time.Second, "how long each process calls after mapping libcudart")
	flagAttachPoll     = flag.Duration("attach.poll", 100*time.Millisecond, "period of the /metrics poll that times when counts become visible")
	// -attach.classic compares with one classic uprobe per function, as
	// kernels before 6.6 (no uprobe_multi) attach.
	flagAttachClassic = flag.Bool("attach.classic", false, "run the agent with --no-uprobe-multi (one classic uprobe per function)")
)

// attachScenario says which libcudart file the short processes map.
type attachScenario struct {
	name string
	// newFile: every process dlopens its own copy of the stub runtime (a
	// new inode, as a new container image would be), so every process
	// needs an attach. Otherwise all dlopen the one stub file, which a
	// holder process keeps mapped and attached from before the first.
	newFile bool
	what    string // for the table
}

// attachResult is what one short process gave.
type attachResult struct {
	pid       int
	calls     int   // cudaLaunchKernel calls made
	countedRT int   // counted as cudaLaunchKernel by the agent
	countedDr int   // counted as cuLaunchKernel (libcuda attached first)
	latency   int64 // ns from t_map to the first call counted as cudaLaunchKernel; -1 = never
	anyOp     int64 // ns from t_map to the first call counted at all (either operation); -1 = never or unknown (twice > 0)
	twice     int   // calls counted both as cudaLaunchKernel and as cuLaunchKernel (guard failure)
	visible   int64 // ns from t_map to the count showing on /metrics; -1 = never
	dlopen    int64 // ns dlopen took
	tMap      int64 // CLOCK_MONOTONIC right after dlopen returned
}

// BenchmarkAttachLatency measures how long after a process maps
// libcudart.so its calls are counted. The real agent runs with a
// one-hour --refresh-interval, so only the library-load trigger (the
// uprobe on ld.so's _dl_debug_state) can attach a library in time. Short
// processes (bench/attach.c), a few at a time, dlopen the stub runtime,
// note CLOCK_MONOTONIC right after dlopen returns (t_map), then call
// cudaLaunchKernel every millisecond for 2 s, noting the time of each
// call, and wait. Probes once attached stay attached, so if the agent
// counted N of the process's T calls, the first counted call is call
// T−N: latency = t[T−N] − t_map, exact to one call period. A second
// latency is when the count first shows on /metrics (polled every
// 100 ms; the agent drains its maps every second).
//
//	sudo go test -run '^$' -bench AttachLatency -benchtime 1x ./bench/
func BenchmarkAttachLatency(b *testing.B) {
	testutil.RequireBPF(b)
	if *flagAttachProcs < 1 || *flagAttachParallel < 1 || *flagAttachPeriod <= 0 || *flagAttachDuration < *flagAttachPeriod {
		b.Fatal("-attach.* flags must be positive, duration at least one period")
	}
	dir := b.TempDir()
	fx, agentBin := fixturesAndAgent(b, dir)
	prog := buildC(b, dir, "attach.c", "-ldl")

	scenarios := []attachScenario{
		{name: "new_file", newFile: true, what: "own copy of libcudart.so.12 per process (new inode: attach needed)"},
		{name: "attached_file", what: "one libcudart.so.12 for all, already attached"},
	}
	results := map[string][]attachResult{}
	passes := map[string][2]float64{} // count, mean seconds
	printMachineLine()
	for _, sc := range scenarios {
		began := time.Now()
		res, n, mean := runAttachScenario(b, sc, fx, agentBin, prog, filepath.Join(dir, sc.name))
		fmt.Printf("%s took %v\n", sc.name, time.Since(began).Round(time.Second))
		results[sc.name] = res
		passes[sc.name] = [2]float64{n, mean}
	}

	fmt.Printf("\n%d processes per scenario, %d at a time; each calls cudaLaunchKernel every %v for %v after dlopen; "+
		"agent: --refresh-interval 3600 (only the library-load trigger attaches)%s\n\n",
		*flagAttachProcs, *flagAttachParallel, *flagAttachPeriod, *flagAttachDuration, classicNote())
	fmt.Printf("| Scenario | Processes | Counted as cudaLaunchKernel (libcudart attached in time) | Attach latency p50 (ms) | p95 (ms) | max (ms) | Any launch counted p95 (ms) | Visible on /metrics p50 (ms) | p95 (ms) | max (ms) | Discovery passes (mean ms) |\n")
	fmt.Printf("|---|---|---|---|---|---|---|---|---|---|---|\n")
	type summary struct{ counted, p50, p95, mx, any95, v50, v95, vmx float64 }
	sums := map[string]summary{}
	for _, sc := range scenarios {
		res := results[sc.name]
		var lat, anyOp, vis []float64
		counted := 0
		for _, r := range res {
			lat = append(lat, msOrInf(r.latency))
			anyOp = append(anyOp, msOrInf(r.anyOp))
			vis = append(vis, msOrInf(r.visible))
			if r.latency >= 0 {
				counted++
			}
		}
		s := summary{float64(counted), percentile(lat, 50), percentile(lat, 95), slices.Max(lat), percentile(anyOp, 95),
			percentile(vis, 50), percentile(vis, 95), slices.Max(vis)}
		sums[sc.name] = s
		fmt.Printf("| %s: %s | %d | %d | %s | **%s** | %s | %s | %s | %s | %s | %.0f (%s) |\n", sc.name, sc.what, len(res), counted,
			fmtMs(s.p50), fmtMs(s.p95), fmtMs(s.mx), fmtMs(s.any95), fmtMs(s.v50), fmtMs(s.v95), fmtMs(s.vmx),
			passes[sc.name][0], fmtMs(passes[sc.name][1]*1000))
	}
	fmt.Println()
	for _, sc := range scenarios {
		res := results[sc.name]
		var lat, vis, dl []float64
		drv := 0
		for _, r := range res {
			lat = append(lat, msOrInf(r.latency))
			vis = append(vis, msOrInf(r.visible))
			dl = append(dl, float64(r.dlopen)/1e6)
			if r.countedDr > 0 {
				drv++
			}
		}
		fmt.Printf("%s: attach latency ms, sorted: %s\n", sc.name, fmtSorted(lat))
		fmt.Printf("%s: visible on /metrics ms, sorted: %s\n", sc.name, fmtSorted(vis))
		var anyOp []float64
		for _, r := range res {
			anyOp = append(anyOp, msOrInf(r.anyOp))
		}
		fmt.Printf("%s: any launch counted ms, sorted: %s\n", sc.name, fmtSorted(anyOp))
		fmt.Printf("%s: dlopen took p50 %s ms, max %s ms; processes with launches counted as cuLaunchKernel before libcudart was attached: %d\n",
			sc.name, fmtMs(percentile(dl, 50)), fmtMs(slices.Max(dl)), drv)
	}
	var twice []string
	for _, sc := range scenarios {
		for _, r := range results[sc.name] {
			if r.twice > 0 {
				twice = append(twice, fmt.Sprintf("%s pid %d: %d of %d calls counted as both cudaLaunchKernel and cuLaunchKernel", sc.name, r.pid, r.twice, r.calls))
			}
		}
	}
	s := sums["new_file"]
	verdict := "met"
	if !(s.p95 <= 1000) {
		verdict = "NOT met"
	}
	fmt.Printf("\ntarget (new_file): p95 attach latency ≤ 1000 ms: %s ms → %s; %d of %d processes counted via the trigger\n\n",
		fmtMs(s.p95), verdict, int(s.counted), *flagAttachProcs)

	if len(twice) > 0 {
		// After the report: the numbers stand, the agent's counts did not.
		b.Errorf("launches counted twice (runtime→driver guard), counts not exact:\n  %s", strings.Join(twice, "\n  "))
	}
	for _, sc := range scenarios {
		s := sums[sc.name]
		b.Run(sc.name, func(b *testing.B) {
			b.ReportMetric(s.p95*1e6, "ns/op") // one op = one process: its p95 attach latency
			b.ReportMetric(s.p50, "p50-ms")
			b.ReportMetric(s.p95, "p95-ms")
			b.ReportMetric(s.mx, "max-ms")
			b.ReportMetric(s.any95, "any-launch-p95-ms")
			b.ReportMetric(s.v95, "visible-p95-ms")
			b.ReportMetric(s.counted, "counted-procs")
		})
	}
}

func msOrInf(ns int64) float64 {
	if ns < 0 {
		return math.Inf(1)
	}
	return float64(ns) / 1e6
}

// fmtSorted lists values in ms, sorted; misses (∞) as one "∞ ×N".
func fmtSorted(ms []float64) string {
	var parts []string
	inf := 0
	for _, v := range slices.Sorted(slices.Values(ms)) {
		if math.IsInf(v, 1) {
			inf++
			continue
		}
		parts = append(parts, fmtMs(v))
	}
	if inf > 0 {
		parts = append(parts, fmt.Sprintf("∞ ×%d", inf))
	}
	return strings.Join(parts, " ")
}

// runAttachScenario runs one scenario against a fresh agent and returns
// the per-process results, the number of discovery passes the agent ran
// meanwhile and their mean duration (seconds).
func runAttachScenario(b *testing.B, sc attachScenario, fx *testutil.Fixtures, agentBin, prog, dir string) ([]attachResult, float64, float64) {
	b.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	libs := make([]string, *flagAttachProcs)
	for i := range libs {
		libs[i] = fx.Cudart
		if sc.newFile {
			// Named libcudart.so.12 so discovery recognises it; its RUNPATH
			// still finds the fixtures' libcuda.so.1.
			d := filepath.Join(dir, fmt.Sprintf("lib%03d", i))
			if err := os.MkdirAll(d, 0o755); err != nil {
				b.Fatal(err)
			}
			libs[i] = filepath.Join(d, "libcudart.so.12")
			if err := copyExecutable(fx.Cudart, libs[i]); err != nil {
				b.Fatal(err)
			}
		}
	}

	args := []string{"--refresh-interval", "3600"}
	if *flagAttachClassic {
		args = append(args, "--no-uprobe-multi")
	}
	a := startAgent(b, agentBin, args...)
	stopped := false
	defer func() {
		if !stopped {
			a.stop(b)
		}
	}()
	a.waitHooks(b)

	if !sc.newFile {
		// A holder maps the shared file first and keeps it attached.
		holder, err := startChild(prog, fx.Cudart, "1000", "1")
		if err != nil {
			b.Fatal(err)
		}
		defer func() {
			if err := holder.exit(); err != nil {
				b.Error(err)
			}
		}()
		if _, err := holder.line(30 * time.Second); err != nil {
			b.Fatal(err)
		}
		err = testenv.Eventually(15*time.Second, func() error {
			st, err := a.status()
			if err != nil {
				return err
			}
			for _, l := range st.Attached {
				if l.Path == fx.Cudart && slices.Contains(l.PIDs, holder.pid) {
					return nil
				}
			}
			return fmt.Errorf("%s not attached for the holder (pid %d)", fx.Cudart, holder.pid)
		})
		if err != nil {
			b.Fatal(err)
		}
	}

	mfs, err := a.Metrics()
	if err != nil {
		b.Fatal(err)
	}
	pass0, passSum0 := histSums(mfs, "profi_system_discovery_scan_duration_seconds")
	fail0 := total(mfs, "profi_system_attach_failures_total", nil) // the missing static --cudart is one

	// Poll /metrics: when does each process's count first show?
	seen := map[int]int64{} // pid -> CLOCK_MONOTONIC of the first scrape showing it
	var seenMu sync.Mutex
	stopPoll := make(chan struct{})
	var pollWG sync.WaitGroup
	pollWG.Go(func() {
		t := time.NewTicker(*flagAttachPoll)
		defer t.Stop()
		for {
			select {
			case <-stopPoll:
				return
			case <-t.C:
			}
			mfs, err := a.Metrics()
			now := monoNow()
			if err != nil {
				continue // the final exact check reads /metrics again
			}
			seenMu.Lock()
			for _, s := range testutil.Samples(mfs["profi_cuda_calls_total"]) {
				if s.Labels["operation"] != "cudaLaunchKernel" || s.Value <= 0 {
					continue
				}
				if pid, err := strconv.Atoi(s.Labels["pid"]); err == nil {
					if _, ok := seen[pid]; !ok {
						seen[pid] = now
					}
				}
			}
			seenMu.Unlock()
		}
	})

	results := make([]attachResult, len(libs))
	errs := make([]error, len(libs))
	slots := make(chan struct{}, *flagAttachParallel)
	var wg sync.WaitGroup
	period, duration := *flagAttachPeriod, *flagAttachDuration
	for i, lib := range libs {
		slots <- struct{}{}
		// A random start phase: the agent drains every second and each
		// process runs about 2 s, so without it every process would map
		// the library at the same point of the drain cycle.
		time.Sleep(rand.N(time.Second))
		c, err := startChild(prog, lib, strconv.FormatInt(period.Microseconds(), 10), strconv.FormatInt(duration.Milliseconds(), 10))
		if err != nil {
			<-slots
			errs[i] = err
			break
		}
		wg.Go(func() {
			released := false
			release := func() {
				if !released {
					released = true
					<-slots
				}
			}
			defer release()
			r, err := finishAttachProc(a, c, release, duration)
			if xerr := c.exit(); err == nil {
				err = xerr
			}
			results[i], errs[i] = r, err
		})
	}
	wg.Wait()
	close(stopPoll)
	pollWG.Wait()
	for i, err := range errs {
		if err != nil {
			b.Fatalf("process %d (%s): %v\nagent log:\n%s", i, libs[i], err, a.Logs())
		}
	}

	pids := map[int]bool{}
	for i := range results {
		r := &results[i]
		if pids[r.pid] {
			b.Fatalf("pid %d used twice: the /metrics poll cannot tell the processes apart", r.pid)
		}
		pids[r.pid] = true
		r.visible = -1
		if t, ok := seen[r.pid]; ok && r.countedRT > 0 {
			r.visible = t - r.tMap
		}
	}

	misses := 0
	for i, r := range results {
		if r.latency < 0 {
			if misses++; misses > 3 {
				continue
			}
			fmt.Printf("%s: pid %d (%s) made %d calls, none counted as cudaLaunchKernel (%d as cuLaunchKernel); agent log lines about it:\n",
				sc.name, r.pid, libs[i], r.calls, r.countedDr)
			lines := a.LogLines(filepath.Dir(libs[i]) + "/")
			if len(lines) == 0 {
				fmt.Println("    (none: not attached while the process ran)")
			}
			for _, line := range lines {
				fmt.Println("   ", line)
			}
		}
	}

	mfs, err = a.Metrics()
	if err != nil {
		b.Fatal(err)
	}
	pass1, passSum1 := histSums(mfs, "profi_system_discovery_scan_duration_seconds")
	if f := total(mfs, "profi_system_attach_failures_total", nil) - fail0; f > 0 {
		b.Errorf("%v attach failures during the run; agent log:\n%s", f, a.Logs())
	}
	files := total(mfs, "profi_system_discovery_attached_libraries", nil)
	if !sc.newFile {
		// Already attached: every call of every process must count.
		for _, r := range results {
			if r.countedRT != r.calls {
				b.Fatalf("pid %d mapped an attached libcudart: %d of %d calls counted, want all (%d counted as cuLaunchKernel)", r.pid, r.countedRT, r.calls, r.countedDr)
			}
		}
	}
	mean := math.NaN()
	if pass1 > pass0 {
		mean = (passSum1 - passSum0) / float64(pass1-pass0)
	}
	if misses > 3 {
		fmt.Printf("%s: %d more processes never counted as cudaLaunchKernel\n", sc.name, misses-3)
	}
	attached := len(a.LogLines("msg=\"library attached\""))
	detached := len(a.LogLines("msg=\"library unmapped by every process, detaching\""))
	took := a.stop(b)
	stopped = true
	fmt.Printf("%s: %d library files attached and %d detached during the run; agent exited %v after SIGTERM, detaching the %.0f still attached\n",
		sc.name, attached, detached, took.Round(time.Millisecond), files)
	return results, float64(pass1 - pass0), mean
}

// finishAttachProc waits for a short process to end its call loop,
// releases its slot (the next process may start), waits for a drain that
// began after the last call, reads the agent's counts of this process and
// asks it for the time of its first counted call.
func finishAttachProc(a *agentRun, c *child, release func(), duration time.Duration) (attachResult, error) {
	r := attachResult{pid: c.pid, latency: -1, anyOp: -1, visible: -1}
	line, err := c.line(duration + 30*time.Second)
	if err != nil {
		return r, err
	}
	tDone := time.Now() // every call returned before the process printed "done"
	release()
	var pid, failed int
	var tBefore int64
	if _, err := fmt.Sscanf(line, "done pid=%d t_before=%d t_map=%d calls=%d failed=%d",
		&pid, &tBefore, &r.tMap, &r.calls, &failed); err != nil || pid != c.pid {
		return r, fmt.Errorf("unexpected output %q (%v)", line, err)
	}
	if failed != 0 || r.calls < 1 {
		return r, fmt.Errorf("%d of %d calls failed", failed, r.calls)
	}
	r.dlopen = r.tMap - tBefore
	if err := a.waitDrainAfter(tDone, 3*time.Minute); err != nil {
		return r, err
	}
	mfs, err := a.Metrics()
	if err != nil {
		return r, err
	}
	p := strconv.Itoa(c.pid)
	rt := total(mfs, "profi_cuda_calls_total", map[string]string{"pid": p, "operation": "cudaLaunchKernel"})
	dr := total(mfs, "profi_cuda_calls_total", map[string]string{"pid": p, "operation": "cuLaunchKernel"})
	all := total(mfs, "profi_cuda_calls_total", map[string]string{"pid": p})
	launches := total(mfs, "profi_cuda_kernel_launches_total", map[string]string{"pid": p})
	r.countedRT, r.countedDr = int(rt), int(dr)
	// Exact counts: integers, nothing but the two launch operations, every
	// counted call a launch, never more runtime launches than were made.
	// A runtime launch also traps in the driver below it; if the agent
	// counts that driver launch too (the runtime→driver guard failed), the
	// sum exceeds the calls made: recorded, and the benchmark fails after
	// reporting. The latency only needs the runtime count.
	switch {
	case float64(r.countedRT) != rt || float64(r.countedDr) != dr:
		return r, fmt.Errorf("non-integer counts %v, %v", rt, dr)
	case all != rt+dr:
		return r, fmt.Errorf("pid %d: %v calls counted in all, %v of them launches", c.pid, all, rt+dr)
	case launches != rt+dr:
		return r, fmt.Errorf("pid %d: %v kernel launches, %v launch calls", c.pid, launches, rt+dr)
	case r.countedRT > r.calls:
		return r, fmt.Errorf("pid %d: %d calls made, %d counted as cudaLaunchKernel", c.pid, r.calls, r.countedRT)
	case r.countedRT+r.countedDr > r.calls:
		r.twice = r.countedRT + r.countedDr - r.calls
	}
	// Probes once attached stay attached: the counted calls are the last
	// ones, so the first counted call is call calls−counted.
	timeOf := func(i int) (int64, error) {
		ans, err := c.ask(fmt.Sprintf("t %d", i), 10*time.Second)
		if err != nil {
			return 0, err
		}
		var j int
		var t int64
		if _, err := fmt.Sscanf(ans, "t %d %d", &j, &t); err != nil || j != i {
			return 0, fmt.Errorf("unexpected answer %q to \"t %d\" (%v)", ans, i, err)
		}
		return t, nil
	}
	if n := r.countedRT + r.countedDr; n > 0 && r.twice == 0 {
		t, err := timeOf(r.calls - n)
		if err != nil {
			return r, err
		}
		r.anyOp = t - r.tMap
	}
	if r.countedRT > 0 {
		t, err := timeOf(r.calls - r.countedRT)
		if err != nil {
			return r, err
		}
		r.latency = t - r.tMap
	}
	return r, nil
}

// printMachineLine prints the kernel and CPUs the numbers come from.
func printMachineLine() {
	var uts unix.Utsname
	release := "?"
	if unix.Uname(&uts) == nil {
		release = unix.ByteSliceToString(uts.Release[:])
	}
	fmt.Printf("kernel %s, %d CPUs, %s/%s\n", release, runtime.NumCPU(), runtime.GOOS, runtime.GOARCH)
}

// classicNote says, in the table's heading, when the agent ran with
// classic uprobes.
func classicNote() string {
	if *flagAttachClassic {
		return ", --no-uprobe-multi (classic uprobes)"
	}
	return ""
}
