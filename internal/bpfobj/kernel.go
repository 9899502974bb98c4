//go:build linux

package bpfobj

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"golang.org/x/sys/unix"
)

// MinKernel is the oldest kernel profi runs on: every probe carries its
// operation and file in a BPF cookie, and uprobes carry cookies since 5.15
// (uprobe_multi links, used where present, since 6.6). docs/KERNELS.md
// lists the kernels the tests boot.
const MinKernel = "5.15"

// TestedKernels are the kernels the tests run profi on: the VM kernel
// matrix (docs/KERNELS.md) and the CI machine's.
const TestedKernels = "6.1, 6.12 (Debian cloud kernels in VMs) and 6.18"

// ErrKernelTooOld is returned (wrapped) by RequireKernel and Load on a
// kernel without BPF cookies on uprobes.
var ErrKernelTooOld = errors.New("uprobes cannot carry BPF cookies (bpf_get_attach_cookie)")

// RequireKernel says in one line what the kernel lacks when it is older
// than MinKernel, probing the feature (a backport counts) rather than
// reading the version. Any other error of the probe (privileges) is left
// to the load, which reports it.
func RequireKernel() error {
	err := features.HaveProgramHelper(ebpf.Kprobe, asm.FnGetAttachCookie)
	if !errors.Is(err, ebpf.ErrNotSupported) {
		return nil
	}
	release := "unknown"
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		release = unix.ByteSliceToString(u.Release[:])
	}
	//nolint:staticcheck // ST1005: "Linux" is a name, and the line starts the operator's error (docs/KERNELS.md)
	return fmt.Errorf("Linux %s is too old for profi: %w, which needs %s or newer", release, ErrKernelTooOld, MinKernel)
}

// RunTimeAllocation reports whether the kernel allocates hash map
// elements safely in uprobe programs: 6.1's BPF memory allocator
// (bpf_mem_alloc). Before it the verifier accepted a run-time allocated
// hash map in a tracing program only with a warning that it is unsafe
// (WARN_ONCE in the kernel log), so the maps stay preallocated there. Told
// by a helper of the same release (bpf_ktime_get_tai_ns, 6.1), a backport
// counting.
func RunTimeAllocation() bool {
	return features.HaveProgramHelper(ebpf.Kprobe, asm.FnKtimeGetTaiNs) == nil
}
