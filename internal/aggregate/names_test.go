package aggregate

import (
	"os"
	"testing"
	"unsafe"

	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/ops"
)

// A name BPF could not read (its page not resident yet in a young
// process) is read through /proc/PID/mem from the address in the event;
// an unreadable one is not stored, so the ELF fallback stays available.
func TestNamesReadsWhatBPFCouldNot(t *testing.T) {
	t.Parallel()
	n := NewNames("/proc", nil)
	pid := os.Getpid()
	mangled := []byte("_ZN5flash16flash_fwd_kernelILi128ELi64EEEvPKfPfi\x00")
	n.add(&bpfobj.ProfiNameEvent{
		Pid:  uint32(pid),
		Kind: uint32(bpfobj.ProfiNameKindNAME_CU_FUNCTION),
		Key:  0xf00,
		Aux:  uint64(uintptr(unsafe.Pointer(&mangled[0]))),
	})
	if got := n.Kernel(pid, ops.OpCuLaunchKernel, 0xf00); got != "flash::flash_fwd_kernel" {
		t.Errorf("name read from memory = %q, want flash::flash_fwd_kernel", got)
	}
	n.add(&bpfobj.ProfiNameEvent{Pid: uint32(pid), Kind: uint32(bpfobj.ProfiNameKindNAME_CU_FUNCTION), Key: 0xbad})
	if got := n.Kernel(pid, ops.OpCuLaunchKernel, 0xbad); got != "" {
		t.Errorf("an empty name was stored as %q", got)
	}
	if f := n.Failures(); f["empty"] != 1 {
		t.Errorf("failures = %v, want one empty", f)
	}
}

// A cudaKernel_t handle (__cudaLaunchKernel) is named by the host stub that
// __cudaGetKernel turned into it; a handle no __cudaGetKernel gave has no
// name (it is not a code address).
func TestNamesKernelHandles(t *testing.T) {
	t.Parallel()
	n := NewNames("/proc", nil)
	pid := os.Getpid()
	name := []byte("_Z11gemm_kernelPfS_i\x00")
	n.add(&bpfobj.ProfiNameEvent{Pid: uint32(pid), Kind: uint32(bpfobj.ProfiNameKindNAME_HOST_FUNC), Key: 0x5000,
		Aux: uint64(uintptr(unsafe.Pointer(&name[0])))})
	n.add(&bpfobj.ProfiNameEvent{Pid: uint32(pid), Kind: uint32(bpfobj.ProfiNameKindNAME_RT_KERNEL), Key: 0x7f0000001000, Aux: 0x5000})
	for _, op := range []ops.Op{ops.OpCudaLaunchKernelHandle, ops.OpCudaLaunchKernelHandlePtsz} {
		if got := n.Kernel(pid, op, 0x7f0000001000); got != "gemm_kernel" {
			t.Errorf("%s of the handle: %q, want gemm_kernel", ops.Name(uint32(op)), got)
		}
	}
	if got := n.Kernel(pid, ops.OpCudaLaunchKernel, 0x5000); got != "gemm_kernel" {
		t.Errorf("the stub itself: %q, want gemm_kernel", got)
	}
}
