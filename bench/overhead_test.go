//go:build linux

package bench

import (
	"bytes"
	"debug/elf"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/testutil"
)

// Run sizes. Probed calls trap into the kernel (5-30 µs each on our VMs),
// so probed runs are short; unprobed runs are long enough to time ~3 ns calls.
var (
	flagReps     = flag.Int("overhead.reps", 5, "runs of each configuration (interleaved)")
	flagProbed   = flag.Int("overhead.probed", 50_000, "timed calls per run with a probe attached")
	flagUnprobed = flag.Int("overhead.unprobed", 50_000_000, "timed calls per run without a probe")
	flagWarmup   = flag.Int("overhead.warmup", 100, "untimed calls before each timed loop")
)

// The stub functions measured: one entry-only (anonymous launches) and one
// timed (entry + return).
const (
	fnLaunch = "cudaLaunchKernel"
	fnTimed  = "cudaMemcpyAsync"
	opTimed  = bpfobj.OpCudaMemcpyAsync
)

// Configuration names, also the sub-benchmark names.
const (
	cfgNone       = "no_probe"
	cfgEmpty      = "empty_uprobe"
	cfgEmptyPair  = "empty_uprobe+uretprobe"
	cfgProfiAnon  = "profi_anonymous"
	cfgProfiTimed = "profi_timed"
)

// A config is one way of probing one function.
type config struct {
	fn    string
	name  string
	traps int                                  // uprobe traps per call (0, 1 or 2)
	progs func() (entry, ret *ebpf.Program)    // nil: no probe
	op    bpfobj.Op                            // BPF cookie
	check func(pid uint32, calls uint64) error // exact-count check; nil: none
	ns    []float64                            // ns per call, one per run
}

// BenchmarkOverhead measures ns per call of stub CUDA functions called in a
// tight loop by a separate process, with no probe, with an empty uprobe (the
// floor: a BPF program that only returns 0) and with profi's programs
// attached as the attacher attaches them. All configurations run
// interleaved in one run, so drift hits them alike; ratios are taken within
// the run. Each sub-benchmark reports ns/op = median ns per stub call.
//
//	sudo go test -run '^$' -bench Overhead -benchtime 1x ./bench/
func BenchmarkOverhead(b *testing.B) {
	testutil.RequireBPF(b)
	if *flagReps < 1 || *flagProbed < 1 || *flagUnprobed < 1 || *flagWarmup < 0 {
		b.Fatal("-overhead.* flags must be positive")
	}
	dir := b.TempDir()
	lib, loop := buildLoop(b, dir)

	objs, err := bpfobj.Load(bpfobj.Sizes{})
	if err != nil {
		b.Fatal(err)
	}
	defer objs.Close()
	empty, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "bench_empty",
		Type:         ebpf.Kprobe, // uprobes are kprobe-type programs
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
		License:      "Dual BSD/GPL",
	})
	if err != nil {
		b.Fatalf("load empty program: %v", err)
	}
	defer empty.Close()
	ex, err := link.OpenExecutable(lib)
	if err != nil {
		b.Fatal(err)
	}

	emptyEntry := func() (*ebpf.Program, *ebpf.Program) { return empty, nil }
	emptyPair := func() (*ebpf.Program, *ebpf.Program) { return empty, empty }
	configs := []*config{
		{fn: fnLaunch, name: cfgNone},
		{fn: fnLaunch, name: cfgEmpty, traps: 1, progs: emptyEntry, op: bpfobj.OpCudaLaunchKernel},
		{fn: fnLaunch, name: cfgProfiAnon, traps: 1, op: bpfobj.OpCudaLaunchKernel,
			progs: func() (*ebpf.Program, *ebpf.Program) { return objs.LaunchEntry, nil },
			check: func(pid uint32, calls uint64) error { return checkLaunches(objs, pid, calls) }},
		{fn: fnTimed, name: cfgNone},
		{fn: fnTimed, name: cfgEmpty, traps: 1, progs: emptyEntry, op: opTimed},
		{fn: fnTimed, name: cfgEmptyPair, traps: 2, progs: emptyPair, op: opTimed},
		{fn: fnTimed, name: cfgProfiTimed, traps: 2, op: opTimed,
			progs: func() (*ebpf.Program, *ebpf.Program) { return objs.TimedEntry, objs.TimedReturn },
			check: func(pid uint32, calls uint64) error { return checkTimed(objs, pid, calls) }},
	}

	printMachine(lib)
	for rep := 0; rep < *flagReps; rep++ {
		for _, c := range configs {
			ns, err := measure(ex, loop, c)
			if err != nil {
				b.Fatalf("%s/%s, run %d: %v", c.fn, c.name, rep+1, err)
			}
			c.ns = append(c.ns, ns)
		}
	}

	find := func(fn, name string) *config {
		for _, c := range configs {
			if c.fn == fn && c.name == name {
				return c
			}
		}
		return nil
	}
	fmt.Printf("\n| Function | Configuration | Traps | ns/call min | ns/call median | × floor (median) | × floor (min) | × no probe (median) | × empty entry+return (median) |\n")
	fmt.Printf("|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range configs {
		floor, none := find(c.fn, cfgEmpty), find(c.fn, cfgNone)
		mn, med := slices.Min(c.ns), median(c.ns)
		pair := "—"
		if p := find(c.fn, cfgEmptyPair); p != nil && c.traps == 2 {
			pair = fmtRatio(med / median(p.ns))
		}
		fmt.Printf("| %s | %s | %d | %s | %s | %s | %s | %s | %s |\n", c.fn, c.name, c.traps,
			fmtNs(mn), fmtNs(med), fmtRatio(med/median(floor.ns)), fmtRatio(mn/slices.Min(floor.ns)),
			fmtRatio(med/median(none.ns)), pair)
	}
	fmt.Printf("\nfloor = %s on the same function; runs per configuration: %d (interleaved); "+
		"calls per run: %d probed, %d unprobed\n", cfgEmpty, *flagReps, *flagProbed, *flagUnprobed)
	for _, c := range configs {
		fmt.Printf("  %s/%s ns/call per run: %s\n", c.fn, c.name, fmtRuns(c.ns))
	}
	fmt.Println()

	// The same numbers as benchmark results (benchstat-friendly).
	for _, c := range configs {
		floor, none, pair := find(c.fn, cfgEmpty), find(c.fn, cfgNone), find(c.fn, cfgEmptyPair)
		b.Run(c.fn+"/"+c.name, func(b *testing.B) {
			med := median(c.ns)
			b.ReportMetric(med, "ns/op") // one op = one stub call
			b.ReportMetric(slices.Min(c.ns), "min-ns/call")
			b.ReportMetric(med/median(floor.ns), "x_floor")
			b.ReportMetric(med/median(none.ns), "x_noprobe")
			if pair != nil {
				b.ReportMetric(med/median(pair.ns), "x_empty_pair")
			}
		})
	}
}

// buildLoop builds the stub library and bench/loop.c into dir. The loop
// links against a private copy of the stub whose file is not named
// libcudart.so*, reached through a libcudart.so.12 symlink: the private
// inode keeps other uprobes on the shared fixtures off it, and the name in
// /proc/PID/maps keeps any profi agent running on this host (other tests)
// from discovering and probing the loop.
func buildLoop(b *testing.B, dir string) (lib, loop string) {
	b.Helper()
	fx, err := testutil.BuildFixtures(filepath.Join(dir, "fixtures"))
	if errors.Is(err, testutil.ErrNoCompiler) {
		b.Skipf("skipping overhead benchmark: %v", err)
	}
	if err != nil {
		b.Fatal(err)
	}
	root, err := testutil.RepoRoot()
	if err != nil {
		b.Fatal(err)
	}
	libDir := filepath.Join(dir, "lib")
	lib = filepath.Join(libDir, "libprofibench-stub.so")
	if err := os.MkdirAll(libDir, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := copyFile(fx.Cudart, lib); err != nil {
		b.Fatal(err)
	}
	if err := os.Symlink(filepath.Base(lib), filepath.Join(libDir, "libcudart.so.12")); err != nil {
		b.Fatal(err)
	}
	loop = filepath.Join(dir, "loop")
	cmd := exec.Command("gcc", "-O2", "-Wall", "-Wextra", "-Werror",
		"-I"+filepath.Join(root, "test", "stubs"), "-o", loop, filepath.Join(root, "bench", "loop.c"),
		"-L"+libDir, "-l:libcudart.so.12", "-Wl,-rpath,"+libDir)
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
	}
	return lib, loop
}

func copyFile(from, to string) error {
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return err
	}
	return dst.Close()
}

// measure attaches c's programs (return probe first, cookie = op, as the
// attacher does), runs the loop once, detaches, checks exact counts when c
// has a check, and returns ns per call.
func measure(ex *link.Executable, loop string, c *config) (float64, error) {
	calls := *flagUnprobed
	var links []link.Link
	defer func() {
		for _, l := range links {
			l.Close()
		}
	}()
	if c.progs != nil {
		calls = *flagProbed
		entry, ret := c.progs()
		opts := &link.UprobeOptions{Cookie: bpfobj.Cookie(c.op, 1)}
		if ret != nil {
			l, err := ex.Uretprobe(c.fn, ret, opts)
			if err != nil {
				return 0, fmt.Errorf("attach return probe: %w", err)
			}
			links = append(links, l)
		}
		l, err := ex.Uprobe(c.fn, entry, opts)
		if err != nil {
			return 0, fmt.Errorf("attach probe: %w", err)
		}
		links = append(links, l)
	}

	var stderr bytes.Buffer
	cmd := exec.Command(loop, c.fn, fmt.Sprint(calls), fmt.Sprint(*flagWarmup))
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return 0, fmt.Errorf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, stderr.String())
	}
	var pid uint32
	var gotCalls, warmup int
	var elapsed int64
	if _, err := fmt.Sscanf(string(out), "pid=%d calls=%d warmup=%d elapsed_ns=%d",
		&pid, &gotCalls, &warmup, &elapsed); err != nil || gotCalls != calls {
		return 0, fmt.Errorf("unexpected loop output %q (%v)", out, err)
	}
	if c.check != nil {
		if err := c.check(pid, uint64(calls+warmup)); err != nil {
			return 0, fmt.Errorf("profi's counts are not exact, so the run measured something else: %w", err)
		}
	}
	return float64(elapsed) / float64(calls), nil
}

// checkLaunches verifies that launch_entry counted exactly calls launches of pid.
func checkLaunches(objs *bpfobj.Objects, pid uint32, calls uint64) error {
	var (
		key  bpfobj.ProfiLaunchKey
		vals []bpfobj.ProfiLaunchVal
		got  uint64
	)
	it := objs.LaunchAgg.Iterate()
	for it.Next(&key, &vals) {
		if key.Pid == pid {
			for _, v := range vals {
				got += v.Count
			}
		}
	}
	if err := it.Err(); err != nil {
		return err
	}
	if got != calls {
		return fmt.Errorf("launch_agg counted %d launches of pid %d, want %d", got, pid, calls)
	}
	return nil
}

// checkTimed verifies that timed_entry/timed_return counted exactly calls
// timed calls of pid, all with a latency in the histogram.
func checkTimed(objs *bpfobj.Objects, pid uint32, calls uint64) error {
	var (
		key            bpfobj.ProfiAggKey
		vals           []bpfobj.ProfiAggVal
		count, buckets uint64
	)
	it := objs.Aggregated.Iterate()
	for it.Next(&key, &vals) {
		if key.Pid == pid {
			for _, v := range vals {
				count += v.Count
				for _, n := range v.Buckets {
					buckets += n
				}
			}
		}
	}
	if err := it.Err(); err != nil {
		return err
	}
	if count != calls || buckets != calls {
		return fmt.Errorf("aggregated counted %d calls (%d in the histogram) of pid %d, want %d",
			count, buckets, pid, calls)
	}
	return nil
}

// printMachine prints what docs/BENCHMARK.md records about the machine and
// the first bytes of each measured function (they decide the trap count:
// "55" = push %rbp, emulated, one trap per probe hit).
func printMachine(lib string) {
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
	for _, fn := range []string{fnLaunch, fnTimed} {
		fmt.Printf("%s starts with: %s\n", fn, firstBytes(lib, fn, 4))
	}
}

// firstBytes returns the first n bytes of a function in an ELF file, in hex.
func firstBytes(path, sym string, n int) string {
	f, err := elf.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		return err.Error()
	}
	for _, s := range syms {
		if s.Name != sym || int(s.Section) >= len(f.Sections) {
			continue
		}
		sec := f.Sections[s.Section]
		buf := make([]byte, n)
		if _, err := sec.ReadAt(buf, int64(s.Value-sec.Addr)); err != nil {
			return err.Error()
		}
		return fmt.Sprintf("% x", buf)
	}
	return "symbol not found"
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
