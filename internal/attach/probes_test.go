package attach

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/discover"
)

// historicalLabels are the operation labels that are not the C function's name.
var historicalLabels = map[string]string{
	"cudaStreamSynchronize":  "cudaStreamSync",
	"cudaEventSynchronize":   "cudaEventSync",
	"__cudaRegisterFunction": "__cudaRegisterFunction",
}

var (
	libs     = []discover.Library{discover.LibCudart, discover.LibCuda, discover.LibNCCL, discover.LibNVTX, "libfoo.so"}
	modes    = []string{KernelModeOff, KernelModeAnonymous, KernelModeFull}
	profiles = []string{ProfileLean, ProfileFull}
)

// The probe set is a pure function of (library, mode, profile); these are
// its invariants, checked on every combination.
func TestProbes(t *testing.T) {
	t.Parallel()
	for _, lib := range libs {
		for _, mode := range modes {
			for _, profile := range profiles {
				t.Run(string(lib)+"/"+mode+"/"+profile, func(t *testing.T) {
					t.Parallel()
					got := Probes(lib, mode, profile)
					ops := map[bpfobj.Op]bool{}
					syms := map[string]bool{}
					for _, p := range got {
						if ops[p.Op] || syms[p.Symbol] {
							t.Errorf("%s (op %d) probed twice", p.Symbol, p.Op)
						}
						ops[p.Op], syms[p.Symbol] = true, true
						want := p.Symbol
						if h, ok := historicalLabels[p.Symbol]; ok {
							want = h
						}
						if name := opName(p); name != want {
							t.Errorf("%s has operation label %q, want %q", p.Symbol, name, want)
						}
						launch := bpfobj.Info(uint32(p.Op)).Family == bpfobj.FamilyLaunch
						nvtx := bpfobj.Info(uint32(p.Op)).Family == bpfobj.FamilyNVTX
						switch {
						case nvtx != (lib == discover.LibNVTX):
							t.Errorf("NVTX probe %s in %s", p.Symbol, lib)
						case nvtx && (p.Traps() != 1 || (p.Entry != bpfobj.ProfiProgNvtxPush && p.Entry != bpfobj.ProfiProgNvtxPop)):
							t.Errorf("NVTX probe %s: %d traps via %s, want 1 via nvtx_push/nvtx_pop", p.Symbol, p.Traps(), p.Entry)
						case nvtx:
						case launch && mode == KernelModeOff:
							t.Errorf("kernel mode off probes launch API %s", p.Symbol)
						case launch && mode == KernelModeAnonymous && (p.Traps() != 1 || p.Entry != bpfobj.ProfiProgLaunchEntry):
							t.Errorf("anonymous launch %s: %d traps via %s, want 1 via launch_entry", p.Symbol, p.Traps(), p.Entry)
						case launch && mode == KernelModeFull && p.Traps() != 2:
							t.Errorf("full-mode launch %s: %d traps, want 2 (timed)", p.Symbol, p.Traps())
						case p.Op == bpfobj.OpCudaRegisterFunction && (mode != KernelModeFull || p.Traps() != 1):
							t.Errorf("name source %s in mode %s with %d traps", p.Symbol, mode, p.Traps())
						case p.Op == bpfobj.OpNcclGroupStart && p.Traps() != 1:
							t.Errorf("count-only %s: %d traps, want 1", p.Symbol, p.Traps())
						case !launch && p.Op != bpfobj.OpCudaRegisterFunction && p.Op != bpfobj.OpNcclGroupStart && (p.Traps() != 2 || !p.Timed()):
							t.Errorf("timed probe %s: %d traps", p.Symbol, p.Traps())
						}
					}
					if mode != KernelModeFull && (ops[bpfobj.OpCuModuleGetFunction] || ops[bpfobj.OpCudaRegisterFunction]) {
						t.Errorf("name sources probed in mode %s", mode)
					}
					diag := ops[bpfobj.OpCudaStreamSync] || ops[bpfobj.OpCudaMemset] || ops[bpfobj.OpCudaMallocHost]
					if diag != (profile == ProfileFull && lib == discover.LibCudart) {
						t.Errorf("diagnostic probes present = %v with profile %s", diag, profile)
					}
				})
			}
		}
	}
}

func TestProbesExactSets(t *testing.T) {
	t.Parallel()
	count := func(lib discover.Library, mode, profile string) (n, traps int) {
		for _, p := range Probes(lib, mode, profile) {
			n++
			traps += p.Traps()
		}
		return n, traps
	}
	tests := []struct {
		lib           discover.Library
		mode, profile string
		n, traps      int
	}{
		{discover.LibCudart, KernelModeOff, ProfileLean, 21, 42},
		{discover.LibCudart, KernelModeAnonymous, ProfileLean, 27, 48},
		{discover.LibCudart, KernelModeFull, ProfileLean, 28, 55},
		{discover.LibCudart, KernelModeAnonymous, ProfileFull, 37, 68},
		{discover.LibCuda, KernelModeOff, ProfileLean, 2, 4},
		{discover.LibCuda, KernelModeAnonymous, ProfileLean, 6, 8},
		{discover.LibCuda, KernelModeFull, ProfileFull, 9, 18},
		{discover.LibNCCL, KernelModeFull, ProfileFull, 15, 29},
		{discover.LibNCCL, KernelModeOff, ProfileLean, 15, 29},
		{discover.LibNVTX, KernelModeOff, ProfileLean, 6, 6},
		{discover.LibNVTX, KernelModeFull, ProfileFull, 6, 6},
	}
	for _, tc := range tests {
		if n, traps := count(tc.lib, tc.mode, tc.profile); n != tc.n || traps != tc.traps {
			t.Errorf("%s %s %s: %d probes, %d traps; want %d, %d", tc.lib, tc.mode, tc.profile, n, traps, tc.n, tc.traps)
		}
	}
}

func TestProbesReturnsACopy(t *testing.T) {
	t.Parallel()
	p := Probes(discover.LibCudart, KernelModeAnonymous, ProfileLean)
	p[0].Symbol = "changed"
	_ = append(Probes(discover.LibCudart, KernelModeOff, ProfileLean), Probe{Symbol: "extra"})
	if got := Probes(discover.LibCudart, KernelModeAnonymous, ProfileLean); got[0].Symbol != "cudaMalloc" || len(got) != 27 {
		t.Errorf("Probes changed by its callers: %+v", got)
	}
}

// The README's trap table is generated from the probe tables.
func TestTrapTableInREADME(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if table := TrapTable(); !strings.Contains(string(readme), table) {
		t.Errorf("README.md does not contain the current trap table; paste this:\n%s", table)
	}
}

// TestProbeProgramsExist: every program a probe names is in the BPF object,
// with the section type its role needs.
func TestProbeProgramsExist(t *testing.T) {
	t.Parallel()
	spec, err := bpfobj.LoadProfi()
	if err != nil {
		t.Fatal(err)
	}
	var all []Probe
	for _, lib := range libs {
		for _, mode := range modes {
			all = append(all, Probes(lib, mode, ProfileFull)...)
		}
	}
	for _, p := range all {
		if ps := spec.Programs[p.Entry]; ps == nil || ps.SectionName != "uprobe" {
			t.Errorf("%s: entry program %q missing or not a uprobe (%+v)", p.Symbol, p.Entry, ps)
		}
		if p.Return == "" {
			continue
		}
		if ps := spec.Programs[p.Return]; ps == nil || ps.SectionName != "uretprobe" {
			t.Errorf("%s: return program %q missing or not a uretprobe (%+v)", p.Symbol, p.Return, ps)
		}
	}
}

func mapping(pid int, lib discover.Library, path string, dev, inode uint64) discover.Mapping {
	return discover.Mapping{PID: pid, Lib: lib, Path: path, Dev: dev, Inode: inode}
}

func TestTargets(t *testing.T) {
	t.Parallel()
	dev := unix.Mkdev(8, 1)
	overlay := unix.Mkdev(0, 0x2f)
	type want struct {
		key  FileKey
		lib  discover.Library
		path string
		pids []int
	}
	tests := []struct {
		name  string
		procs []discover.Process
		want  []want
	}{
		{
			name: "two processes map one file",
			procs: []discover.Process{
				{PID: 10, Libs: []discover.Mapping{mapping(10, discover.LibCudart, "/usr/lib/libcudart.so.12", dev, 500)}},
				{PID: 20, Libs: []discover.Mapping{mapping(20, discover.LibCudart, "/opt/cuda/libcudart.so.12", dev, 500)}},
			},
			want: []want{{FileKey{dev, 500}, discover.LibCudart, "/usr/lib/libcudart.so.12", []int{10, 20}}},
		},
		{
			name: "different inodes",
			procs: []discover.Process{
				{PID: 10, Libs: []discover.Mapping{mapping(10, discover.LibCudart, "/a/libcudart.so.12", dev, 501)}},
				{PID: 20, Libs: []discover.Mapping{mapping(20, discover.LibCudart, "/b/libcudart.so.12", dev, 500)}},
			},
			want: []want{
				{FileKey{dev, 500}, discover.LibCudart, "/b/libcudart.so.12", []int{20}},
				{FileKey{dev, 501}, discover.LibCudart, "/a/libcudart.so.12", []int{10}},
			},
		},
		{
			name: "same inode on another device",
			procs: []discover.Process{
				{PID: 10, Libs: []discover.Mapping{mapping(10, discover.LibCudart, "/a/libcudart.so.12", dev, 500)}},
				{PID: 20, Libs: []discover.Mapping{mapping(20, discover.LibCudart, "/a/libcudart.so.12", overlay, 500)}},
			},
			want: []want{
				{FileKey{overlay, 500}, discover.LibCudart, "/a/libcudart.so.12", []int{20}},
				{FileKey{dev, 500}, discover.LibCudart, "/a/libcudart.so.12", []int{10}},
			},
		},
		{
			name: "several libraries of several processes",
			procs: []discover.Process{
				{PID: 10, Libs: []discover.Mapping{
					mapping(10, discover.LibCudart, "/l/libcudart.so.12", dev, 3),
					mapping(10, discover.LibCuda, "/l/libcuda.so.1", dev, 1),
					mapping(10, discover.LibNCCL, "/l/libnccl.so.2", dev, 2),
				}},
				{PID: 30, Libs: []discover.Mapping{mapping(30, discover.LibCuda, "/l/libcuda.so.1", dev, 1)}},
				{PID: 40, Libs: []discover.Mapping{mapping(40, discover.LibCudart, "/l/libcudart.so.12", dev, 3)}},
			},
			want: []want{
				{FileKey{dev, 1}, discover.LibCuda, "/l/libcuda.so.1", []int{10, 30}},
				{FileKey{dev, 2}, discover.LibNCCL, "/l/libnccl.so.2", []int{10}},
				{FileKey{dev, 3}, discover.LibCudart, "/l/libcudart.so.12", []int{10, 40}},
			},
		},
		{name: "no processes"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := Targets(&discover.Result{Processes: tc.procs}, t.TempDir())
			var view []want
			for _, tg := range got {
				if tg.Open == nil {
					t.Errorf("target %v has no Open", tg.Key)
				}
				view = append(view, want{tg.Key, tg.Lib, tg.Path, tg.PIDs})
			}
			if !reflect.DeepEqual(view, tc.want) {
				t.Errorf("Targets =\n%+v\nwant\n%+v", view, tc.want)
			}
		})
	}
}

// TestTargetOpen: a target opens its file inside a mapping process's root
// and falls through to the next process when one has exited.
func TestTargetOpen(t *testing.T) {
	t.Parallel()
	procRoot := t.TempDir()
	const libPath = "/usr/lib/libcudart.so.12"
	put := func(pid, content string) {
		p := filepath.Join(procRoot, pid, "root", libPath)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	put("20", "library of 20")
	put("30", "library of 30")
	targets := func(pids ...int) []Target {
		var procs []discover.Process
		for _, pid := range pids {
			procs = append(procs, discover.Process{PID: pid, Libs: []discover.Mapping{mapping(pid, discover.LibCudart, libPath, 1, 1)}})
		}
		return Targets(&discover.Result{Processes: procs}, procRoot)
	}
	tests := []struct {
		name string
		pids []int
		want string // file content; "" = ErrProcessGone
	}{
		{"first process", []int{20, 30}, "library of 20"},
		{"first process gone", []int{10, 30}, "library of 30"},
		{"all gone", []int{10, 11}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ts := targets(tc.pids...)
			if len(ts) != 1 {
				t.Fatalf("%d targets, want 1", len(ts))
			}
			f, err := ts[0].Open()
			if tc.want == "" {
				if !errors.Is(err, discover.ErrProcessGone) {
					t.Fatalf("Open = %v, %v; want ErrProcessGone", f, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			b, err := io.ReadAll(f)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tc.want {
				t.Errorf("opened %q, want %q", b, tc.want)
			}
		})
	}
}
