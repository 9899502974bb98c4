package attach

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/discover"
)

// Program names in the BPF object.
const (
	progTimedEntry  = bpfobj.ProfiProgTimedEntry
	progTimedReturn = bpfobj.ProfiProgTimedReturn
	progLaunchEntry = bpfobj.ProfiProgLaunchEntry
	progNameEntry   = bpfobj.ProfiProgNameEntry
	progDlEvent     = bpfobj.ProfiProgDlEvent
	progNCCLEntry   = bpfobj.ProfiProgNcclEntry
	progNCCLReturn  = bpfobj.ProfiProgNcclReturn
	progNVTXPush    = bpfobj.ProfiProgNvtxPush
	progNVTXPop     = bpfobj.ProfiProgNvtxPop
)

// Probe is one probed function: its entry program and, when the call is
// timed, its return program. The operation id travels as the BPF cookie.
type Probe struct {
	Symbol string
	Op     bpfobj.Op
	Entry  string // program name
	Return string // program name; "" = entry only (one trap per call)
	// Optional probes are for functions that only some library versions
	// export (per-thread-stream variants, newer driver APIs): their
	// absence is normal, not a failure.
	Optional bool
}

// Traps is the number of uprobe traps one call of the function costs.
func (p Probe) Traps() int {
	if p.Return != "" {
		return 2
	}
	return 1
}

// Pausable reports whether the overhead budget may detach probes of op for
// a while (duty cycling): the hot calls whose counts can be extrapolated.
// Allocations and frees (the active-memory gauge pairs them), the current
// device, and the name sources keep state that later calls depend on, so
// they are never paused.
func Pausable(op bpfobj.Op) bool {
	switch bpfobj.Info(uint32(op)).Family {
	case bpfobj.FamilyLaunch, bpfobj.FamilyMemcpy, bpfobj.FamilyMemset:
		return true
	}
	switch op {
	case bpfobj.OpCudaStreamSync, bpfobj.OpCudaStreamSyncPtsz, bpfobj.OpCudaEventSync, bpfobj.OpCudaDeviceSync,
		bpfobj.OpCudaGraphLaunch, bpfobj.OpCudaGraphLaunchPtsz, bpfobj.OpCuGraphLaunch:
		return true
	}
	return false
}

// Timed reports whether the probe measures latency and return codes.
func (p Probe) Timed() bool { return p.Return != "" }

// KernelMode values of --kernel-mode.
const (
	KernelModeOff       = "off"
	KernelModeAnonymous = "anonymous"
	KernelModeFull      = "full"
)

// ProbeProfile values of --probe-profile.
const (
	ProfileLean = "lean"
	ProfileFull = "full"
)

func timed(symbol string, op bpfobj.Op) Probe {
	return Probe{Symbol: symbol, Op: op, Entry: progTimedEntry, Return: progTimedReturn}
}

func optional(p Probe) Probe {
	p.Optional = true
	return p
}

// The probe tables. One row per function; the profile and mode decide
// which rows are attached and how.
var (
	// cudartLean is the hot, production set of libcudart (no launches).
	cudartLean = []Probe{
		timed("cudaMalloc", bpfobj.OpCudaMalloc),
		timed("cudaFree", bpfobj.OpCudaFree),
		timed("cudaMemcpy", bpfobj.OpCudaMemcpy),
		timed("cudaMemcpyAsync", bpfobj.OpCudaMemcpyAsync),
		timed("cudaMallocAsync", bpfobj.OpCudaMallocAsync),
		timed("cudaFreeAsync", bpfobj.OpCudaFreeAsync),
		timed("cudaGraphLaunch", bpfobj.OpCudaGraphLaunch),
		timed("cudaGraphInstantiate", bpfobj.OpCudaGraphInstantiate),
		optional(timed("cudaMemcpyAsync_ptsz", bpfobj.OpCudaMemcpyAsyncPtsz)),
		optional(timed("cudaMemcpyPeer", bpfobj.OpCudaMemcpyPeer)),
		optional(timed("cudaMemcpyPeerAsync", bpfobj.OpCudaMemcpyPeerAsync)),
		optional(timed("cudaMemcpy2D", bpfobj.OpCudaMemcpy2D)),
		optional(timed("cudaMemcpy2DAsync", bpfobj.OpCudaMemcpy2DAsync)),
		optional(timed("cudaMallocManaged", bpfobj.OpCudaMallocManaged)),
		optional(timed("cudaSetDevice", bpfobj.OpCudaSetDevice)),
		// Per-thread default stream variants (nvcc --default-stream per-thread).
		optional(timed("cudaMemcpy_ptds", bpfobj.OpCudaMemcpyPtds)),
		optional(timed("cudaMemcpy2D_ptds", bpfobj.OpCudaMemcpy2DPtds)),
		optional(timed("cudaMemcpy2DAsync_ptsz", bpfobj.OpCudaMemcpy2DAsyncPtsz)),
		optional(timed("cudaGraphLaunch_ptsz", bpfobj.OpCudaGraphLaunchPtsz)),
		optional(timed("cudaMallocAsync_ptsz", bpfobj.OpCudaMallocAsyncPtsz)),
		optional(timed("cudaFreeAsync_ptsz", bpfobj.OpCudaFreeAsyncPtsz)),
	}
	// cudartDiagnostic is what --probe-profile full adds: synchronisation
	// and pinned-host/memset calls, useful to diagnose, costly in hot loops.
	cudartDiagnostic = []Probe{
		timed("cudaStreamSynchronize", bpfobj.OpCudaStreamSync),
		timed("cudaEventSynchronize", bpfobj.OpCudaEventSync),
		timed("cudaMemset", bpfobj.OpCudaMemset),
		timed("cudaMemsetAsync", bpfobj.OpCudaMemsetAsync),
		timed("cudaMallocHost", bpfobj.OpCudaMallocHost),
		timed("cudaFreeHost", bpfobj.OpCudaFreeHost),
		optional(timed("cudaDeviceSynchronize", bpfobj.OpCudaDeviceSync)),
		optional(timed("cudaStreamSynchronize_ptsz", bpfobj.OpCudaStreamSyncPtsz)),
		optional(timed("cudaMemset_ptds", bpfobj.OpCudaMemsetPtds)),
		optional(timed("cudaMemsetAsync_ptsz", bpfobj.OpCudaMemsetAsyncPtsz)),
	}
	cudartLaunches = []launchRow{
		{"cudaLaunchKernel", bpfobj.OpCudaLaunchKernel, false},
		{"cudaLaunchKernel_ptsz", bpfobj.OpCudaLaunchKernelPtsz, true},
		{"cudaLaunchKernelExC", bpfobj.OpCudaLaunchKernelExC, true},
		{"cudaLaunchCooperativeKernel", bpfobj.OpCudaLaunchCooperative, true},
		{"cudaLaunchKernelExC_ptsz", bpfobj.OpCudaLaunchKernelExCPtsz, true},
		{"cudaLaunchCooperativeKernel_ptsz", bpfobj.OpCudaLaunchCooperativePtsz, true},
	}
	// cudartNames are the name sources of full mode in libcudart.
	cudartNames = []Probe{
		optional(Probe{Symbol: "__cudaRegisterFunction", Op: bpfobj.OpCudaRegisterFunction, Entry: progNameEntry}),
	}

	cudaLean = []Probe{
		timed("cuGraphLaunch", bpfobj.OpCuGraphLaunch),
		timed("cuModuleLoadData", bpfobj.OpCuModuleLoadData),
	}
	cudaLaunches = []launchRow{
		{"cuLaunchKernel", bpfobj.OpCuLaunchKernel, false},
		{"cuLaunchKernel_ptsz", bpfobj.OpCuLaunchKernelPtsz, true},
		{"cuLaunchKernelEx", bpfobj.OpCuLaunchKernelEx, true},
		{"cuLaunchCooperativeKernel", bpfobj.OpCuLaunchCooperative, true},
	}
	cudaNames = []Probe{
		timed("cuModuleGetFunction", bpfobj.OpCuModuleGetFunction),
		optional(timed("cuLibraryGetKernel", bpfobj.OpCuLibraryGetKernel)),
		optional(timed("cuKernelGetFunction", bpfobj.OpCuKernelGetFunction)),
	}
)

// ncclProbes are libnccl's probes: every collective, point-to-point and
// group call, communicator init and teardown. One entry and one return
// program serve them all (the cookie names the operation); with
// uprobe_multi they are two links per library file.
var ncclProbes = []Probe{
	ncclTimed("ncclAllReduce", bpfobj.OpNcclAllReduce),
	ncclTimed("ncclAllGather", bpfobj.OpNcclAllGather),
	ncclTimed("ncclReduceScatter", bpfobj.OpNcclReduceScatter),
	ncclTimed("ncclBroadcast", bpfobj.OpNcclBroadcast),
	ncclTimed("ncclReduce", bpfobj.OpNcclReduce),
	ncclTimed("ncclSend", bpfobj.OpNcclSend),
	ncclTimed("ncclRecv", bpfobj.OpNcclRecv),
	// Count-only: nothing to time, and it cannot block.
	{Symbol: "ncclGroupStart", Op: bpfobj.OpNcclGroupStart, Entry: progNCCLEntry},
	ncclTimed("ncclGroupEnd", bpfobj.OpNcclGroupEnd),
	ncclTimed("ncclCommInitRank", bpfobj.OpNcclCommInitRank),
	ncclTimed("ncclCommDestroy", bpfobj.OpNcclCommDestroy),
	ncclTimed("ncclCommAbort", bpfobj.OpNcclCommAbort),
	// Newer APIs: ncclAlltoAll since 2.28, the config init since 2.14.
	optional(ncclTimed("ncclAlltoAll", bpfobj.OpNcclAllToAll)),
	optional(ncclTimed("ncclCommInitRankConfig", bpfobj.OpNcclCommInitRankConfig)),
	optional(ncclTimed("ncclCommInitAll", bpfobj.OpNcclCommInitAll)),
}

// nvtxProbes are the NVTX range functions (--enable-nvtx-tracing; the
// scanner reports NVTX libraries only then). Entry only: a push classifies
// the range name into a phase on the thread's range stack, a pop drops the
// innermost range; launches read the stack. Ranges must be seen from the
// first push, so these are never paused.
var nvtxProbes = []Probe{
	{Symbol: "nvtxRangePushA", Op: bpfobj.OpNvtxRangePushA, Entry: progNVTXPush},
	{Symbol: "nvtxRangePop", Op: bpfobj.OpNvtxRangePop, Entry: progNVTXPop},
	optional(Probe{Symbol: "nvtxRangePushW", Op: bpfobj.OpNvtxRangePushW, Entry: progNVTXPush}),
	optional(Probe{Symbol: "nvtxRangePushEx", Op: bpfobj.OpNvtxRangePushEx, Entry: progNVTXPush}),
	optional(Probe{Symbol: "nvtxDomainRangePushEx", Op: bpfobj.OpNvtxDomainRangePushEx, Entry: progNVTXPush}),
	optional(Probe{Symbol: "nvtxDomainRangePop", Op: bpfobj.OpNvtxDomainRangePop, Entry: progNVTXPop}),
}

func ncclTimed(symbol string, op bpfobj.Op) Probe {
	return Probe{Symbol: symbol, Op: op, Entry: progNCCLEntry, Return: progNCCLReturn}
}

type launchRow struct {
	symbol   string
	op       bpfobj.Op
	optional bool
}

// launches returns the launch probes of a kernel mode: none when off,
// entry-only when anonymous (count, stream, geometry need no return),
// entry and return when full (per-kernel launch latency).
func launches(rows []launchRow, kernelMode string) []Probe {
	var out []Probe
	for _, r := range rows {
		var p Probe
		switch kernelMode {
		case KernelModeOff:
			return nil
		case KernelModeFull:
			p = timed(r.symbol, r.op)
		default:
			p = Probe{Symbol: r.symbol, Op: r.op, Entry: progLaunchEntry}
		}
		p.Optional = r.optional
		out = append(out, p)
	}
	return out
}

// Probes returns the probe set for a library: a pure function of the
// library, the kernel mode and the probe profile, so the set (and the
// traps every call costs) can be table-tested and documented.
func Probes(lib discover.Library, kernelMode, profile string) []Probe {
	var out []Probe
	switch lib {
	case discover.LibCudart:
		out = append(out, cudartLean...)
		if profile == ProfileFull {
			out = append(out, cudartDiagnostic...)
		}
		out = append(out, launches(cudartLaunches, kernelMode)...)
		if kernelMode == KernelModeFull {
			out = append(out, cudartNames...)
		}
	case discover.LibLoader:
		// Not profiled: the hook that announces library loads. Optional:
		// a loader without it (some musl builds) only loses the speed-up.
		out = append(out, optional(Probe{Symbol: "_dl_debug_state", Op: bpfobj.OpUnknown, Entry: progDlEvent}))
	case discover.LibNCCL:
		// Independent of the kernel mode and probe profile.
		out = append(out, ncclProbes...)
	case discover.LibNVTX:
		// Independent of the kernel mode and probe profile; the scanner
		// reports NVTX libraries only with --enable-nvtx-tracing.
		out = append(out, nvtxProbes...)
	case discover.LibCuda:
		out = append(out, cudaLean...)
		out = append(out, launches(cudaLaunches, kernelMode)...)
		if kernelMode == KernelModeFull {
			out = append(out, cudaNames...)
		}
	}
	return out
}

// libraryOf maps every probed operation to the library that defines it.
var libraryOf = func() map[bpfobj.Op]discover.Library {
	m := map[bpfobj.Op]discover.Library{}
	for _, lib := range []discover.Library{discover.LibCudart, discover.LibCuda, discover.LibNCCL, discover.LibNVTX} {
		for _, mode := range []string{KernelModeAnonymous, KernelModeFull} {
			for _, p := range Probes(lib, mode, ProfileFull) {
				m[p.Op] = lib
			}
		}
	}
	return m
}()

// LibraryOf returns the library whose probes count op ("" for none).
func LibraryOf(op bpfobj.Op) discover.Library { return libraryOf[op] }

func opName(p Probe) string { return bpfobj.OpName(uint32(p.Op)) }

// TrapTable renders, as a Markdown table, the uprobe traps one call of
// each probed function costs in each kernel mode, and the profile that
// probes it. README.md embeds it; a test keeps the two equal.
func TrapTable() string {
	var b strings.Builder
	b.WriteString("| Function | Library | Profile | `off` | `anonymous` | `full` |\n")
	b.WriteString("|---|---|---|---|---|---|\n")
	seen := map[string]bool{}
	for _, lib := range []discover.Library{discover.LibCudart, discover.LibCuda, discover.LibNCCL, discover.LibNVTX} {
		for _, profile := range []string{ProfileLean, ProfileFull} {
			for _, p := range Probes(lib, KernelModeFull, profile) {
				if seen[p.Symbol] {
					continue
				}
				seen[p.Symbol] = true
				traps := make([]string, 0, 3)
				for _, mode := range []string{KernelModeOff, KernelModeAnonymous, KernelModeFull} {
					n := 0
					for _, q := range Probes(lib, mode, profile) {
						if q.Symbol == p.Symbol {
							n = q.Traps()
						}
					}
					traps = append(traps, strconv.Itoa(n))
				}
				fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", p.Symbol, lib, profile, strings.Join(traps, " | "))
			}
		}
	}
	return b.String()
}
