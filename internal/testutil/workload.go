package testutil

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// The function lists below name test/workloads/workload.c's groups and
// restate the operation table's rows (TestFuncListsFollowTable fails when
// they drift apart). docs/PROBES.md, "Adding a function", lists every step.

// ProbedFuncs are the functions the default workload reports in
// GroundTruth.Calls (always listed, 0 included).
var ProbedFuncs = []string{
	"cudaMalloc", "cudaFree", "cudaMemcpy", "cudaMemcpyAsync", "cudaLaunchKernel",
	"cudaMallocAsync", "cudaFreeAsync", "cudaGraphLaunch", "cudaGraphInstantiate",
}

// ExtraFuncs are the runtime functions the workload calls with --extra, and
// then lists in GroundTruth.Calls.
var ExtraFuncs = []string{
	"cudaLaunchKernel_ptsz", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel",
	"cudaMemcpyAsync_ptsz", "cudaMemcpyPeer", "cudaMemcpyPeerAsync", "cudaMemcpy2D",
	"cudaMemcpy2DAsync", "cudaMallocManaged", "cudaMallocHost", "cudaFreeHost",
	"cudaMemset", "cudaMemsetAsync", "cudaStreamSynchronize", "cudaEventSynchronize",
	"cudaDeviceSynchronize", "cudaSetDevice", "cudaGetDevice",
	"cudaMemcpy3D", "cudaMemcpy3DAsync", "cudaMemcpy3DPeer", "cudaMemcpy3DPeerAsync",
	"cudaMemcpyToSymbol", "cudaMemcpyFromSymbol", "cudaMemcpyToSymbolAsync", "cudaMemcpyFromSymbolAsync",
	"cudaMemset2D", "cudaMemset2DAsync", "cudaMemset3D", "cudaMemset3DAsync",
	"cudaMallocPitch", "cudaMalloc3D", "cudaMallocFromPoolAsync",
}

// DriverFuncs are the driver functions the workload calls directly with
// --driver N, and then lists in GroundTruth.Calls. Driver calls the stub
// libcudart makes inside runtime calls are never in the ground truth.
var DriverFuncs = []string{
	"cuInit", "cuModuleLoadData", "cuModuleGetFunction", "cuLibraryLoadData",
	"cuLibraryGetKernel", "cuKernelGetFunction", "cuLaunchKernel", "cuLaunchKernelEx",
	"cuLaunchCooperativeKernel",
}

// PtszFuncs are the per-thread default stream variants (_ptds without a
// stream argument, _ptsz with one) the workload calls with --ptsz, once each
// per iteration, and then lists in GroundTruth.Calls. Each is tallied like
// its base function (PtszBase). cudaGraphLaunch_ptsz is a graph function:
// absent from the library without graph symbols, and then never called.
var PtszFuncs = []string{
	"cudaMemcpy_ptds", "cudaMemcpy2D_ptds", "cudaMemcpy2DAsync_ptsz", "cudaMemset_ptds",
	"cudaMemsetAsync_ptsz", "cudaStreamSynchronize_ptsz", "cudaGraphLaunch_ptsz",
	"cudaMallocAsync_ptsz", "cudaFreeAsync_ptsz", "cudaLaunchKernelExC_ptsz",
	"cudaLaunchCooperativeKernel_ptsz",
	"cudaMemcpy3D_ptds", "cudaMemcpy3DAsync_ptsz", "cudaMemcpy3DPeer_ptds", "cudaMemcpy3DPeerAsync_ptsz",
	"cudaMemcpyToSymbol_ptds", "cudaMemcpyFromSymbol_ptds", "cudaMemcpyToSymbolAsync_ptsz",
	"cudaMemcpyFromSymbolAsync_ptsz", "cudaMemset2D_ptds", "cudaMemset2DAsync_ptsz",
	"cudaMemset3D_ptds", "cudaMemset3DAsync_ptsz", "cudaMallocFromPoolAsync_ptsz",
}

// PtszBase maps each of PtszFuncs to its base function: the operation
// table's Base, restated here because internal/ops' tests import this
// package (TestFuncListsFollowTable holds the two together).
var PtszBase = map[string]string{
	"cudaMemcpy_ptds":                  "cudaMemcpy",
	"cudaMemcpy2D_ptds":                "cudaMemcpy2D",
	"cudaMemcpy2DAsync_ptsz":           "cudaMemcpy2DAsync",
	"cudaMemset_ptds":                  "cudaMemset",
	"cudaMemsetAsync_ptsz":             "cudaMemsetAsync",
	"cudaStreamSynchronize_ptsz":       "cudaStreamSynchronize",
	"cudaGraphLaunch_ptsz":             "cudaGraphLaunch",
	"cudaMallocAsync_ptsz":             "cudaMallocAsync",
	"cudaFreeAsync_ptsz":               "cudaFreeAsync",
	"cudaLaunchKernelExC_ptsz":         "cudaLaunchKernelExC",
	"cudaLaunchCooperativeKernel_ptsz": "cudaLaunchCooperativeKernel",
	"cudaMemcpy3D_ptds":                "cudaMemcpy3D",
	"cudaMemcpy3DAsync_ptsz":           "cudaMemcpy3DAsync",
	"cudaMemcpy3DPeer_ptds":            "cudaMemcpy3DPeer",
	"cudaMemcpy3DPeerAsync_ptsz":       "cudaMemcpy3DPeerAsync",
	"cudaMemcpyToSymbol_ptds":          "cudaMemcpyToSymbol",
	"cudaMemcpyFromSymbol_ptds":        "cudaMemcpyFromSymbol",
	"cudaMemcpyToSymbolAsync_ptsz":     "cudaMemcpyToSymbolAsync",
	"cudaMemcpyFromSymbolAsync_ptsz":   "cudaMemcpyFromSymbolAsync",
	"cudaMemset2D_ptds":                "cudaMemset2D",
	"cudaMemset2DAsync_ptsz":           "cudaMemset2DAsync",
	"cudaMemset3D_ptds":                "cudaMemset3D",
	"cudaMemset3DAsync_ptsz":           "cudaMemset3DAsync",
	"cudaMallocFromPoolAsync_ptsz":     "cudaMallocFromPoolAsync",
}

// AllFuncs are all keys GroundTruth.Calls may have.
var AllFuncs = slices.Concat(ProbedFuncs, ExtraFuncs, DriverFuncs, PtszFuncs)

// StreamFuncs are the probed functions that take a stream argument, the keys
// of GroundTruth.CallsByStream in a default run.
var StreamFuncs = []string{
	"cudaLaunchKernel", "cudaMemcpyAsync", "cudaMallocAsync", "cudaFreeAsync", "cudaGraphLaunch",
}

// AllStreamFuncs are all functions that take a stream (for the launch
// config APIs, in the config): all keys GroundTruth.CallsByStream may have.
var AllStreamFuncs = slices.Concat(StreamFuncs, []string{
	"cudaLaunchKernel_ptsz", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel",
	"cudaMemcpyAsync_ptsz", "cudaMemcpyPeerAsync", "cudaMemcpy2DAsync", "cudaMemsetAsync",
	"cudaStreamSynchronize", "cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel",
	"cudaMemcpy2DAsync_ptsz", "cudaMemsetAsync_ptsz", "cudaStreamSynchronize_ptsz",
	"cudaGraphLaunch_ptsz", "cudaMallocAsync_ptsz", "cudaFreeAsync_ptsz",
	"cudaLaunchKernelExC_ptsz", "cudaLaunchCooperativeKernel_ptsz",
	"cudaMemcpy3DAsync", "cudaMemcpy3DPeerAsync", "cudaMemcpy3DAsync_ptsz", "cudaMemcpy3DPeerAsync_ptsz",
	"cudaMemcpyToSymbolAsync", "cudaMemcpyFromSymbolAsync", "cudaMemcpyToSymbolAsync_ptsz",
	"cudaMemcpyFromSymbolAsync_ptsz", "cudaMemset2DAsync", "cudaMemset2DAsync_ptsz",
	"cudaMemset3DAsync", "cudaMemset3DAsync_ptsz", "cudaMallocFromPoolAsync",
	"cudaMallocFromPoolAsync_ptsz",
})

// LaunchAPIs are the keys of GroundTruth.LaunchesByAPI and
// LaunchGeometryByAPI (always all listed), runtime then driver.
var LaunchAPIs = []string{
	"cudaLaunchKernel", "cudaLaunchKernel_ptsz", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel",
	"cudaLaunchKernelExC_ptsz", "cudaLaunchCooperativeKernel_ptsz",
	"cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel",
}

// RuntimeKernels are the mangled names of the kernels the workload registers
// with __cudaRegisterFunction (host stubs exported under the same names),
// launched through the runtime; DriverKernels are the names it gives
// cuModuleGetFunction (the first two) and cuLibraryGetKernel (the last),
// launched through the driver. They are the keys of
// GroundTruth.LaunchesByKernel, with "" for launches of a NULL function.
var (
	RuntimeKernels = []string{
		"_ZN5flash16flash_fwd_kernelILi128ELi64EEEvPKfPfi",
		"_ZN7cutlass6KernelI66cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x3_tn_align8EEvNT_6ParamsE",
		"_ZN2at6native29vectorized_elementwise_kernelILi4EZZZNS0_12_GLOBAL__N_111silu_kernelERNS_18TensorIteratorBaseEENKUlvE_clEvENKUlvE0_clEvEUlfE_NS_6detail5ArrayIPcLi2EEEEEviT0_T1_",
		"_Z15rms_norm_kernelIfEvPT_PKS0_i",
	}
	DriverKernels = []string{"triton_poi_fused_add_mul_0", "triton_red_fused_softmax_1", "_Z15paged_attentionPfS_i"}
)

// MemcpyKinds are the keys of GroundTruth.MemcpyBytes (cudaMemcpyKind 0..4);
// MemcpyCalls also has "unknown" for invalid kinds. With --extra or --ptsz
// both also have MemcpyPeer.
var MemcpyKinds = []string{"h2h", "h2d", "d2h", "d2d", "default"}

// MemcpyPeer is the memcpy_bytes/memcpy_calls key of peer-to-peer copies.
const MemcpyPeer = "p2p"

// memcpyFuncs take a cudaMemcpyKind; memcpy_calls counts them under their
// kind, and the peer copies under MemcpyPeer.
var (
	memcpyFuncs = []string{"cudaMemcpy", "cudaMemcpyAsync", "cudaMemcpyAsync_ptsz", "cudaMemcpy2D", "cudaMemcpy2DAsync",
		"cudaMemcpy_ptds", "cudaMemcpy2D_ptds", "cudaMemcpy2DAsync_ptsz", "cudaMemcpy3D", "cudaMemcpy3DAsync",
		"cudaMemcpy3D_ptds", "cudaMemcpy3DAsync_ptsz", "cudaMemcpyToSymbol", "cudaMemcpyFromSymbol",
		"cudaMemcpyToSymbolAsync", "cudaMemcpyFromSymbolAsync", "cudaMemcpyToSymbol_ptds", "cudaMemcpyFromSymbol_ptds",
		"cudaMemcpyToSymbolAsync_ptsz", "cudaMemcpyFromSymbolAsync_ptsz"}
	memcpyPeerFuncs = []string{"cudaMemcpyPeer", "cudaMemcpyPeerAsync", "cudaMemcpy3DPeer", "cudaMemcpy3DPeerAsync",
		"cudaMemcpy3DPeer_ptds", "cudaMemcpy3DPeerAsync_ptsz"}
	memsetFuncs = []string{"cudaMemset", "cudaMemsetAsync", "cudaMemset_ptds", "cudaMemsetAsync_ptsz",
		"cudaMemset2D", "cudaMemset2DAsync", "cudaMemset2D_ptds", "cudaMemset2DAsync_ptsz",
		"cudaMemset3D", "cudaMemset3DAsync", "cudaMemset3D_ptds", "cudaMemset3DAsync_ptsz"}
)

// GroundTruth is what the workload did in all its measured phases so far,
// tallied from the arguments it passed and the codes the calls returned.
// Only calls the workload makes itself count, never the driver calls the
// stub runtime makes on its behalf. Absent map keys mean 0.
type GroundTruth struct {
	PID                int                          `json:"pid"`
	Calls              map[string]uint64            `json:"calls"`           // function -> calls
	CallsByStream      map[string]map[string]uint64 `json:"calls_by_stream"` // function -> "default"|"0x..." -> calls
	Errors             map[string]map[string]uint64 `json:"errors"`          // function -> decimal error code -> calls
	MemcpyBytes        map[string]uint64            `json:"memcpy_bytes"`    // kind or "p2p" -> bytes of successful copies (2D: width*height)
	MemcpyCalls        map[string]uint64            `json:"memcpy_calls"`    // kind, "unknown" or "p2p" -> all copies
	MallocBytes        uint64                       `json:"malloc_bytes"`    // device allocations, managed included
	FreeBytes          uint64                       `json:"free_bytes"`
	ActiveBytes        uint64                       `json:"active_bytes"`
	Launches           uint64                       `json:"launches"` // cudaLaunchKernel calls
	LaunchGridBlocks   uint64                       `json:"launch_grid_blocks"`
	LaunchBlockThreads uint64                       `json:"launch_block_threads"`
	LaunchSharedBytes  uint64                       `json:"launch_shared_bytes"`

	LaunchesByAPI       map[string]uint64         `json:"launches_by_api"`        // LaunchAPIs -> calls, failed included
	LaunchesByKernel    map[string]uint64         `json:"launches_by_kernel"`     // kernel name ("" for NULL) -> launches, all APIs
	LaunchGeometryByAPI map[string]LaunchGeometry `json:"launch_geometry_by_api"` // LaunchAPIs -> sums, failed included
	MemsetBytes         map[string]uint64         `json:"memset_bytes"`           // "default"|"0x..." -> bytes of successful memsets
	MallocHostBytes     uint64                    `json:"malloc_host_bytes"`      // successful cudaMallocHost
	ManagedBytes        uint64                    `json:"managed_bytes"`          // successful cudaMallocManaged (also in MallocBytes)
	SetDeviceCalls      uint64                    `json:"set_device_calls"`       // cudaSetDevice calls, failed included

	// With --nvtx only (absent otherwise).
	LaunchesByPhase map[string]uint64 `json:"launches_by_phase,omitempty"` // Phases -> launches, all APIs (always all listed)
	NVTXCalls       map[string]uint64 `json:"nvtx_calls,omitempty"`        // NVTXFuncs -> calls (always all listed)
	// With --nvtx and --nccl-lib only: the empty groups' calls.
	NCCLCalls map[string]uint64 `json:"nccl_calls,omitempty"` // ncclGroupStart, ncclGroupEnd -> calls
	// With --park only: the phase's threads, parked.
	Threads []ThreadTruth `json:"threads,omitempty"`
}

// ThreadTruth is one parked worker thread of a --park phase: its CPU clock
// (CLOCK_THREAD_CPUTIME_ID) at its start and once parked (it runs no
// more), and the wall clock (CLOCK_REALTIME) at its start and at the end
// of its iterations, in nanoseconds.
type ThreadTruth struct {
	TID         int    `json:"tid"`
	CPUStartNS  uint64 `json:"cpu_start_ns"`
	CPUNS       uint64 `json:"cpu_ns"`
	WallStartNS uint64 `json:"wall_start_ns"`
	WallEndNS   uint64 `json:"wall_end_ns"`
}

// Phases are the values of the phase label (docs/INTERFACE.md), "" for no open
// NVTX range: the keys of GroundTruth.LaunchesByPhase.
var Phases = []string{"", "prefill", "decode", "attention", "mlp", "norm", "other"}

// NVTXFuncs are the NVTX functions the workload calls with --nvtx, the keys
// of GroundTruth.NVTXCalls. Per iteration and thread it makes 7
// nvtxRangePushA, 1 nvtxRangePushW, 9 nvtxRangePop (one with no range
// open), 3 nvtxDomainRangePushEx and 3 nvtxDomainRangePop (one pair on the
// default domain, NULL), and 12 runtime launches: phase "" 2, prefill 2,
// decode 2, attention 1, mlp 2, norm 2, other 1. Each thread creates its
// domain once per phase (nvtxDomainCreateA).
var NVTXFuncs = []string{
	"nvtxRangePushA", "nvtxRangePushW", "nvtxRangePop", "nvtxDomainCreateA",
	"nvtxDomainRangePushEx", "nvtxDomainRangePop",
}

// LaunchGeometry sums the launches' grid blocks (x*y*z), block threads
// (x*y*z) and dynamic shared memory bytes.
type LaunchGeometry struct {
	GridBlocks   uint64 `json:"grid_blocks"`
	BlockThreads uint64 `json:"block_threads"`
	SharedBytes  uint64 `json:"shared_bytes"`
}

// TotalCalls is the number of calls made (of all listed functions).
func (g *GroundTruth) TotalCalls() uint64 {
	var n uint64
	for _, c := range g.Calls {
		n += c
	}
	return n
}

var streamKeyRE = regexp.MustCompile(`^(default|0x[1-9a-f][0-9a-f]*)$`)

// Check verifies the ground truth's internal consistency, so a broken
// workload is caught before its numbers are used to judge the agent.
func (g *GroundTruth) Check() error {
	var errs []string
	fail := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	sumCalls := func(fns []string) uint64 {
		var n uint64
		for _, fn := range fns {
			n += g.Calls[fn]
		}
		return n
	}
	if g.PID <= 0 {
		fail("pid %d", g.PID)
	}
	for fn := range g.Calls {
		if !slices.Contains(AllFuncs, fn) {
			fail("calls: unknown function %q", fn)
		}
	}
	// --ptsz lists all its functions (0 included) or none.
	listed := 0
	for _, fn := range PtszFuncs {
		if _, ok := g.Calls[fn]; ok {
			listed++
		}
	}
	if listed != 0 && listed != len(PtszFuncs) {
		fail("calls lists %d of the %d per-thread stream variants, want all or none", listed, len(PtszFuncs))
	}
	if g.Launches != g.Calls["cudaLaunchKernel"] {
		fail("launches %d != calls[cudaLaunchKernel] %d", g.Launches, g.Calls["cudaLaunchKernel"])
	}
	if g.LaunchGridBlocks < g.Launches || g.LaunchBlockThreads < g.Launches {
		fail("launch grid blocks %d / block threads %d below launches %d (every dim is >= 1)",
			g.LaunchGridBlocks, g.LaunchBlockThreads, g.Launches)
	}
	for fn, byStream := range g.CallsByStream {
		if !slices.Contains(AllStreamFuncs, fn) {
			fail("calls_by_stream: %q takes no stream", fn)
		}
		for key := range byStream {
			if !streamKeyRE.MatchString(key) {
				fail("calls_by_stream[%s]: bad stream key %q", fn, key)
			}
		}
	}
	for _, fn := range AllStreamFuncs {
		if sum := sumValues(g.CallsByStream[fn]); sum != g.Calls[fn] {
			fail("calls_by_stream[%s] sums to %d, calls[%s] = %d", fn, sum, fn, g.Calls[fn])
		}
	}
	for fn, codes := range g.Errors {
		for code := range codes {
			if c, err := strconv.Atoi(code); err != nil || c == 0 {
				fail("errors[%s]: bad error code %q", fn, code)
			}
		}
		if sum := sumValues(codes); sum > g.Calls[fn] {
			fail("errors[%s] sum %d exceeds calls %d", fn, sum, g.Calls[fn])
		}
	}
	for kind := range g.MemcpyBytes {
		if kind != MemcpyPeer && !slices.Contains(MemcpyKinds, kind) {
			fail("memcpy_bytes: bad kind %q", kind)
		}
	}
	for kind := range g.MemcpyCalls {
		if kind != "unknown" && kind != MemcpyPeer && !slices.Contains(MemcpyKinds, kind) {
			fail("memcpy_calls: bad kind %q", kind)
		}
	}
	if sum, want := sumValues(g.MemcpyCalls), sumCalls(slices.Concat(memcpyFuncs, memcpyPeerFuncs)); sum != want {
		fail("memcpy_calls sum %d != memcpy function calls %d", sum, want)
	}
	if p, want := g.MemcpyCalls[MemcpyPeer], sumCalls(memcpyPeerFuncs); p != want {
		fail("memcpy_calls[p2p] %d != peer copy calls %d", p, want)
	}
	// The stub fails a copy only for an invalid kind, with code 21.
	var e21 uint64
	for _, fn := range memcpyFuncs {
		e21 += g.Errors[fn]["21"]
	}
	if u := g.MemcpyCalls["unknown"]; u != e21 {
		fail("memcpy_calls[unknown] %d != memcpy errors 21: %d", u, e21)
	}
	if g.FreeBytes > g.MallocBytes || g.ActiveBytes != g.MallocBytes-g.FreeBytes {
		fail("active_bytes %d != malloc_bytes %d - free_bytes %d", g.ActiveBytes, g.MallocBytes, g.FreeBytes)
	}
	g.checkLaunches(fail)
	for key := range g.MemsetBytes {
		if !streamKeyRE.MatchString(key) {
			fail("memset_bytes: bad stream key %q", key)
		}
	}
	if len(g.MemsetBytes) > 0 && sumCalls(memsetFuncs) == 0 {
		fail("memset_bytes %v without memset calls", g.MemsetBytes)
	}
	if g.MallocHostBytes > 0 && g.Calls["cudaMallocHost"] == 0 {
		fail("malloc_host_bytes %d without cudaMallocHost calls", g.MallocHostBytes)
	}
	if g.ManagedBytes > g.MallocBytes || (g.ManagedBytes > 0 && g.Calls["cudaMallocManaged"] == 0) {
		fail("managed_bytes %d: above malloc_bytes %d or without cudaMallocManaged calls", g.ManagedBytes, g.MallocBytes)
	}
	if g.SetDeviceCalls != g.Calls["cudaSetDevice"] {
		fail("set_device_calls %d != calls[cudaSetDevice] %d", g.SetDeviceCalls, g.Calls["cudaSetDevice"])
	}
	g.checkNVTX(fail)
	if len(errs) > 0 {
		return fmt.Errorf("testutil: inconsistent ground truth:\n  %s", strings.Join(errs, "\n  "))
	}
	return nil
}

func (g *GroundTruth) checkLaunches(fail func(string, ...any)) {
	for api := range g.LaunchesByAPI {
		if !slices.Contains(LaunchAPIs, api) {
			fail("launches_by_api: unknown API %q", api)
		}
	}
	for api := range g.LaunchGeometryByAPI {
		if !slices.Contains(LaunchAPIs, api) {
			fail("launch_geometry_by_api: unknown API %q", api)
		}
	}
	var failed uint64
	for _, api := range LaunchAPIs {
		n := g.LaunchesByAPI[api]
		if n != g.Calls[api] {
			fail("launches_by_api[%s] %d != calls %d", api, n, g.Calls[api])
		}
		if geo := g.LaunchGeometryByAPI[api]; geo.GridBlocks < n || geo.BlockThreads < n {
			fail("launch_geometry_by_api[%s] %+v below launches %d (every dim is >= 1)", api, geo, n)
		}
		failed += sumValues(g.Errors[api])
	}
	want := LaunchGeometry{g.LaunchGridBlocks, g.LaunchBlockThreads, g.LaunchSharedBytes}
	if geo := g.LaunchGeometryByAPI["cudaLaunchKernel"]; geo != want {
		fail("launch_geometry_by_api[cudaLaunchKernel] %+v != launch_* %+v", geo, want)
	}
	if sum, want := sumValues(g.LaunchesByKernel), sumValues(g.LaunchesByAPI); sum != want {
		fail("launches_by_kernel sums to %d, launches_by_api to %d", sum, want)
	}
	known := slices.Concat(RuntimeKernels, DriverKernels, []string{""})
	for k := range g.LaunchesByKernel {
		if !slices.Contains(known, k) {
			fail("launches_by_kernel: unknown kernel %q", k)
		}
	}
	// The stubs fail a launch only for a NULL function.
	if n := g.LaunchesByKernel[""]; n != failed {
		fail("launches_by_kernel[\"\"] %d != failed launches %d", n, failed)
	}
}

// checkNVTX: --nvtx lists every phase and NVTX function, or nothing.
func (g *GroundTruth) checkNVTX(fail func(string, ...any)) {
	if (g.LaunchesByPhase == nil) != (g.NVTXCalls == nil) {
		fail("launches_by_phase %v and nvtx_calls %v: want both or neither", g.LaunchesByPhase, g.NVTXCalls)
	}
	if g.LaunchesByPhase == nil {
		return
	}
	if !sameKeys(g.LaunchesByPhase, Phases) {
		fail("launches_by_phase keys %q, want %q", slices.Sorted(maps.Keys(g.LaunchesByPhase)), Phases)
	}
	if !sameKeys(g.NVTXCalls, NVTXFuncs) {
		fail("nvtx_calls keys %q, want %q", slices.Sorted(maps.Keys(g.NVTXCalls)), NVTXFuncs)
	}
	if sum, want := sumValues(g.LaunchesByPhase), sumValues(g.LaunchesByAPI); sum != want {
		fail("launches_by_phase sums to %d, launches_by_api to %d", sum, want)
	}
	// Every range pushed is popped within its iteration; default-domain
	// pops may exceed pushes (a pop with nothing open), never fall short.
	if g.NCCLCalls != nil && (!sameKeys(g.NCCLCalls, []string{"ncclGroupStart", "ncclGroupEnd"}) ||
		g.NCCLCalls["ncclGroupStart"] != g.NCCLCalls["ncclGroupEnd"]) {
		fail("nccl_calls %v: want ncclGroupStart and ncclGroupEnd, as many of each", g.NCCLCalls)
	}
	n := g.NVTXCalls
	if n["nvtxDomainRangePushEx"] != n["nvtxDomainRangePop"] || n["nvtxRangePop"] < n["nvtxRangePushA"]+n["nvtxRangePushW"] {
		fail("nvtx_calls %v: unbalanced pushes and pops", n)
	}
}

// sameKeys reports whether m's keys are exactly keys.
func sameKeys[V any](m map[string]V, keys []string) bool {
	if len(m) != len(keys) {
		return false
	}
	for _, k := range keys {
		if _, ok := m[k]; !ok {
			return false
		}
	}
	return true
}

func sumValues(m map[string]uint64) uint64 {
	var n uint64
	for _, v := range m {
		n += v
	}
	return n
}
