package aggregate

import (
	"os"
	"path/filepath"
	"strconv"
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

// fakeMaps writes <root>/<pid>/maps.
func fakeMaps(t *testing.T, root string, pid int, maps string) {
	t.Helper()
	dir := filepath.Join(root, strconv.Itoa(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "maps"), []byte(maps), 0o644); err != nil {
		t.Fatal(err)
	}
}

// An unnamed launch address is named by its module and the offset in the
// file, the same in two processes whose libraries ASLR put at different
// addresses; an address in no file keeps unknown_0x<address>.
func TestNamesPlaceholderIsStableAcrossASLR(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	fakeMaps(t, root, 5, "7f0000000000-7f0000010000 r-xp 00001000 08:01 42 /opt/app/lib/libfoo.so\n"+
		"55d000000000-55d000100000 rw-p 00000000 00:00 0 [heap]\n")
	fakeMaps(t, root, 6, "7f1234560000-7f1234570000 r-xp 00001000 08:01 42 /opt/app/lib/libfoo.so\n")
	n := NewNames(root, nil)
	if got, want := n.Placeholder(5, 0x7f0000000234), "unknown_libfoo.so+0x1234"; got != want {
		t.Errorf("pid 5: %q, want %q", got, want)
	}
	if got, want := n.Placeholder(6, 0x7f1234560234), "unknown_libfoo.so+0x1234"; got != want {
		t.Errorf("pid 6 (other load address): %q, want %q", got, want)
	}
	if got, want := n.Placeholder(5, 0x55d000000040), "unknown_0x55d000000040"; got != want {
		t.Errorf("heap address: %q, want %q", got, want)
	}
	// Remembered: the same answer once the process's maps are gone.
	if err := os.RemoveAll(filepath.Join(root, "5")); err != nil {
		t.Fatal(err)
	}
	if got, want := n.Placeholder(5, 0x7f0000000234), "unknown_libfoo.so+0x1234"; got != want {
		t.Errorf("after exit: %q, want %q", got, want)
	}
}

// The name table has a node-wide cap beside the per-process one: past it,
// names are refused and counted as node_table_full; Forget frees room.
func TestNamesNodeCap(t *testing.T) {
	t.Parallel()
	n := NewNames(t.TempDir(), nil)
	n.nodeCap = 3
	reg := func(pid uint32, key uint64) {
		n.add(&bpfobj.ProfiNameEvent{Pid: pid, Kind: uint32(bpfobj.ProfiNameKindNAME_RT_KERNEL), Key: key, Aux: 0x5000})
	}
	reg(1, 1)
	reg(1, 2)
	reg(1, 2) // the same key again: no new entry
	reg(2, 1)
	reg(2, 2) // fourth entry: refused
	reg(3, 1) // refused
	if f := n.Failures(); f["node_table_full"] != 2 {
		t.Errorf("failures %v, want node_table_full 2", f)
	}
	n.Forget(1)
	reg(3, 1)
	if f := n.Failures(); f["node_table_full"] != 2 || n.total != 2 {
		t.Errorf("after Forget: failures %v, total %d; want node_table_full 2, total 2", f, n.total)
	}
}
