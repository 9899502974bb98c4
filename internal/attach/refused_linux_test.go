//go:build linux

package attach

import (
	"encoding/hex"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/ops"
	"github.com/profi-dev/profi/internal/testutil"
)

// mapFile maps path read-only into the test process for the test's
// length. The kernel reads the instruction under a uprobe (and refuses
// it) only when it installs the probe in a process that maps the file
// and passes the PID filter: the tests' filter is the test process.
func mapFile(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Munmap(m) })
}

func loadKind(t *testing.T, multi bool) *bpfobj.Objects {
	t.Helper()
	objs, err := bpfobj.Load(bpfobj.Sizes{NoUprobeMulti: !multi})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { objs.Close() })
	return objs
}

// Issue 17 item 2: the runtime's cudaGraphLaunch starts with "lock xadd"
// (refused by the kernel, not movable). The file is attached without it:
// every other probe is there, the refused one is reported with reason,
// offsets and bytes, counted once as probe_refused, and the budget's
// pause and resume leave it out too.
func TestAttachRefusedProbe(t *testing.T) {
	skipShort(t)
	testutil.RequireBPF(t)
	forEachLinkKind(t, func(t *testing.T, multi bool) {
		fx := fixtures(t)
		objs := loadKind(t, multi)
		pid := os.Getpid()
		mapFile(t, fx.CudartLocked)
		a := New(Options{Programs: objs.Programs(), KernelMode: ops.KernelModeAnonymous, Profile: ops.ProfileLean, PID: pid, UprobeMulti: multi})
		defer a.Close()
		var opens atomic.Int32
		tg := fileTarget(t, discover.LibCudart, fx.CudartLocked, []int{pid}, &opens)
		for range 2 {
			a.Sync([]Target{tg})
		}
		checkLinkKind(t, a, multi)
		st := a.Status()
		if len(st.Failed) != 0 || len(st.Attached) != 1 {
			t.Fatalf("status = %+v, want one attached library", st)
		}
		lib := st.Attached[0]
		var want, got []string
		for _, p := range ops.Probes(discover.LibCudart, ops.KernelModeAnonymous, ops.ProfileLean) {
			if p.Symbol != "cudaGraphLaunch" && !slices.Contains(cuda13Launches, p.Symbol) {
				want = append(want, p.Symbol)
			}
		}
		for _, p := range lib.Probes {
			got = append(got, p.Symbol)
		}
		if !slices.Equal(got, want) {
			t.Errorf("probes %v, want %v", got, want)
		}
		f, err := os.Open(fx.CudartLocked)
		if err != nil {
			t.Fatal(err)
		}
		syms, err := definedFuncs(f, []string{"cudaGraphLaunch"}, false)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(lib.Refused) != 1 {
			t.Fatalf("refused %+v, want cudaGraphLaunch", lib.Refused)
		}
		r := lib.Refused[0]
		if r.Symbol != "cudaGraphLaunch" || r.Operation != "cudaGraphLaunch" || r.Reason != RefusedLockPrefix || r.Offset != 0 ||
			r.FileOffset != syms["cudaGraphLaunch"].addr || !strings.HasPrefix(r.Code, "f00fc10d") || r.Error != "" {
			t.Errorf("refused %+v, want cudaGraphLaunch, lock_prefix at +0 (file offset %#x), code f00fc10d…", r, syms["cudaGraphLaunch"].addr)
		}
		if c := a.Counters(); !reflect.DeepEqual(c.Failures, map[[2]string]uint64{{"libcudart.so", ReasonProbeRefused}: 1}) {
			t.Errorf("failures %v, want probe_refused 1 (once per file, not per pass)", c.Failures)
		}
		if l := Layers(st)[pid]; len(l) == 0 || l[0].State != "partial" || !strings.Contains(l[0].Detail, "cudaGraphLaunch+0 (lock_prefix)") {
			t.Errorf("runtime layer %+v, want partial naming cudaGraphLaunch", l)
		}
		// The overhead budget's resume re-attaches the hot probes (graph
		// launches among them): still without the refused one.
		if err := a.SetPaused(tg.Key, true); err != nil {
			t.Fatal(err)
		}
		if err := a.SetPaused(tg.Key, false); err != nil {
			t.Fatalf("resume: %v", err)
		}
	})
}

// The kernel refuses more than the bytes tell (opcodes it cannot
// single-step, an int3): with the verdict read from the file removed, the
// attach offers cudaGraphLaunch, the kernel refuses it (with uprobe_multi
// the whole link of its program fails), and the attacher finds it by
// trying addresses alone, remembers it for the file, and attaches the
// rest. A second attach does not offer it again.
func TestAttachRefusedFoundByTrying(t *testing.T) {
	skipShort(t)
	testutil.RequireBPF(t)
	forEachLinkKind(t, func(t *testing.T, multi bool) {
		fx := fixtures(t)
		objs := loadKind(t, multi)
		pid := os.Getpid()
		mapFile(t, fx.CudartLocked)
		a := New(Options{Programs: objs.Programs(), KernelMode: ops.KernelModeAnonymous, Profile: ops.ProfileLean, PID: pid, UprobeMulti: multi})
		defer a.Close()
		var opens atomic.Int32
		tg := fileTarget(t, discover.LibCudart, fx.CudartLocked, []int{pid}, &opens)

		f, err := os.Open(fx.CudartLocked)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		syms, err := definedFuncs(f, probedSymbols(discover.LibCudart, ops.KernelModeAnonymous, ops.ProfileLean), false)
		if err != nil {
			t.Fatal(err)
		}
		graph := syms["cudaGraphLaunch"]
		if graph.refused == nil {
			t.Fatal("cudaGraphLaunch not known refused from the bytes")
		}
		graph.refused = nil
		syms["cudaGraphLaunch"] = graph
		ex, err := link.OpenExecutable(fx.CudartLocked)
		if err != nil {
			t.Fatal(err)
		}
		probes := ops.Probes(discover.LibCudart, ops.KernelModeAnonymous, ops.ProfileLean)
		offered := 0
		for _, p := range probes {
			if _, ok := syms[p.Symbol]; ok {
				offered++
			}
		}
		for try := range 2 {
			links, reason, err := a.attachProbes(ex, tg, probes, syms, 1, pid)
			if err != nil {
				t.Fatalf("attach %d: %s: %v", try, reason, err)
			}
			if !multi && len(links.entries) != offered-1 {
				t.Errorf("attach %d: %d classic entry probes, want %d (all but cudaGraphLaunch)", try, len(links.entries), offered-1)
			}
			if multi && (len(links.entries) == 0 || !links.multi) {
				t.Errorf("attach %d: %d uprobe_multi entry links", try, len(links.entries))
			}
			links.close()
			if got := slices.Collect(maps.Keys(a.refused[tg.Key])); !slices.Equal(got, []uint64{graph.probeAddr()}) {
				t.Fatalf("attach %d: refused addresses %#x, want [%#x]", try, got, graph.probeAddr())
			}
			r := a.refusal(tg.Key, graph)
			if r == nil || r.reason != RefusedByKernel || !strings.Contains(r.err, "cudaGraphLaunch") || !isRefusalText(r.err) {
				t.Errorf("attach %d: refusal %+v, want kernel_refused naming cudaGraphLaunch", try, r)
			}
		}
		if multi && a.trial == nil {
			t.Error("uprobe_multi: the refused address was not found by trying")
		}
		// Status of a file attached this way: the refusal, with the kernel's answer.
		for _, p := range probes {
			if p.Symbol == "cudaGraphLaunch" {
				rp := refusedProbe(p, graph, a.refusal(tg.Key, graph))
				if rp.Reason != RefusedByKernel || rp.Error == "" || rp.FileOffset != graph.addr || rp.Code != hex.EncodeToString(nil) {
					t.Errorf("refused probe %+v", rp)
				}
			}
		}
	})
}

// isRefusalText: the kernel's refusal as cilium/ebpf prints it (ENOTSUPP,
// 524: "operation not supported" for uprobe_multi, "errno 524" classic).
func isRefusalText(s string) bool {
	return strings.Contains(s, "not supported") || strings.Contains(s, "524")
}
