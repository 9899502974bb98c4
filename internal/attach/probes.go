package attach

import (
	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/discover"
)

// Program names in the BPF object.
const (
	progTimedEntry  = bpfobj.ProfiProgTimedEntry
	progTimedReturn = bpfobj.ProfiProgTimedReturn
	progLaunchEntry = bpfobj.ProfiProgLaunchEntry
)

// Probe is one probed function: its entry program and, when the call is
// timed, its return program. The operation id travels as the BPF cookie.
type Probe struct {
	Symbol string
	Op     bpfobj.Op
	Entry  string // program name
	Return string // program name; "" = entry only (one trap per call)
}

// Traps is the number of uprobe traps one call of the function costs.
func (p Probe) Traps() int {
	if p.Return != "" {
		return 2
	}
	return 1
}

// Timed reports whether the probe measures latency and return codes.
func (p Probe) Timed() bool { return p.Return != "" }

// KernelMode values of --kernel-mode.
const (
	KernelModeOff       = "off"
	KernelModeAnonymous = "anonymous"
	KernelModeFull      = "full"
)

func timed(symbol string, op bpfobj.Op) Probe {
	return Probe{Symbol: symbol, Op: op, Entry: progTimedEntry, Return: progTimedReturn}
}

// cudartLean is the lean profile of libcudart without launch probes.
var cudartLean = []Probe{
	timed("cudaMalloc", bpfobj.OpCudaMalloc),
	timed("cudaFree", bpfobj.OpCudaFree),
	timed("cudaMemcpy", bpfobj.OpCudaMemcpy),
	timed("cudaMemcpyAsync", bpfobj.OpCudaMemcpyAsync),
	timed("cudaMallocAsync", bpfobj.OpCudaMallocAsync),
	timed("cudaFreeAsync", bpfobj.OpCudaFreeAsync),
	timed("cudaGraphLaunch", bpfobj.OpCudaGraphLaunch),
	timed("cudaGraphInstantiate", bpfobj.OpCudaGraphInstantiate),
}

// Probes returns the probe set for a library: a pure function of the
// library and the kernel mode, so the set can be table-tested. Anonymous
// launches are entry-only: a count, the stream and the launch geometry
// need no return probe. Off attaches no launch probe at all.
func Probes(lib discover.Library, kernelMode string) []Probe {
	if lib != discover.LibCudart {
		return nil // libcuda and libnccl probes land with their issues
	}
	probes := append([]Probe(nil), cudartLean...)
	if kernelMode != KernelModeOff {
		probes = append(probes, Probe{Symbol: "cudaLaunchKernel", Op: bpfobj.OpCudaLaunchKernel, Entry: progLaunchEntry})
	}
	return probes
}

func opName(p Probe) string { return bpfobj.OpName(uint32(p.Op)) }
