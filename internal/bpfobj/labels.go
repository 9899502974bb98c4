package bpfobj

import "strconv"

// KindP2P is the memcpy kind BPF records for peer copies (KIND_P2P).
const KindP2P = 0x100

// Direction returns the `direction` label of a memcpy kind.
func Direction(kind uint32) string {
	switch {
	case kind < uint32(len(directions)):
		return directions[kind]
	case kind == KindP2P:
		return "p2p"
	default:
		return "unknown"
	}
}

// directions are the labels of cudaMemcpyKind 0..4.
var directions = [...]string{"h2h", "h2d", "d2h", "d2d", "default"}

// Drop indexes the per-CPU drops array.
type Drop = ProfiDrop

// Drop counters, named for Go.
const (
	DropAggregated   Drop = ProfiDropDROP_AGGREGATED
	DropLaunchAgg    Drop = ProfiDropDROP_LAUNCH_AGG
	DropInflight     Drop = ProfiDropDROP_INFLIGHT
	DropMallocSizes  Drop = ProfiDropDROP_MALLOC_SIZES
	DropOrphanReturn Drop = ProfiDropDROP_ORPHAN_RETURN
	DropNested       Drop = ProfiDropDROP_NESTED
	DropEventsRing   Drop = ProfiDropDROP_EVENTS_RING
	DropPIDClaim     Drop = ProfiDropDROP_PID_CLAIM
	DropKernelRegs   Drop = ProfiDropDROP_KERNEL_REGS
	DropRuntimeToDrv Drop = ProfiDropDROP_RT_TO_DRV
	DropLibLoads     Drop = ProfiDropDROP_LIB_LOADS
	DropNCCLAgg      Drop = ProfiDropDROP_NCCL_AGG
	DropNCCLInflight Drop = ProfiDropDROP_NCCL_INFLIGHT
	DropNVTXStack    Drop = ProfiDropDROP_NVTX_STACK
	DropGraphMaps    Drop = ProfiDropDROP_GRAPH_MAPS
	DropGraphQuota   Drop = ProfiDropDROP_GRAPH_QUOTA
	DropGraphReplays Drop = ProfiDropDROP_GRAPH_REPLAYS
	DropCapture      Drop = ProfiDropDROP_CAPTURE
	DropPIDQuota     Drop = ProfiDropDROP_PID_QUOTA
	DropRuntimeLearn Drop = ProfiDropDROP_RT_LEARN
	DropNCCLComms    Drop = ProfiDropDROP_NCCL_COMMS
	DropThreadDevice Drop = ProfiDropDROP_THREAD_DEVICE
	DropRuntimeMark  Drop = ProfiDropDROP_RT_MARKER
	DropRuntimeText  Drop = ProfiDropDROP_RT_TEXT
	DropLaunchThread Drop = ProfiDropDROP_LAUNCH_THREADS
	DropBreakerHit   Drop = ProfiDropDROP_BREAKER_HIT
	NumDrops         Drop = ProfiDropDROP_MAX
)

// LatencyBoundsNs are the inclusive upper bounds of the CUDA API latency
// buckets in BPF (lat_bounds_ns in bpf/core.h); the last bucket is +Inf.
var LatencyBoundsNs = [...]uint64{
	1e3, 5e3, 1e4, 5e4, 1e5, 5e5, 1e6, 5e6, 1e7, 5e7, 1e8, 5e8, 1e9,
}

// KernelLatencyBoundsNs are the bounds of the kernel launch latency
// buckets (klat_bounds_ns); the last bucket is +Inf.
var KernelLatencyBoundsNs = [...]uint64{1e3, 5e3, 1e4, 5e4, 1e5, 5e5, 1e6, 1e7}

// NCCLLatencyBoundsNs are the bounds of the NCCL latency buckets
// (nlat_bounds_ns in bpf/core.h, docs/INTERFACE.md 5.5); the last bucket is +Inf.
var NCCLLatencyBoundsNs = [...]uint64{1e4, 5e4, 1e5, 5e5, 1e6, 5e6, 1e7, 5e7, 1e8, 5e8, 1e9}

// StreamOther is the stream BPF puts in a key instead of a stream beyond
// the process's --max-streams-per-pid admitted streams (STREAM_OTHER).
const StreamOther uint64 = 0xffffffffffffffff

// StreamLabel formats a cudaStream_t handle as the `stream` label value:
// "default" for 0, "other" for StreamOther.
func StreamLabel(stream uint64) string {
	switch stream {
	case 0:
		return "default"
	case StreamOther:
		return "other"
	}
	return "0x" + strconv.FormatUint(stream, 16)
}

// QuotaMap indexes a process's keys per shared map (enum quota_map).
type QuotaMap = ProfiQuotaMap

// The shared maps with per-process quotas.
const (
	QuotaAggregated     QuotaMap = ProfiQuotaMapQUOTA_AGGREGATED
	QuotaLaunchAgg      QuotaMap = ProfiQuotaMapQUOTA_LAUNCH_AGG
	QuotaNCCLAgg        QuotaMap = ProfiQuotaMapQUOTA_NCCL_AGG
	QuotaMallocSizes    QuotaMap = ProfiQuotaMapQUOTA_MALLOC_SIZES
	QuotaGraphNodes     QuotaMap = ProfiQuotaMapQUOTA_GRAPH_NODES
	QuotaGraphReplays   QuotaMap = ProfiQuotaMapQUOTA_GRAPH_REPLAYS
	QuotaCaptureStreams QuotaMap = ProfiQuotaMapQUOTA_CAPTURE_STREAMS
	QuotaCaptures       QuotaMap = ProfiQuotaMapQUOTA_CAPTURES
	QuotaCaptureEvents  QuotaMap = ProfiQuotaMapQUOTA_CAPTURE_EVENTS
	QuotaGraphIDs       QuotaMap = ProfiQuotaMapQUOTA_GRAPH_IDS
	QuotaNCCLInflight   QuotaMap = ProfiQuotaMapQUOTA_NCCL_INFLIGHT
	QuotaNCCLComms      QuotaMap = ProfiQuotaMapQUOTA_NCCL_COMMS
	QuotaGraphExecs     QuotaMap = ProfiQuotaMapQUOTA_GRAPH_EXECS
	QuotaNVTXStack      QuotaMap = ProfiQuotaMapQUOTA_NVTX_STACK
	QuotaPIDQuotas      QuotaMap = ProfiQuotaMapQUOTA_PID_QUOTAS
	NumQuotaMaps        QuotaMap = ProfiQuotaMapQUOTA_MAPS
)

// QuotaMapNames are the maps of the quota_map ids.
var QuotaMapNames = [NumQuotaMaps]string{
	QuotaAggregated:     ProfiMapAggregated,
	QuotaLaunchAgg:      ProfiMapLaunchAgg,
	QuotaNCCLAgg:        ProfiMapNcclAgg,
	QuotaMallocSizes:    ProfiMapMallocSizes,
	QuotaGraphNodes:     ProfiMapGraphNodes,
	QuotaGraphReplays:   ProfiMapGraphReplays,
	QuotaCaptureStreams: ProfiMapCaptureStreams,
	QuotaCaptures:       ProfiMapCaptures,
	QuotaCaptureEvents:  ProfiMapCaptureEvents,
	QuotaGraphIDs:       ProfiMapGraphIds,
	QuotaNCCLInflight:   ProfiMapNcclInflight,
	QuotaNCCLComms:      ProfiMapNcclComms,
	QuotaGraphExecs:     ProfiMapGraphExecs,
	QuotaNVTXStack:      ProfiMapNvtxStack,
	QuotaPIDQuotas:      ProfiMapPidQuotas,
}

// The shares of the shared maps (docs/METRICS.md, "Shares of the shared
// maps"; bpf/quota.h take_shared): work-conserving. While the node holds
// fewer than NodeRoom keys of a map, any tenant takes a new one; the
// Reserve left past it goes only to tenants holding fewer than their
// TenantGuarantee, so that whoever came first, a newcomer finds room.

// MinReserve is the least reserve of a shared map, however small the map:
// a map of MinReserve entries or fewer has no quota (a full map is counted
// as that map's drop).
const MinReserve = 64

// Reserve is how many keys of a shared map of maxEntries are kept for
// tenants below their guarantee: an eighth of the map, at least
// MinReserve (two newcomers' guarantees; the rest of the map is there
// for whoever needs it).
func Reserve(maxEntries uint32) uint32 {
	_, reserve := Share(uint64(maxEntries), MinReserve)
	return uint32(reserve)
}

// Share is the rule of every bound shared by tenants, the BPF maps' keys
// here and the attacher's files and links (internal/attach/shares.go):
// the last eighth of limit, at least minReserve, is a reserve for tenants
// below their guarantee (half of it), the rest the room anyone takes.
// room 0: the reserve would be all of limit, nothing is shared.
func Share(limit, minReserve uint64) (room, reserve uint64) {
	reserve = max(limit/8, minReserve)
	if reserve >= limit {
		return 0, reserve
	}
	return limit - reserve, reserve
}

// NodeRoom is how many keys of a shared map of maxEntries the node fills
// before the reserve: node_room's value, 0 (no quota) when the reserve
// would be all of it.
func NodeRoom(maxEntries uint32) uint32 {
	if r := Reserve(maxEntries); r < maxEntries {
		return maxEntries - r
	}
	return 0
}

// TenantGuarantee is how many keys of a shared map of maxEntries a tenant
// may always take, however full the node: half the reserve; 0 with no
// quota.
func TenantGuarantee(maxEntries uint32) uint32 {
	if NodeRoom(maxEntries) == 0 {
		return 0
	}
	return Reserve(maxEntries) / 2
}

// MinPIDStreams is pid_streams' size with the default map sizes.
const MinPIDStreams = 16384

// PIDStreamsSize is pid_streams' size for aggregated and launch_agg of
// these sizes: their keys together, at least MinPIDStreams. A full
// pid_streams admits no new stream (its calls count under "other").
func PIDStreamsSize(aggregated, launchAgg uint32) uint32 {
	return max(MinPIDStreams, aggregated+launchAgg)
}

// Phase is the NVTX phase id BPF records in launch_key.phase (enum phase).
type Phase = ProfiPhase

// Phase ids, named for Go.
const (
	PhaseNone      Phase = ProfiPhasePHASE_NONE
	PhasePrefill   Phase = ProfiPhasePHASE_PREFILL
	PhaseDecode    Phase = ProfiPhasePHASE_DECODE
	PhaseAttention Phase = ProfiPhasePHASE_ATTENTION
	PhaseMLP       Phase = ProfiPhasePHASE_MLP
	PhaseNorm      Phase = ProfiPhasePHASE_NORM
	PhaseOther     Phase = ProfiPhasePHASE_OTHER
	NumPhases      Phase = ProfiPhasePHASE_MAX
)

// phases are the `phase` labels of the phase ids (docs/INTERFACE.md 5.2).
var phases = [NumPhases]string{
	PhaseNone:      "",
	PhasePrefill:   "prefill",
	PhaseDecode:    "decode",
	PhaseAttention: "attention",
	PhaseMLP:       "mlp",
	PhaseNorm:      "norm",
	PhaseOther:     "other",
}

// PhaseName returns the `phase` label of a phase id: "" for none (no NVTX
// range open, or NVTX tracing off), "other" for ids out of range.
func PhaseName(p uint32) string {
	if p < uint32(NumPhases) {
		return phases[p]
	}
	return phases[PhaseOther]
}

// DevNone is the device of a call made on a thread that never set one with
// cudaSetDevice (DEV_NONE in bpf/types.h): CUDA's default device then, which
// userspace resolves (internal/gpu).
const DevNone uint32 = 0xffffffff

// DevInvalid is the device of a call made after a cudaSetDevice to an
// ordinal of MaxDevices or more (DEV_INVALID in bpf/types.h): no device of
// any node, whatever the process's runtime answered; one key for all such
// ordinals (issue 47 item 3). Its gpu label is empty.
const DevInvalid uint32 = 0xfffffffe

// MaxDevices is the bound on device ordinals (MAX_DEVICES in bpf/types.h).
const MaxDevices = 64

// GraphNodeType is the kind of a graph_nodes entry (enum graph_node_type).
type GraphNodeType = ProfiGraphNodeType

// Graph node types, named for Go.
const (
	GraphNodeKernel GraphNodeType = ProfiGraphNodeTypeGRAPH_NODE_KERNEL
	GraphNodeMemcpy GraphNodeType = ProfiGraphNodeTypeGRAPH_NODE_MEMCPY
	GraphNodeMemset GraphNodeType = ProfiGraphNodeTypeGRAPH_NODE_MEMSET
	GraphNodeChild  GraphNodeType = ProfiGraphNodeTypeGRAPH_NODE_CHILD
)
