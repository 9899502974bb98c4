//go:build linux

package attach

import (
	"os"
	"reflect"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/testutil"
)

// skipShort skips real uprobe attaches under -short: detaching waits for
// the kernel and the tests take seconds.
func skipShort(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("attaches and detaches real uprobes; slow, run without -short")
	}
}

// loaded returns Options with the real programs and pid_files map.
func loaded(t *testing.T, mode string) Options {
	t.Helper()
	testutil.RequireBPF(t)
	objs, err := bpfobj.Load(bpfobj.Sizes{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { objs.Close() })
	return Options{
		Programs: map[string]*ebpf.Program{
			bpfobj.ProfiProgTimedEntry:  objs.TimedEntry,
			bpfobj.ProfiProgTimedReturn: objs.TimedReturn,
			bpfobj.ProfiProgLaunchEntry: objs.LaunchEntry,
		},
		KernelMode: mode,
		// Probes fire only in this test process, never in other tests' workloads.
		PID:      os.Getpid(),
		PIDFiles: objs.PidFiles,
	}
}

func fileTarget(t *testing.T, lib discover.Library, path string, pids []int, opens *atomic.Int32) Target {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return target(FileKey{Dev: st.Dev, Inode: st.Ino}, lib, path, pids, opens, func() (*os.File, error) { return os.Open(path) })
}

func pidFiles(t *testing.T, m *ebpf.Map) []bpfobj.ProfiPidFile {
	t.Helper()
	var (
		out []bpfobj.ProfiPidFile
		k   bpfobj.ProfiPidFile
		v   uint8
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		out = append(out, k)
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(out, func(a, b bpfobj.ProfiPidFile) int {
		if a.Pid != b.Pid {
			return int(a.Pid) - int(b.Pid)
		}
		return int(a.File) - int(b.File)
	})
	return out
}

func TestAttachStub(t *testing.T) {
	skipShort(t)
	testutil.RequireBPF(t)
	fx := fixtures(t)
	tests := []struct {
		name    string
		mode    string
		path    string
		probes  []string // attached symbols, in probe order
		missing []string
	}{
		{
			name: "anonymous",
			mode: KernelModeAnonymous,
			path: fx.Cudart,
		},
		{
			name: "off",
			mode: KernelModeOff,
			path: fx.Cudart,
		},
		{
			name:    "missing symbols",
			mode:    KernelModeAnonymous,
			path:    fx.CudartMissing,
			missing: []string{"cudaGraphLaunch", "cudaGraphInstantiate"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			opts := loaded(t, tc.mode)
			a := New(opts)
			defer a.Close()
			pid := os.Getpid()
			var opens atomic.Int32
			tg := fileTarget(t, discover.LibCudart, tc.path, []int{pid}, &opens)

			for range 2 { // the second Sync finds the file attached
				a.Sync([]Target{tg})
			}
			st := a.Status()
			if len(st.Failed) != 0 || len(st.Attached) != 1 {
				t.Fatalf("status = %+v, want one attached library", st)
			}
			lib := st.Attached[0]
			// Everything the probe table asks for that the file defines.
			var want []string
			traps := map[string]int{}
			for _, p := range Probes(discover.LibCudart, tc.mode, ProfileLean) {
				if !slices.Contains(tc.missing, p.Symbol) {
					want = append(want, p.Symbol)
				}
				traps[p.Symbol] = p.Traps()
			}
			var syms []string
			for _, p := range lib.Probes {
				syms = append(syms, p.Symbol)
				if p.Operation != p.Symbol || p.Traps != traps[p.Symbol] || p.Return != (p.Traps == 2) {
					t.Errorf("probe %+v", p)
				}
			}
			if !slices.Equal(syms, want) || !slices.Equal(lib.Missing, tc.missing) {
				t.Errorf("probes %v, missing %v; want %v, %v", syms, lib.Missing, want, tc.missing)
			}
			if lib.Library != "libcudart.so" || lib.Path != tc.path || !slices.Equal(lib.PIDs, []int{pid}) || lib.File != tg.Key.String() {
				t.Errorf("library status = %+v", lib)
			}
			if opens.Load() != 1 {
				t.Errorf("Open called %d times, want 1", opens.Load())
			}
			c := a.Counters()
			wantFailures := map[[2]string]uint64{}
			if len(tc.missing) > 0 {
				// Each missing symbol once per file, not once per Sync.
				wantFailures[[2]string{"libcudart.so", ReasonSymbolNotFound}] = uint64(len(tc.missing))
			}
			if !reflect.DeepEqual(c.Failures, wantFailures) {
				t.Errorf("Failures = %v, want %v", c.Failures, wantFailures)
			}
			if !reflect.DeepEqual(c.Attached, map[discover.Library]int{discover.LibCudart: 1}) || !slices.Equal(c.TrackedPIDs, []int{pid}) {
				t.Errorf("Attached %v, TrackedPIDs %v", c.Attached, c.TrackedPIDs)
			}
			// pid_files: the process's own file, then its "known" marker.
			if got, want := pidFiles(t, opts.PIDFiles), []bpfobj.ProfiPidFile{{Pid: uint32(pid)}, {Pid: uint32(pid), File: 1}}; !reflect.DeepEqual(got, want) {
				t.Errorf("pid_files = %+v, want %+v", got, want)
			}

			// No process maps it any more: detached and forgotten.
			a.Sync(nil)
			if st := a.Status(); len(st.Attached) != 0 || len(st.Failed) != 0 {
				t.Errorf("status after unmapping = %+v", st)
			}
			if c := a.Counters(); len(c.Attached) != 0 || len(c.TrackedPIDs) != 0 {
				t.Errorf("counters after unmapping = %+v", c)
			}
			if got := pidFiles(t, opts.PIDFiles); len(got) != 0 {
				t.Errorf("pid_files after unmapping = %+v", got)
			}
		})
	}
}

func TestAttachStubTwoKeys(t *testing.T) {
	skipShort(t)
	testutil.RequireBPF(t)
	fx := fixtures(t)
	opts := loaded(t, KernelModeAnonymous)
	a := New(opts)
	defer a.Close()
	pid := os.Getpid()
	var opens atomic.Int32
	// One file seen under two (dev, inode) keys, as two overlay mounts show it.
	first := fileTarget(t, discover.LibCudart, fx.Cudart, []int{pid}, &opens)
	alias := first
	alias.Key.Inode++
	alias.PIDs = []int{pid + 1}
	a.Sync([]Target{first, alias})
	if st := a.Status(); len(st.Attached) != 2 {
		t.Fatalf("attached %d files, want 2", len(st.Attached))
	}
	want := []bpfobj.ProfiPidFile{{Pid: uint32(pid)}, {Pid: uint32(pid), File: 1}, {Pid: uint32(pid + 1)}, {Pid: uint32(pid + 1), File: 2}}
	if got := pidFiles(t, opts.PIDFiles); !reflect.DeepEqual(got, want) {
		t.Errorf("pid_files = %+v, want %+v", got, want)
	}
	a.Sync([]Target{first})
	want = want[:2]
	if got := pidFiles(t, opts.PIDFiles); !reflect.DeepEqual(got, want) {
		t.Errorf("pid_files after the alias went away = %+v, want %+v", got, want)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if st := a.Status(); len(st.Attached) != 0 {
		t.Errorf("attached after Close: %+v", st.Attached)
	}
}
