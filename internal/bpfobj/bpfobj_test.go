package bpfobj

import (
	"maps"
	"math"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"

	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/ops"
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
		{"op", opEnum()},
		{"op_args", argsEnum()},
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
			"DROP_GRAPH_MAPS": uint64(DropGraphMaps), "DROP_GRAPH_QUOTA": uint64(DropGraphQuota),
			"DROP_GRAPH_REPLAYS": uint64(DropGraphReplays), "DROP_CAPTURE": uint64(DropCapture),
			"DROP_PID_QUOTA": uint64(DropPIDQuota), "DROP_RT_LEARN": uint64(DropRuntimeLearn),
			"DROP_NCCL_COMMS": uint64(DropNCCLComms), "DROP_THREAD_DEVICE": uint64(DropThreadDevice),
			"DROP_RT_MARKER": uint64(DropRuntimeMark), "DROP_RT_TEXT": uint64(DropRuntimeText),
			"DROP_LAUNCH_THREADS": uint64(DropLaunchThread), "DROP_BREAKER_HIT": uint64(DropBreakerHit),
			"DROP_MAX": uint64(NumDrops),
		}},
		{"quota_map", map[string]uint64{
			"QUOTA_AGGREGATED": uint64(QuotaAggregated), "QUOTA_LAUNCH_AGG": uint64(QuotaLaunchAgg),
			"QUOTA_NCCL_AGG": uint64(QuotaNCCLAgg), "QUOTA_MALLOC_SIZES": uint64(QuotaMallocSizes),
			"QUOTA_GRAPH_NODES": uint64(QuotaGraphNodes), "QUOTA_GRAPH_REPLAYS": uint64(QuotaGraphReplays),
			"QUOTA_CAPTURE_STREAMS": uint64(QuotaCaptureStreams), "QUOTA_CAPTURES": uint64(QuotaCaptures),
			"QUOTA_CAPTURE_EVENTS": uint64(QuotaCaptureEvents), "QUOTA_GRAPH_IDS": uint64(QuotaGraphIDs),
			"QUOTA_NCCL_INFLIGHT": uint64(QuotaNCCLInflight), "QUOTA_NCCL_COMMS": uint64(QuotaNCCLComms),
			"QUOTA_GRAPH_EXECS": uint64(QuotaGraphExecs),
			"QUOTA_NVTX_STACK":  uint64(QuotaNVTXStack), "QUOTA_PID_QUOTAS": uint64(QuotaPIDQuotas),
			"QUOTA_MAPS": uint64(NumQuotaMaps),
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
		{math.MaxUint64 - 1, "0xfffffffffffffffe"},
		{math.MaxUint64, "other"}, // StreamOther: BPF folded a stream beyond the cap
	}
	for _, tc := range tests {
		if got := StreamLabel(tc.stream); got != tc.want {
			t.Errorf("StreamLabel(%#x) = %q, want %q", tc.stream, got, tc.want)
		}
	}
}

// TestLatencyBounds: the Go bounds are the C lat_bounds_ns and the CUDA API
// latency bounds of docs/INTERFACE.md 5.3, and agg_val has one bucket more (+Inf).
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

	src, err := os.ReadFile("../../bpf/core.h")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)lat_bounds_ns\[[^\]]*\]\s*=\s*\{([^}]*)\}`).FindSubmatch(src)
	if m == nil {
		t.Fatal("lat_bounds_ns initializer not found in bpf/core.h")
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
// docs/INTERFACE.md 2.1, so Load with zero Options matches an agent run without flags.
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
		ProfiMapNvtxStack:   1024, // docs/INTERFACE.md: the NVTX map (1024)
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

// opEnum is what enum op in bpf/ops.h must be: OP_UNKNOWN, one enumerator
// per operation table row at its id, OP_MAX.
func opEnum() map[string]uint64 {
	m := map[string]uint64{"OP_UNKNOWN": 0, "OP_MAX": uint64(ops.NumOps)}
	for i, r := range ops.Table {
		m[r.CEnum()] = uint64(i + 1)
	}
	return m
}

func argsEnum() map[string]uint64 {
	m := map[string]uint64{}
	for a := ops.ArgsNone; a < ops.NumArgs; a++ {
		m["ARGS_"+a.CName()] = uint64(a)
	}
	return m
}

// The object's per-operation tables are the operation table's: a stale
// object (bpf/ops.h regenerated, make generate not run) fails here.
func TestOpTablesInObject(t *testing.T) {
	t.Parallel()
	spec, err := LoadProfi()
	if err != nil {
		t.Fatal(err)
	}
	args := make([]uint8, ops.TableSize())
	if err := spec.Variables["op_args"].Get(&args); err != nil {
		t.Fatal(err)
	}
	for i, r := range ops.Table {
		if got := ops.Args(args[i+1]); got != r.Args {
			t.Errorf("op_args[%s] = %d in the object, table says %d", r.CEnum(), got, r.Args)
		}
	}
	// One program per role: every program the table names exists, as
	// uprobe.multi, and there are no others but the exit and fault hooks.
	hooks := map[string]bool{ProfiProgThreadExit: true, ProfiProgFaultDeliver: true}
	want := maps.Clone(hooks)
	for _, lib := range []discover.Library{discover.LibCudart, discover.LibCuda, discover.LibNCCL, discover.LibNVTX, discover.LibLoader} {
		for _, p := range ops.Probes(lib, ops.KernelModeFull, ops.ProfileFull) {
			want[p.Entry] = true
			if p.Return != "" {
				want[p.Return] = true
			}
		}
		for _, p := range ops.Probes(lib, ops.KernelModeAnonymous, ops.ProfileFull) {
			want[p.Entry] = true
		}
	}
	for name, p := range spec.Programs {
		if !want[name] {
			t.Errorf("program %s is in the object but no table row uses it", name)
		}
		if !hooks[name] && p.AttachType != ebpf.AttachTraceUprobeMulti {
			t.Errorf("program %s: attach type %v, want uprobe.multi", name, p.AttachType)
		}
		delete(want, name)
	}
	if len(want) > 0 {
		t.Errorf("programs the table uses but the object lacks: %v", want)
	}
}

// TestShares: the reserve is an eighth of the map, at least 64; the
// node fills the rest before it; a tenant's guarantee is half the
// reserve; a map whose reserve would be all of it has no
// quota (docs/METRICS.md, "Shares of the shared maps").
func TestShares(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ size, room, guarantee uint32 }{
		{1, 0, 0}, {64, 0, 0}, {65, 1, 32}, {100, 36, 32}, {512, 448, 32}, {1024, 896, 64},
		{2048, 1792, 128}, {8192, 7168, 512}, {65536, 57344, 4096}, {131072, 114688, 8192},
	} {
		if got := NodeRoom(tc.size); got != tc.room {
			t.Errorf("NodeRoom(%d) = %d, want %d", tc.size, got, tc.room)
		}
		if got := TenantGuarantee(tc.size); got != tc.guarantee {
			t.Errorf("TenantGuarantee(%d) = %d, want %d", tc.size, got, tc.guarantee)
		}
	}
}

// TestSpecQuotaDefaults: the object's node_room and tenant_guarantee
// placeholders are those of its placeholder sizes, and max_streams_per_pid is the flag's
// default (32), so the object alone behaves as the agent without flags.
func TestSpecQuotaDefaults(t *testing.T) {
	t.Parallel()
	spec, err := LoadProfi()
	if err != nil {
		t.Fatal(err)
	}
	var room, guarantee [NumQuotaMaps]uint32
	if err := spec.Variables[ProfiVarNodeRoom].Get(&room); err != nil {
		t.Fatal(err)
	}
	if err := spec.Variables[ProfiVarTenantGuarantee].Get(&guarantee); err != nil {
		t.Fatal(err)
	}
	for m, name := range QuotaMapNames {
		if want := NodeRoom(spec.Maps[name].MaxEntries); room[m] != want || want == 0 {
			t.Errorf("node_room[%s] = %d, want %d", name, room[m], want)
		}
		if want := TenantGuarantee(spec.Maps[name].MaxEntries); guarantee[m] != want || want == 0 {
			t.Errorf("tenant_guarantee[%s] = %d, want %d", name, guarantee[m], want)
		}
	}
	var streams uint32
	if err := spec.Variables[ProfiVarMaxStreamsPerPid].Get(&streams); err != nil {
		t.Fatal(err)
	}
	if streams != 32 {
		t.Errorf("max_streams_per_pid = %d, want 32", streams)
	}
}

// TestDeviceConstants: the Go copies of bpf/types.h's device constants.
func TestDeviceConstants(t *testing.T) {
	t.Parallel()
	src := mustRead(t, "../../bpf/types.h")
	for name, want := range map[string]uint64{"DEV_NONE": uint64(DevNone), "DEV_INVALID": uint64(DevInvalid), "MAX_DEVICES": MaxDevices} {
		m := regexp.MustCompile(`#define\s+` + name + `\s+(\S+)`).FindSubmatch(src)
		if m == nil {
			t.Errorf("%s not found in bpf/types.h", name)
			continue
		}
		if got, err := strconv.ParseUint(string(m[1]), 0, 64); err != nil || got != want {
			t.Errorf("%s = %s, want %#x", name, m[1], want)
		}
	}
}
