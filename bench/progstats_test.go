//go:build linux

package bench

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// The BPF programs' own run time, beside the traps: the kernel's run-time
// statistics (what kernel.bpf_stats_enabled turns on) per program, read
// before and after every loop and charged to the configuration that ran.
// The empty programs the floor configurations use are read in the same
// run, so the table shows what a program costs over one that does nothing
// (the statistics' own two clock reads are in both).

// Per-run targets (ns per program run, this run's kernel statistics):
// launch_entry and a timed call's entry + return from issue 33, which
// tightened issue 18's 150 and 350; the NCCL pair from issue 18.
const (
	targetLaunchEntryNs = 120
	targetTimedPairNs   = 300
	targetNcclPairNs    = 350
)

// A progKey names a loaded program: its name and the links it serves
// (profi's programs are loaded twice, for uprobe_multi and classic links).
type progKey struct{ name, links string }

func (k progKey) String() string { return k.name + " (" + k.links + ")" }

// progRun is a program's cumulative run time and run count.
type progRun struct {
	ns   time.Duration
	runs uint64
}

func (r progRun) perRun() float64 { return float64(r.ns.Nanoseconds()) / float64(r.runs) }

// Empty programs' names in the tables, and the clock program's; the
// links of profi's programs loaded with the crash breaker off (classic).
const (
	emptyName      = "empty program"
	clockName      = "clock program"
	linksNoBreaker = "classic, crash breaker off"
)

// enableStats turns the kernel's BPF run-time statistics on for the run
// (BPF_ENABLE_STATS: kernel.bpf_stats_enabled reads 1 while the returned
// fd is open, and goes back to what it was when it closes, also if the
// benchmark dies). Without them the program table is left out.
func enableStats() io.Closer {
	c, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		fmt.Printf("BPF run-time statistics unavailable, so the program table is left out: %v\n", err)
		return nil
	}
	return c
}

// programs are the programs whose statistics the benchmark reads.
func (bc *bench) programs() map[progKey]*ebpf.Program {
	out := map[progKey]*ebpf.Program{}
	for name, p := range bc.objs.Programs() {
		links := "uprobe_multi"
		if bc.emptyMulti == nil {
			links = "classic, as loaded" // the kernel has no uprobe_multi: bpfobj.Load made them classic
		}
		out[progKey{name, links}] = p
	}
	for name, p := range bc.classic.Programs() {
		out[progKey{name, "classic"}] = p
	}
	if bc.noBreaker != nil {
		for name, p := range bc.noBreaker.Programs() {
			out[progKey{name, linksNoBreaker}] = p
		}
	}
	out[progKey{emptyName, "classic"}] = bc.empty
	out[progKey{clockName, "classic"}] = bc.clock
	if bc.emptyMulti != nil {
		out[progKey{emptyName, "uprobe_multi"}] = bc.emptyMulti
	}
	return out
}

// programStats reads every program's cumulative statistics; nil when they
// are off.
func (bc *bench) programStats() (map[progKey]progRun, error) {
	if bc.stats == nil {
		return nil, nil
	}
	out := map[progKey]progRun{}
	for k, p := range bc.programs() {
		st, err := p.Stats()
		if err != nil {
			return nil, fmt.Errorf("statistics of %s: %w", k, err)
		}
		out[k] = progRun{st.Runtime, st.RunCount}
	}
	return out, nil
}

// addRuns charges the programs' runs between before and after to c.
func (c *config) addRuns(before, after map[progKey]progRun) {
	for k, a := range after {
		b := before[k]
		if a.runs <= b.runs {
			continue
		}
		if c.progs == nil {
			c.progs = map[progKey]progRun{}
		}
		r := c.progs[k]
		r.ns += a.ns - b.ns
		r.runs += a.runs - b.runs
		c.progs[k] = r
	}
}

// printPrograms prints ns per program run, per configuration (only those
// whose loops ran a program the benchmark loaded: profi's and the empty
// probes), then per program over the whole run, with the targets.
func printPrograms(configs results) {
	total := map[progKey]progRun{}
	any := false
	for _, c := range configs {
		if len(c.progs) > 0 {
			any = true
		}
	}
	if !any {
		return
	}
	fmt.Printf("\nBPF program run time (kernel statistics, BPF_STATS_RUN_TIME, on for the whole run):\n\n")
	fmt.Printf("| Function | Configuration | Program | Links | Runs/call | ns per run |\n|---|---|---|---|---|---|\n")
	for _, c := range configs {
		calls := float64(len(c.ns)) * float64(*flagProbed+*flagWarmup)
		for _, k := range slices.SortedFunc(maps.Keys(c.progs), func(a, b progKey) int {
			return strings.Compare(a.String(), b.String())
		}) {
			r := c.progs[k]
			t := total[k]
			t.ns += r.ns
			t.runs += r.runs
			total[k] = t
			fmt.Printf("| %s | %s | %s | %s | %.2f | %.0f |\n", c.function(), c.name, k.name, k.links, float64(r.runs)/calls, r.perRun())
		}
	}
	fmt.Printf("\n| Program | Links | Runs | ns per run | × empty program (same links) | Target |\n|---|---|---|---|---|---|\n")
	target := map[string]string{
		"launch_entry": fmt.Sprintf("≤ %d", targetLaunchEntryNs),
		"timed_entry":  fmt.Sprintf("entry + return ≤ %d", targetTimedPairNs),
		"timed_return": fmt.Sprintf("entry + return ≤ %d", targetTimedPairNs),
		"nccl_entry":   fmt.Sprintf("entry + return ≤ %d", targetNcclPairNs),
		"nccl_return":  fmt.Sprintf("entry + return ≤ %d", targetNcclPairNs),
	}
	for _, k := range slices.SortedFunc(maps.Keys(total), func(a, b progKey) int {
		if (a.name == emptyName) != (b.name == emptyName) {
			if a.name == emptyName {
				return -1
			}
			return 1
		}
		return strings.Compare(a.String(), b.String())
	}) {
		r := total[k]
		ratio := "—"
		links := k.links
		if links == linksNoBreaker {
			links = "classic"
		}
		if e, ok := total[progKey{emptyName, links}]; ok && k.name != emptyName {
			ratio = fmtRatio(r.perRun() / e.perRun())
		}
		t := target[k.name]
		if t == "" {
			t = "—"
		}
		fmt.Printf("| %s | %s | %d | %.0f | %s | %s |\n", k.name, k.links, r.runs, r.perRun(), ratio, t)
	}
	for _, links := range []string{"uprobe_multi", "classic"} {
		pair := func(a, b string) string {
			x, okx := total[progKey{a, links}]
			y, oky := total[progKey{b, links}]
			if !okx || !oky {
				return "—"
			}
			return fmt.Sprintf("%.0f", x.perRun()+y.perRun())
		}
		fmt.Printf("%s: timed_entry + timed_return = %s ns (target ≤ %d), nccl_entry + nccl_return = %s ns (target ≤ %d)\n",
			links, pair("timed_entry", "timed_return"), targetTimedPairNs, pair("nccl_entry", "nccl_return"), targetNcclPairNs)
	}
}
