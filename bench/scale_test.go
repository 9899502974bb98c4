//go:build linux

package bench

import (
	"bytes"
	"flag"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

var (
	flagScaleProcs   = flag.Int("scale.procs", 4, "driver processes (the series and the call rate are split evenly among them)")
	flagScaleWindow  = flag.Duration("scale.window", 10*time.Second, "CPU window of each series level; the rate sweep takes -scale.rounds windows of a third of it per rate")
	flagScaleRounds  = flag.Int("scale.rounds", 3, "rounds of the rate sweep (each round: one CPU window per rate, rates in turn)")
	flagScaleScrapes = flag.Int("scale.scrapes", 50, "timed /metrics scrapes per level")
	flagScaleGap     = flag.Duration("scale.gap", 100*time.Millisecond, "pause between two timed scrapes")
	flagScaleBudget  = flag.Duration("scale.scrape-time", time.Minute, "stop the timed scrapes of a level after this long if at least 20 were taken (slow scrapes at 5·10⁴ series)")
	flagScaleRates   = flag.String("scale.rates", "100,10000,100000", "probed calls/s of the rate sweep (at -scale.rate-series series)")
	flagScaleSeries  = flag.String("scale.series", "100,1000,10000,50000", "series of the series sweep (at -scale.series-rate calls/s)")
	flagScaleRS      = flag.Int("scale.rate-series", 1000, "series of the rate sweep")
	flagScaleSR      = flag.Int("scale.series-rate", 10000, "calls/s of the series sweep")
)

// The agent's flags for every level: the caps raised so 5·10⁴ series from
// a few processes fit (defaults: 50,000 tuples, 32 streams per PID,
// launch_agg 8,192 keys), and nothing else changed.
var scaleAgentArgs = []string{
	"--max-time-series", "60000",
	"--max-streams-per-pid", "20000",
	"--launch-agg-size", "65536",
}

// Stream handles of bench/scale.c: STREAM_BASE + i * STREAM_STEP.
const (
	scaleStreamBase = 0x5ca1e0000
	scaleStreamStep = 0x10
)

// scaleLevel is one measured configuration and what it gave.
type scaleLevel struct {
	sweep  string
	series int     // driver series: profi_cuda_calls_total{operation="cuLaunchKernel"} tuples
	rate   float64 // target probed calls/s, all drivers together

	cpuTime, wall time.Duration // agent CPU time over the CPU windows, and their length
	windows       []float64     // agent CPU of each window, % of one CPU
	calls         uint64        // calls the drivers made in the windows
	drains        uint64        // drains around the windows
	drainSum      float64       // their total duration, seconds
	scrapes       []float64     // wall ms of each timed scrape
	encodeMs      float64       // mean server-side /metrics render during the scrapes
	mem           procMem       // after the scrapes: VmRSS, VmHWM (peak since the agent started), RssAnon
	tuples        int           // label tuples the agent exports (profi_system_metric_handle_cache_size)
	samples       int           // samples on /metrics (lines that are not comments)
	bodyBytes     int           // size of one /metrics body
	otherPIDs     int           // other processes the agent exported (other tests' workloads on this host)
	passes        uint64        // discovery passes during the timed scrapes
	passSum       float64       // their total duration, seconds (a pass that detaches holds the lock scrapes wait for)
	took          time.Duration // wall time of the level (of the whole run for the rate sweep)
}

func (l *scaleLevel) cpu() float64      { return 100 * l.cpuTime.Seconds() / l.wall.Seconds() }
func (l *scaleLevel) achieved() float64 { return float64(l.calls) / l.wall.Seconds() }
func (l *scaleLevel) drainMs() float64 {
	if l.drains == 0 {
		return math.NaN()
	}
	return 1000 * l.drainSum / float64(l.drains)
}

// BenchmarkScaleCost measures what the agent's userspace costs as the
// probed call rate and the number of series grow. Driver processes
// (bench/scale.c) make cuLaunchKernel calls (one trap each in the default
// anonymous mode) round-robin over distinct stream handles, so the agent
// exports one profi_cuda_calls_total series per (pid, stream).
//
// Rate sweep: one agent and one set of drivers (a fixed set of series);
// the drivers switch rates in turn, several rounds, and the agent's CPU
// time (utime + stime of all threads, /proc/PID/stat) is read over a
// window at each rate with no scrape inside: noise from the rest of the
// host hits every rate alike. Then, per rate, timed /metrics scrapes,
// VmRSS and VmHWM. Series sweep: a fresh agent and drivers per level,
// one CPU window, scrapes, memory. After each run the drivers stop, and
// every series must hold exactly the calls its driver made on its
// stream: a level whose probes did not all fire fails.
//
//	sudo go test -run '^$' -bench ScaleCost -benchtime 1x ./bench/
func BenchmarkScaleCost(b *testing.B) {
	testutil.RequireBPF(b)
	rates, err1 := parseInts(*flagScaleRates)
	series, err2 := parseInts(*flagScaleSeries)
	if err1 != nil || err2 != nil || *flagScaleProcs < 1 || *flagScaleWindow <= 0 || *flagScaleRounds < 1 ||
		*flagScaleScrapes < 1 || *flagScaleRS < 1 || *flagScaleSR < 1 {
		b.Fatalf("bad -scale.* flags: %v %v", err1, err2)
	}
	for _, s := range append(slices.Clone(series), *flagScaleRS) {
		if s%*flagScaleProcs != 0 {
			b.Fatalf("%d series do not split evenly over %d processes", s, *flagScaleProcs)
		}
	}
	dir := b.TempDir()
	fx, agentBin := fixturesAndAgent(b, dir)
	driver := buildC(b, dir, "scale.c", "-L"+fx.Dir, "-l:libcuda.so.1", "-Wl,-rpath,"+fx.Dir)
	printMachineLine()

	// Rate sweep: one run, rates in turn.
	var rateLevels []*scaleLevel
	for _, r := range rates {
		rateLevels = append(rateLevels, &scaleLevel{sweep: "rate", series: *flagScaleRS, rate: float64(r)})
	}
	began := time.Now()
	func() {
		run := startScaleRun(b, fx, agentBin, driver, *flagScaleRS, float64(rates[0]))
		defer run.close(b)
		win := *flagScaleWindow / 3
		for range *flagScaleRounds {
			for _, l := range rateLevels {
				run.setRate(b, l.rate)
				run.cpuWindow(b, l, time.Second, win)
			}
		}
		for _, l := range rateLevels {
			run.setRate(b, l.rate)
			time.Sleep(2 * time.Second)
			run.scrapes(b, l)
		}
		run.finish(b, rateLevels...)
	}()
	for _, l := range rateLevels {
		l.took = time.Since(began)
		fmt.Printf("rate sweep, %s series at %s calls/s: CPU %.2f%% (windows %s), scrape p99 %s ms, VmRSS %s MiB (sweep took %v)\n",
			fmtInt(int64(l.series)), fmtInt(int64(l.rate)), l.cpu(), fmtPcts(l.windows), fmtMs(percentile(l.scrapes, 99)), fmtMiB(l.mem.rss),
			l.took.Round(time.Second))
	}

	// Series sweep: a fresh run per level.
	var seriesLevels []*scaleLevel
	for _, s := range series {
		l := &scaleLevel{sweep: "series", series: s, rate: float64(*flagScaleSR)}
		seriesLevels = append(seriesLevels, l)
		began := time.Now()
		func() {
			run := startScaleRun(b, fx, agentBin, driver, s, l.rate)
			defer run.close(b)
			run.cpuWindow(b, l, 2*time.Second, *flagScaleWindow)
			run.scrapes(b, l)
			run.finish(b, l)
		}()
		l.took = time.Since(began)
		fmt.Printf("series sweep, %s series at %s calls/s: CPU %.2f%%, scrape p99 %s ms, VmRSS %s MiB (level took %v)\n",
			fmtInt(int64(l.series)), fmtInt(int64(l.rate)), l.cpu(), fmtMs(percentile(l.scrapes, 99)), fmtMiB(l.mem.rss), l.took.Round(time.Second))
	}

	fmt.Printf("\n%d driver processes; agent flags %s; no scrape during CPU windows; %d scrapes %v apart per level (fewer, at least 20, when they take over %v)\n",
		*flagScaleProcs, strings.Join(scaleAgentArgs, " "), *flagScaleScrapes, *flagScaleGap, *flagScaleBudget)
	fmt.Printf("rate sweep: one agent, %d rounds of one %v window per rate; series sweep: a fresh agent per level, one %v window\n\n",
		*flagScaleRounds, *flagScaleWindow/3, *flagScaleWindow)
	fmt.Printf("| Sweep | Driver series | Label tuples | Samples on /metrics | Calls/s target | Calls/s made | Agent CPU (%% of 1 CPU) | Drain mean (ms) | Scrapes | Scrape p50 (ms) | Scrape p99 (ms) | Render mean (ms) | Body (KiB) | VmRSS (MiB) | VmHWM (MiB) | RssAnon (MiB) | Other PIDs | Passes during scrapes (s) |\n")
	fmt.Printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, l := range slices.Concat(rateLevels, seriesLevels) {
		fmt.Printf("| %s | %s | %s | %s | %s | %s | %.2f | %s | %d | %s | %s | %s | %.0f | %s | %s | %s | %d | %d (%.1f) |\n", l.sweep,
			fmtInt(int64(l.series)), fmtInt(int64(l.tuples)), fmtInt(int64(l.samples)), fmtInt(int64(l.rate)),
			fmtInt(int64(math.Round(l.achieved()))), l.cpu(), fmtMs(l.drainMs()), len(l.scrapes), fmtMs(percentile(l.scrapes, 50)),
			fmtMs(percentile(l.scrapes, 99)), fmtMs(l.encodeMs), float64(l.bodyBytes)/1024, fmtMiB(l.mem.rss), fmtMiB(l.mem.hwm), fmtMiB(l.mem.anon), l.otherPIDs, l.passes, l.passSum)
	}
	fmt.Println()

	lo, hi := rateLevels[0], rateLevels[0]
	for _, l := range rateLevels {
		if l.rate < lo.rate {
			lo = l
		}
		if l.rate > hi.rate {
			hi = l
		}
	}
	fmt.Printf("target: agent CPU flat in the event rate: %.2f%% at %s calls/s (windows %s), %.2f%% at %s calls/s (windows %s): %+.2f points\n",
		lo.cpu(), fmtInt(int64(lo.rate)), fmtPcts(lo.windows), hi.cpu(), fmtInt(int64(hi.rate)), fmtPcts(hi.windows), hi.cpu()-lo.cpu())
	top := seriesLevels[0]
	for _, l := range seriesLevels {
		if l.series > top.series {
			top = l
		}
	}
	p99 := percentile(top.scrapes, 99)
	fmt.Printf("target: at %s series scrape p99 ≤ 100 ms: %s ms → %s\n", fmtInt(int64(top.series)), fmtMs(p99), metOrNot(p99 <= 100))
	fmt.Printf("target: at %s series RSS ≤ 100 MiB: VmRSS %s MiB, VmHWM %s MiB (RssAnon %s MiB) → %s\n\n", fmtInt(int64(top.series)),
		fmtMiB(top.mem.rss), fmtMiB(top.mem.hwm), fmtMiB(top.mem.anon), metOrNot(top.mem.hwm <= 100*1024))

	for _, l := range slices.Concat(rateLevels, seriesLevels) {
		b.Run(fmt.Sprintf("%s/series=%d/rate=%d", l.sweep, l.series, int(l.rate)), func(b *testing.B) {
			b.ReportMetric(percentile(l.scrapes, 50)*1e6, "ns/op") // one op = one scrape: the median
			b.ReportMetric(l.cpu(), "cpu-%")
			b.ReportMetric(percentile(l.scrapes, 50), "scrape-p50-ms")
			b.ReportMetric(percentile(l.scrapes, 99), "scrape-p99-ms")
			b.ReportMetric(float64(l.mem.rss)/1024, "rss-MiB")
			b.ReportMetric(float64(l.mem.hwm)/1024, "hwm-MiB")
			b.ReportMetric(float64(l.mem.anon)/1024, "anon-MiB")
			b.ReportMetric(float64(l.tuples), "tuples")
			b.ReportMetric(l.achieved(), "calls/s")
		})
	}
}

func metOrNot(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

func fmtMiB(kib uint64) string { return fmt.Sprintf("%.1f", float64(kib)/1024) }

func fmtPcts(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf("%.2f", x)
	}
	return strings.Join(parts, " / ")
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bad list %q", s)
		}
		out = append(out, n)
	}
	return out, nil
}

// scaleRun is one agent with its driver processes.
type scaleRun struct {
	a       *agentRun
	drivers []*child
	streams int // per driver
}

// startScaleRun starts the drivers (series split evenly, rate too), then
// a fresh agent, waits until it attached the stub driver for all of them,
// makes every series exist (one call per stream) and waits until /metrics
// exports them all.
func startScaleRun(b *testing.B, fx *testutil.Fixtures, agentBin, driver string, series int, rate float64) *scaleRun {
	b.Helper()
	procs := *flagScaleProcs
	run := &scaleRun{streams: series / procs}
	ok := false
	defer func() {
		if !ok {
			run.close(b)
		}
	}()
	for range procs {
		d, err := startChild(driver, strconv.Itoa(run.streams), strconv.FormatFloat(rate/float64(procs), 'f', -1, 64))
		if err != nil {
			b.Fatal(err)
		}
		run.drivers = append(run.drivers, d)
		if line, err := d.line(30 * time.Second); err != nil || line != fmt.Sprintf("ready pid=%d", d.pid) {
			b.Fatalf("driver: %q %v", line, err)
		}
	}
	// The agent's first pass finds the drivers, which map the stub driver.
	run.a = startAgent(b, agentBin, scaleAgentArgs...)
	err := testenv.Eventually(30*time.Second, func() error {
		st, err := run.a.status()
		if err != nil {
			return err
		}
		for _, lib := range st.Attached {
			if lib.Path != fx.Cuda {
				continue
			}
			for _, d := range run.drivers {
				if !slices.Contains(lib.PIDs, d.pid) {
					return fmt.Errorf("pid %d not attached yet", d.pid)
				}
			}
			return nil
		}
		return fmt.Errorf("%s not attached", fx.Cuda)
	})
	if err != nil {
		b.Fatal(err)
	}
	for _, d := range run.drivers {
		if line, err := d.ask("go", 60*time.Second); err != nil || line != fmt.Sprintf("warm calls=%d", run.streams) {
			b.Fatalf("driver %d: %q %v", d.pid, line, err)
		}
	}
	err = testenv.Eventually(60*time.Second, func() error {
		mfs, err := run.a.Metrics()
		if err != nil {
			return err
		}
		n := map[string]int{}
		for _, s := range testutil.Samples(mfs["profi_cuda_calls_total"]) {
			if s.Labels["operation"] == "cuLaunchKernel" {
				n[s.Labels["pid"]]++
			}
		}
		for _, d := range run.drivers {
			if got := n[strconv.Itoa(d.pid)]; got != run.streams {
				return fmt.Errorf("pid %d: %d of %d series exported", d.pid, got, run.streams)
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	ok = true
	return run
}

// close stops the drivers and the agent.
func (r *scaleRun) close(b *testing.B) {
	b.Helper()
	for _, d := range r.drivers {
		if err := d.exit(); err != nil {
			b.Error(err)
		}
	}
	r.drivers = nil
	if r.a != nil {
		r.a.stop(b)
		r.a = nil
	}
}

func (r *scaleRun) setRate(b *testing.B, rate float64) {
	b.Helper()
	each := strconv.FormatFloat(rate/float64(len(r.drivers)), 'f', -1, 64)
	for _, d := range r.drivers {
		if line, err := d.ask("rate "+each, 10*time.Second); err != nil || line != "rate "+each {
			b.Fatalf("driver %d: %q %v", d.pid, line, err)
		}
	}
}

// cpuWindow waits settle, then reads the agent's CPU time and the
// drivers' calls over a window with no scrape inside, and adds them to l;
// the drain histogram is read just outside the window.
func (r *scaleRun) cpuWindow(b *testing.B, l *scaleLevel, settle, window time.Duration) {
	b.Helper()
	mfs, err := r.a.Metrics()
	if err != nil {
		b.Fatal(err)
	}
	d0, s0 := histSums(mfs, "profi_system_aggregated_map_drain_duration_seconds")
	time.Sleep(settle)
	calls0, t0 := driverCalls(b, r.drivers), time.Now()
	cpu0, err := cpuTime(r.a.pid)
	if err != nil {
		b.Fatal(err)
	}
	time.Sleep(window)
	cpu1, err := cpuTime(r.a.pid)
	if err != nil {
		b.Fatal(err)
	}
	calls1, t1 := driverCalls(b, r.drivers), time.Now()
	if mfs, err = r.a.Metrics(); err != nil {
		b.Fatal(err)
	}
	d1, s1 := histSums(mfs, "profi_system_aggregated_map_drain_duration_seconds")
	l.cpuTime += cpu1 - cpu0
	l.wall += t1.Sub(t0)
	l.windows = append(l.windows, 100*(cpu1-cpu0).Seconds()/t1.Sub(t0).Seconds())
	l.calls += calls1 - calls0
	l.drains += d1 - d0
	l.drainSum += s1 - s0
}

// scrapes times -scale.scrapes scrapes of /metrics, then reads the
// agent's memory, and the mean render time from its own histogram.
func (r *scaleRun) scrapes(b *testing.B, l *scaleLevel) {
	b.Helper()
	mfs, err := r.a.Metrics()
	if err != nil {
		b.Fatal(err)
	}
	e0, es0 := histSums(mfs, "profi_system_prometheus_encode_duration_seconds")
	p0, ps0 := histSums(mfs, "profi_system_discovery_scan_duration_seconds")
	var body []byte
	began := time.Now()
	for i := range *flagScaleScrapes {
		if i >= 20 && time.Since(began) > *flagScaleBudget {
			break
		}
		time.Sleep(*flagScaleGap)
		var took time.Duration
		if body, took, err = r.a.scrape(); err != nil {
			b.Fatal(err)
		}
		l.scrapes = append(l.scrapes, float64(took)/1e6)
	}
	if l.mem, err = memKiB(r.a.pid); err != nil {
		b.Fatal(err)
	}
	l.bodyBytes = len(body)
	l.samples = 0
	for _, line := range bytes.Split(body, []byte("\n")) {
		if len(line) > 0 && line[0] != '#' {
			l.samples++
		}
	}
	if mfs, err = r.a.Metrics(); err != nil {
		b.Fatal(err)
	}
	e1, es1 := histSums(mfs, "profi_system_prometheus_encode_duration_seconds")
	p1, ps1 := histSums(mfs, "profi_system_discovery_scan_duration_seconds")
	l.passes, l.passSum = p1-p0, ps1-ps0
	l.encodeMs = math.NaN()
	if e1 > e0 { // the timed scrapes and the one that read e0 (each observed after its render)
		l.encodeMs = 1000 * (es1 - es0) / float64(e1-e0)
	}
}

// finish stops the drivers' calls, waits for a drain after the last one,
// and checks the agent's counts exactly (see check); the tuple count and
// other PIDs go to every level of the run.
func (r *scaleRun) finish(b *testing.B, levels ...*scaleLevel) {
	b.Helper()
	made := map[int]uint64{}
	for _, d := range r.drivers {
		line, err := d.ask("stop", 30*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		var n, failed uint64
		if _, err := fmt.Sscanf(line, "stopped calls=%d failed=%d", &n, &failed); err != nil || failed != 0 {
			b.Fatalf("driver %d: %q %v", d.pid, line, err)
		}
		made[d.pid] = n
	}
	if err := r.a.waitDrainAfter(time.Now(), time.Minute); err != nil {
		b.Fatal(err)
	}
	body, _, err := r.a.scrape()
	if err != nil {
		b.Fatal(err)
	}
	tuples, others, err := check(body, r.drivers, made, r.streams)
	if err != nil {
		b.Fatalf("%s series: the agent's counts are not exact, so the run measured something else: %v",
			fmtInt(int64(r.streams*len(r.drivers))), err)
	}
	for _, l := range levels {
		l.tuples, l.otherPIDs = tuples, others
	}
}

// driverCalls sums the calls the drivers made so far.
func driverCalls(b *testing.B, drivers []*child) uint64 {
	b.Helper()
	var sum uint64
	for _, d := range drivers {
		line, err := d.ask("count", 10*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		var n uint64
		if _, err := fmt.Sscanf(line, "count calls=%d", &n); err != nil {
			b.Fatalf("driver %d: %q %v", d.pid, line, err)
		}
		sum += n
	}
	return sum
}

// check verifies, on a scrape taken after the drivers stopped, that each
// driver has exactly its streams as profi_cuda_calls_total series, each
// holding the calls made on that stream (call j went to stream j mod
// streams), that its kernel launches sum to its calls, and that no tuple
// was refused by a cap or dropped at a full map. It returns the label
// tuples the agent exports and how many other processes it exported.
func check(body []byte, drivers []*child, made map[int]uint64, streams int) (tuples, otherPIDs int, err error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return 0, 0, err
	}
	if v := total(mfs, "profi_cardinality_limit_drops_total", nil); v != 0 {
		return 0, 0, fmt.Errorf("%v tuples refused by --max-time-series", v)
	}
	if v := total(mfs, "profi_system_launch_agg_drops_total", nil); v != 0 {
		return 0, 0, fmt.Errorf("%v launches dropped at a full launch_agg map", v)
	}
	driverPIDs := map[string]bool{}
	for _, d := range drivers {
		driverPIDs[strconv.Itoa(d.pid)] = true
	}
	others := map[string]bool{}
	got := map[string]map[string]float64{} // pid -> stream -> calls
	for _, s := range testutil.Samples(mfs["profi_cuda_calls_total"]) {
		pid := s.Labels["pid"]
		if !driverPIDs[pid] {
			others[pid] = true
			continue
		}
		if s.Labels["operation"] != "cuLaunchKernel" {
			return 0, 0, fmt.Errorf("pid %s: unexpected series %v = %v", pid, s.Labels, s.Value)
		}
		if got[pid] == nil {
			got[pid] = map[string]float64{}
		}
		got[pid][s.Labels["stream"]] += s.Value
	}
	for _, d := range drivers {
		pid := strconv.Itoa(d.pid)
		n := made[d.pid]
		if len(got[pid]) != streams {
			return 0, 0, fmt.Errorf("pid %s: %d series, want %d", pid, len(got[pid]), streams)
		}
		for i := range streams {
			label := "0x" + strconv.FormatUint(scaleStreamBase+uint64(i)*scaleStreamStep, 16)
			want := n / uint64(streams)
			if uint64(i) < n%uint64(streams) {
				want++
			}
			if v, ok := got[pid][label]; !ok || v != float64(want) {
				return 0, 0, fmt.Errorf("pid %s stream %s: %v calls counted (series present: %v), %d made", pid, label, v, ok, want)
			}
		}
		if v := total(mfs, "profi_cuda_kernel_launches_total", map[string]string{"pid": pid}); v != float64(n) {
			return 0, 0, fmt.Errorf("pid %s: %v kernel launches counted, %d made", pid, v, n)
		}
	}
	return int(total(mfs, "profi_system_metric_handle_cache_size", nil)), len(others), nil
}
