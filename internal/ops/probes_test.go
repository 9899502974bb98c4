package ops

import (
	"testing"

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
					seen := map[Op]bool{}
					syms := map[string]bool{}
					for _, p := range got {
						if seen[p.Op] || syms[p.Symbol] {
							t.Errorf("%s (op %d) probed twice", p.Symbol, p.Op)
						}
						seen[p.Op], syms[p.Symbol] = true, true
						want := p.Symbol
						if h, ok := historicalLabels[p.Symbol]; ok {
							want = h
						}
						if name := Name(uint32(p.Op)); name != want {
							t.Errorf("%s has operation label %q, want %q", p.Symbol, name, want)
						}
						launch := Info(p.Op).Family == FamilyLaunch
						nvtx := Info(p.Op).Family == FamilyNVTX
						switch {
						case nvtx != (lib == discover.LibNVTX):
							t.Errorf("NVTX probe %s in %s", p.Symbol, lib)
						case nvtx && (p.Traps() != 1 || (p.Entry != ProgNVTXPush && p.Entry != ProgNVTXPop)):
							t.Errorf("NVTX probe %s: %d traps via %s, want 1 via nvtx_push/nvtx_pop", p.Symbol, p.Traps(), p.Entry)
						case nvtx:
						case launch && mode == KernelModeOff:
							t.Errorf("kernel mode off probes launch API %s", p.Symbol)
						case launch && mode == KernelModeAnonymous && (p.Traps() != 1 || p.Entry != ProgLaunchEntry):
							t.Errorf("anonymous launch %s: %d traps via %s, want 1 via launch_entry", p.Symbol, p.Traps(), p.Entry)
						case launch && mode == KernelModeFull && p.Traps() != 2:
							t.Errorf("full-mode launch %s: %d traps, want 2 (timed)", p.Symbol, p.Traps())
						case p.Op == OpCudaRegisterFunction && (mode != KernelModeFull || p.Traps() != 1):
							t.Errorf("name source %s in mode %s with %d traps", p.Symbol, mode, p.Traps())
						case p.Op == OpNcclGroupStart && p.Traps() != 1:
							t.Errorf("count-only %s: %d traps, want 1", p.Symbol, p.Traps())
						case !launch && p.Op != OpCudaRegisterFunction && p.Op != OpNcclGroupStart && (p.Traps() != 2 || !p.Timed()):
							t.Errorf("timed probe %s: %d traps", p.Symbol, p.Traps())
						}
					}
					if mode != KernelModeFull && (seen[OpCuModuleGetFunction] || seen[OpCudaRegisterFunction]) {
						t.Errorf("name sources probed in mode %s", mode)
					}
					diag := seen[OpCudaStreamSync] || seen[OpCudaMemset] || seen[OpCudaMallocHost]
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
		{discover.LibCudart, KernelModeOff, ProfileLean, 62, 124}, // + 21 graph and capture rows, 8 3D and 8 symbol copies, 4 pitched and pool allocations (timed),
		{discover.LibCudart, KernelModeAnonymous, ProfileLean, 70, 132},
		{discover.LibCudart, KernelModeFull, ProfileLean, 72, 143},
		{discover.LibCudart, KernelModeAnonymous, ProfileFull, 88, 168},
		{discover.LibCuda, KernelModeOff, ProfileLean, 78, 156},       // + cuGraphLaunch_ptsz, 27 graph and capture rows, 14 2D/3D copies, 3 pitched and pool allocations (timed)
		{discover.LibCuda, KernelModeAnonymous, ProfileLean, 84, 162}, // + two _ptsz launches (entry only)
		{discover.LibCuda, KernelModeFull, ProfileFull, 111, 222},     // + 12 pitched sets (diagnostic, timed)
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
	if got := Probes(discover.LibCudart, KernelModeAnonymous, ProfileLean); got[0].Symbol != "cudaMalloc" || len(got) != 70 {
		t.Errorf("Probes changed by its callers: %+v", got)
	}
}
