//go:build linux

package attach

import (
	"debug/elf"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/profi-dev/profi/internal/attach/uprobe"
	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/ops"
	"github.com/profi-dev/profi/internal/testutil"
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
		testutil.MapFile(t, fx.CudartLocked)
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
		syms, err := uprobe.DefinedFuncs(f, []string{"cudaGraphLaunch"}, false, elf.EM_NONE)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(lib.Refused) != 1 {
			t.Fatalf("refused %+v, want cudaGraphLaunch", lib.Refused)
		}
		r := lib.Refused[0]
		if r.Symbol != "cudaGraphLaunch" || r.Operation != "cudaGraphLaunch" || r.Reason != uprobe.RefusedLockPrefix || r.Offset != 0 ||
			r.FileOffset != syms["cudaGraphLaunch"].Addr || !strings.HasPrefix(r.Code, "f00fc10d") || r.Error != "" {
			t.Errorf("refused %+v, want cudaGraphLaunch, lock_prefix at +0 (file offset %#x), code f00fc10d…", r, syms["cudaGraphLaunch"].Addr)
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
