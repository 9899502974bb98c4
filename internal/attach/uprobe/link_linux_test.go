//go:build linux

package uprobe

import (
	"debug/elf"
	"errors"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf/link"

	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/ops"
	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

func loadKind(t *testing.T, multi bool) *bpfobj.Objects {
	t.Helper()
	objs, err := bpfobj.Load(bpfobj.Options{NoUprobeMulti: !multi})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { objs.Close() })
	return objs
}

// skipShort skips real uprobe attaches under -short: detaching waits for
// the kernel and the tests take seconds.
func skipShort(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("attaches and detaches real uprobes; slow, run without -short")
	}
}

// forEachLinkKind runs a test with uprobe_multi links (where the kernel
// has them) and with classic uprobes.
func forEachLinkKind(t *testing.T, test func(t *testing.T, multi bool)) {
	t.Run("classic", func(t *testing.T) { test(t, false) })
	t.Run("uprobe_multi", func(t *testing.T) {
		if err := bpfobj.HaveUprobeMulti(); err != nil {
			t.Skipf("kernel without uprobe_multi: %v", err)
		}
		test(t, true)
	})
}

// fixtures builds the stub libraries (a C compiler needed).
func fixtures(t *testing.T) *testutil.Fixtures {
	t.Helper()
	fx, err := testutil.BuildFixtures(testutil.SharedDir())
	if errors.Is(err, testutil.ErrNoCompiler) && os.Getenv(testenv.E2EEnv) != "1" {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return fx
}

// The kernel refuses more than the bytes tell (opcodes it cannot
// single-step, an int3): with the verdict read from the file removed, the
// link offers cudaGraphLaunch, the kernel refuses it (with uprobe_multi
// the whole link of its program fails), and the linker finds it by
// trying addresses alone, adds it to the file's refusals, and links the
// rest. A second link does not offer it again.
func TestLinkRefusedFoundByTrying(t *testing.T) {
	skipShort(t)
	testutil.RequireBPF(t)
	forEachLinkKind(t, func(t *testing.T, multi bool) {
		fx := fixtures(t)
		objs := loadKind(t, multi)
		pid := os.Getpid()
		testutil.MapFile(t, fx.CudartLocked)
		l := &Linker{Programs: objs.Programs(), Multi: multi}
		defer l.Close()

		f, err := os.Open(fx.CudartLocked)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		probes := ops.Probes(discover.LibCudart, ops.KernelModeAnonymous, ops.ProfileLean)
		var names []string
		for _, p := range probes {
			names = append(names, p.Symbol)
		}
		funcs, err := DefinedFuncs(f, names, false, elf.EM_X86_64)
		if err != nil {
			t.Fatal(err)
		}
		graph := funcs["cudaGraphLaunch"]
		if graph.Refused == nil {
			t.Fatal("cudaGraphLaunch not known refused from the bytes")
		}
		graph.Refused = nil
		funcs["cudaGraphLaunch"] = graph
		ex, err := link.OpenExecutable(fx.CudartLocked)
		if err != nil {
			t.Fatal(err)
		}
		offered := 0
		for _, p := range probes {
			if _, ok := funcs[p.Symbol]; ok {
				offered++
			}
		}
		set := Set{Exe: ex, Path: fx.CudartLocked, Funcs: funcs, FileID: 1, PID: pid, Refused: Refusals{}}
		for try := range 2 {
			links, reason, err := l.Link(set, probes)
			if err != nil {
				t.Fatalf("link %d: %s: %v", try, reason, err)
			}
			if !multi && len(links.Entries) != offered-1 {
				t.Errorf("link %d: %d classic entry probes, want %d (all but cudaGraphLaunch)", try, len(links.Entries), offered-1)
			}
			if multi && (len(links.Entries) == 0 || !links.Multi) {
				t.Errorf("link %d: %d uprobe_multi entry links", try, len(links.Entries))
			}
			links.Close()
			if got := slices.Collect(maps.Keys(set.Refused)); !slices.Equal(got, []uint64{graph.ProbeAddr()}) {
				t.Fatalf("link %d: refused addresses %#x, want [%#x]", try, got, graph.ProbeAddr())
			}
			r := set.Refused.Refusal(graph)
			if r == nil || r.Reason != RefusedByKernel || !strings.Contains(r.Err, "cudaGraphLaunch") || !isRefusalText(r.Err) || r.Code != nil {
				t.Errorf("link %d: refusal %+v, want kernel_refused naming cudaGraphLaunch, no bytes", try, r)
			}
		}
		if multi != l.Tried() {
			t.Errorf("trial program loaded: %v, want %v (found by trying only for uprobe_multi)", l.Tried(), multi)
		}
	})
}

// isRefusalText: the kernel's refusal as cilium/ebpf prints it (ENOTSUPP,
// 524: "operation not supported" for uprobe_multi, "errno 524" classic).
func isRefusalText(s string) bool {
	return strings.Contains(s, "not supported") || strings.Contains(s, "524")
}
