package e2e

import (
	"bufio"
	"encoding/binary"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/profi-dev/profi/internal/testutil"
)

// TestBTIGuardedLibrary probes a BTI-guarded runtime on arm64 (the
// BTI-marked stub, fixtures.CudartCET; docs/PROBES.md, "Probe placement"):
// the loader maps its code with PROT_BTI, so every call through the PLT (an
// indirect branch) lands on the probe's breakpoint where `paciasp` was, and
// the kernel steps `paciasp` out of line. A probe that broke this would
// kill the workload with SIGILL (a branch target exception), the fault the
// crash breaker exists for (docs/SECURITY.md). The workload runs its
// mixed phase and every count is exact. x86-64's twin, CET's endbr64, is
// TestProbesSkipEndbr64. The VM matrix runs it on arm64 (test/vm, qemu's
// "max" CPU has BTI); elsewhere it runs where the CPU has BTI.
func TestBTIGuardedLibrary(t *testing.T) {
	if runtime.GOARCH != "arm64" {
		t.Skip("skipping: BTI is arm64's; x86-64's CET is TestProbesSkipEndbr64")
	}
	if !cpuHasBTI(t) {
		t.Skip("skipping: this CPU has no BTI (HWCAP2_BTI), so nothing is guarded")
	}
	a := startAgent(t)
	w := startWorkload(t, fixtures.WorkloadDlopen, append([]string{"--lib", fixtures.CudartCET, "--lib-cuda", fixtures.Cuda}, mixArgs...))
	if err := w.Load(); err != nil {
		t.Fatal(err)
	}
	if flags := codeVMFlags(t, w.PID, fixtures.CudartCET); !slices.Contains(flags, "bt") {
		t.Fatalf("%s's code in pid %d is mapped with VmFlags %v, without bt: the loader did not guard it, so this test proves nothing",
			fixtures.CudartCET, w.PID, flags)
	}
	waitAttached(t, a, w.PID)
	gt := runPhase(t, w)
	requireExact(t, a, expected([]*testutil.GroundTruth{gt}), w.PID)
}

// cpuHasBTI reads HWCAP2_BTI (bit 17 of AT_HWCAP2, 26) from this process's
// auxiliary vector.
func cpuHasBTI(t *testing.T) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/auxv")
	if err != nil {
		t.Fatal(err)
	}
	const atHWCAP2, hwcap2BTI = 26, 1 << 17
	for i := 0; i+16 <= len(b); i += 16 {
		if binary.LittleEndian.Uint64(b[i:]) == atHWCAP2 {
			return binary.LittleEndian.Uint64(b[i+8:])&hwcap2BTI != 0
		}
	}
	return false
}

// codeVMFlags returns the VmFlags of pid's executable mapping of path
// (/proc/PID/smaps).
func codeVMFlags(t *testing.T, pid int, path string) []string {
	t.Helper()
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/smaps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	inCode := false
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 6 && strings.Contains(fields[0], "-") && len(fields[1]) == 4 {
			inCode = fields[5] == path && fields[1][2] == 'x'
			continue
		}
		if inCode && len(fields) > 0 && fields[0] == "VmFlags:" {
			return fields[1:]
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	t.Fatalf("pid %d maps no executable %s", pid, path)
	return nil
}
