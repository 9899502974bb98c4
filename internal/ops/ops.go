// Package ops is profi's operation table: one row per probed function,
// with everything the agent knows about it. The BPF programs, the
// attacher, the aggregator, the overhead budget and the docs all read it:
// `go generate` writes bpf/ops.h (the C enum and the per-operation tables
// the programs read) and the probe table of docs/PROBES.md from it, and
// TestGeneratedFilesCurrent fails when they are stale.
//
// Adding a probed function starts with one row in table.go (plus a
// decoder in bpf/args.h only for a new argument layout); docs/PROBES.md,
// "Adding a function", lists every step, stub and workload included.
package ops

import (
	"strings"

	"github.com/profi-dev/profi/internal/discover"
)

//go:generate go run ./gen

// Op is an operation id: the low half of a probe's BPF cookie and part of
// every map key (enum op in bpf/ops.h). Ids are table positions; their
// values are not part of any interface.
type Op uint32

// Family groups operations by what their bytes mean.
type Family uint8

// Families.
const (
	FamilyOther      Family = iota
	FamilyLaunch            // kernel launches (launch_agg)
	FamilyMemcpy            // bytes copied, by direction
	FamilyMalloc            // device (or managed) bytes allocated
	FamilyFree              // tracked device bytes freed
	FamilyMallocHost        // pinned host bytes allocated
	FamilyMemset            // bytes set
	FamilyNCCL              // NCCL calls (nccl_agg): payload bytes
	FamilyNVTX              // NVTX range push/pop: counted nowhere, they set the phase
)

// Kind is how a function is probed: which programs, in which kernel modes.
type Kind uint8

// Kinds.
const (
	// Timed: entry and return (timed_entry, timed_return) in every mode.
	Timed Kind = iota
	// Launch: none in kernel mode off, entry only (launch_entry) in
	// anonymous mode, timed in full mode (per-kernel latency).
	Launch
	// NameSource: a driver call that names a kernel handle; timed, full
	// mode only.
	NameSource
	// Registration: __cudaRegisterFunction, entry only (name_entry), full
	// mode only.
	Registration
	// NCCL: nccl_entry and nccl_return.
	NCCL
	// NCCLCount: nccl_entry only (nothing to time, cannot block).
	NCCLCount
	// NVTXPush, NVTXPop: entry only, nvtx_push / nvtx_pop.
	NVTXPush
	NVTXPop
	// LoadHook: the dynamic loader's _dl_debug_state (dl_event), one trap
	// per library load; not a profiled call.
	LoadHook
)

// Args is the argument layout the BPF programs decode at entry, and what
// the return does with it (enum op_args in bpf/ops.h). A new layout needs
// a decoder in bpf/args.h; a new function with a known layout does not.
type Args uint8

// Argument layouts, at the function's entry (each architecture's calling
// convention: bpf/arch/).
const (
	ArgsNone              Args = iota
	ArgsAlloc                  // (void **ptr, size): tracked device allocation
	ArgsAllocAsync             // (void **ptr, size, stream)
	ArgsAllocHost              // (void **ptr, size): pinned host memory, counted, not tracked
	ArgsFree                   // (ptr)
	ArgsFreeAsync              // (ptr, stream)
	ArgsCopy                   // (dst, src, count, kind)
	ArgsCopyAsync              // (dst, src, count, kind, stream)
	ArgsCopyPeer               // (dst, dstDevice, src, srcDevice, count)
	ArgsCopyPeerAsync          // (..., count, stream)
	ArgsCopy2D                 // (dst, dpitch, src, spitch, width, height, kind)
	ArgsCopy2DAsync            // (..., kind, stream)
	ArgsSet                    // (ptr, value, count)
	ArgsSetAsync               // (ptr, value, count, stream)
	ArgsStream                 // (stream)
	ArgsGraphLaunch            // (exec, stream): one replay of exec's graph
	ArgsSetDevice              // (int device)
	ArgsGetFunction            // (CUfunction *out, CUmodule, const char *name)
	ArgsGetKernel              // (CUkernel *out, CUlibrary, const char *name)
	ArgsKernelFunction         // (CUfunction *out, CUkernel)
	ArgsLaunch                 // (func, dim3 grid, dim3 block, args, shmem, stream)
	ArgsLaunchExC              // (const cudaLaunchConfig_t *, func, args)
	ArgsCuLaunch               // (f, gx, gy, gz, bx, by, bz, shmem, stream, ...)
	ArgsCuLaunchEx             // (const CUlaunchConfig *, f, ...)
	ArgsRegisterFunction       // (fatCubinHandle, hostFun, deviceFun, ...)
	ArgsNCCLColl               // (send, recv, count, dtype, op, comm, stream)
	ArgsNCCLGather             // (send, recv, count, dtype, comm, stream)
	ArgsNCCLReduce             // (send, recv, count, dtype, op, root, comm, stream)
	ArgsNCCLP2P                // (buf, count, dtype, peer, comm, stream)
	ArgsNCCLInitRank           // (ncclComm_t *, nranks, ncclUniqueId by value, rank, ...)
	ArgsNCCLInitAll            // (ncclComm_t *, ndev, devlist)
	ArgsNCCLComm               // (comm)
	ArgsNVTXA                  // (const char *)
	ArgsNVTXW                  // (const wchar_t *)
	ArgsNVTXEx                 // (const nvtxEventAttributes_t *)
	ArgsNVTXDomainEx           // (domain, const nvtxEventAttributes_t *)
	ArgsGetKernelHandle        // (cudaKernel_t *out, const void *hostFun)
	ArgsCuCopy                 // (dst, src, bytes): the row's Direction
	ArgsCuCopyAsync            // (dst, src, bytes, stream)
	ArgsCaptureBegin           // (stream, ...): the stream starts capturing a new graph
	ArgsCaptureToGraph         // (stream, graph, ...): capturing into an existing graph
	ArgsCaptureEnd             // (stream, graph *out)
	ArgsEventRecord            // (event, stream)
	ArgsStreamWaitEvent        // (stream, event, ...)
	ArgsGraphInstantiate       // (exec *out, graph, ...)
	ArgsGraphExecUpdate        // (exec, graph, ...)
	ArgsGraphExecDestroy       // (exec)
	ArgsGraphDestroy           // (graph)
	ArgsGraphKernelNode        // (node *out, graph, deps, n, kernel node params *)
	ArgsGraphMemcpyNode        // (node *out, graph, deps, n, const cudaMemcpy3DParms *)
	ArgsGraphMemcpyNode1D      // (node *out, graph, deps, n, dst, src, count, kind)
	ArgsGraphMemsetNode        // (node *out, graph, deps, n, memset params *)
	ArgsGraphChildNode         // (node *out, graph, deps, n, child graph)
	ArgsCopy3D                 // (const cudaMemcpy3DParms *): extent at 128, kind at 152
	ArgsCopy3DAsync            // (const cudaMemcpy3DParms *, stream)
	ArgsCopy3DPeer             // (const cudaMemcpy3DPeerParms *): extent at 144
	ArgsCopy3DPeerAsync        // (const cudaMemcpy3DPeerParms *, stream)
	ArgsCopySymbol             // (symbol or dst, src or symbol, count, offset, kind)
	ArgsCopySymbolAsync        // (..., count, offset, kind, stream)
	ArgsSet2D                  // (ptr, pitch, value, width, height)
	ArgsSet2DAsync             // (ptr, pitch, value, width, height, stream)
	ArgsCuCopy2D               // (const CUDA_MEMCPY2D *): memory types at 16 and 72, WidthInBytes at 112
	ArgsCuCopy2DAsync          // (const CUDA_MEMCPY2D *, stream)
	ArgsCuCopy3D               // (const CUDA_MEMCPY3D *): memory types at 32 and 120, WidthInBytes at 176
	ArgsCuCopy3DAsync          // (const CUDA_MEMCPY3D *, stream)
	ArgsCuCopy3DPeer           // (const CUDA_MEMCPY3D_PEER *): WidthInBytes at 176, a peer copy
	ArgsCuCopy3DPeerAsync      // (const CUDA_MEMCPY3D_PEER *, stream)
	ArgsSet3D                  // (cudaPitchedPtr, int value, cudaExtent): structs by value, extent width x height x depth
	ArgsSet3DAsync             // (cudaPitchedPtr, int value, cudaExtent, stream)
	ArgsAllocPitch             // (void **ptr, size_t *pitch, width, height, ...): tracked, pitch x height
	ArgsAlloc3D                // (cudaPitchedPtr *out, cudaExtent by value): tracked, pitch x height x depth
	ArgsAllocPool              // (void **ptr, size, pool, stream): tracked, as ArgsAllocAsync
	ArgsCuGraphMemcpyNode      // (node *out, graph, deps, n, const CUDA_MEMCPY3D *, ctx): read as ArgsCuCopy3D
	NumArgs
)

// argsNames are the layouts' C names without the ARGS_ prefix.
var argsNames = [NumArgs]string{
	"NONE", "ALLOC", "ALLOC_ASYNC", "ALLOC_HOST", "FREE", "FREE_ASYNC", "COPY", "COPY_ASYNC",
	"COPY_PEER", "COPY_PEER_ASYNC", "COPY_2D", "COPY_2D_ASYNC", "SET", "SET_ASYNC", "STREAM",
	"GRAPH_LAUNCH", "SET_DEVICE", "GET_FUNCTION", "GET_KERNEL", "KERNEL_FUNCTION", "LAUNCH",
	"LAUNCH_EXC", "CU_LAUNCH", "CU_LAUNCH_EX", "REGISTER_FUNCTION", "NCCL_COLL", "NCCL_GATHER",
	"NCCL_REDUCE", "NCCL_P2P", "NCCL_INIT_RANK", "NCCL_INIT_ALL", "NCCL_COMM", "NVTX_A",
	"NVTX_W", "NVTX_EX", "NVTX_DOMAIN_EX", "GET_KERNEL_HANDLE", "CU_COPY", "CU_COPY_ASYNC",
	"CAPTURE_BEGIN", "CAPTURE_TO_GRAPH", "CAPTURE_END", "EVENT_RECORD", "STREAM_WAIT_EVENT",
	"GRAPH_INSTANTIATE", "GRAPH_EXEC_UPDATE", "GRAPH_EXEC_DESTROY", "GRAPH_DESTROY",
	"GRAPH_KERNEL_NODE", "GRAPH_MEMCPY_NODE", "GRAPH_MEMCPY_NODE_1D", "GRAPH_MEMSET_NODE",
	"GRAPH_CHILD_NODE", "COPY_3D", "COPY_3D_ASYNC", "COPY_3D_PEER", "COPY_3D_PEER_ASYNC",
	"COPY_SYMBOL", "COPY_SYMBOL_ASYNC", "SET_2D", "SET_2D_ASYNC", "CU_COPY_2D", "CU_COPY_2D_ASYNC",
	"CU_COPY_3D", "CU_COPY_3D_ASYNC", "CU_COPY_3D_PEER", "CU_COPY_3D_PEER_ASYNC", "SET_3D", "SET_3D_ASYNC", "ALLOC_PITCH", "ALLOC_3D", "ALLOC_POOL",
	"CU_GRAPH_MEMCPY_NODE",
}

// Direction is a cudaMemcpyKind (the `direction` label's source).
type Direction uint8

// Directions.
const (
	H2H Direction = iota
	H2D
	D2H
	D2D
	DirDefault // unified addressing: the pointers decide
)

// Profile values of --probe-profile.
const (
	ProfileLean = "lean" // the hot production set
	ProfileFull = "full" // adds the diagnostic functions
)

// KernelMode values of --kernel-mode.
const (
	KernelModeOff       = "off"
	KernelModeAnonymous = "anonymous"
	KernelModeFull      = "full"
)

// Row is one probed function.
type Row struct {
	// Const is the Go constant's name without "Op" (OpCudaMalloc); the C
	// enum's name is derived from it (OP_CUDA_MALLOC).
	Const  string
	Symbol string
	Lib    discover.Library
	// Label is the `operation` label when it is not Symbol (the
	// historical cudaStreamSync and cudaEventSync).
	Label  string
	Family Family
	Kind   Kind
	Args   Args
	// Diagnostic rows are probed only with --probe-profile full.
	Diagnostic bool
	// Optional functions are exported by some library versions only
	// (per-thread-stream variants, newer APIs): their absence is normal.
	Optional bool
	// Pausable rows may be detached for a while by the overhead budget
	// (the hot calls whose counts can be extrapolated). Allocations,
	// frees, the current device, name sources, NCCL and NVTX keep state
	// that later calls depend on: never pausable.
	Pausable bool
	// Base is the function whose arguments a per-thread-stream variant
	// (_ptsz, _ptds) shares; "" for none. Documentation and tests: the
	// layout (Args) is what BPF decodes.
	Base string
	// Direction is the cudaMemcpyKind of a copy whose arguments name none
	// (the driver's cuMemcpyHtoD and friends; ArgsCuCopy layouts).
	Direction Direction
	// Unit is the bytes per counted element of a set (cuMemsetD16: 2,
	// cuMemsetD32: 4); 0 means 1.
	Unit uint8
	// Since is the first library release that exports the function, where
	// it is newer than the oldest release profi supports.
	Since string
	// KernelHandle launches name their kernel by an opaque cudaKernel_t
	// (__cudaLaunchKernel): in full mode BPF reports the call site of each
	// new handle, the nvcc-generated __device_stub_ function whose symbol
	// names the kernel when __cudaGetKernel ran before the agent attached.
	KernelHandle bool
}

// Name is the row's `operation` label.
func (r Row) Name() string {
	if r.Label != "" {
		return r.Label
	}
	return r.Symbol
}

// Profile is the probe profile that probes the row.
func (r Row) Profile() string {
	if r.Diagnostic {
		return ProfileFull
	}
	return ProfileLean
}

// RuntimeLaunch and DriverLaunch: the launch layouts of each API level.
func (r Row) RuntimeLaunch() bool { return r.Args == ArgsLaunch || r.Args == ArgsLaunchExC }

// DriverLaunch reports whether the row is a driver launch.
func (r Row) DriverLaunch() bool { return r.Args == ArgsCuLaunch || r.Args == ArgsCuLaunchEx }

var unknown = Row{Const: "Unknown", Symbol: "unknown"}

// Collective: an NCCL collective, which every rank of the communicator
// calls in the same order (NCCL's rule), point-to-point calls excepted.
func (r Row) Collective() bool {
	return r.Args == ArgsNCCLColl || r.Args == ArgsNCCLGather || r.Args == ArgsNCCLReduce
}

// Info returns the row of op; ids out of range are "unknown".
func Info(op Op) Row {
	if op > 0 && int(op) <= len(Table) {
		return Table[op-1]
	}
	return unknown
}

// Name returns the operation label of op, "unknown" for ids out of range.
func Name(op uint32) string { return Info(Op(op)).Name() }

// FamilyOf returns the family of op.
func FamilyOf(op uint32) Family { return Info(Op(op)).Family }

// IsDriver reports whether op is a Driver API (libcuda) function.
func IsDriver(op Op) bool { return Info(op).Lib == discover.LibCuda }

// LibraryOf returns the library whose probes count op ("" for none).
func LibraryOf(op Op) discover.Library { return Info(op).Lib }

// Pausable reports whether the overhead budget may pause op's probes.
func Pausable(op Op) bool { return Info(op).Pausable }

// Cookie is the BPF cookie of a probe: the operation in the low 32 bits,
// the attached file's id in the high 32 bits (COOKIE_OP/COOKIE_FILE in
// bpf/types.h).
func Cookie(op Op, file uint32) uint64 { return uint64(op) | uint64(file)<<32 }

// CEnum is the row's enumerator in bpf/ops.h.
func (r Row) CEnum() string { return "OP_" + cName(r.Const) }

// CName is the layout's enumerator in bpf/ops.h without "ARGS_".
func (a Args) CName() string { return argsNames[a] }

// cName derives the C enum name of a Go constant name: CudaMemcpy2DAsync
// -> CUDA_MEMCPY_2D_ASYNC.
func cName(goName string) string {
	var b strings.Builder
	rs := []rune(goName)
	for i, r := range rs {
		if i > 0 {
			prev := rs[i-1]
			lower := func(c rune) bool { return c >= 'a' && c <= 'z' }
			upper := func(c rune) bool { return c >= 'A' && c <= 'Z' }
			digit := func(c rune) bool { return c >= '0' && c <= '9' }
			next := rune(0)
			if i+1 < len(rs) {
				next = rs[i+1]
			}
			switch {
			case upper(r) && (lower(prev) || (digit(prev) && lower(next))):
				b.WriteByte('_')
			case upper(r) && upper(prev) && lower(next):
				b.WriteByte('_')
			case digit(r) && !digit(prev):
				b.WriteByte('_')
			}
		}
		b.WriteString(strings.ToUpper(string(r)))
	}
	return b.String()
}
