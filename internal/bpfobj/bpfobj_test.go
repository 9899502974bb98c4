package bpfobj

import (
	"math"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/cilium/ebpf/btf"
)

// TestLayoutsMatchBTF guards the generated Go types against hand edits and
// against a stale generation: size, field order and field offsets must
// match the BTF of the embedded object.
func TestLayoutsMatchBTF(t *testing.T) {
	t.Parallel()
	spec, err := LoadProfi()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		cName  string
		goType reflect.Type
		size   uintptr
	}{
		{"agg_key", reflect.TypeFor[ProfiAggKey](), unsafe.Sizeof(ProfiAggKey{})},
		{"agg_val", reflect.TypeFor[ProfiAggVal](), unsafe.Sizeof(ProfiAggVal{})},
		{"launch_key", reflect.TypeFor[ProfiLaunchKey](), unsafe.Sizeof(ProfiLaunchKey{})},
		{"launch_val", reflect.TypeFor[ProfiLaunchVal](), unsafe.Sizeof(ProfiLaunchVal{})},
		{"inflight_call", reflect.TypeFor[ProfiInflightCall](), unsafe.Sizeof(ProfiInflightCall{})},
		{"alloc_key", reflect.TypeFor[ProfiAllocKey](), unsafe.Sizeof(ProfiAllocKey{})},
		{"pid_file", reflect.TypeFor[ProfiPidFile](), unsafe.Sizeof(ProfiPidFile{})},
		{"nvtx_ranges", reflect.TypeFor[ProfiNvtxRanges](), unsafe.Sizeof(ProfiNvtxRanges{})},
	}
	for _, tc := range tests {
		t.Run(tc.cName, func(t *testing.T) {
			t.Parallel()
			var st *btf.Struct
			if err := spec.Types.TypeByName(tc.cName, &st); err != nil {
				t.Fatalf("BTF struct %s: %v", tc.cName, err)
			}
			if uintptr(st.Size) != tc.size {
				t.Errorf("unsafe.Sizeof(%s) = %d, BTF size of struct %s = %d", tc.goType.Name(), tc.size, tc.cName, st.Size)
			}
			var fields []reflect.StructField
			for f := range tc.goType.Fields() {
				if f.Name != "_" {
					fields = append(fields, f)
				}
			}
			if len(fields) != len(st.Members) {
				t.Fatalf("%s has %d fields, struct %s has %d members", tc.goType.Name(), len(fields), tc.cName, len(st.Members))
			}
			for i, m := range st.Members {
				f := fields[i]
				if want := strings.ReplaceAll(m.Name, "_", ""); !strings.EqualFold(f.Name, want) {
					t.Errorf("field %d: Go %s, C %s", i, f.Name, m.Name)
				}
				if m.BitfieldSize != 0 {
					t.Errorf("member %s is a bitfield", m.Name)
				}
				if uintptr(m.Offset.Bytes()) != f.Offset {
					t.Errorf("%s.%s at offset %d, C %s at %d", tc.goType.Name(), f.Name, f.Offset, m.Name, m.Offset.Bytes())
				}
				size, err := btf.Sizeof(m.Type)
				if err != nil {
					t.Fatal(err)
				}
				if uintptr(size) != f.Type.Size() {
					t.Errorf("%s.%s is %d bytes, C %s is %d", tc.goType.Name(), f.Name, f.Type.Size(), m.Name, size)
				}
			}
		})
	}
}

// TestEnumsMatchBTF checks that every C enumerator has its Go constant with
// the same value, so a regenerated enum cannot silently shift.
func TestEnumsMatchBTF(t *testing.T) {
	t.Parallel()
	spec, err := LoadProfi()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		cName string
		want  map[string]uint64
	}{
		{"op", map[string]uint64{
			"OP_UNKNOWN": uint64(OpUnknown), "OP_CUDA_MALLOC": uint64(OpCudaMalloc), "OP_CUDA_FREE": uint64(OpCudaFree),
			"OP_CUDA_MEMCPY": uint64(OpCudaMemcpy), "OP_CUDA_MEMCPY_ASYNC": uint64(OpCudaMemcpyAsync),
			"OP_CUDA_LAUNCH_KERNEL": uint64(OpCudaLaunchKernel), "OP_CUDA_MALLOC_ASYNC": uint64(OpCudaMallocAsync),
			"OP_CUDA_FREE_ASYNC": uint64(OpCudaFreeAsync), "OP_CUDA_GRAPH_LAUNCH": uint64(OpCudaGraphLaunch),
			"OP_CUDA_GRAPH_INSTANTIATE": uint64(OpCudaGraphInstantiate), "OP_MAX": uint64(NumOps),
			"OP_CUDA_LAUNCH_KERNEL_PTSZ": uint64(OpCudaLaunchKernelPtsz), "OP_CUDA_LAUNCH_KERNEL_EXC": uint64(OpCudaLaunchKernelExC),
			"OP_CUDA_LAUNCH_COOPERATIVE_KERNEL": uint64(OpCudaLaunchCooperative), "OP_CUDA_MEMCPY_ASYNC_PTSZ": uint64(OpCudaMemcpyAsyncPtsz),
			"OP_CUDA_MEMCPY_PEER": uint64(OpCudaMemcpyPeer), "OP_CUDA_MEMCPY_PEER_ASYNC": uint64(OpCudaMemcpyPeerAsync),
			"OP_CUDA_MEMCPY_2D": uint64(OpCudaMemcpy2D), "OP_CUDA_MEMCPY_2D_ASYNC": uint64(OpCudaMemcpy2DAsync),
			"OP_CUDA_MALLOC_MANAGED": uint64(OpCudaMallocManaged), "OP_CUDA_MALLOC_HOST": uint64(OpCudaMallocHost),
			"OP_CUDA_FREE_HOST": uint64(OpCudaFreeHost), "OP_CUDA_MEMSET": uint64(OpCudaMemset), "OP_CUDA_MEMSET_ASYNC": uint64(OpCudaMemsetAsync),
			"OP_CUDA_STREAM_SYNC": uint64(OpCudaStreamSync), "OP_CUDA_EVENT_SYNC": uint64(OpCudaEventSync),
			"OP_CUDA_DEVICE_SYNC": uint64(OpCudaDeviceSync), "OP_CUDA_SET_DEVICE": uint64(OpCudaSetDevice),
			"OP_CU_LAUNCH_KERNEL": uint64(OpCuLaunchKernel), "OP_CU_LAUNCH_KERNEL_PTSZ": uint64(OpCuLaunchKernelPtsz),
			"OP_CU_LAUNCH_KERNEL_EX": uint64(OpCuLaunchKernelEx), "OP_CU_LAUNCH_COOPERATIVE_KERNEL": uint64(OpCuLaunchCooperative),
			"OP_CU_GRAPH_LAUNCH": uint64(OpCuGraphLaunch), "OP_CU_MODULE_LOAD_DATA": uint64(OpCuModuleLoadData),
			"OP_CU_MODULE_GET_FUNCTION": uint64(OpCuModuleGetFunction), "OP_CU_LIBRARY_GET_KERNEL": uint64(OpCuLibraryGetKernel),
			"OP_CU_KERNEL_GET_FUNCTION": uint64(OpCuKernelGetFunction), "OP_CUDA_REGISTER_FUNCTION": uint64(OpCudaRegisterFunction),
			"OP_CUDA_MEMCPY_PTDS": uint64(OpCudaMemcpyPtds), "OP_CUDA_MEMCPY_2D_PTDS": uint64(OpCudaMemcpy2DPtds),
			"OP_CUDA_MEMCPY_2D_ASYNC_PTSZ": uint64(OpCudaMemcpy2DAsyncPtsz), "OP_CUDA_MEMSET_PTDS": uint64(OpCudaMemsetPtds),
			"OP_CUDA_MEMSET_ASYNC_PTSZ": uint64(OpCudaMemsetAsyncPtsz), "OP_CUDA_STREAM_SYNC_PTSZ": uint64(OpCudaStreamSyncPtsz),
			"OP_CUDA_GRAPH_LAUNCH_PTSZ": uint64(OpCudaGraphLaunchPtsz), "OP_CUDA_MALLOC_ASYNC_PTSZ": uint64(OpCudaMallocAsyncPtsz),
			"OP_CUDA_FREE_ASYNC_PTSZ": uint64(OpCudaFreeAsyncPtsz), "OP_CUDA_LAUNCH_KERNEL_EXC_PTSZ": uint64(OpCudaLaunchKernelExCPtsz),
			"OP_CUDA_LAUNCH_COOPERATIVE_KERNEL_PTSZ": uint64(OpCudaLaunchCooperativePtsz),
			"OP_NCCL_ALL_REDUCE":                     uint64(OpNcclAllReduce), "OP_NCCL_ALL_GATHER": uint64(OpNcclAllGather),
			"OP_NCCL_REDUCE_SCATTER": uint64(OpNcclReduceScatter), "OP_NCCL_BROADCAST": uint64(OpNcclBroadcast),
			"OP_NCCL_REDUCE": uint64(OpNcclReduce), "OP_NCCL_SEND": uint64(OpNcclSend), "OP_NCCL_RECV": uint64(OpNcclRecv),
			"OP_NCCL_ALL_TO_ALL": uint64(OpNcclAllToAll), "OP_NCCL_GROUP_START": uint64(OpNcclGroupStart),
			"OP_NCCL_GROUP_END": uint64(OpNcclGroupEnd), "OP_NCCL_COMM_INIT_RANK": uint64(OpNcclCommInitRank),
			"OP_NCCL_COMM_INIT_RANK_CONFIG": uint64(OpNcclCommInitRankConfig), "OP_NCCL_COMM_INIT_ALL": uint64(OpNcclCommInitAll),
			"OP_NCCL_COMM_DESTROY": uint64(OpNcclCommDestroy), "OP_NCCL_COMM_ABORT": uint64(OpNcclCommAbort),
			"OP_NVTX_RANGE_PUSH_A": uint64(OpNvtxRangePushA), "OP_NVTX_RANGE_PUSH_W": uint64(OpNvtxRangePushW),
			"OP_NVTX_RANGE_PUSH_EX": uint64(OpNvtxRangePushEx), "OP_NVTX_DOMAIN_RANGE_PUSH_EX": uint64(OpNvtxDomainRangePushEx),
			"OP_NVTX_RANGE_POP": uint64(OpNvtxRangePop), "OP_NVTX_DOMAIN_RANGE_POP": uint64(OpNvtxDomainRangePop),
		}},
		{"phase", map[string]uint64{
			"PHASE_NONE": uint64(PhaseNone), "PHASE_PREFILL": uint64(PhasePrefill), "PHASE_DECODE": uint64(PhaseDecode),
			"PHASE_ATTENTION": uint64(PhaseAttention), "PHASE_MLP": uint64(PhaseMLP), "PHASE_NORM": uint64(PhaseNorm),
			"PHASE_OTHER": uint64(PhaseOther), "PHASE_MAX": uint64(NumPhases),
		}},
		{"drop", map[string]uint64{
			"DROP_AGGREGATED": uint64(DropAggregated), "DROP_LAUNCH_AGG": uint64(DropLaunchAgg),
			"DROP_INFLIGHT": uint64(DropInflight), "DROP_MALLOC_SIZES": uint64(DropMallocSizes),
			"DROP_ORPHAN_RETURN": uint64(DropOrphanReturn), "DROP_NESTED": uint64(DropNested),
			"DROP_EVENTS_RING": uint64(DropEventsRing), "DROP_PID_CLAIM": uint64(DropPIDClaim),
			"DROP_KERNEL_REGS": uint64(DropKernelRegs), "DROP_RT_TO_DRV": uint64(DropRuntimeToDrv),
			"DROP_LIB_LOADS": uint64(DropLibLoads), "DROP_NCCL_AGG": uint64(DropNCCLAgg),
			"DROP_NCCL_INFLIGHT": uint64(DropNCCLInflight), "DROP_NVTX_STACK": uint64(DropNVTXStack),
			"DROP_MAX": uint64(NumDrops),
		}},
	}
	for _, tc := range tests {
		var e *btf.Enum
		if err := spec.Types.TypeByName(tc.cName, &e); err != nil {
			t.Fatalf("BTF enum %s: %v", tc.cName, err)
		}
		got := map[string]uint64{}
		for _, v := range e.Values {
			got[v.Name] = v.Value
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("enum %s = %v, Go constants %v", tc.cName, got, tc.want)
		}
	}
}

func TestOpName(t *testing.T) {
	t.Parallel()
	// The operation labels of interface.md 5.2.
	tests := []struct {
		op   uint32
		want string
	}{
		{uint32(OpUnknown), "unknown"},
		{uint32(OpCudaMalloc), "cudaMalloc"},
		{uint32(OpCudaFree), "cudaFree"},
		{uint32(OpCudaMemcpy), "cudaMemcpy"},
		{uint32(OpCudaMemcpyAsync), "cudaMemcpyAsync"},
		{uint32(OpCudaLaunchKernel), "cudaLaunchKernel"},
		{uint32(OpCudaMallocAsync), "cudaMallocAsync"},
		{uint32(OpCudaFreeAsync), "cudaFreeAsync"},
		{uint32(OpCudaGraphLaunch), "cudaGraphLaunch"},
		{uint32(OpCudaGraphInstantiate), "cudaGraphInstantiate"},
		{uint32(NumOps), "unknown"},
		{1000, "unknown"},
		{math.MaxUint32, "unknown"},
	}
	for _, tc := range tests {
		if got := OpName(tc.op); got != tc.want {
			t.Errorf("OpName(%d) = %q, want %q", tc.op, got, tc.want)
		}
	}
	// Every operation but OP_UNKNOWN has a name of its own.
	seen := map[string]Op{}
	for op := OpUnknown + 1; op < NumOps; op++ {
		name := OpName(uint32(op))
		if name == "unknown" {
			t.Errorf("operation %d has no name", op)
		}
		if prev, ok := seen[name]; ok {
			t.Errorf("operations %d and %d are both %q", prev, op, name)
		}
		seen[name] = op
	}
}

func TestStreamLabel(t *testing.T) {
	t.Parallel()
	tests := []struct {
		stream uint64
		want   string
	}{
		{0, "default"},
		{1, "0x1"},
		{0x55d0c2a4f1e0, "0x55d0c2a4f1e0"},
		{0xABCDEF, "0xabcdef"},
		{math.MaxUint64, "0xffffffffffffffff"},
	}
	for _, tc := range tests {
		if got := StreamLabel(tc.stream); got != tc.want {
			t.Errorf("StreamLabel(%#x) = %q, want %q", tc.stream, got, tc.want)
		}
	}
}

func TestCookie(t *testing.T) {
	t.Parallel()
	tests := []struct {
		op   Op
		file uint32
		want uint64
	}{
		{OpCudaMemcpy, 0, 3},
		{OpCudaMemcpy, 7, 7<<32 | 3},
		{OpCudaLaunchKernel, math.MaxUint32, 0xffffffff_00000005},
	}
	for _, tc := range tests {
		got := Cookie(tc.op, tc.file)
		if got != tc.want {
			t.Errorf("Cookie(%d, %d) = %#x, want %#x", tc.op, tc.file, got, tc.want)
		}
		// COOKIE_OP and COOKIE_FILE of types.h.
		if Op(uint32(got)) != tc.op || uint32(got>>32) != tc.file {
			t.Errorf("Cookie(%d, %d) = %#x does not unpack", tc.op, tc.file, got)
		}
	}
}

// TestLatencyBounds: the Go bounds are the C lat_bounds_ns and the CUDA API
// latency bounds of interface.md 5.3, and agg_val has one bucket more (+Inf).
func TestLatencyBounds(t *testing.T) {
	t.Parallel()
	interfaceSeconds := []float64{1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.5, 1}
	if len(LatencyBoundsNs) != len(interfaceSeconds) {
		t.Fatalf("%d bounds, interface has %d", len(LatencyBoundsNs), len(interfaceSeconds))
	}
	for i, s := range interfaceSeconds {
		if want := uint64(math.Round(s * 1e9)); LatencyBoundsNs[i] != want {
			t.Errorf("bound %d = %d ns, want %d", i, LatencyBoundsNs[i], want)
		}
	}
	if got, want := len(ProfiAggVal{}.Buckets), len(LatencyBoundsNs)+1; got != want {
		t.Errorf("agg_val has %d buckets, want %d", got, want)
	}

	src, err := os.ReadFile("../../bpf/profi.bpf.c")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)lat_bounds_ns\[[^\]]*\]\s*=\s*\{([^}]*)\}`).FindSubmatch(src)
	if m == nil {
		t.Fatal("lat_bounds_ns initializer not found in bpf/profi.bpf.c")
	}
	var cBounds []uint64
	body := regexp.MustCompile(`(?s)/\*.*?\*/`).ReplaceAll(m[1], nil) // drop comments
	for _, f := range strings.Split(string(body), ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		v, err := strconv.ParseUint(f, 0, 64)
		if err != nil {
			t.Fatalf("lat_bounds_ns element %q: %v", f, err)
		}
		cBounds = append(cBounds, v)
	}
	if !reflect.DeepEqual(cBounds, LatencyBoundsNs[:]) {
		t.Errorf("lat_bounds_ns = %v, LatencyBoundsNs = %v", cBounds, LatencyBoundsNs)
	}
	if lb := regexp.MustCompile(`#define\s+LAT_BUCKETS\s+(\d+)`).FindSubmatch(mustRead(t, "../../bpf/types.h")); lb == nil {
		t.Error("LAT_BUCKETS not found in bpf/types.h")
	} else if n, _ := strconv.Atoi(string(lb[1])); n != len(LatencyBoundsNs)+1 {
		t.Errorf("LAT_BUCKETS = %d, want %d", n, len(LatencyBoundsNs)+1)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSpecMapSizes: the object's placeholder sizes are the flag defaults of
// interface.md 2.1, so Load with zero Sizes matches an agent run without flags.
func TestSpecMapSizes(t *testing.T) {
	t.Parallel()
	spec, err := LoadProfi()
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]uint32{
		ProfiMapAggregated:  2048,
		ProfiMapLaunchAgg:   8192,
		ProfiMapInflight:    10240,
		ProfiMapMallocSizes: 131072,
		ProfiMapDrops:       uint32(NumDrops),
		ProfiMapNvtxStack:   1024, // interface.md: the NVTX map (1024)
	} {
		if got := spec.Maps[name].MaxEntries; got != want {
			t.Errorf("map %s max_entries = %d, want %d", name, got, want)
		}
	}
}

func TestNCCLLatencyBoundsMatchBuckets(t *testing.T) {
	interfaceSeconds := []float64{1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.5, 1}
	if len(NCCLLatencyBoundsNs) != len(interfaceSeconds) {
		t.Fatalf("%d bounds, interface has %d", len(NCCLLatencyBoundsNs), len(interfaceSeconds))
	}
	for i, s := range interfaceSeconds {
		if want := uint64(math.Round(s * 1e9)); NCCLLatencyBoundsNs[i] != want {
			t.Errorf("bound %d = %d ns, want %d", i, NCCLLatencyBoundsNs[i], want)
		}
	}
	if got, want := len(ProfiNcclVal{}.Buckets), len(NCCLLatencyBoundsNs)+1; got != want {
		t.Errorf("nccl_val has %d buckets, want %d", got, want)
	}
}

func TestPhaseName(t *testing.T) {
	t.Parallel()
	for p, want := range map[uint32]string{
		uint32(PhaseNone): "", uint32(PhasePrefill): "prefill", uint32(PhaseDecode): "decode",
		uint32(PhaseAttention): "attention", uint32(PhaseMLP): "mlp", uint32(PhaseNorm): "norm",
		uint32(PhaseOther): "other", uint32(NumPhases): "other", 1000: "other",
	} {
		if got := PhaseName(p); got != want {
			t.Errorf("PhaseName(%d) = %q, want %q", p, got, want)
		}
	}
}
