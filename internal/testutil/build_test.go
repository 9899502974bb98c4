package testutil

import (
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

var (
	sharedOnce sync.Once
	sharedFx   *Fixtures
	sharedErr  error
	sharedDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if sharedDir != "" {
		os.RemoveAll(sharedDir)
	}
	os.Exit(code)
}

// fixtures builds once per test binary: most tests only need to run them.
func fixtures(t *testing.T) *Fixtures {
	t.Helper()
	sharedOnce.Do(func() {
		if sharedDir, sharedErr = os.MkdirTemp("", "profi-testutil-"); sharedErr == nil {
			sharedFx, sharedErr = BuildFixtures(sharedDir)
		}
	})
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return sharedFx
}

var graphFuncs = []string{"cudaGraphLaunch", "cudaGraphInstantiate"}

// exportedFuncs are all functions the stub defines and exports.
var exportedFuncs = append(append([]string{}, ProbedFuncs...),
	"cudaStreamCreate", "cudaGetLastError", "cudaGetDeviceCount")

func dynFuncs(t *testing.T, path string) map[string]elf.Symbol {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]elf.Symbol{}
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Section != elf.SHN_UNDEF &&
			elf.ST_BIND(s.Info) == elf.STB_GLOBAL && strings.HasPrefix(s.Name, "cuda") {
			out[s.Name] = s
		}
	}
	return out
}

func dynStrings(t *testing.T, path string, tag elf.DynTag) []string {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	v, err := f.DynString(tag)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestStubELF(t *testing.T) {
	fx := fixtures(t)
	for _, lib := range []string{fx.Cudart, fx.CudartMissing} {
		if got := dynStrings(t, lib, elf.DT_SONAME); len(got) != 1 || got[0] != "libcudart.so.12" {
			t.Errorf("%s: SONAME %q, want libcudart.so.12", lib, got)
		}
	}

	full := dynFuncs(t, fx.Cudart)
	addrs := map[uint64]string{}
	for _, name := range exportedFuncs {
		s, ok := full[name]
		if !ok {
			t.Errorf("%s does not export %s", fx.Cudart, name)
			continue
		}
		// -fno-ipa-icf: one probe site per function, never shared.
		if other, dup := addrs[s.Value]; dup {
			t.Errorf("%s and %s share address %#x", name, other, s.Value)
		}
		addrs[s.Value] = name
	}

	missing := dynFuncs(t, fx.CudartMissing)
	for _, name := range exportedFuncs {
		_, ok := missing[name]
		if want := !contains(graphFuncs, name); ok != want {
			t.Errorf("%s: exports %s = %v, want %v", fx.CudartMissing, name, ok, want)
		}
	}

	if f, err := elf.Open(fx.CudartNotELF); err == nil {
		f.Close()
		t.Errorf("%s opens as ELF", fx.CudartNotELF)
	}
}

// The fixed flags exist to give every probed function the same first
// instruction; catch a compiler or source change that breaks that.
func TestStubFirstInstruction(t *testing.T) {
	fx := fixtures(t)
	f, err := elf.Open(fx.Cudart)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	text := f.Section(".text")
	data, err := text.Data()
	if err != nil {
		t.Fatal(err)
	}
	syms := dynFuncs(t, fx.Cudart)
	for _, name := range ProbedFuncs {
		off := syms[name].Value - text.Addr
		// push %rbp; then mov %rsp,%rbp may be scheduled later.
		if off >= uint64(len(data)) || data[off] != 0x55 {
			t.Errorf("%s does not start with push %%rbp (0x55): % x", name, data[off:min(off+8, uint64(len(data)))])
		}
	}
}

func TestWorkloadELF(t *testing.T) {
	fx := fixtures(t)
	if got := dynStrings(t, fx.Workload, elf.DT_NEEDED); !contains(got, "libcudart.so.12") {
		t.Errorf("linked workload NEEDED %q lacks libcudart.so.12", got)
	}
	runpath := append(dynStrings(t, fx.Workload, elf.DT_RUNPATH), dynStrings(t, fx.Workload, elf.DT_RPATH)...)
	if !contains(runpath, fx.Dir) {
		t.Errorf("linked workload RUNPATH %q, want %s", runpath, fx.Dir)
	}
	if got := dynStrings(t, fx.WorkloadDlopen, elf.DT_NEEDED); contains(got, "libcudart.so.12") {
		t.Errorf("dlopen workload links libcudart: NEEDED %q", got)
	}
}

func TestBuildFixturesConcurrentAndCached(t *testing.T) {
	dir := t.TempDir()
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = BuildFixtures(dir)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	fx := fixturesIn(dir)
	before := make([]os.FileInfo, 0, len(fx.all()))
	for _, p := range fx.all() {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		before = append(before, fi)
	}
	if _, err := BuildFixtures(dir); err != nil {
		t.Fatal(err)
	}
	// Up to date: no file may be replaced, or attached uprobes would go stale.
	for i, p := range fx.all() {
		if fi, err := os.Stat(p); err != nil || !os.SameFile(before[i], fi) {
			t.Errorf("%s was rebuilt though up to date (err %v)", p, err)
		}
	}
	if leftovers, _ := filepath.Glob(filepath.Join(dir, ".build-*")); len(leftovers) > 0 {
		t.Errorf("temporary build dirs left: %v", leftovers)
	}
}

func TestRepoRoot(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, stubSrc)); err != nil {
		t.Error(err)
	}
}

// params mirrors the workload's arguments, to predict exact call counts.
type params struct{ threads, iters, launches, memcpys, mallocs, graphs, streams int }

func (p params) args() []string {
	return strings.Fields(fmt.Sprintf("--threads %d --iters %d --launches %d --memcpy %d --mallocs %d --graphs %d --streams %d",
		p.threads, p.iters, p.launches, p.memcpys, p.mallocs, p.graphs, p.streams))
}

// small keeps launches > streams so every stream is used in each iteration.
var small = params{threads: 3, iters: 25, launches: 7, memcpys: 2, mallocs: 2, graphs: 2, streams: 3}

// wantCalls predicts the calls of one phase from the workload's documented
// structure; the workload itself counts what happened, so the two are
// independent.
func wantCalls(p params, errors, graphs bool) map[string]uint64 {
	T, I := uint64(p.threads), uint64(p.iters)
	perIter := func(n int) uint64 { return T * I * uint64(n) }
	c := map[string]uint64{
		"cudaMalloc":       T + perIter(p.mallocs), // + resident weights
		"cudaFree":         T + perIter(p.mallocs), // + cudaFree(NULL)
		"cudaMemcpy":       perIter(5 * p.memcpys),
		"cudaMemcpyAsync":  perIter(5 * p.memcpys),
		"cudaLaunchKernel": perIter(p.launches),
		"cudaMallocAsync":  T + perIter(p.mallocs), // + resident KV cache
		"cudaFreeAsync":    perIter(p.mallocs),
	}
	if graphs {
		c["cudaGraphLaunch"] = perIter(p.graphs)
		c["cudaGraphInstantiate"] = T
	}
	if errors {
		errIters := T * uint64((p.iters+9)/10) // iterations 0, 10, 20, ...
		for _, fn := range []string{"cudaMalloc", "cudaFree", "cudaMemcpy", "cudaMemcpyAsync",
			"cudaLaunchKernel", "cudaMallocAsync", "cudaFreeAsync"} {
			c[fn] += errIters
		}
		if graphs {
			c["cudaGraphLaunch"] += errIters
		}
	}
	return c
}

func wantErrors(p params, graphs bool) map[string]map[string]uint64 {
	n := uint64(p.threads * ((p.iters + 9) / 10))
	e := map[string]map[string]uint64{
		"cudaMalloc": {"2": n}, "cudaMallocAsync": {"2": n},
		"cudaMemcpy": {"21": n}, "cudaMemcpyAsync": {"21": n},
		"cudaFree": {"1": n}, "cudaFreeAsync": {"1": n},
		"cudaLaunchKernel": {"98": n},
	}
	if graphs {
		e["cudaGraphLaunch"] = map[string]uint64{"400": n}
	}
	return e
}

func checkPhase(t *testing.T, gt *GroundTruth, p params, phases uint64, errors, graphs bool) {
	t.Helper()
	for _, fn := range ProbedFuncs {
		if want := phases * wantCalls(p, errors, graphs)[fn]; gt.Calls[fn] != want {
			t.Errorf("calls[%s] = %d, want %d", fn, gt.Calls[fn], want)
		}
	}
	if !errors && len(gt.Errors) != 0 {
		t.Errorf("errors with --no-errors: %v", gt.Errors)
	}
	if errors {
		want := wantErrors(p, graphs)
		if len(gt.Errors) != len(want) {
			t.Errorf("errors %v, want %v (per phase)", gt.Errors, want)
		}
		for fn, codes := range want {
			for code, n := range codes {
				if gt.Errors[fn][code] != phases*n || len(gt.Errors[fn]) != 1 {
					t.Errorf("errors[%s] = %v, want {%s: %d}", fn, gt.Errors[fn], code, phases*n)
				}
			}
		}
	}
	// Weights (64 MiB) and KV cache (8 MiB) stay allocated per thread.
	if want := phases * uint64(p.threads) * (72 << 20); gt.ActiveBytes != want {
		t.Errorf("active_bytes = %d, want %d", gt.ActiveBytes, want)
	}
	for _, k := range MemcpyKinds {
		if want := phases * 2 * uint64(p.threads*p.iters*p.memcpys); gt.MemcpyCalls[k] != want || gt.MemcpyBytes[k] == 0 {
			t.Errorf("memcpy_calls[%s] = %d (bytes %d), want %d calls", k, gt.MemcpyCalls[k], gt.MemcpyBytes[k], want)
		}
	}
	// Each thread's own streams plus the shared default stream, per phase.
	if want := int(phases)*p.threads*p.streams + 1; len(gt.CallsByStream["cudaLaunchKernel"]) != want {
		t.Errorf("launch streams %v, want %d keys", gt.CallsByStream["cudaLaunchKernel"], want)
	}
	if gt.CallsByStream["cudaLaunchKernel"]["default"] == 0 {
		t.Error("no launches on the default stream")
	}
}

func start(t *testing.T, bin string, args []string, opts ...Option) *Workload {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	w, err := StartWorkload(ctx, bin, args, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop() })
	return w
}

func TestWorkloadLinked(t *testing.T) {
	fx := fixtures(t)
	w := start(t, fx.Workload, small.args())
	first, err := w.Run()
	if err != nil {
		t.Fatal(err)
	}
	checkPhase(t, first, small, 1, true, true)

	// A second phase repeats the first exactly; totals are cumulative.
	second, err := w.Run()
	if err != nil {
		t.Fatal(err)
	}
	checkPhase(t, second, small, 2, true, true)
	for _, pair := range [][2]uint64{
		{first.MallocBytes, second.MallocBytes}, {first.FreeBytes, second.FreeBytes},
		{first.LaunchGridBlocks, second.LaunchGridBlocks}, {first.LaunchBlockThreads, second.LaunchBlockThreads},
		{first.LaunchSharedBytes, second.LaunchSharedBytes}, {first.TotalCalls(), second.TotalCalls()},
	} {
		if pair[1] != 2*pair[0] {
			t.Errorf("second phase total %d, want twice %d", pair[1], pair[0])
		}
	}
	for _, k := range MemcpyKinds {
		if second.MemcpyBytes[k] != 2*first.MemcpyBytes[k] {
			t.Errorf("memcpy_bytes[%s]: %d then %d", k, first.MemcpyBytes[k], second.MemcpyBytes[k])
		}
	}
	if first.PID != w.PID || w.PID != w.Cmd.Process.Pid {
		t.Errorf("pid %d, ready pid %d, process %d", first.PID, w.PID, w.Cmd.Process.Pid)
	}
	if err := w.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := w.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
}

func TestWorkloadDlopenNoErrors(t *testing.T) {
	fx := fixtures(t)
	w := start(t, fx.WorkloadDlopen, append(small.args(), "--no-errors", "--lib", fx.Cudart))
	if err := w.Load(); err != nil {
		t.Fatal(err)
	}
	gt, err := w.Run()
	if err != nil {
		t.Fatal(err)
	}
	checkPhase(t, gt, small, 1, false, true)
	if gt.MemcpyCalls["unknown"] != 0 {
		t.Errorf("memcpy_calls[unknown] = %d with --no-errors", gt.MemcpyCalls["unknown"])
	}
}

func TestWorkloadDlopenMissingGraph(t *testing.T) {
	fx := fixtures(t)
	w := start(t, fx.WorkloadDlopen, append(small.args(), "--lib", fx.CudartMissing))
	if err := w.Load(); err != nil {
		t.Fatal(err)
	}
	gt, err := w.Run()
	if err != nil {
		t.Fatal(err)
	}
	checkPhase(t, gt, small, 1, true, false)
	if !strings.Contains(w.Stderr(), "no graph symbols") {
		t.Errorf("stderr %q does not report the missing graph symbols", w.Stderr())
	}
}

func TestWorkloadDlopenNotELF(t *testing.T) {
	fx := fixtures(t)
	w := start(t, fx.WorkloadDlopen, []string{"--lib", fx.CudartNotELF})
	err := w.Load()
	if err == nil || !strings.Contains(err.Error(), "dlopen") {
		t.Fatalf("Load of a non-ELF library: %v, want a dlopen error", err)
	}
	if err := w.Stop(); err == nil {
		t.Error("Stop after a failed load reports no error")
	}
}

// Behind a wrapper that forks, the PID must be the workload's own.
func TestWorkloadWrapper(t *testing.T) {
	fx := fixtures(t)
	w := start(t, fx.Workload, []string{"--threads", "1", "--iters", "3"},
		WithWrapper("sh", "-c", `"$@"; exit $?`, "sh"), WithDir(t.TempDir()))
	gt, err := w.Run()
	if err != nil {
		t.Fatal(err)
	}
	if w.PID == w.Cmd.Process.Pid || gt.PID != w.PID {
		t.Errorf("ready pid %d, ground truth pid %d, wrapper pid %d", w.PID, gt.PID, w.Cmd.Process.Pid)
	}
	if err := w.Stop(); err != nil {
		t.Fatal(err)
	}
}

func TestStartWorkloadFailures(t *testing.T) {
	fx := fixtures(t)
	ctx := context.Background()
	if _, err := StartWorkload(ctx, fx.Workload, []string{"--bogus"}); err == nil ||
		!strings.Contains(err.Error(), "bad argument --bogus") {
		t.Errorf("bad argument: %v, want the workload's stderr", err)
	}
	if _, err := StartWorkload(ctx, filepath.Join(fx.Dir, "nonexistent"), nil); err == nil {
		t.Error("nonexistent binary started")
	}
	begin := time.Now()
	if _, err := StartWorkload(ctx, "sleep", []string{"60"}, WithReadyTimeout(200*time.Millisecond)); err == nil ||
		!strings.Contains(err.Error(), "timed out") {
		t.Errorf("silent process: %v, want a timeout", err)
	}
	if d := time.Since(begin); d > 10*time.Second {
		t.Errorf("timeout took %v: process not killed promptly", d)
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// Check must catch each kind of inconsistency it claims to.
func TestGroundTruthCheck(t *testing.T) {
	fx := fixtures(t)
	w := start(t, fx.Workload, small.args())
	good, err := w.Run()
	if err != nil {
		t.Fatal(err)
	}
	clone := func() *GroundTruth {
		b, err := json.Marshal(good)
		if err != nil {
			t.Fatal(err)
		}
		var g GroundTruth
		if err := json.Unmarshal(b, &g); err != nil {
			t.Fatal(err)
		}
		return &g
	}
	for name, mutate := range map[string]func(g *GroundTruth){
		"launches":        func(g *GroundTruth) { g.Launches++ },
		"stream sum":      func(g *GroundTruth) { g.CallsByStream["cudaMemcpyAsync"]["default"]++ },
		"stream key":      func(g *GroundTruth) { g.CallsByStream["cudaGraphLaunch"]["0x0"] = 0 },
		"stream function": func(g *GroundTruth) { g.CallsByStream["cudaMalloc"] = map[string]uint64{} },
		"active":          func(g *GroundTruth) { g.ActiveBytes++ },
		"memcpy calls":    func(g *GroundTruth) { g.MemcpyCalls["h2d"]++ },
		"memcpy unknown":  func(g *GroundTruth) { g.Errors["cudaMemcpy"]["21"]++ },
		"error code":      func(g *GroundTruth) { g.Errors["cudaFree"]["0"] = 1 },
		"function":        func(g *GroundTruth) { g.Calls["cudaMallocHost"] = 1 },
	} {
		g := clone()
		mutate(g)
		if err := g.Check(); err == nil {
			t.Errorf("%s: inconsistency not caught", name)
		}
	}
	if err := clone().Check(); err != nil {
		t.Errorf("clone of valid ground truth: %v", err)
	}
}
