package testutil

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/profi-dev/profi/internal/testutil/testenv"
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
	"cudaMemset2D", "cudaMemset2DAsync",
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
		"cudaMemset2D", "cudaMemset2DAsync", "cudaMemset2D_ptds", "cudaMemset2DAsync_ptsz"}
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

// Option configures StartWorkload.
type Option func(*startOptions)

type startOptions struct {
	dir          string
	env          []string
	wrapper      []string
	sysProcAttr  *syscall.SysProcAttr
	readyTimeout time.Duration
	runTimeout   time.Duration
}

// WithDir sets the working directory.
func WithDir(dir string) Option { return func(o *startOptions) { o.dir = dir } }

// WithEnv sets the whole environment (exec.Cmd.Env semantics: nil inherits).
func WithEnv(env []string) Option { return func(o *startOptions) { o.env = env } }

// WithWrapper runs the workload under a command prefix, e.g.
// "unshare", "--mount", "--". Workload.PID is then still the workload's own.
func WithWrapper(argv ...string) Option {
	return func(o *startOptions) { o.wrapper = argv }
}

// WithSysProcAttr sets exec.Cmd.SysProcAttr.
func WithSysProcAttr(a *syscall.SysProcAttr) Option {
	return func(o *startOptions) { o.sysProcAttr = a }
}

// WithReadyTimeout bounds the wait for "ready" (default 30 s).
func WithReadyTimeout(d time.Duration) Option { return func(o *startOptions) { o.readyTimeout = d } }

// WithRunTimeout bounds each Run (default 120 s: probed runs are slow).
func WithRunTimeout(d time.Duration) Option { return func(o *startOptions) { o.runTimeout = d } }

// Workload is a running workload process driven over its stdin protocol.
type Workload struct {
	Cmd *exec.Cmd
	PID int // the workload's PID as it printed it (not the wrapper's)

	opts    startOptions
	stdin   io.WriteCloser
	lines   chan string   // stdout lines; closed at EOF
	eof     atomic.Bool   // stdout hit EOF: the workload closed it
	quit    chan struct{} // closed by Stop: stop delivering lines
	exited  chan struct{} // closed once Cmd.Wait returned (wrapper, if any)
	waitErr error         // Cmd.Wait's result, valid after exited
	stderr  lockedBuffer

	mu       sync.Mutex // serialises protocol exchanges
	stopOnce sync.Once
	stopErr  error
}

const (
	stopTimeout = 10 * time.Second
	loadTimeout = 30 * time.Second
)

// StartWorkload starts bin with args and waits until it prints "ready <pid>".
// Cancelling ctx kills the process (the wrapper, when one is used).
func StartWorkload(ctx context.Context, bin string, args []string, opts ...Option) (*Workload, error) {
	w := &Workload{
		opts:   startOptions{readyTimeout: 30 * time.Second, runTimeout: 120 * time.Second},
		lines:  make(chan string, 16),
		quit:   make(chan struct{}),
		exited: make(chan struct{}),
	}
	for _, o := range opts {
		o(&w.opts)
	}
	argv := append(append(slices.Clone(w.opts.wrapper), bin), args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = w.opts.dir
	cmd.Env = w.opts.env
	cmd.SysProcAttr = w.opts.sysProcAttr
	cmd.Stderr = &w.stderr
	// Bounds Wait if a wrapper's child outlives it holding stderr.
	cmd.WaitDelay = stopTimeout
	w.Cmd = cmd
	var err error
	if w.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, fmt.Errorf("testutil: %w", err)
	}
	// A plain pipe rather than StdoutPipe: Cmd.Wait must not close stdout
	// under the reader, so the two can run independently.
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("testutil: %w", err)
	}
	cmd.Stdout = pw
	err = cmd.Start()
	pw.Close()
	if err != nil {
		pr.Close()
		return nil, fmt.Errorf("testutil: start %s: %w", strings.Join(argv, " "), err)
	}
	go w.readLoop(pr)
	go func() {
		w.waitErr = cmd.Wait()
		close(w.exited)
	}()

	line, err := w.waitLine(w.opts.readyTimeout, `"ready <pid>"`)
	if err == nil {
		var pid int
		if _, serr := fmt.Sscanf(line, "ready %d", &pid); serr != nil || pid <= 0 {
			err = fmt.Errorf("testutil: workload printed %q, want \"ready <pid>\"", line)
		}
		w.PID = pid
	}
	if err != nil {
		w.kill()
		return nil, err
	}
	return w, nil
}

// readLoop forwards stdout lines until EOF. It keeps draining stdout after
// Stop so the workload never blocks writing to it.
func (w *Workload) readLoop(stdout *os.File) {
	defer stdout.Close()
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64<<10), 64<<20) // JSON lines grow with streams
	for sc.Scan() {
		select {
		case w.lines <- sc.Text():
		case <-w.quit:
		}
	}
	_, _ = io.Copy(io.Discard, stdout) // after a scan error (line too long)
	w.eof.Store(true)
	close(w.lines)
}

// waitLine returns the next stdout line, or an error with the workload's
// stderr when it exits or timeout passes first.
func (w *Workload) waitLine(timeout time.Duration, what string) (string, error) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case line, ok := <-w.lines:
		if ok {
			return line, nil
		}
		select {
		case <-w.exited:
		case <-timer.C:
		}
		return "", w.errorf("exited (%v) while waiting for %s", w.exitStatus(), what)
	case <-timer.C:
		return "", w.errorf("timed out after %v waiting for %s", timeout, what)
	}
}

func (w *Workload) exitStatus() error {
	select {
	case <-w.exited:
		return w.waitErr
	default:
		return fmt.Errorf("exit status not yet known")
	}
}

func (w *Workload) errorf(format string, args ...any) error {
	return fmt.Errorf("testutil: workload %s (pid %d): %s; stderr:\n%s",
		strings.Join(w.Cmd.Args, " "), w.PID, fmt.Sprintf(format, args...), w.Stderr())
}

func (w *Workload) send(cmd string) error {
	if _, err := io.WriteString(w.stdin, cmd+"\n"); err != nil {
		return w.errorf("sending %q: %v", cmd, err)
	}
	return nil
}

// Stderr returns what the workload wrote to stderr so far.
func (w *Workload) Stderr() string { return w.stderr.String() }

// Load makes the dlopen build load the library ("load" -> "loaded"). The
// linked build answers too, so callers may treat both builds alike.
func (w *Workload) Load() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.send("load"); err != nil {
		return err
	}
	line, err := w.waitLine(loadTimeout, `"loaded"`)
	if err != nil {
		return err
	}
	if line != "loaded" {
		return w.errorf("printed %q, want \"loaded\"", line)
	}
	return nil
}

// Run runs one measured phase ("go") and returns the cumulative ground truth
// of all phases so far, after checking its internal consistency.
func (w *Workload) Run() (*GroundTruth, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.send("go"); err != nil {
		return nil, err
	}
	line, err := w.waitLine(w.opts.runTimeout, "ground truth JSON")
	if err != nil {
		return nil, err
	}
	var gt GroundTruth
	dec := json.NewDecoder(strings.NewReader(line))
	dec.DisallowUnknownFields() // a renamed key must fail loudly, not read as 0
	if err := dec.Decode(&gt); err != nil {
		return nil, w.errorf("bad ground truth %q: %v", line, err)
	}
	if gt.PID != w.PID {
		return nil, w.errorf("ground truth pid %d != ready pid %d", gt.PID, w.PID)
	}
	if err := gt.Check(); err != nil {
		return nil, err
	}
	return &gt, nil
}

// Die sends cmd, a command after which the workload dies ("segv" and
// "ill": one probed call, then that fault), and waits for it to exit. It
// returns the kernel's wait status of the workload (no wrapper).
func (w *Workload) Die(cmd string) (syscall.WaitStatus, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.send(cmd); err != nil {
		return 0, err
	}
	select {
	case <-w.exited:
	case <-time.After(stopTimeout):
		return 0, w.errorf("still running %v after %q", stopTimeout, cmd)
	}
	ws, ok := w.Cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok {
		return 0, w.errorf("no wait status")
	}
	return ws, nil
}

// Signal sends sig to the workload and waits for it to exit; it returns
// the kernel's wait status (no wrapper).
func (w *Workload) Signal(sig syscall.Signal) (syscall.WaitStatus, error) {
	if err := w.Cmd.Process.Signal(sig); err != nil {
		return 0, w.errorf("signal %v: %v", sig, err)
	}
	select {
	case <-w.exited:
	case <-time.After(stopTimeout):
		return 0, w.errorf("still running %v after %v", stopTimeout, sig)
	}
	ws, ok := w.Cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok {
		return 0, w.errorf("no wait status")
	}
	return ws, nil
}

// Stop asks the workload to exit, waits, and kills it after a timeout. It is
// idempotent; the error reports a non-zero exit or a needed kill.
func (w *Workload) Stop() error {
	w.stopOnce.Do(func() {
		close(w.quit)
		_, _ = io.WriteString(w.stdin, "exit\n") // fails harmlessly if it is gone
		_ = w.stdin.Close()                      // EOF also means exit
		select {
		case <-w.exited:
			if w.waitErr != nil {
				w.stopErr = w.errorf("exit: %v", w.waitErr)
			}
		case <-time.After(stopTimeout):
			w.kill()
			w.stopErr = w.errorf("did not exit within %v; killed", stopTimeout)
		}
	})
	return w.stopErr
}

// kill kills the process, and the workload itself when behind a wrapper, and
// waits until it is reaped.
func (w *Workload) kill() {
	select {
	case <-w.exited:
		return
	default:
	}
	if w.PID > 0 && w.PID != w.Cmd.Process.Pid && !w.eof.Load() {
		// Behind a wrapper; its stdout still open says the PID is still it.
		_ = syscall.Kill(w.PID, syscall.SIGKILL)
	}
	_ = w.Cmd.Process.Kill()
	<-w.exited
}

// lockedBuffer is an io.Writer safe to read while exec copies stderr into it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// NCCLDataFuncs are the NCCL data calls (count and datatype arguments) the
// NCCL workload makes: the keys of NCCLGroundTruth.Bytes, always all listed.
var NCCLDataFuncs = []string{
	"ncclAllReduce", "ncclAllGather", "ncclReduceScatter", "ncclBroadcast", "ncclReduce",
	"ncclAlltoAll", "ncclSend", "ncclRecv",
}

// NCCLFuncs are all functions the NCCL workload calls: the keys of
// NCCLGroundTruth.Calls, HostNS and HostNSMax, always all listed.
var NCCLFuncs = slices.Concat(NCCLDataFuncs, []string{
	"ncclGroupStart", "ncclGroupEnd", "ncclGetVersion", "ncclGetUniqueId", "ncclCommInitRank",
	"ncclCommInitRankConfig", "ncclCommInitAll", "ncclCommDestroy", "ncclCommAbort",
	"ncclCommGetAsyncError", "ncclCommCount", "ncclCommUserRank", "ncclCommCuDevice",
	"ncclGetErrorString",
})

// NCCLDatatypeSizes are the bytes per element of each ncclDataType_t value
// (index); any other value is unknown and adds 0 bytes (docs/INTERFACE.md §5.5).
var NCCLDatatypeSizes = []uint64{1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1}

// ncclResult_t values the stub returns.
const (
	NCCLInvalidArgument = 4
	NCCLInvalidUsage    = 5
	NCCLInProgress      = 7
)

// NCCLIdentity is who a rank is: printed by "init" and in every ground truth.
type NCCLIdentity struct {
	Comm     string `json:"comm"` // ncclComm_t, "0x..."
	Rank     int    `json:"rank"`
	NRanks   int    `json:"nranks"`
	Device   int    `json:"device"`    // CUDA device set before init (cudaSetDevice)
	CommHash string `json:"comm_hash"` // NCCL's commHash of ID, "0x..." (NCCLCommHash)
	ID       string `json:"id"`        // the ncclUniqueId, 256 hex digits
	Blocking int    `json:"blocking"`  // -1: ncclCommInitRank; 0 or 1: ncclCommInitRankConfig's config.blocking
}

// NCCLInit is the answer to "init".
type NCCLInit struct {
	NCCLIdentity
	RC    int `json:"rc"`    // of ncclCommInitRank(Config): 0, or 7 when non-blocking
	Async int `json:"async"` // last ncclCommGetAsyncError state polled (0 when blocking)
}

// NCCLTally sums one (function, datatype) pair's calls. Elements are the
// count arguments as passed (docs/INTERFACE.md's element count); bytes are
// elements × datatype size, 0 for an unknown datatype. Error calls are those
// that returned non-zero (ncclInProgress included).
type NCCLTally struct {
	Calls      uint64 `json:"calls"`
	Elements   uint64 `json:"elements"`
	Bytes      uint64 `json:"bytes"`
	ErrorCalls uint64 `json:"error_calls"`
	ErrorBytes uint64 `json:"error_bytes"`
}

// NCCLGroundTruth is what one rank of the NCCL workload did over all its
// commands so far (cumulative, not per phase), tallied from the arguments
// it passed and the codes the calls returned. Absent map keys mean 0.
//
// One "go" makes, with n ranks and I = --iters steps (i = 0..I-1):
// ncclGetVersion, ncclCommCount, ncclCommUserRank, ncclCommCuDevice,
// ncclCommGetAsyncError and ncclGetErrorString once; per step ncclAllReduce
// over all 12 datatypes, ncclAllGather ×3, ncclReduceScatter ×3 (default
// stream), ncclBroadcast ×2, ncclReduce ×2, ncclAlltoAll ×2, a group of 3
// ncclSend and 3 ncclRecv (ring: peer rank±1), and a nested group (one
// ncclAllReduce inside, one ncclAllGather in the outer group); on steps
// 0, 10, 20, ... one call per argument error (7 calls: invalid datatype 12,
// datatype -1, NULL comm, root n, peer -1, reduction op 99, all 4; an
// unmatched ncclGroupEnd, 5) and an ncclBroadcast of 2^32+512 int8 that
// succeeds.
type NCCLGroundTruth struct {
	PID int `json:"pid"`
	NCCLIdentity
	DelayNS    uint64                          `json:"delay_ns"`    // the stub's current per-call delay
	Calls      map[string]uint64               `json:"calls"`       // NCCLFuncs -> calls
	Errors     map[string]map[string]uint64    `json:"errors"`      // function -> decimal ncclResult_t -> calls
	Bytes      map[string]uint64               `json:"bytes"`       // NCCLDataFuncs -> bytes of all calls, failed included
	ByDatatype map[string]map[string]NCCLTally `json:"by_datatype"` // data function -> decimal ncclDataType_t as passed -> tally
	HostNS     map[string]uint64               `json:"host_ns"`     // NCCLFuncs -> summed host time around the calls
	HostNSMax  map[string]uint64               `json:"host_ns_max"` // NCCLFuncs -> longest call
	CUDACalls  map[string]uint64               `json:"cuda_calls"`  // "cudaSetDevice", "cudaStreamCreate" -> calls (at init)
}

// TotalCalls is the number of NCCL calls made.
func (g *NCCLGroundTruth) TotalCalls() uint64 { return sumValues(g.Calls) }

// NCCLCommHash is NCCL's commHash of a unique id given in hex: DJB2a over
// its 128 bytes, each a C char: sign-extended on x86-64, not on arm64,
// where char is unsigned.
func NCCLCommHash(idHex string) (uint64, error) {
	b, err := hex.DecodeString(idHex)
	if err != nil || len(b) != 128 {
		return 0, fmt.Errorf("testutil: unique id %q: want 256 hex digits", idHex)
	}
	h := uint64(5381)
	for _, c := range b {
		v := uint64(c)
		if runtime.GOARCH == "amd64" {
			v = uint64(int64(int8(c)))
		}
		h = (h<<5 + h) ^ v
	}
	return h, nil
}

// Check verifies the ground truth's internal consistency.
func (g *NCCLGroundTruth) Check() error {
	var errs []string
	fail := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	if g.PID <= 0 || g.Rank < 0 || g.Rank >= g.NRanks {
		fail("pid %d, rank %d of %d", g.PID, g.Rank, g.NRanks)
	}
	if h, err := NCCLCommHash(g.ID); err != nil || fmt.Sprintf("%#x", h) != g.CommHash {
		fail("comm_hash %s of id %s: want %#x (%v)", g.CommHash, g.ID, h, err)
	}
	for name, m := range map[string]map[string]uint64{"calls": g.Calls, "host_ns": g.HostNS, "host_ns_max": g.HostNSMax} {
		if !sameKeys(m, NCCLFuncs) {
			fail("%s keys %q, want %q", name, slices.Sorted(maps.Keys(m)), NCCLFuncs)
		}
	}
	for _, fn := range NCCLFuncs {
		if g.HostNSMax[fn] > g.HostNS[fn] || (g.Calls[fn] == 0 && g.HostNS[fn] != 0) {
			fail("%s: host_ns %d, host_ns_max %d for %d calls", fn, g.HostNS[fn], g.HostNSMax[fn], g.Calls[fn])
		}
	}
	if !sameKeys(g.Bytes, NCCLDataFuncs) {
		fail("bytes keys %q, want %q", slices.Sorted(maps.Keys(g.Bytes)), NCCLDataFuncs)
	}
	for fn, codes := range g.Errors {
		for code := range codes {
			if c, err := strconv.Atoi(code); err != nil || c == 0 {
				fail("errors[%s]: bad code %q", fn, code)
			}
		}
		if sum := sumValues(codes); sum > g.Calls[fn] || fn == "ncclGetErrorString" {
			fail("errors[%s] = %v for %d calls", fn, codes, g.Calls[fn])
		}
	}
	for fn := range g.ByDatatype {
		if !slices.Contains(NCCLDataFuncs, fn) {
			fail("by_datatype: %q is no data call", fn)
		}
	}
	for _, fn := range NCCLDataFuncs {
		var sum NCCLTally
		for key, r := range g.ByDatatype[fn] {
			dt, err := strconv.Atoi(key)
			if err != nil {
				fail("by_datatype[%s]: bad datatype %q", fn, key)
			}
			size := uint64(0)
			if dt >= 0 && dt < len(NCCLDatatypeSizes) {
				size = NCCLDatatypeSizes[dt]
			}
			if r.Calls == 0 || r.Bytes != r.Elements*size || r.ErrorCalls > r.Calls || r.ErrorBytes > r.Bytes {
				fail("by_datatype[%s][%s] = %+v (element size %d)", fn, key, r, size)
			}
			sum.Calls += r.Calls
			sum.Bytes += r.Bytes
			sum.ErrorCalls += r.ErrorCalls
		}
		if sum.Calls != g.Calls[fn] || sum.Bytes != g.Bytes[fn] || sum.ErrorCalls != sumValues(g.Errors[fn]) {
			fail("by_datatype[%s] sums to %d calls, %d bytes, %d errors; want %d, %d, %d", fn, sum.Calls,
				sum.Bytes, sum.ErrorCalls, g.Calls[fn], g.Bytes[fn], sumValues(g.Errors[fn]))
		}
	}
	if !sameKeys(g.CUDACalls, []string{"cudaSetDevice", "cudaStreamCreate"}) {
		fail("cuda_calls %v", g.CUDACalls)
	}
	if len(errs) > 0 {
		return fmt.Errorf("testutil: inconsistent NCCL ground truth:\n  %s", strings.Join(errs, "\n  "))
	}
	return nil
}

// NCCLWorkload is one running rank of the NCCL workload (fixtures'
// NcclWorkload), driven over its stdin protocol. Stop (or Exit) ends it.
type NCCLWorkload struct {
	*Workload
}

// NCCLArgs are the workload flags of one rank; extra flags follow.
func NCCLArgs(rank, nranks int, extra ...string) []string {
	return append([]string{"--rank", strconv.Itoa(rank), "--nranks", strconv.Itoa(nranks)}, extra...)
}

// StartNCCL starts one rank (args: NCCLArgs) and waits for "ready <pid>".
func StartNCCL(ctx context.Context, bin string, args []string, opts ...Option) (*NCCLWorkload, error) {
	w, err := StartWorkload(ctx, bin, args, opts...)
	if err != nil {
		return nil, err
	}
	return &NCCLWorkload{w}, nil
}

// StartNCCLJob starts nranks ranks, as torchrun would, and initialises them:
// rank 0 makes the unique id, the others join with it. args(rank) gives
// flags beyond --rank and --nranks (nil for none). On error it stops the
// ranks it started.
func StartNCCLJob(ctx context.Context, bin string, nranks int, args func(rank int) []string,
	opts ...Option) ([]*NCCLWorkload, error) {
	var ranks []*NCCLWorkload
	fail := func(err error) ([]*NCCLWorkload, error) {
		for _, r := range ranks {
			r.Kill()
		}
		return nil, err
	}
	for rank := range nranks {
		var extra []string
		if args != nil {
			extra = args(rank)
		}
		w, err := StartNCCL(ctx, bin, NCCLArgs(rank, nranks, extra...), opts...)
		if err != nil {
			return fail(err)
		}
		ranks = append(ranks, w)
	}
	var id string
	for _, w := range ranks {
		in, err := w.InitWithID(id)
		if err != nil {
			return fail(err)
		}
		id = in.ID
	}
	return ranks, nil
}

// exchange sends cmd and returns the answer line.
func (w *NCCLWorkload) exchange(cmd, what string, timeout time.Duration) (string, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.send(cmd); err != nil {
		return "", err
	}
	return w.waitLine(timeout, what)
}

// decodeStrict decodes one JSON line: a renamed key must fail loudly.
func (w *NCCLWorkload) decodeStrict(line string, v any) error {
	dec := json.NewDecoder(strings.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return w.errorf("bad answer %q: %v", line, err)
	}
	return nil
}

// Init creates the communicator ("init"), with --id's unique id, or a new
// one on rank 0 without it. It fails unless init returned 0 or, for a
// non-blocking communicator, 7 with the async state settled at 0.
func (w *NCCLWorkload) Init() (*NCCLInit, error) { return w.InitWithID("") }

// InitWithID is Init with the job's unique id (hex; "" for Init).
func (w *NCCLWorkload) InitWithID(id string) (*NCCLInit, error) {
	cmd := "init"
	if id != "" {
		cmd += " " + id
	}
	line, err := w.exchange(cmd, "init JSON", loadTimeout)
	if err != nil {
		return nil, err
	}
	var in NCCLInit
	if err := w.decodeStrict(line, &in); err != nil {
		return nil, err
	}
	if (in.RC != 0 && in.RC != NCCLInProgress) || in.Async != 0 {
		return &in, w.errorf("init returned %d (async %d)", in.RC, in.Async)
	}
	return &in, nil
}

// Go runs one measured phase ("go") and returns the cumulative ground
// truth, after checking its internal consistency.
func (w *NCCLWorkload) Go() (*NCCLGroundTruth, error) {
	line, err := w.exchange("go", "ground truth JSON", w.opts.runTimeout)
	if err != nil {
		return nil, err
	}
	var gt NCCLGroundTruth
	if err := w.decodeStrict(line, &gt); err != nil {
		return nil, err
	}
	if gt.PID != w.PID {
		return nil, w.errorf("ground truth pid %d != ready pid %d", gt.PID, w.PID)
	}
	if err := gt.Check(); err != nil {
		return nil, err
	}
	return &gt, nil
}

// NCCLHang is the answer to "hang": the call made, its return code and its
// host time.
type NCCLHang struct {
	Op string
	RC int
	NS uint64
}

// Hang makes one data call op ("" for ncclAllReduce; any of NCCLDataFuncs)
// that blocks d inside the stub, and returns when it has.
func (w *NCCLWorkload) Hang(d time.Duration, op string) (*NCCLHang, error) {
	cmd := fmt.Sprintf("hang %d %s", d.Milliseconds(), op)
	line, err := w.exchange(strings.TrimSpace(cmd), `"hung ..."`, d+w.opts.runTimeout)
	if err != nil {
		return nil, err
	}
	var h NCCLHang
	if _, err := fmt.Sscanf(line, "hung %s %d %d", &h.Op, &h.RC, &h.NS); err != nil {
		return nil, w.errorf("printed %q, want \"hung OP RC NS\"", line)
	}
	return &h, nil
}

// Block makes one data call op ("" for ncclAllReduce) that blocks inside
// the stub until the process is killed, and returns once the workload said
// it is about to make it. The rank answers nothing more: Kill it.
func (w *NCCLWorkload) Block(op string) error {
	line, err := w.exchange(strings.TrimSpace("block "+op), `"blocking ..."`, loadTimeout)
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "blocking ") {
		return w.errorf("printed %q, want \"blocking OP\"", line)
	}
	return nil
}

// BlockCUDA makes one cudaMemcpy that blocks inside the stub
// runtime until the process is killed (a GPU that never answers), and
// returns once the workload said it is about to make it. The rank answers
// nothing more: Kill it.
func (w *NCCLWorkload) BlockCUDA() error {
	const want = "cuda-blocking cudaMemcpy"
	line, err := w.exchange("cudablock", strconv.Quote(want), loadTimeout)
	if err == nil && line != want {
		err = w.errorf("printed %q, want %q", line, want)
	}
	return err
}

// SetDelay makes every later data call take at least ns of host time.
func (w *NCCLWorkload) SetDelay(ns uint64) error {
	want := fmt.Sprintf("delay %d", ns)
	line, err := w.exchange(want, strconv.Quote(want), loadTimeout)
	if err == nil && line != want {
		err = w.errorf("printed %q, want %q", line, want)
	}
	return err
}

// code sends cmd and parses the answer "<word> RC".
func (w *NCCLWorkload) code(cmd, word string) (int, error) {
	line, err := w.exchange(cmd, strconv.Quote(word+" RC"), loadTimeout)
	if err != nil {
		return 0, err
	}
	var rc int
	if _, err := fmt.Sscanf(line, word+" %d", &rc); err != nil {
		return 0, w.errorf("printed %q, want \"%s RC\"", line, word)
	}
	return rc, nil
}

// InitAll runs "initall n": ncclCommInitAll of n communicators, one grouped
// ncclAllReduce (1024 float32, default stream) on each, then
// ncclCommDestroy of each. It returns ncclCommInitAll's code.
func (w *NCCLWorkload) InitAll(n int) (int, error) {
	return w.code(fmt.Sprintf("initall %d", n), "initall")
}

// Destroy calls ncclCommDestroy on the rank's communicator; later data
// calls on it fail with 4.
func (w *NCCLWorkload) Destroy() (int, error) { return w.code("destroy", "destroyed") }

// Abort calls ncclCommAbort on the rank's communicator.
func (w *NCCLWorkload) Abort() (int, error) { return w.code("abort", "aborted") }

// Exit asks the rank to exit and waits (Stop).
func (w *NCCLWorkload) Exit() error { return w.Stop() }

// Kill kills the rank (a blocked one cannot exit) and waits until it is
// reaped. Stop afterwards returns nil.
func (w *NCCLWorkload) Kill() {
	w.stopOnce.Do(func() {
		close(w.quit)
		w.kill()
		_ = w.stdin.Close()
	})
}

// gpuWorkloadSrc is the GPU attribution workload (cudaSetDevice per thread).
const gpuWorkloadSrc = "test/workloads/gpu_workload.c"

// BuildGPUWorkload compiles the GPU attribution workload into dir, linked
// against fx's stub runtime (found through its RUNPATH). A program, not a
// library: rebuilding it cannot strand uprobes.
func BuildGPUWorkload(fx *Fixtures, dir string) (string, error) {
	root, err := testenv.RepoRoot()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "gpu-workload")
	args := cat(workloadFlags, warnFlags, []string{"-I" + filepath.Join(root, filepath.Dir(stubHeader)), "-o", out,
		filepath.Join(root, gpuWorkloadSrc), "-L" + fx.Dir, "-l:libcudart.so.12", "-Wl,-rpath," + fx.Dir})
	cc, err := CC(runtime.GOARCH)
	if err != nil {
		return "", err
	}
	cmd := cc.Command(args...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("testutil: %s: %v\n%s", strings.Join(cmd.Args, " "), err, b)
	}
	return out, nil
}

// GPUThread is what one thread of the GPU workload did after
// cudaSetDevice(Ordinal). Frees counts the main thread's cudaFree calls of
// this thread's allocations.
type GPUThread struct {
	Ordinal     int    `json:"ordinal"`
	SetDevice   uint64 `json:"set_device"`
	Memcpy      uint64 `json:"memcpy"` // cudaMemcpy calls of 32 bytes, device to device
	Launches    uint64 `json:"launches"`
	MallocBytes uint64 `json:"malloc_bytes"`
	Frees       uint64 `json:"frees"`
}

// GPUGroundTruth is the cumulative ground truth of the GPU workload.
// MainMemcpy are the cudaMemcpy calls of the main thread, which never
// calls cudaSetDevice (CUDA's default device, ordinal 0).
type GPUGroundTruth struct {
	PID        int         `json:"pid"`
	Threads    []GPUThread `json:"threads"`
	MainMemcpy uint64      `json:"main_memcpy"`
}

// RunGPU runs one phase of the GPU workload ("go") and returns its
// cumulative ground truth.
func (w *Workload) RunGPU() (*GPUGroundTruth, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.send("go"); err != nil {
		return nil, err
	}
	line, err := w.waitLine(w.opts.runTimeout, "GPU ground truth JSON")
	if err != nil {
		return nil, err
	}
	var gt GPUGroundTruth
	dec := json.NewDecoder(strings.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&gt); err != nil {
		return nil, w.errorf("bad GPU ground truth %q: %v", line, err)
	}
	if gt.PID != w.PID {
		return nil, w.errorf("ground truth pid %d != ready pid %d", gt.PID, w.PID)
	}
	return &gt, nil
}
