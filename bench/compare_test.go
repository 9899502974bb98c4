//go:build linux

package bench

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/profi-dev/profi/internal/attach"
	"github.com/profi-dev/profi/internal/ops"
)

// The prologue-skip target (issue 9): a hit on an endbr64; push function,
// probed where internal/attach probes it, costs at most this fraction of
// an entry probe at +0 on the same function.
const skipTarget = 0.4

// A counter is a tool other than profi that counts the loop's calls of
// c.fn. Its count is checked exactly, as profi's maps are.
type counter interface {
	// env is what the loop's environment needs for the tool.
	env() []string
	// probes are the addresses the tool puts uprobes on (entry only).
	probes(c *config) []probeAt
	// start begins counting the calls of loop pid, which waits for its
	// go-ahead. measure calls the returned stop exactly once: after the
	// loop exited, with its stderr, to end counting and get the count, or
	// to clean up after a failed run.
	start(c *config, pid int) (stop func(loopStderr string) (uint64, error), err error)
}

// bpftrace counts with the one-liner users reach for first: an entry
// uprobe at the symbol, whose program increments a per-CPU count map.
// It is started per run, once the loop waits, so it attaches to a running
// process as profi does, and stopped with SIGINT, when it prints @c.
type bpftrace struct{ bin string }

func (bpftrace) env() []string { return nil }

// probes: bpftrace probes at the symbol (uprobe:LIB:FUNC has offset 0).
func (bpftrace) probes(c *config) []probeAt { return []probeAt{{at: callPath[c.fn][0]}} }

// How long bpftrace may take to compile and attach its program, and to
// print its map and exit after SIGINT, on a busy VM.
const (
	bpftraceStartLimit = 60 * time.Second
	bpftraceStopLimit  = 30 * time.Second
)

// bpftraceSettle is how long to wait after the breakpoint appears (see
// start) for bpftrace to attach its program to the perf event that put
// it there: two syscalls later. A miss would fail the count check.
const bpftraceSettle = 100 * time.Millisecond

// bpftraceResignal is how often stop repeats SIGINT until bpftrace exits.
const bpftraceResignal = 2 * time.Second

var bpftraceCount = regexp.MustCompile(`(?m)^@c: (\d+)$`)

// start runs bpftrace on c's private copy. bpftrace 0.17 prints
// "Attaching 1 probe..." before it attaches, and nothing after, so the
// sign of the probe being in place is the probe itself: the int3 (0xcc)
// the kernel writes over the function's first byte in the waiting loop.
func (t bpftrace) start(c *config, pid int) (func(string) (uint64, error), error) {
	s := callPath[c.fn][0]
	lib := c.libs[s.lib]
	addr, err := funcAddr(pid, lib, s.sym)
	if err != nil {
		return nil, err
	}
	var out, errOut bytes.Buffer
	cmd := exec.Command(t.bin, "-e", fmt.Sprintf("uprobe:%s:%s { @c = count(); }", lib, s.sym))
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	var waitErr error
	exited := make(chan struct{})
	go func() { waitErr = cmd.Wait(); close(exited) }()
	stop := func(string) (uint64, error) {
		// On a heavily loaded VM (load average in the hundreds), bpftrace
		// 0.17 sometimes misses a SIGINT and goes on waiting in epoll_wait;
		// a second one ends it. So SIGINT is repeated until it exits: each
		// only sets its exit flag, so extra ones are harmless.
		deadline := time.After(bpftraceStopLimit)
		for done := false; !done; {
			_ = cmd.Process.Signal(os.Interrupt) // fails only if it has exited already
			select {
			case <-exited:
				done = true
			case <-time.After(bpftraceResignal):
			case <-deadline:
				_ = cmd.Process.Kill()
				<-exited
				return 0, fmt.Errorf("bpftrace did not exit %v after SIGINT\n%s", bpftraceStopLimit, errOut.String())
			}
		}
		if waitErr != nil {
			return 0, fmt.Errorf("%v: %v\n%s%s", cmd.Args, waitErr, out.String(), errOut.String())
		}
		m := bpftraceCount.FindSubmatch(out.Bytes())
		if m == nil {
			return 0, fmt.Errorf("no @c in bpftrace's output:\n%s%s", out.String(), errOut.String())
		}
		return strconv.ParseUint(string(m[1]), 10, 64)
	}
	if err := waitByte(pid, addr, 0xcc, exited, bpftraceStartLimit); err != nil {
		_, stopErr := stop("")
		return nil, fmt.Errorf("bpftrace did not attach: %w (%v)", err, stopErr)
	}
	time.Sleep(bpftraceSettle)
	return stop, nil
}

// interposer counts with bench/interpose.c preloaded into the loop: a
// library defining cuLaunchKernel, which the dynamic linker binds the
// loop's calls to. No kernel is involved, but it only reaches processes
// started with it.
type interposer struct{ lib string }

func (t interposer) env() []string { return []string{"LD_PRELOAD=" + t.lib} }

func (interposer) probes(*config) []probeAt { return nil }

var interposeCount = regexp.MustCompile(`(?m)^profi-interpose: (\w+) calls=(\d+)$`)

// start has nothing to start: the interposer reports its count on the
// loop's stderr at exit.
func (interposer) start(c *config, _ int) (func(string) (uint64, error), error) {
	return func(loopStderr string) (uint64, error) {
		m := interposeCount.FindStringSubmatch(loopStderr)
		if m == nil || m[1] != c.fn {
			return 0, fmt.Errorf("no count of %s from the interposer on the loop's stderr:\n%s", c.fn, loopStderr)
		}
		return strconv.ParseUint(m[2], 10, 64)
	}, nil
}

// funcAddr returns where function sym of the library file at path is
// mapped in process pid.
func funcAddr(pid int, path, sym string) (uint64, error) {
	off, err := funcOffset(path, sym)
	if err != nil {
		return 0, err
	}
	entries, err := readMaps(pid)
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		if e.Path == path && e.Perms[2] == 'x' && off >= e.Offset && off < e.Offset+(e.End-e.Start) {
			return e.Start + off - e.Offset, nil
		}
	}
	return 0, fmt.Errorf("pid %d does not map the code of %s at file offset %#x", pid, path, off)
}

// waitByte polls the byte at addr in process pid until it is want. It
// gives up after limit, or when done is closed (the tool exited).
func waitByte(pid int, addr uint64, want byte, done <-chan struct{}, limit time.Duration) error {
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		return err
	}
	defer mem.Close()
	deadline := time.Now().Add(limit)
	b := make([]byte, 1)
	for {
		if _, err := mem.ReadAt(b, int64(addr)); err != nil {
			return fmt.Errorf("read pid %d at %#x: %w", pid, addr, err)
		}
		if b[0] == want {
			return nil
		}
		select {
		case <-done:
			return errors.New("it exited")
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("byte at %#x is still %#02x after %v", addr, b[0], limit)
		}
	}
}

// skipOffset returns the offset past s's symbol where internal/attach
// probes s in the library file at path. The package exports that choice
// (its prologue logic) only as the Offset of each probe in its Status, so
// a scratch Attacher (kernel mode off, every program the empty one)
// attaches to the file, is read and is closed. No loop maps that file
// (loops map private copies), so the scratch probes never fire.
func (bc *bench) skipOffset(path string, s site) (uint64, error) {
	if offs, ok := bc.skip[path]; ok {
		return lookupOffset(offs, path, s)
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, err
	}
	progs := bc.classic.Programs()
	for name := range progs {
		progs[name] = bc.empty
	}
	att := attach.New(attach.Options{Programs: progs, KernelMode: ops.KernelModeOff, Profile: ops.ProfileLean}) // classic: bc.empty is no uprobe_multi program
	defer att.Close()
	att.Sync([]attach.Target{{
		Key:  attach.FileKey{Dev: st.Dev, Inode: st.Ino},
		Lib:  s.lib,
		Path: path,
		Open: func() (*os.File, error) { return os.Open(path) },
	}})
	status := att.Status()
	if len(status.Attached) != 1 {
		return 0, fmt.Errorf("scratch attach of %s: %+v", path, status)
	}
	offs := map[string]uint64{}
	for _, p := range status.Attached[0].Probes {
		offs[p.Symbol] = p.Offset
	}
	bc.skip[path] = offs
	return lookupOffset(offs, path, s)
}

func lookupOffset(offs map[string]uint64, path string, s site) (uint64, error) {
	off, ok := offs[s.sym]
	if !ok {
		return 0, fmt.Errorf("internal/attach does not probe %s in %s with kernel mode off", s.sym, path)
	}
	return off, nil
}

// skipRatio is what a hit at the skip offset costs relative to a hit at
// +0 on the same function, each less the unprobed call, by stat (median
// or min) of the runs.
func skipRatio(skip, plus0, none *config, stat func([]float64) float64) float64 {
	return (stat(skip.ns) - stat(none.ns)) / (stat(plus0.ns) - stat(none.ns))
}

// printSkipTarget reports the prologue-skip target on the CET function,
// by the median and by the min of the runs: on a shared VM other jobs
// only ever add time, so the two can disagree, and a reader should see
// both.
func printSkipTarget(configs results) {
	skip := slices.IndexFunc(configs, func(c *config) bool { return c.cet && c.name == cfgEmptySkip })
	if skip < 0 {
		return
	}
	s := configs[skip]
	plus0, none := configs.floorOf(s), configs.noneOf(s)
	fmt.Printf("\nPrologue skip on %s: internal/attach probes at %s (starts: %s).\n", s.function(), s.at(),
		firstBytes(s.libs[s.probes[0].at.lib], s.probes[0].at.sym, 6))
	if p := configs.named(s, cfgProfi+ops.KernelModeAnonymous); p != nil {
		fmt.Printf("profi's Status puts its probes on the call path at %v (single-steps per call: %d).\n", p.probes, p.steps)
	}
	fmt.Printf("A hit at %s, less the unprobed call, against a hit at +0 (target ≤ %.1f×):\n", s.at(), skipTarget)
	for _, st := range []struct {
		name string
		f    func([]float64) float64
	}{{"median", median}, {"min", slices.Min[[]float64]}} {
		r := skipRatio(s, plus0, none, st.f)
		verdict := "met"
		if r > skipTarget {
			verdict = "NOT met"
		}
		fmt.Printf("  by the %-6s %s× (%s − %s) / (%s − %s) ns: %s\n", st.name+":", fmtRatio(r),
			fmtNs(st.f(s.ns)), fmtNs(st.f(none.ns)), fmtNs(st.f(plus0.ns)), fmtNs(st.f(none.ns)), verdict)
	}
}

// Per-hit targets of issue 18: profi anonymous on a non-CET launch
// function against bpftrace's count() and an empty uprobe at the same
// symbol, and on the CET build against bpftrace (which probes at +0 and
// so single-steps endbr64).
const (
	targetHitVsBpftrace    = 1.0
	targetHitVsEmpty       = 1.15
	targetCETHitVsBpftrace = 0.1
)

// perHit is what one probe hit of c costs, by the median: ns per call
// less the unprobed call, over c's traps.
func perHit(configs results, c *config) float64 {
	return (median(c.ns) - median(configs.noneOf(c).ns)) / float64(c.traps)
}

// printHitTargets prints the per-hit ratios of issue 18 and the traps
// each launch API costs in anonymous mode.
func printHitTargets(configs results) {
	verdict := func(r, target float64) string {
		if r <= target {
			return "met"
		}
		return "NOT met"
	}
	fmt.Printf("\nPer hit (median ns per call less the unprobed call, over traps per call):\n")
	for _, t := range []struct {
		fn       string
		cet      bool
		vs       string
		target   float64
		profiCfg string
	}{
		{fnCuLaunch, false, cfgBpftrace, targetHitVsBpftrace, cfgProfi + ops.KernelModeAnonymous},
		{fnCuLaunch, false, cfgEmpty, targetHitVsEmpty, cfgProfi + ops.KernelModeAnonymous},
		{fnTimed, true, cfgBpftrace, targetCETHitVsBpftrace, cfgProfi + ops.KernelModeAnonymous},
	} {
		like := &config{fn: t.fn, cet: t.cet}
		p, o := configs.named(like, t.profiCfg), configs.named(like, t.vs)
		if p == nil || o == nil {
			continue
		}
		r := perHit(configs, p) / perHit(configs, o)
		fmt.Printf("  %s: %s %s ns/hit (%d traps) against %s %s ns/hit: %s× (target ≤ %.2f): %s\n", p.function(), p.name,
			fmtNs(perHit(configs, p)), p.traps, o.name, fmtNs(perHit(configs, o)), fmtRatio(r), t.target, verdict(r, t.target))
	}
	fmt.Printf("Traps per call in anonymous mode (target: 1 per launch, whatever the API):")
	for _, c := range configs {
		switch {
		case c.mode == ops.KernelModeAnonymous && c.handover:
			fmt.Printf(" %s %d once handed to the driver;", c.fn, c.traps)
		case c.mode == ops.KernelModeAnonymous && !c.multi && !c.cet && !c.noBreaker:
			fmt.Printf(" %s %d;", c.fn, c.traps)
		}
	}
	fmt.Println()
}

// A comparisonRow picks one configuration for the comparison table.
type comparisonRow struct {
	fn      string
	cet     bool
	name    string
	label   string
	restart string // what it takes to start counting a running process
}

// comparison is the table users ask for: ways of counting cuLaunchKernel,
// each against the empty probe at +0 on the same function. The CET rows
// show profi where the prologue skip applies (the driver stub has no CET
// build, so they are on the CET runtime's cudaMemcpyAsync).
var comparison = []comparisonRow{
	{fnCuLaunch, false, cfgNone, "no probe", "—"},
	{fnCuLaunch, false, cfgEmpty, "empty uprobe at +0 (floor)", "no"},
	{fnCuLaunch, false, cfgBpftrace, "bpftrace `@c = count()`", "no"},
	{fnCuLaunch, false, cfgProfi + ops.KernelModeOff, "profi, kernel mode `off`", "no"},
	{fnCuLaunch, false, cfgProfi + ops.KernelModeAnonymous, "profi, `anonymous`", "no"},
	{fnCuLaunch, false, cfgProfi + ops.KernelModeFull, "profi, `full`", "no"},
	{fnCuLaunch, false, cfgInterpose, "LD_PRELOAD interposer (relaxed atomic count)", "yes"},
	{fnTimed, true, cfgEmpty, "empty uprobe at +0 (floor)", "no"},
	{fnTimed, true, cfgProfi + ops.KernelModeAnonymous, "profi (entry + return), probes past endbr64", "no"},
}

// printComparison prints the comparison table; rows whose configuration
// did not run (bpftrace missing) are left out.
func printComparison(configs results) {
	fmt.Printf("\n| Function | Counting with | Needs a restart | Probe at | Kernel entries/call | ns/call min | ns/call median | × floor (median) | × floor (min) |\n")
	fmt.Printf("|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range comparison {
		c := configs.named(&config{fn: r.fn, cet: r.cet}, r.name)
		if c == nil {
			continue
		}
		floor := configs.floorOf(c)
		fmt.Printf("| %s | %s | %s | %s | %d | %s | %s | %s | %s |\n", c.function(), r.label, r.restart, c.at(), c.traps+c.steps,
			fmtNs(slices.Min(c.ns)), fmtNs(median(c.ns)), fmtRatio(median(c.ns)/median(floor.ns)),
			fmtRatio(slices.Min(c.ns)/slices.Min(floor.ns)))
	}
	fmt.Println()
}
