package testutil

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/profi-dev/profi/internal/testutil/testenv"
)

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
	DelayNS uint64 `json:"delay_ns"` // the stub's current per-call delay
	// Collectives counts the collectives (no send/recv) called on the
	// job's communicator, failed ones included.
	Collectives uint64                          `json:"collectives"`
	Calls       map[string]uint64               `json:"calls"`       // NCCLFuncs -> calls
	Errors      map[string]map[string]uint64    `json:"errors"`      // function -> decimal ncclResult_t -> calls
	Bytes       map[string]uint64               `json:"bytes"`       // NCCLDataFuncs -> bytes of all calls, failed included
	ByDatatype  map[string]map[string]NCCLTally `json:"by_datatype"` // data function -> decimal ncclDataType_t as passed -> tally
	HostNS      map[string]uint64               `json:"host_ns"`     // NCCLFuncs -> summed host time around the calls
	HostNSMax   map[string]uint64               `json:"host_ns_max"` // NCCLFuncs -> longest call
	CUDACalls   map[string]uint64               `json:"cuda_calls"`  // "cudaSetDevice", "cudaStreamCreate" -> calls (at init)
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
	if err := InitJob(ranks); err != nil {
		return fail(err)
	}
	return ranks, nil
}

// InitJob initialises the started ranks of one job in order: rank 0 makes
// the unique id, the others join with it.
func InitJob(ranks []*NCCLWorkload) error {
	var id string
	for _, w := range ranks {
		in, err := w.InitWithID(id)
		if err != nil {
			return fmt.Errorf("%w\n%s", err, w.Stderr())
		}
		id = in.ID
	}
	return nil
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
