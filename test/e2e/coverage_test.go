package e2e

import (
	"testing"

	"github.com/profi-dev/profi/internal/attach"
	"github.com/profi-dev/profi/internal/testutil"
)

// The full mix: runtime launches through every launch API (each going down
// into the stub driver), direct driver launches, peer/2D copies, managed
// and pinned memory, memsets, synchronisation, cudaSetDevice.
var mixArgs = []string{"--driver", "5", "--extra"}

// Every probed call exactly once, in each kernel mode and probe profile:
// runtime launches that enter the driver are not counted twice, the
// diagnostic functions appear only with --probe-profile full, and
// --kernel-mode off produces no launch series at all.
func TestModesAndProfiles(t *testing.T) {
	for _, m := range []mode{
		{attach.KernelModeAnonymous, attach.ProfileLean},
		{attach.KernelModeAnonymous, attach.ProfileFull},
		{attach.KernelModeOff, attach.ProfileLean},
		{attach.KernelModeFull, attach.ProfileFull},
	} {
		t.Run(m.kernel+"/"+m.profile, func(t *testing.T) {
			a := startAgent(t, "--kernel-mode", m.kernel, "--probe-profile", m.profile)
			w := startWorkload(t, fixtures.WorkloadDlopen, append([]string{"--lib", fixtures.Cudart}, mixArgs...))
			if err := w.Load(); err != nil {
				t.Fatal(err)
			}
			waitAttached(t, a, w.PID)
			gt := runPhase(t, w)
			requireExact(t, a, expectedFor(m, []*testutil.GroundTruth{gt}), w.PID)
		})
	}
}

// Kernel names in full mode for a process started before the agent: its
// kernels were registered before any probe existed, so runtime launches
// are named from the ELF symbols of the host stubs, driver launches from
// the cuModuleGetFunction/cuLibraryGetKernel calls seen after attach.
func TestFullModeNamesProcessStartedBefore(t *testing.T) {
	m := mode{attach.KernelModeFull, attach.ProfileLean}
	w := startWorkload(t, fixtures.Workload, mixArgs)
	a := startAgent(t, "--kernel-mode", m.kernel)
	waitAttached(t, a, w.PID)
	gt := runPhase(t, w)
	requireExact(t, a, expectedFor(m, []*testutil.GroundTruth{gt}), w.PID)
}
