package aggregate

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"path/filepath"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/kernelname"
	"github.com/profi-dev/profi/internal/ops"
)

// maxNamesPerPID bounds what one process can make the agent remember: a
// hostile process registering millions of functions costs a counter, not
// memory.
const maxNamesPerPID = 1 << 16

// maxNamesPerNode bounds the whole table (about 100 bytes an entry: some
// 50 MiB at most), so many processes, each below maxNamesPerPID, cannot
// exhaust the agent's memory either; names beyond it are counted as
// node_table_full and their launches keep a placeholder.
const maxNamesPerNode = 1 << 19

// pidNames is what the name sources told about one process.
type pidNames struct {
	host     map[uint64]string // host stub -> name (__cudaRegisterFunction)
	function map[uint64]string // CUfunction -> name (cuModuleGetFunction)
	kernel   map[uint64]string // CUkernel -> name (cuLibraryGetKernel)
	fnKernel map[uint64]uint64 // CUfunction -> CUkernel (cuKernelGetFunction)
	rtKernel map[uint64]uint64 // cudaKernel_t -> host stub (__cudaGetKernel)
	site     map[uint64]uint64 // cudaKernel_t -> call site of its first launch (__cudaLaunchKernel)
	elf      map[uint64]string // host stub (or handle, by its call site) -> name from the ELF symbols ("" = none)
	unknown  map[uint64]string // address -> placeholder (Placeholder)
}

func (p *pidNames) size() int {
	return len(p.host) + len(p.function) + len(p.kernel) + len(p.fnKernel) + len(p.rtKernel) + len(p.site) + len(p.elf) + len(p.unknown)
}

// Names resolves kernel names in full mode. Run consumes the kernel_regs
// ring buffer (name sources seen by BPF); Kernel answers the drain. Launch
// addresses that no source named (processes started before the agent)
// fall back to the ELF symbols of the mapped file containing the host
// stub: nvcc gives the host stub the kernel's mangled name. A cudaKernel_t
// handle whose __cudaGetKernel ran before the agent attached is named by
// the symbol around its call site: nvcc launches kernel K from
// __device_stub_K (docs/PROBES.md, "Kernel names").
type Names struct {
	log      *slog.Logger
	sym      *kernelname.Symbolizer
	procRoot string

	mu       sync.Mutex
	byPID    map[int]*pidNames
	total    int               // entries of every process
	nodeCap  int               // maxNamesPerNode; tests lower it
	failures map[string]uint64 // profi_system_kernel_name_resolve_failures_total (incl. table_full)
}

// NewNames returns a resolver that reads files of processes under procRoot.
func NewNames(procRoot string, log *slog.Logger) *Names {
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Names{
		log:      log.With("component", "names"),
		sym:      kernelname.NewSymbolizer(procRoot, 64),
		procRoot: procRoot,
		byPID:    map[int]*pidNames{},
		nodeCap:  maxNamesPerNode,
		failures: map[string]uint64{},
	}
}

// Run reads name events from the kernel_regs ring buffer until ctx ends.
func (n *Names) Run(ctx context.Context, objs *bpfobj.Objects) error {
	return bpfobj.ReadRing(ctx, objs.KernelRegs, n.log, func(raw []byte) {
		if len(raw) >= int(unsafe.Sizeof(bpfobj.ProfiNameEvent{})) {
			n.add((*bpfobj.ProfiNameEvent)(unsafe.Pointer(&raw[0])))
		}
	})
}

func (n *Names) add(ev *bpfobj.ProfiNameEvent) {
	kind := bpfobj.ProfiNameKind(ev.Kind)
	name := ""
	if kind != bpfobj.ProfiNameKindNAME_KERNEL_FUNC && kind != bpfobj.ProfiNameKindNAME_RT_KERNEL &&
		kind != bpfobj.ProfiNameKindNAME_LAUNCH_SITE {
		raw := unix.ByteSliceToString(unsafe.Slice((*byte)(unsafe.Pointer(&ev.Name[0])), len(ev.Name)))
		if raw == "" && ev.Aux != 0 {
			// BPF could not read it (page not resident yet): /proc/PID/mem can.
			var err error
			if raw, err = kernelname.ReadString(n.procRoot, int(ev.Pid), ev.Aux, kernelname.MaxStringLen); err != nil {
				n.countFailure(kernelname.Reason(err))
				return // a host stub still has the ELF fallback
			}
		}
		if name = kernelname.Normalize(raw); name == "" {
			n.countFailure("empty")
			return
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	p := n.pid(int(ev.Pid))
	if n.full(p) {
		return
	}
	before := p.size()
	defer func() { n.total += p.size() - before }()
	switch kind {
	case bpfobj.ProfiNameKindNAME_HOST_FUNC:
		p.host[ev.Key] = name
	case bpfobj.ProfiNameKindNAME_CU_FUNCTION:
		p.function[ev.Key] = name
	case bpfobj.ProfiNameKindNAME_CU_KERNEL:
		p.kernel[ev.Key] = name
	case bpfobj.ProfiNameKindNAME_KERNEL_FUNC:
		p.fnKernel[ev.Key] = ev.Aux
	case bpfobj.ProfiNameKindNAME_RT_KERNEL:
		p.rtKernel[ev.Key] = ev.Aux
	case bpfobj.ProfiNameKindNAME_LAUNCH_SITE:
		p.site[ev.Key] = ev.Aux
	}
}

// full reports, and counts, whether p or the node has no room for
// another entry. n.mu is held.
func (n *Names) full(p *pidNames) bool {
	switch {
	case p.size() >= maxNamesPerPID:
		n.failures["table_full"]++
	case n.total >= n.nodeCap:
		n.failures["node_table_full"]++
	default:
		return false
	}
	return true
}

func (n *Names) countFailure(reason string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.failures[reason]++
}

func (n *Names) pid(pid int) *pidNames {
	p := n.byPID[pid]
	if p == nil {
		p = &pidNames{host: map[uint64]string{}, function: map[uint64]string{}, kernel: map[uint64]string{}, fnKernel: map[uint64]uint64{}, rtKernel: map[uint64]uint64{}, site: map[uint64]uint64{}, elf: map[uint64]string{}, unknown: map[uint64]string{}}
		n.byPID[pid] = p
	}
	return p
}

// Kernel implements Namer.
func (n *Names) Kernel(pid int, op ops.Op, fn uint64) string {
	n.mu.Lock()
	p := n.pid(pid)
	if ops.IsDriver(op) {
		// Driver launch: fn is a CUfunction, opaque; only name sources know it.
		defer n.mu.Unlock()
		if name, ok := p.function[fn]; ok {
			return name
		}
		if k, ok := p.fnKernel[fn]; ok {
			return p.kernel[k]
		}
		return ""
	}
	// A cudaKernel_t handle (__cudaLaunchKernel) stands for its host stub;
	// one obtained before the agent attached, for its call site.
	site := uint64(0)
	if stub, ok := p.rtKernel[fn]; ok {
		fn = stub
	} else if a, ok := p.site[fn]; ok && ops.Info(op).KernelHandle {
		site = a
	}
	if name, ok := p.host[fn]; ok {
		n.mu.Unlock()
		return name
	}
	if name, ok := p.elf[fn]; ok {
		n.mu.Unlock()
		return name
	}
	if n.full(p) {
		n.mu.Unlock()
		return ""
	}
	n.mu.Unlock()

	// Reading and parsing ELF files happens outside the lock, so the ring
	// consumer never waits for it. Once per (process, function).
	var (
		raw  string
		err  error
		name string
	)
	if site != 0 {
		if raw, err = n.sym.Resolve(pid, site); err == nil {
			if raw, err = kernelname.FromDeviceStub(raw); err == nil {
				name = kernelname.Normalize(raw)
			}
		}
	} else if raw, err = n.sym.Resolve(pid, fn); err == nil {
		name = kernelname.Normalize(raw)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if err != nil {
		n.failures[resolveReason(err)]++
	}
	if p = n.pid(pid); !n.full(p) {
		if _, ok := p.elf[fn]; !ok {
			n.total++
		}
		p.elf[fn] = name
	}
	return name
}

// Placeholder implements Namer: the module (file base name) and the offset
// in it of fn, which stay the same from run to run (kernelname.UnknownIn),
// or unknown_0x<fn> for an address in no file (a CUfunction handle on the
// heap). Remembered per process, so the data of an exited process is
// retained under the name its live series had.
func (n *Names) Placeholder(pid int, fn uint64) string {
	n.mu.Lock()
	if name, ok := n.pid(pid).unknown[fn]; ok {
		n.mu.Unlock()
		return name
	}
	n.mu.Unlock()
	name := kernelname.Unknown(fn)
	m, err := discover.FindMapping(n.procRoot, pid, fn)
	switch {
	case err == nil:
		name = kernelname.UnknownIn(filepath.Base(m.Path), fn-m.Start+m.Offset)
	case !errors.Is(err, discover.ErrNoFileMapping):
		return name // gone or unreadable: not remembered
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if p := n.pid(pid); !n.full(p) {
		if _, ok := p.unknown[fn]; !ok {
			n.total++
		}
		p.unknown[fn] = name
	}
	return name
}

// Forget implements Namer.
func (n *Names) Forget(pid int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if p, ok := n.byPID[pid]; ok {
		n.total -= p.size()
		delete(n.byPID, pid)
	}
}

// Failures returns resolve failures by reason.
func (n *Names) Failures() map[string]uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make(map[string]uint64, len(n.failures))
	for k, v := range n.failures {
		out[k] = v
	}
	return out
}

// resolveReason labels an ELF fallback failure for
// profi_system_kernel_name_resolve_failures_total.
func resolveReason(err error) string {
	switch {
	case errors.Is(err, kernelname.ErrNoSymbol), errors.Is(err, kernelname.ErrNoMapping):
		return "no_symbol"
	case errors.Is(err, kernelname.ErrNotELF):
		return "not_elf"
	case errors.Is(err, kernelname.ErrNotDeviceStub):
		return "not_device_stub"
	case errors.Is(err, discover.ErrProcessGone), errors.Is(err, fs.ErrNotExist), errors.Is(err, fs.ErrPermission):
		return "open_failed"
	default:
		return "read_failed"
	}
}
