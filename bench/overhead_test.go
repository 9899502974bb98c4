//go:build linux

package bench

import (
	"bufio"
	"bytes"
	"debug/elf"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/profi-dev/profi/internal/attach"
	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/ops"
	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// Run sizes. Probed calls trap into the kernel (5-30 µs each on our VMs),
// so probed runs are short; unprobed runs are long enough to time ~3 ns calls.
var (
	flagReps     = flag.Int("overhead.reps", 5, "runs of each configuration (interleaved)")
	flagProbed   = flag.Int("overhead.probed", 50_000, "timed calls per run with a probe on the call path")
	flagUnprobed = flag.Int("overhead.unprobed", 50_000_000, "timed calls per run with no probe on the call path")
	flagWarmup   = flag.Int("overhead.warmup", 100, "untimed calls before each timed loop")
	flagBreaker  = flag.Bool("overhead.crash-breaker", true, "load the programs with the crash circuit breaker on, as the agent's default --crash-window does")
	flagOnly     = flag.String("overhead.only", "", "comma-separated loop functions to measure (e.g. cuLaunchKernel,ncclAllReduce); empty: all")
)

// The functions bench/loop.c calls.
const (
	fnLaunch   = "cudaLaunchKernel" // runtime launch: enters cuLaunchKernel below it
	fnCuLaunch = "cuLaunchKernel"   // driver launch, called directly
	fnTimed    = "cudaMemcpyAsync"  // timed in every kernel mode
	fnGraph    = "cudaGraphLaunch"  // a graph replay: timed in every kernel mode, enters cuGraphLaunch
)

// A site is a probeable function in one of the two stub libraries.
type site struct {
	lib discover.Library
	sym string
	op  ops.Op
}

var (
	siteLaunch   = site{discover.LibCudart, fnLaunch, ops.OpCudaLaunchKernel}
	siteCuLaunch = site{discover.LibCuda, fnCuLaunch, ops.OpCuLaunchKernel}
	siteTimed    = site{discover.LibCudart, fnTimed, ops.OpCudaMemcpyAsync}
	siteGraph    = site{discover.LibCudart, fnGraph, ops.OpCudaGraphLaunch}
	siteCuGraph  = site{discover.LibCuda, "cuGraphLaunch", ops.OpCuGraphLaunch}
)

// callPath lists the probeable functions one call of each loop function
// runs, outermost first: the runtime launch goes down into the driver.
var callPath = map[string][]site{
	fnLaunch:    {siteLaunch, siteCuLaunch},
	fnCuLaunch:  {siteCuLaunch},
	fnTimed:     {siteTimed},
	fnGraph:     {siteGraph, siteCuGraph},
	fnAllReduce: {siteAllReduce}, // nccl_overhead_test.go
}

// Configuration names, also the sub-benchmark names.
const (
	cfgNone      = "no_probe"
	cfgEmpty     = "empty_uprobe" // the floor: one entry probe at the called function's symbol (+0)
	cfgEmptyPair = "empty_uprobe+uretprobe"
	cfgClock     = "clock_uprobe"                  // one entry probe whose program only reads the clock
	cfgEmptyRD   = "empty_uprobe_rt+drv"           // entry probes on cudaLaunchKernel and cuLaunchKernel
	cfgEmptyRD4  = "empty_uprobe+uretprobe_rt+drv" // entry and return probes on both
	// At the offset internal/attach chooses: past an endbr64 followed by a push.
	cfgEmptySkip     = "empty_uprobe@skip"
	cfgEmptyPairSkip = "empty_uprobe+uretprobe@skip"
	cfgBpftrace      = "bpftrace_count"        // bpftrace one-liner, @c = count()
	cfgInterpose     = "ld_preload_interposer" // bench/interpose.c, no kernel
	cfgProfi         = "profi_"                // + kernel mode
	cfgMultiSuffix   = "_uprobe_multi"         // profi with uprobe_multi links (the agent's default)
	cfgHandedSuffix  = "_handed_over"          // profi after the runtime's launches were handed to the driver
	cfgNoBreaker     = "_no_breaker"           // profi's classic programs with the crash breaker off
)

// An emptyProbe is a probe running the floor program.
type emptyProbe struct {
	at    site
	ret   bool // a return probe as well
	skip  bool // at internal/attach's prologue offset instead of the symbol
	clock bool // the clock program (one bpf_ktime_get_ns) instead of the empty one
}

// A probeAt is a probed address: a function and the offset past its symbol.
type probeAt struct {
	at     site
	offset uint64
}

func (p probeAt) String() string { return fmt.Sprintf("%s+%d", p.at.sym, p.offset) }

// A config is one way of probing one loop function.
type config struct {
	fn    string
	cet   bool // the runtime is the CET build: every function starts endbr64; push %rbp
	name  string
	traps int // uprobe traps per call; checked against what was attached
	// steps is how many of those traps also single-step the probed
	// instruction out of line (a second kernel entry); checked against
	// the bytes at the probed addresses.
	steps int
	// multi: the probes are uprobe_multi links (profi: Options.UprobeMulti,
	// the agent's default; empty probes: one multi link per program). Only
	// configurations alike in this are "same traps".
	multi bool
	empty []emptyProbe // floor-program probes
	mode  string       // profi's kernel mode, attached by attach.Attacher; "" = profi not attached
	// handover: profi's attacher hands the runtime's launches to the
	// driver (attach.HandoverMaps), after one learning run in setup
	// (learning: that run, whose launches still trap at both layers).
	handover, learning bool
	// noBreaker: profi's classic programs loaded with the crash breaker
	// off (bench.noBreaker), beside the breaker-on ones in the same run.
	noBreaker bool
	tool      counter   // a tool other than profi counting the calls (compare_test.go); nil = none
	ns        []float64 // ns per call, one per run
	// progs: the BPF programs this configuration's loops ran, with their
	// run time from the kernel's statistics (progstats_test.go).
	progs map[progKey]progRun

	probes []probeAt                   // the probed addresses on the call path, outermost first
	libDir string                      // this configuration's private library copies
	libs   map[discover.Library]string // their real paths, as /proc/PID/maps shows them
	links  []link.Link                 // floor-program probes, attached once
	att    *attach.Attacher            // profi, attached once, synced with every loop
}

func (c *config) probed() bool { return c.traps > 0 }

// function names the measured function in tables: the CET build's is a
// different function body (endbr64 first).
func (c *config) function() string {
	if c.cet {
		return c.fn + " (CET)"
	}
	return c.fn
}

// id is the sub-benchmark name.
func (c *config) id() string {
	if c.cet {
		return c.fn + "_CET/" + c.name
	}
	return c.fn + "/" + c.name
}

// at is where the configuration probes the called function ("+4"), "—"
// when nothing on the call path is probed.
func (c *config) at() string {
	if len(c.probes) == 0 {
		return "—"
	}
	return fmt.Sprintf("+%d", c.probes[0].offset)
}

// results are the configurations of one run, with the lookups the reports
// need. Ratios are only taken within one function (and build).
type results []*config

func (r results) find(like *config, match func(*config) bool) *config {
	for _, c := range r {
		if c.fn == like.fn && c.cet == like.cet && match(c) {
			return c
		}
	}
	return nil
}

func (r results) named(like *config, name string) *config {
	return r.find(like, func(e *config) bool { return e.name == name })
}

// floorOf is the empty entry probe at the symbol of c's function.
func (r results) floorOf(c *config) *config { return r.named(c, cfgEmpty) }

func (r results) noneOf(c *config) *config { return r.named(c, cfgNone) }

// sameTraps is the empty-program configuration with the same traps and
// single-steps as c.
func (r results) sameTraps(c *config) *config {
	if !c.probed() {
		return nil
	}
	return r.find(c, func(e *config) bool {
		return e.empty != nil && e.traps == c.traps && e.steps == c.steps && e.multi == c.multi
	})
}

// bench is what every run shares.
type bench struct {
	dir       string // build outputs
	loop      string
	ncclLoop  string // bench/nccl_loop.c
	interpose string // the LD_PRELOAD interposer (bench/interpose.c)
	fx        *testutil.Fixtures
	objs      *bpfobj.Objects
	classic   *bpfobj.Objects // the programs of objs as classic uprobe programs
	// noBreaker: classic again, loaded with the crash breaker off; nil
	// when -overhead.crash-breaker=false (then every program is).
	noBreaker *bpfobj.Objects
	empty     *ebpf.Program
	// emptyMulti is the floor program for uprobe_multi links; nil where
	// the kernel has none (then the uprobe_multi rows are left out).
	emptyMulti *ebpf.Program
	// skip caches, per library file, the probe offset internal/attach
	// chooses for each function (skipOffset).
	skip map[string]map[string]uint64
	// clock is the floor program plus one bpf_ktime_get_ns: what the
	// machine's clock read adds to a program (a timed call reads it twice).
	clock *ebpf.Program
	// stats holds the kernel's BPF run-time statistics on; nil when
	// unavailable (progstats_test.go).
	stats io.Closer
}

// BenchmarkOverhead measures ns per call of stub CUDA functions called in a
// tight loop by a separate process: with no probe, with an empty uprobe
// (the floor: a BPF program that only returns 0) on the called function,
// with empty probes at the sites profi probes, with profi attached by its
// own attach.Attacher in each kernel mode (runtime→driver guard included),
// on a CET function at +0 and past its endbr64, and with the tools users
// compare profi with: bpftrace and an LD_PRELOAD interposer; and
// ncclAllReduce on the stub libnccl with the same kinds of probes and with
// profi's NCCL probes as uprobe_multi and as classic links
// (nccl_overhead_test.go). All
// configurations run interleaved in one run, so drift hits them alike;
// ratios are taken within the run. Each sub-benchmark reports ns/op =
// median ns per stub call.
//
//	sudo go test -run '^$' -bench Overhead -benchtime 1x ./bench/
func BenchmarkOverhead(b *testing.B) {
	testutil.RequireBPF(b)
	if *flagReps < 1 || *flagProbed < 1 || *flagUnprobed < 1 || *flagWarmup < 0 {
		b.Fatal("-overhead.* flags must be positive")
	}
	dir := b.TempDir()
	bc := &bench{dir: dir, skip: map[string]map[string]uint64{}}
	bc.build(b)

	// As cmd/profi loads it (uprobe_multi where the kernel has it), and
	// the same programs again as classic uprobe programs on the same maps,
	// for the configurations that compare the two kinds of links.
	noMulti := bpfobj.HaveUprobeMulti()
	objs, err := bpfobj.Load(bpfobj.Options{CrashBreaker: *flagBreaker})
	if err != nil {
		b.Fatal(err)
	}
	defer objs.Close()
	bc.objs = objs
	bc.classic, err = classicPrograms(objs, *flagBreaker)
	if err != nil {
		b.Fatal(err)
	}
	defer bc.classic.Close()
	if *flagBreaker {
		if bc.noBreaker, err = classicPrograms(objs, false); err != nil {
			b.Fatal(err)
		}
		defer bc.noBreaker.Close()
	}
	emptySpec := &ebpf.ProgramSpec{
		Name:         "bench_empty",
		Type:         ebpf.Kprobe, // uprobes are kprobe-type programs
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
		License:      "Dual BSD/GPL",
	}
	bc.empty, err = ebpf.NewProgram(emptySpec)
	if err != nil {
		b.Fatalf("load empty program: %v", err)
	}
	defer bc.empty.Close()
	clockSpec := emptySpec.Copy()
	clockSpec.Name = "bench_clock"
	clockSpec.Instructions = asm.Instructions{asm.FnKtimeGetNs.Call(), asm.Mov.Imm(asm.R0, 0), asm.Return()}
	if bc.clock, err = ebpf.NewProgram(clockSpec); err != nil {
		b.Fatalf("load clock program: %v", err)
	}
	defer bc.clock.Close()
	if noMulti != nil {
		fmt.Printf("the kernel has no uprobe_multi links, so the NCCL uprobe_multi rows are left out: %v\n", noMulti)
	} else {
		multiSpec := emptySpec.Copy()
		multiSpec.Name, multiSpec.AttachType = "bench_empty_m", ebpf.AttachTraceUprobeMulti
		if bc.emptyMulti, err = ebpf.NewProgram(multiSpec); err != nil {
			b.Fatalf("load empty uprobe_multi program: %v", err)
		}
		defer bc.emptyMulti.Close()
	}

	if bc.stats = enableStats(); bc.stats != nil {
		defer bc.stats.Close()
	}

	configs := bc.configurations()
	if *flagOnly != "" {
		only := strings.Split(*flagOnly, ",")
		configs = slices.DeleteFunc(configs, func(c *config) bool { return !slices.Contains(only, c.fn) })
	}
	defer bc.teardown(configs)
	for i, c := range configs {
		if err := bc.setup(c, filepath.Join(dir, fmt.Sprintf("cfg%02d", i))); err != nil {
			b.Fatalf("%s: %v", c.id(), err)
		}
		if c.handover { // the learning run; the next sync hands the launches over
			c.learning = true
			_, err := bc.measure(c)
			c.learning, c.progs = false, nil
			if err != nil {
				b.Fatalf("%s, learning run: %v", c.id(), err)
			}
		}
	}
	printMachine(configs)
	for rep := 0; rep < *flagReps; rep++ {
		for _, c := range configs {
			ns, err := bc.measure(c)
			if err != nil {
				b.Fatalf("%s, run %d: %v", c.id(), rep+1, err)
			}
			c.ns = append(c.ns, ns)
		}
	}

	printTable(configs)
	printSkipTarget(configs)
	printComparison(configs)
	printNccl(configs)
	printHitTargets(configs)
	printPrograms(configs)

	// The same numbers as benchmark results (benchstat-friendly).
	for _, c := range configs {
		floor, none, same := configs.floorOf(c), configs.noneOf(c), configs.sameTraps(c)
		b.Run(c.id(), func(b *testing.B) {
			med := median(c.ns)
			b.ReportMetric(med, "ns/op") // one op = one stub call
			b.ReportMetric(slices.Min(c.ns), "min-ns/call")
			b.ReportMetric(float64(c.traps), "traps/call")
			b.ReportMetric(float64(c.steps), "steps/call")
			b.ReportMetric(med/median(floor.ns), "x_floor")
			b.ReportMetric(med/median(none.ns), "x_noprobe")
			if same != nil {
				b.ReportMetric(med/median(same.ns), "x_empty_same")
			}
			if c.name == cfgEmptySkip {
				b.ReportMetric(skipRatio(c, floor, none, median), "x_plus0_hit")
			}
		})
	}
}

// configurations lists what runs, in the order of each round.
func (bc *bench) configurations() results {
	entry := func(s site) []emptyProbe { return []emptyProbe{{at: s}} }
	pair := func(s site) []emptyProbe { return []emptyProbe{{at: s, ret: true}} }
	skipped := func(ps []emptyProbe) []emptyProbe {
		for i := range ps {
			ps[i].skip = true
		}
		return ps
	}
	const (
		off  = ops.KernelModeOff
		anon = ops.KernelModeAnonymous
		full = ops.KernelModeFull
	)
	// bpftrace runs where it is installed; elsewhere its row is left out
	// with a message, not a failure.
	var bpftraceRow, bpftraceCET results
	if bin, err := exec.LookPath("bpftrace"); err != nil {
		fmt.Printf("bpftrace not found in PATH, so its row is left out (install it: apt-get install -y bpftrace): %v\n", err)
	} else {
		bpftraceRow = results{{fn: fnCuLaunch, name: cfgBpftrace, traps: 1, tool: bpftrace{bin: bin}}}
		// On the CET build bpftrace probes at +0: endbr64 is single-stepped.
		bpftraceCET = results{{fn: fnTimed, cet: true, name: cfgBpftrace, traps: 1, steps: 1, tool: bpftrace{bin: bin}}}
	}
	return bc.withoutBreaker(slices.Concat(results{
		{fn: fnLaunch, name: cfgNone},
		{fn: fnLaunch, name: cfgEmpty, traps: 1, empty: entry(siteLaunch)},
		{fn: fnLaunch, name: cfgEmptyRD, traps: 2, empty: []emptyProbe{{at: siteLaunch}, {at: siteCuLaunch}}},
		{fn: fnLaunch, name: cfgEmptyRD4, traps: 4, empty: []emptyProbe{{at: siteLaunch, ret: true}, {at: siteCuLaunch, ret: true}}},
		{fn: fnLaunch, name: cfgProfi + off, mode: off},
		{fn: fnLaunch, name: cfgProfi + anon, traps: 2, mode: anon},
		{fn: fnLaunch, name: cfgProfi + full, traps: 4, mode: full},
		// The agent's default links (uprobe_multi, one per program and file):
		// the same traps, a different kernel path to the program.
		{fn: fnLaunch, name: cfgProfi + anon + cfgMultiSuffix, traps: 2, mode: anon, multi: true},
		{fn: fnLaunch, name: cfgProfi + full + cfgMultiSuffix, traps: 4, mode: full, multi: true},
		// One trap per launch: the runtime's launch probe detached, the
		// driver's counting the launch as cudaLaunchKernel. One such
		// configuration only: what an attacher learned is keyed by its
		// file ids, which another attacher on the same maps reuses.
		{fn: fnLaunch, name: cfgProfi + anon + cfgMultiSuffix + cfgHandedSuffix, traps: 1, mode: anon, multi: true, handover: true},
		// The comparison (compare_test.go) is on the direct driver launch.
		{fn: fnCuLaunch, name: cfgNone},
		{fn: fnCuLaunch, name: cfgEmpty, traps: 1, empty: entry(siteCuLaunch)},
		{fn: fnCuLaunch, name: cfgEmptyPair, traps: 2, empty: pair(siteCuLaunch)},
		{fn: fnCuLaunch, name: cfgClock, traps: 1, empty: []emptyProbe{{at: siteCuLaunch, clock: true}}},
	}, bpftraceRow, results{
		{fn: fnCuLaunch, name: cfgProfi + off, mode: off},
		{fn: fnCuLaunch, name: cfgProfi + anon, traps: 1, mode: anon},
		{fn: fnCuLaunch, name: cfgProfi + full, traps: 2, mode: full},
		{fn: fnCuLaunch, name: cfgInterpose, tool: interposer{lib: bc.interpose}},
		{fn: fnTimed, name: cfgNone},
		{fn: fnTimed, name: cfgEmpty, traps: 1, empty: entry(siteTimed)},
		{fn: fnTimed, name: cfgEmptyPair, traps: 2, empty: pair(siteTimed)},
		// Timed in every mode; attached with the default mode.
		{fn: fnTimed, name: cfgProfi + anon, traps: 2, mode: anon},
		{fn: fnTimed, name: cfgProfi + anon + cfgMultiSuffix, traps: 2, mode: anon, multi: true},
		// The same function in the CET build: at +0 the kernel single-steps
		// endbr64; past it, it emulates the push (docs/PROBES.md, "Probe placement").
		{fn: fnTimed, cet: true, name: cfgNone},
		{fn: fnTimed, cet: true, name: cfgEmpty, traps: 1, steps: 1, empty: entry(siteTimed)},
		{fn: fnTimed, cet: true, name: cfgEmptySkip, traps: 1, empty: skipped(entry(siteTimed))},
		{fn: fnTimed, cet: true, name: cfgEmptyPairSkip, traps: 2, empty: skipped(pair(siteTimed))},
		{fn: fnTimed, cet: true, name: cfgProfi + anon, traps: 2, mode: anon},
	}, bpftraceCET, results{
		// A graph replay of an executable graph profi did not see built
		// (the stub hands out fake handles; bench/loop.c): graph id 0, so
		// timed_return's graph_execs lookup misses; a known graph costs
		// that lookup's hit instead. The runtime replays through
		// cuGraphLaunch: both are timed, 4 traps.
		{fn: fnGraph, name: cfgNone},
		{fn: fnGraph, name: cfgEmpty, traps: 1, empty: entry(siteGraph)},
		{fn: fnGraph, name: cfgEmptyRD4, traps: 4, empty: []emptyProbe{{at: siteGraph, ret: true}, {at: siteCuGraph, ret: true}}},
		{fn: fnGraph, name: cfgProfi + anon, traps: 4, mode: anon},
		{fn: fnGraph, name: cfgProfi + anon + cfgMultiSuffix, traps: 4, mode: anon, multi: true},
	}, bc.ncclConfigurations()))
}

// withoutBreaker measures the crash breaker's cost within the run: after
// each classic anonymous row of a direct driver launch and of a timed call
// it adds the same row with profi's programs loaded with the breaker off,
// so that drift over a round hits both alike.
func (bc *bench) withoutBreaker(configs results) results {
	if bc.noBreaker == nil {
		return configs
	}
	var out results
	for _, c := range configs {
		out = append(out, c)
		if c.mode == ops.KernelModeAnonymous && !c.multi && !c.cet && (c.fn == fnCuLaunch || c.fn == fnTimed) {
			off := *c
			off.name += cfgNoBreaker
			off.noBreaker = true
			out = append(out, &off)
		}
	}
	return out
}

// build builds the stubs, bench/loop.c, bench/nccl_loop.c and
// bench/interpose.c into bc.dir.
// The loop is linked without a RUNPATH: each run finds its configuration's
// library copies through LD_LIBRARY_PATH (see setup).
func (bc *bench) build(b *testing.B) {
	b.Helper()
	fx, err := testutil.BuildFixtures(filepath.Join(bc.dir, "fixtures"))
	if errors.Is(err, testutil.ErrNoCompiler) {
		b.Skipf("skipping overhead benchmark: %v", err)
	}
	if err != nil {
		b.Fatal(err)
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		b.Fatal(err)
	}
	bc.fx = fx
	bc.loop = filepath.Join(bc.dir, "loop")
	bc.ncclLoop = filepath.Join(bc.dir, "nccl_loop")
	// Not named libcuda*: discover must not recognise it (see targets).
	bc.interpose = filepath.Join(bc.dir, "libprofibench-interpose.so")
	incl := "-I" + filepath.Join(root, "test", "stubs")
	for _, args := range [][]string{
		{incl, "-o", bc.loop, filepath.Join(root, "bench", "loop.c"),
			"-L" + fx.Dir, "-l:libcudart.so.12", "-l:libcuda.so.1"},
		{incl, "-o", bc.ncclLoop, filepath.Join(root, "bench", "nccl_loop.c"), "-L" + fx.Dir, "-l:libnccl.so.2"},
		{"-shared", "-fPIC", incl, "-o", bc.interpose, filepath.Join(root, "bench", "interpose.c"), "-ldl"},
	} {
		cmd := exec.Command("gcc", append([]string{"-O2", "-Wall", "-Wextra", "-Werror"}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
		}
	}
}

// sources are the fixture files c's private copies are made from.
func (bc *bench) sources(c *config) map[discover.Library]string {
	if c.fn == fnAllReduce {
		return map[discover.Library]string{discover.LibNCCL: bc.fx.Nccl}
	}
	src := map[discover.Library]string{discover.LibCudart: bc.fx.Cudart, discover.LibCuda: bc.fx.Cuda}
	if c.cet {
		src[discover.LibCudart] = bc.fx.CudartCET
	}
	return src
}

// profiPrograms are the programs profi's attacher attaches, by name: all
// of them, as the agent passes them (cmd/profi), loaded for uprobe_multi
// links or for classic ones.
func (bc *bench) profiPrograms(c *config) map[string]*ebpf.Program {
	switch {
	case c.noBreaker:
		return bc.noBreaker.Programs()
	case !c.multi:
		return bc.classic.Programs()
	}
	return bc.objs.Programs()
}

// classicPrograms loads profi's programs as classic uprobe programs (as
// bpfobj.Load does on kernels without uprobe_multi) on objs's maps, so
// both kinds of links count into the same maps.
func classicPrograms(objs *bpfobj.Objects, breaker bool) (*bpfobj.Objects, error) {
	spec, err := bpfobj.LoadProfi()
	if err != nil {
		return nil, err
	}
	for _, p := range spec.Programs {
		if p.AttachType == ebpf.AttachTraceUprobeMulti {
			p.AttachType = ebpf.AttachNone
		}
	}
	if err := spec.Variables[bpfobj.ProfiVarCrashBreaker].Set(breaker); err != nil {
		return nil, fmt.Errorf("set crash_breaker: %w", err)
	}
	// The maps are objs' own, as bpfobj.Load made them (its hash maps
	// BPF_F_NO_PREALLOC where the kernel allows it): the specs must say so.
	maps := objs.Maps()
	for name, m := range spec.Maps {
		if r, ok := maps[name]; ok {
			m.Flags = r.Flags()
		}
	}
	var out bpfobj.Objects
	if err := spec.LoadAndAssign(&out.ProfiPrograms, &ebpf.CollectionOptions{MapReplacements: maps}); err != nil {
		return nil, fmt.Errorf("load classic programs: %w", err)
	}
	return &out, nil
}

// privateNames are the names of the private copies of each stub library
// (which discover.Classify does not recognise) and the soname each loop
// finds them by (a symlink next to the copy).
var privateNames = map[discover.Library]struct{ priv, alt string }{
	discover.LibCudart: {"libprofibench-rt.so", "libcudart.so.12"},
	discover.LibCuda:   {"libprofibench-drv.so", "libcuda.so.1"},
	discover.LibNCCL:   {"libprofibench-nccl.so", "libnccl.so.2"},
}

// setup gives c its own copies of its stubs in dir (both CUDA stubs, or
// libnccl) and attaches its probes to them, once for the whole run.
//
// The copies' files are not named libcudart.so* / libcuda.so* /
// libnccl.so*; the loop reaches them through libcudart.so.12,
// libcuda.so.1 and libnccl.so.2 symlinks in dir
// (LD_LIBRARY_PATH; the loop links libcuda.so.1 itself, so the copy of
// libcudart finds the driver loaded instead of the fixture its RUNPATH
// names). Private inodes per configuration keep every other probe off
// c's loops: other configurations' (attached all run long), the shared
// fixtures', and those of any profi agent on this host (other tests),
// which the names in /proc/PID/maps keep from discovering the loop.
//
// Attaching once keeps uprobe teardown out of the run (closing a uprobe
// link waits for an RCU grace period: 2.8-5.4 s for profi's 34-57 links
// here), and matches an agent's steady state: the probes are in place
// when a process maps the library, and each new process is synced in.
// Tools other than profi attach per run (see counter).
func (bc *bench) setup(c *config, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	dir, err := filepath.EvalSymlinks(dir) // the path /proc/PID/maps shows
	if err != nil {
		return err
	}
	src := bc.sources(c)
	c.libDir, c.libs = dir, map[discover.Library]string{}
	for lib, from := range src {
		l := privateNames[lib]
		c.libs[lib] = filepath.Join(dir, l.priv)
		if _, ok := discover.Classify(c.libs[lib]); ok {
			return fmt.Errorf("discover recognises the private copy %s: any profi agent on this host would probe it", c.libs[lib])
		}
		if err := testutil.CopyFile(from, c.libs[lib]); err != nil {
			return err
		}
		if err := os.Symlink(l.priv, filepath.Join(dir, l.alt)); err != nil {
			return err
		}
	}

	switch {
	case c.mode != "":
		// profi as the agent runs it: its attacher, the kernel mode, the
		// default probe profile, no PID filter (--pid unset).
		opts := attach.Options{
			Programs:      bc.profiPrograms(c),
			KernelMode:    c.mode,
			Profile:       ops.ProfileLean,
			PIDFiles:      bc.objs.PidFiles,
			RuntimeRanges: true,
			UprobeMulti:   c.multi,
		}
		if c.handover {
			opts.Handover = attach.HandoverMaps{Sites: bc.objs.RtSites, Ops: bc.objs.RtOps, Counted: bc.objs.RtCounted}
		}
		c.att = attach.New(opts)
		return nil // attached by the first Sync, with the first loop; checked there
	case c.tool != nil:
		c.probes = c.tool.probes(c)
		if len(c.probes) != c.traps { // entry probes only: one trap each
			return fmt.Errorf("%T probes %d functions, the configuration says %d traps", c.tool, len(c.probes), c.traps)
		}
		return c.checkSteps()
	}
	if err := bc.attachEmpty(c, src); err != nil {
		return err
	}
	return c.checkSteps()
}

// attachEmpty attaches c's floor-program probes to its copies.
func (bc *bench) attachEmpty(c *config, src map[discover.Library]string) error {
	exes := map[discover.Library]*link.Executable{}
	for lib, path := range c.libs {
		var err error
		if exes[lib], err = link.OpenExecutable(path); err != nil {
			return err
		}
	}
	traps := 0
	for _, e := range c.empty {
		var off uint64
		if e.skip {
			var err error
			if off, err = bc.skipOffset(src[e.at.lib], e.at); err != nil {
				return err
			}
		}
		c.probes = append(c.probes, probeAt{e.at, off})
		// As the attacher does: return probe first, cookie = op | file << 32.
		opts := &link.UprobeOptions{Cookie: ops.Cookie(e.at.op, 1), Offset: off}
		if c.multi {
			n, err := bc.attachEmptyMulti(c, exes[e.at.lib], e, off)
			if err != nil {
				return err
			}
			traps += n
			continue
		}
		prog := bc.empty
		if e.clock {
			prog = bc.clock
		}
		if e.ret {
			l, err := exes[e.at.lib].Uretprobe(e.at.sym, prog, opts)
			if err != nil {
				return fmt.Errorf("attach return probe %s+%d: %w", e.at.sym, off, err)
			}
			c.links = append(c.links, l)
			traps++
		}
		l, err := exes[e.at.lib].Uprobe(e.at.sym, prog, opts)
		if err != nil {
			return fmt.Errorf("attach probe %s+%d: %w", e.at.sym, off, err)
		}
		c.links = append(c.links, l)
		traps++
	}
	if traps != c.traps {
		return fmt.Errorf("the probes attached trap %d times per call, the configuration says %d", traps, c.traps)
	}
	return nil
}

// checkSteps counts, from the bytes at c's probed addresses, the hits per
// call whose instruction the kernel single-steps, and fails if that is not
// what c says. A return probe shares its entry's address (one breakpoint),
// so each address counts once.
func (c *config) checkSteps() error {
	steps := 0
	seen := map[probeAt]bool{}
	for _, p := range c.probes {
		if seen[p] {
			continue
		}
		seen[p] = true
		start, err := funcOffset(c.libs[p.at.lib], p.at.sym)
		if err != nil {
			return err
		}
		code, err := readAt(c.libs[p.at.lib], start+p.offset, 2)
		if err != nil {
			return err
		}
		if !emulated(code) {
			steps++
		}
	}
	if steps != c.steps {
		return fmt.Errorf("probes at %v single-step %d instructions per call, the configuration says %d", c.probes, steps, c.steps)
	}
	return nil
}

// emulated reports whether the kernel emulates the instruction at code
// under a uprobe (one trap) rather than single-stepping it out of line
// (a second trap): a push of a general register, as in
// internal/attach/prologue.go. The kernel emulates some jumps, calls and
// nops as well; no measured function starts with one, so treating them as
// stepped could only fail a run, never hide a step.
func emulated(code []byte) bool {
	switch {
	case len(code) >= 1 && code[0] >= 0x50 && code[0] <= 0x57: // push %rax..%rdi
		return true
	case len(code) >= 2 && code[0] == 0x41 && code[1] >= 0x50 && code[1] <= 0x57: // push %r8..%r15
		return true
	}
	return false
}

// teardown detaches every configuration, all at once: each link close
// waits for a grace period, and the waits overlap.
func (bc *bench) teardown(configs []*config) {
	var wg sync.WaitGroup
	for _, c := range configs {
		if c.att != nil {
			wg.Go(func() { c.att.Sync(nil); c.att.Close() })
		}
		for _, l := range c.links {
			wg.Go(func() { l.Close() })
		}
	}
	wg.Wait()
}

// measure starts a loop on c's libraries and, while it waits, syncs
// profi's attacher with it or starts c's tool (c's other probes are in
// place already). Then it lets the loop run, checks that profi's BPF maps
// or the tool counted exactly its calls, and returns ns per call.
func (bc *bench) measure(c *config) (ns float64, err error) {
	calls, loop := *flagUnprobed, bc.loop
	if c.fn == fnAllReduce {
		calls, loop = *flagNcclUnprobed, bc.ncclLoop
	}
	if c.probed() {
		calls = *flagProbed
	}
	var stderr bytes.Buffer
	cmd := exec.Command(loop, c.fn, fmt.Sprint(calls), fmt.Sprint(*flagWarmup))
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+c.libDir)
	if c.tool != nil {
		cmd.Env = append(cmd.Env, c.tool.env()...)
	}
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return 0, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	waited := false
	defer func() {
		if !waited {
			stdin.Close()          // the loop exits when stdin ends before the go-ahead
			_ = cmd.Process.Kill() // cleanup of a failed run: the run's error is what matters
			_ = cmd.Wait()
		}
	}()
	out := bufio.NewReader(stdout)
	var pid int
	if line, err := out.ReadString('\n'); err != nil {
		return 0, fmt.Errorf("loop did not start: %v\n%s", err, stderr.String())
	} else if _, err := fmt.Sscanf(line, "ready pid=%d\n", &pid); err != nil || pid != cmd.Process.Pid {
		return 0, fmt.Errorf("unexpected loop output %q (%v)", line, err)
	}

	// Every run checks the loop's mappings, so no foreign probe can reach it.
	targets, err := c.targets(pid)
	if err != nil {
		return 0, err
	}
	if c.att != nil {
		if err := c.syncProfi(targets); err != nil {
			return 0, err
		}
	}
	var stop func(loopStderr string) (uint64, error)
	if c.tool != nil {
		if stop, err = c.tool.start(c, pid); err != nil {
			return 0, fmt.Errorf("%s: %w", c.name, err)
		}
		defer func() {
			if stop != nil {
				_, _ = stop("") // a failed run: only stop the tool
			}
		}()
	}
	before, err := bc.drops()
	if err != nil {
		return 0, err
	}
	progsBefore, err := bc.programStats()
	if err != nil {
		return 0, err
	}
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		return 0, err
	}
	stdin.Close()
	rest, err := io.ReadAll(out)
	if err != nil {
		return 0, err
	}
	err = cmd.Wait()
	waited = true
	if err != nil {
		return 0, fmt.Errorf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, stderr.String())
	}
	var gotPID, gotCalls, warmup int
	var elapsed int64
	if _, err := fmt.Sscanf(string(rest), "pid=%d calls=%d warmup=%d elapsed_ns=%d",
		&gotPID, &gotCalls, &warmup, &elapsed); err != nil || gotPID != pid || gotCalls != calls {
		return 0, fmt.Errorf("unexpected loop output %q (%v)", rest, err)
	}
	n := uint64(calls + warmup)
	progsAfter, err := bc.programStats()
	if err != nil {
		return 0, err
	}
	c.addRuns(progsBefore, progsAfter)
	if stop != nil {
		got, err := stop(stderr.String())
		stop = nil
		if err != nil {
			return 0, fmt.Errorf("%s: %w", c.name, err)
		}
		if got != n {
			return 0, fmt.Errorf("%s counted %d calls of %s, the loop made %d, so the run measured something else", c.name, got, c.fn, n)
		}
	}
	if c.att != nil {
		after, err := bc.drops()
		if err != nil {
			return 0, err
		}
		if err := bc.checkCounts(c, uint32(pid), n, before, after); err != nil {
			return 0, fmt.Errorf("profi's counts are not exact, so the run measured something else: %w", err)
		}
		if err := bc.checkNccl(c, uint32(pid), n); err != nil {
			return 0, fmt.Errorf("profi's NCCL counts are not exact, so the run measured something else: %w", err)
		}
	}
	return float64(elapsed) / float64(calls), nil
}

// syncProfi syncs c's attacher with the loop's targets, as a discovery
// pass does: it attaches the libraries on the first run and, on every
// run, writes pid_files (with the runtime→driver guard's range)
// for the new process. Then it checks that its libraries (both CUDA
// stubs, or libnccl) are attached without failures, as uprobe_multi
// links exactly when c says so, and, from the attacher's Status (what
// /status shows),
// that one call of c.fn traps c.traps times and single-steps c.steps
// instructions: on the CET build, the probe offsets must skip endbr64.
func (c *config) syncProfi(targets []attach.Target) error {
	c.att.Sync(targets)
	cnt := c.att.Counters()
	attached := 0
	for lib := range c.libs {
		if cnt.Attached[lib] == 1 {
			attached++
		}
	}
	if len(cnt.Failures) > 0 || attached != len(c.libs) {
		return fmt.Errorf("attach: files attached by library %v, want one of each of %v; failures %v, status %+v",
			cnt.Attached, slices.Sorted(maps.Keys(c.libs)), cnt.Failures, c.att.Status())
	}
	for _, ls := range c.att.Status().Attached {
		// A refusal of uprobe_multi would fall back to classic links
		// silently.
		if ls.UprobeMulti != c.multi {
			return fmt.Errorf("%s attached with uprobe_multi %v, want %v", ls.Path, ls.UprobeMulti, c.multi)
		}
	}
	traps := 0
	c.probes = c.probes[:0]
	for _, s := range callPath[c.fn] {
		for _, ls := range c.att.Status().Attached {
			for _, p := range ls.Probes {
				if string(s.lib) == ls.Library && s.sym == p.Symbol && !p.CountedAtDriver {
					traps += p.Traps
					c.probes = append(c.probes, probeAt{s, p.Offset})
				}
			}
		}
	}
	want := c.traps
	if c.learning {
		want++ // the runtime's probe too, until the handover
	}
	if traps != want {
		return fmt.Errorf("profi's probes trap %d times per call, the configuration says %d", traps, want)
	}
	return c.checkSteps()
}

// targets is what attach.Targets makes of a discovery scan of the loop,
// read from /proc/PID/maps as discover's scan reads it (one mapping per
// file, its code = the first executable mapping), with the private copies
// standing for libcudart and libcuda. It fails if the loop maps a CUDA
// library discover would recognise: an agent elsewhere on the host could
// probe it. The dynamic loader is left out: an agent's hook there fires
// when a library loads, never in the timed loop, and hooking the host's
// ld.so from here would trap every process's library loads.
func (c *config) targets(pid int) ([]attach.Target, error) {
	entries, err := readMaps(pid)
	if err != nil {
		return nil, err
	}
	proc := discover.Process{PID: pid}
	for _, e := range entries {
		if lib, ok := discover.Classify(e.Path); ok && lib != discover.LibLoader {
			return nil, fmt.Errorf("the loop maps %s (%s), which any profi agent on this host would probe", e.Path, lib)
		}
		var lib discover.Library
		for l, path := range c.libs {
			if e.Path == path {
				lib = l
			}
		}
		if lib == "" {
			continue
		}
		i := slices.IndexFunc(proc.Libs, func(m discover.Mapping) bool { return m.Lib == lib })
		if i < 0 {
			proc.Libs = append(proc.Libs, discover.Mapping{PID: pid, Lib: lib, Path: e.Path, Dev: e.Dev, Inode: e.Inode})
			i = len(proc.Libs) - 1
		}
		if m := &proc.Libs[i]; e.Perms[2] == 'x' && m.TextEnd == 0 {
			m.TextStart, m.TextEnd = e.Start, e.End
		}
	}
	for _, lib := range slices.Sorted(maps.Keys(c.libs)) {
		i := slices.IndexFunc(proc.Libs, func(m discover.Mapping) bool { return m.Lib == lib })
		if i < 0 || proc.Libs[i].TextEnd == 0 {
			return nil, fmt.Errorf("the loop does not map the code of %s (%s)", c.libs[lib], lib)
		}
	}
	return attach.Targets(&discover.Result{Processes: []discover.Process{proc}}, discover.DefaultProcRoot), nil
}

// readMaps returns the file mappings of a process.
func readMaps(pid int) ([]discover.MapsEntry, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return nil, err
	}
	var out []discover.MapsEntry
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		e, ok, err := discover.ParseMapsLine(line)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, e)
		}
	}
	return out, nil
}

// drops sums the per-CPU drop counters (global to this benchmark's BPF
// object, which only the loop's calls reach).
func (bc *bench) drops() ([bpfobj.NumDrops]uint64, error) {
	var out [bpfobj.NumDrops]uint64
	for i := range out {
		var cpus []uint64
		if err := bc.objs.Drops.Lookup(uint32(i), &cpus); err != nil {
			return out, fmt.Errorf("lookup drop counter %d: %w", i, err)
		}
		for _, v := range cpus {
			out[i] += v
		}
	}
	return out, nil
}

// counted is what profi's maps hold for one process, by operation.
type counted struct {
	launches      map[ops.Op]uint64 // launch_agg count
	timedLaunches map[ops.Op]uint64 // launch_agg timed (full mode)
	calls         map[ops.Op]uint64 // aggregated count
	histogram     map[ops.Op]uint64 // aggregated histogram total
	drops         map[bpfobj.Drop]uint64
}

func newCounted() counted {
	return counted{map[ops.Op]uint64{}, map[ops.Op]uint64{}, map[ops.Op]uint64{}, map[ops.Op]uint64{}, map[bpfobj.Drop]uint64{}}
}

// checkCounts verifies that profi counted the loop's n calls exactly, and
// nothing else: a launch once, as the outermost probed launch API (a
// runtime launch as cudaLaunchKernel, never as cuLaunchKernel too); a
// timed call with its latency in the histogram; the driver launch below a
// runtime launch merged (rt_to_drv drop reason, anonymous mode) or nested
// (nested, full mode), which also proves its probe trapped on every call.
func (bc *bench) checkCounts(c *config, pid uint32, n uint64, before, after [bpfobj.NumDrops]uint64) error {
	want := newCounted()
	if c.traps > 0 && c.fn != fnAllReduce { // NCCL calls count in nccl_agg only (checkNccl)
		outer := callPath[c.fn][0]
		switch {
		case c.fn == fnTimed:
			want.calls[outer.op], want.histogram[outer.op] = n, n
		case c.fn == fnGraph: // and the loop's one instantiate
			want.calls[outer.op], want.histogram[outer.op] = n, n
			want.calls[ops.OpCudaGraphInstantiate], want.histogram[ops.OpCudaGraphInstantiate] = 1, 1
			// Each replay's cuGraphLaunch, and the instantiate's
			// cuGraphInstantiateWithFlags (test/stubs/cudart.c), nest.
			want.drops[bpfobj.DropNested] = n + 1
		case c.mode == ops.KernelModeAnonymous:
			want.launches[outer.op] = n
		case c.mode == ops.KernelModeFull: // timed launches: aggregated too
			want.launches[outer.op], want.timedLaunches[outer.op] = n, n
			want.calls[outer.op], want.histogram[outer.op] = n, n
		}
		if c.fn == fnLaunch {
			switch c.mode {
			case ops.KernelModeAnonymous:
				if !c.handover || c.learning {
					want.drops[bpfobj.DropRuntimeToDrv] = n
				}
			case ops.KernelModeFull:
				want.drops[bpfobj.DropNested] = n
			}
		}
	}
	got := newCounted()
	var (
		lk bpfobj.ProfiLaunchKey
		lv []bpfobj.ProfiLaunchVal
	)
	it := bc.objs.LaunchAgg.Iterate()
	for it.Next(&lk, &lv) {
		if lk.Pid != pid {
			continue
		}
		for _, v := range lv {
			got.launches[ops.Op(lk.Op)] += v.Count
			got.timedLaunches[ops.Op(lk.Op)] += v.Timed
		}
	}
	if err := it.Err(); err != nil {
		return err
	}
	var (
		ak bpfobj.ProfiAggKey
		av []bpfobj.ProfiAggVal
	)
	it = bc.objs.Aggregated.Iterate()
	for it.Next(&ak, &av) {
		if ak.Pid != pid {
			continue
		}
		for _, v := range av {
			got.calls[ops.Op(ak.Op)] += v.Count
			for _, k := range v.Buckets {
				got.histogram[ops.Op(ak.Op)] += k
			}
		}
	}
	if err := it.Err(); err != nil {
		return err
	}
	for i := range after {
		got.drops[bpfobj.Drop(i)] = after[i] - before[i]
	}
	for _, m := range []map[ops.Op]uint64{got.launches, got.timedLaunches, got.calls, got.histogram} {
		maps.DeleteFunc(m, func(_ ops.Op, v uint64) bool { return v == 0 })
	}
	maps.DeleteFunc(got.drops, func(_ bpfobj.Drop, v uint64) bool { return v == 0 })
	for _, m := range []struct {
		what      string
		got, want map[ops.Op]uint64
	}{
		{"launch_agg count", got.launches, want.launches},
		{"launch_agg timed", got.timedLaunches, want.timedLaunches},
		{"aggregated count", got.calls, want.calls},
		{"aggregated histogram", got.histogram, want.histogram},
	} {
		if !maps.Equal(m.got, m.want) {
			return fmt.Errorf("%s of pid %d by operation: got %s, want %s", m.what, pid, fmtOps(m.got), fmtOps(m.want))
		}
	}
	if !maps.Equal(got.drops, want.drops) {
		return fmt.Errorf("drop counters moved by %v during the run, want %v", got.drops, want.drops)
	}
	if c.fn == fnGraph && c.traps > 0 {
		return bc.checkReplays(pid, n)
	}
	return nil
}

// checkReplays verifies that graph_replays holds exactly n replays of the
// loop's executable graph (graph id 0: profi did not see it built).
func (bc *bench) checkReplays(pid uint32, n uint64) error {
	var (
		k   bpfobj.ProfiReplayKey
		v   []uint64
		got = map[uint64]uint64{}
	)
	it := bc.objs.GraphReplays.Iterate()
	for it.Next(&k, &v) {
		if k.Pid != pid {
			continue
		}
		for _, x := range v {
			got[k.Graph] += x
		}
	}
	if err := it.Err(); err != nil {
		return err
	}
	if want := map[uint64]uint64{0: n}; !maps.Equal(got, want) {
		return fmt.Errorf("graph_replays of pid %d by graph id: got %v, want %v", pid, got, want)
	}
	return nil
}

func fmtOps(m map[ops.Op]uint64) string {
	var parts []string
	for _, op := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s=%d", ops.Name(uint32(op)), m[op]))
	}
	return "{" + strings.Join(parts, " ") + "}"
}

// printTable prints every configuration's results as a Markdown table,
// then every run's ns per call.
func printTable(configs results) {
	fmt.Printf("\n| Function | Configuration | Kernel mode | Probe at | Traps/call | Single-steps/call | ns/call min | ns/call median | × floor (median) | × floor (min) | × no probe (median) | × empty, same traps (median) | ns per kernel entry (median) |\n")
	fmt.Printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range configs {
		floor, none := configs.floorOf(c), configs.noneOf(c)
		mn, med := slices.Min(c.ns), median(c.ns)
		same, perEntry, mode := "—", "—", "—"
		if e := configs.sameTraps(c); e != nil {
			same = fmtRatio(med / median(e.ns))
		}
		if c.probed() {
			perEntry = fmtNs((med - median(none.ns)) / float64(c.traps+c.steps))
		}
		if c.mode != "" {
			mode = c.mode
		}
		fmt.Printf("| %s | %s | %s | %s | %d | %d | %s | %s | %s | %s | %s | %s | %s |\n", c.function(), c.name, mode, c.at(),
			c.traps, c.steps, fmtNs(mn), fmtNs(med), fmtRatio(med/median(floor.ns)), fmtRatio(mn/slices.Min(floor.ns)),
			fmtRatio(med/median(none.ns)), same, perEntry)
	}
	fmt.Printf("\nfloor = %s at +0 on the called function; runs per configuration: %d (interleaved); "+
		"calls per run: %d probed, %d unprobed (%s: %d)\n", cfgEmpty, *flagReps, *flagProbed, *flagUnprobed,
		fnAllReduce, *flagNcclUnprobed)
	for _, c := range configs {
		fmt.Printf("  %-52s %s\n", c.id(), fmtRuns(c.ns))
	}
}

// printMachine prints what docs/BENCHMARK.md records about the machine and
// the first bytes of each measured function (they decide the trap count:
// "55" = push %rbp, emulated, one trap per probe hit; "f3 0f 1e fa" =
// endbr64, single-stepped: a second trap).
func printMachine(configs results) {
	var uts unix.Utsname
	release := "?"
	if unix.Uname(&uts) == nil {
		release = unix.ByteSliceToString(uts.Release[:])
	}
	model := "?"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	fmt.Printf("kernel %s, %d CPUs, CPU %q, %s/%s\n", release, runtime.NumCPU(), model, runtime.GOOS, runtime.GOARCH)
	seen := map[string]bool{}
	for _, c := range configs {
		for _, s := range callPath[c.fn] {
			name := s.sym
			if c.cet && s.lib == discover.LibCudart {
				name += " (CET)"
			}
			if !seen[name] {
				seen[name] = true
				fmt.Printf("%s (%s) starts with: %s\n", name, s.lib, firstBytes(c.libs[s.lib], s.sym, 6))
			}
		}
	}
}

// firstBytes returns the first n bytes of a function in an ELF file, in hex.
func firstBytes(path, sym string, n int) string {
	off, err := funcOffset(path, sym)
	if err != nil {
		return err.Error()
	}
	code, err := readAt(path, off, n)
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("% x", code)
}

// funcOffset returns where function sym of the ELF file at path starts, as
// a file offset (what uprobe offsets and /proc/PID/maps offsets count).
func funcOffset(path, sym string) (uint64, error) {
	f, err := elf.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		return 0, err
	}
	for _, s := range syms {
		if s.Name != sym || elf.ST_TYPE(s.Info) != elf.STT_FUNC || int(s.Section) >= len(f.Sections) {
			continue
		}
		sec := f.Sections[s.Section]
		return sec.Offset + s.Value - sec.Addr, nil
	}
	return 0, fmt.Errorf("%s: function %s not found", path, sym)
}

// readAt reads n bytes of the file at path from offset off.
func readAt(path string, off uint64, n int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	buf := make([]byte, n)
	if _, err := f.ReadAt(buf, int64(off)); err != nil {
		return nil, fmt.Errorf("read %s at %#x: %w", path, off, err)
	}
	return buf, nil
}

func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func fmtNs(ns float64) string {
	if ns < 100 {
		return fmt.Sprintf("%.1f", ns)
	}
	return fmt.Sprintf("%.0f", ns)
}

func fmtRatio(r float64) string {
	switch {
	case r < 0.01:
		return fmt.Sprintf("%.4f", r)
	case r < 10:
		return fmt.Sprintf("%.2f", r)
	}
	return fmt.Sprintf("%.0f", r)
}

func fmtRuns(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmtNs(x)
	}
	return strings.Join(parts, " / ")
}
