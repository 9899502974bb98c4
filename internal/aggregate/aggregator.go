package aggregate

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"sync/atomic"
	"time"

	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/kernelname"
	"github.com/profi-dev/profi/internal/ops"
)

// Source reads the BPF maps. Values are summed over CPUs.
type Source interface {
	Aggregated(fn func(bpfobj.ProfiAggKey, *bpfobj.ProfiAggVal)) error
	Launches(fn func(bpfobj.ProfiLaunchKey, *bpfobj.ProfiLaunchVal)) error
	NCCL(fn func(bpfobj.ProfiNcclKey, *bpfobj.ProfiNcclVal)) error
	// NCCLInflight reads the NCCL calls in progress, by pid_tgid.
	NCCLInflight(fn func(tid uint64, c *bpfobj.ProfiNcclCall)) error
	// CUDAInflight reads the timed CUDA calls in progress, by pid_tgid.
	CUDAInflight(fn func(tid uint64, c *bpfobj.ProfiInflightCall)) error
	NCCLComms(fn func(bpfobj.ProfiNcclCommKey, *bpfobj.ProfiNcclComm)) error
	Drops() ([bpfobj.NumDrops]uint64, error)
	// DeletePIDs removes every key of these processes from every map.
	DeletePIDs(pids map[uint32]bool) error
	// GraphNodes reads what each CUDA graph profi saw built runs.
	GraphNodes(fn func(bpfobj.ProfiGraphNodeKey, *bpfobj.ProfiGraphNodeVal)) error
	// GraphReplays reads the replays of each graph, summed over CPUs.
	GraphReplays(fn func(bpfobj.ProfiReplayKey, uint64)) error
	// Unseen returns who process pid was when BPF noted it before
	// userspace registered it (unseen_procs); ok false when not noted.
	Unseen(pid uint32) (id bpfobj.ProfiProcIdentity, ok bool)
	// Launchers takes the threads that launched a kernel noted since the
	// last call (launch_threads), tid and pid.
	Launchers(fn func(tid, pid uint32)) error
	// Quotas reads each process's quotas (pid_quotas): graph ids,
	// executable graphs, admitted streams, keys per shared map.
	Quotas(fn func(pid uint32, q bpfobj.ProfiPidQuota)) error
	// Tenants reads each tenant's keys and refusals (tenant_quotas).
	Tenants(fn func(tenant uint64, q *bpfobj.ProfiTenantQuota)) error
	// DeleteDead removes per-process entries that have no aggregation key
	// (live allocations, claims) of processes for which alive is false,
	// and returns how many it removed.
	DeleteDead(alive func(pid uint32) bool) (int, error)
}

// Procs tells who a PID is and whether it is still the same live process.
type Procs interface {
	// Lookup returns the command name and start time of a live process.
	Lookup(pid int) (comm string, start uint64, ok bool)
	Alive(pid int, start uint64) bool
	// ThreadCPU returns the CPU time thread tid of process pid has run
	// (user and system); ok false when the thread is gone.
	ThreadCPU(pid, tid int) (cpu time.Duration, ok bool)
}

// Options configure an Aggregator.
type Options struct {
	Source           Source
	Procs            Procs
	Interval         time.Duration // drain period
	GCInterval       time.Duration // --gc-interval: sweep of entries DeletePIDs cannot see
	MaxTimeSeries    int           // --max-time-series
	MaxStreamsPerPID int           // --max-streams-per-pid
	MaxKernelsPerPID int           // --max-kernels-per-pid
	// NoKernels is --kernel-mode off: graph replays count no kernels
	// (their copies and sets still move bytes).
	NoKernels bool
	// Names resolves kernel names (full mode); nil means launches with a
	// function are labelled unknown_0x<address>.
	Names  Namer
	Logger *slog.Logger
	// Observe receives each drain's duration (self metric); may be nil.
	Observe func(time.Duration)
	// Scale, when set (--overhead-budget), is the factor by which op's
	// counts in pid are multiplied now: 1 when counted exactly, 1/ratio
	// while the op's probes are duty-cycled. Exported values are then the
	// sum of each drain's scaled increase.
	Scale func(pid int, op ops.Op) float64
	// NCCLHangTimeout is --nccl-hang-timeout; 0 disables hang detection.
	NCCLHangTimeout time.Duration
	// StragglerInterval is the window of the straggler ratio (default
	// GCInterval, which docs/INTERFACE.md ties it to).
	StragglerInterval time.Duration
	// Pods labels processes with their pod (--node-name); nil = no pod labels.
	Pods PodLabeler
	// GPUs labels each call's device with its GPU; nil = empty gpu labels.
	GPUs GPULabeler
	// Monotonic returns CLOCK_MONOTONIC in ns, the clock of
	// bpf_ktime_get_ns (for the age of in-flight calls); nil = the real one.
	Monotonic func() uint64
	// Now is the wall clock of drains (snapshot times, the expiry of
	// retained histograms); nil = time.Now. Tests inject one.
	Now func() time.Time
}

// RetainedExpiry is how long the retained histogram data of exited
// processes stays exported after the last process of its label set has
// exited (docs/OPERATIONS.md): long enough for every scrape and rate()
// window to see the final values, short enough that pod churn cannot fill
// --max-time-series with series of pods long gone.
const RetainedExpiry = 15 * time.Minute

// maxCommLen bounds the comm label (the kernel's TASK_COMM_LEN is 16;
// a fake or future procfs is not believed beyond this).
const maxCommLen = 64

type procState struct {
	meta    Meta
	start   uint64
	streams map[uint64]string // admitted stream handles and their labels
	kernels map[string]bool   // admitted kernel labels
	podDone bool              // pod labels final (see PodLabeler)
	// With Options.Scale: per key, the last raw value and the estimate.
	aggEst    map[bpfobj.ProfiAggKey]*[2]bpfobj.ProfiAggVal
	launchEst map[bpfobj.ProfiLaunchKey]*[2]bpfobj.ProfiLaunchVal
	// refusedGraphs are the graphs whose expansion was refused (counted
	// once each in graphRefused); at most the process's graph quota.
	refusedGraphs map[uint64]bool
	// launched are, per gpu label, the kernels the process's launches
	// and graph replays ran so far, and when that count last grew (or the
	// process was first seen): what Process.IdleFor measures from.
	launched map[string]launchMark
}

// launchMark is a process's kernel count on one GPU and since when it is
// that count.
type launchMark struct {
	kernels uint64
	since   time.Time
}

// PodLabeler tells which pod a process runs in.
type PodLabeler interface {
	// Pod returns the labels of process pid that started at start (field
	// 22 of its stat: a new process reusing the PID is another process);
	// done is false while they may still change (asked again at every
	// drain until done).
	Pod(pid int, start uint64) (namespace, pod, container string, done bool)
	// PodOfCgroup returns the labels of a process that was in the cgroup
	// path and is gone (no /proc/PID to read): one that exited before
	// any drain saw it alive. Empty when the path is no pod's.
	PodOfCgroup(path string) (namespace, pod, container string)
	// Forget drops what is known about an exited process.
	Forget(pid int)
}

// GPULabeler tells which GPU a call ran on. A process whose calls ran on
// several GPUs becomes one Process per GPU in the Snapshot.
type GPULabeler interface {
	// GPU returns the gpu and gpu_uuid labels of device dev (the CUDA
	// ordinal the calling thread had set, or bpfobj.DevNone) of process
	// pid that started at start, and how they were found (for /status).
	GPU(pid int, start uint64, dev uint32) (gpu, uuid, source string)
	// Forget drops what is known about an exited process.
	Forget(pid int)
}

// Namer resolves the name of a launched function.
type Namer interface {
	// Kernel returns the normalized kernel name of fn (a host stub for
	// runtime launches, a CUfunction for driver launches) in process pid,
	// or "" while it is unknown.
	Kernel(pid int, op ops.Op, fn uint64) string
	// Placeholder is the kernel label of fn while Kernel does not know it:
	// stable across runs where it can be (module and offset).
	Placeholder(pid int, fn uint64) string
	// Forget drops what is known about an exited process.
	Forget(pid int)
}

// seriesFamily is a group of exported series that --max-time-series
// counts apart (not an operation's ops.Family).
type seriesFamily uint8

const (
	famCalls seriesFamily = iota
	famErrors
	famMemcpy
	famMemory // malloc bytes and active memory of a process
	famLaunch
	famHist
	famMemset
	famHostMemory
	famKernelHist
	famNCCL          // per (pid, operation): calls, bytes, hangs, oldest, straggler
	famNCCLComm      // per (pid, operation, communicator)
	famNCCLRank      // per (pid, communicator): its collective sequence
	famLaunchThreads // per pid: its launching threads' CPU, count and busy share
	famNCCLHist
	famCaptured    // launches recorded into a CUDA graph
	famGraphLaunch // kernels run by CUDA graph replays
)

// tuple identifies one exported label tuple for the --max-time-series cap.
type tuple struct {
	fam  seriesFamily
	pid  int
	gpu  string // gpu/gpu_uuid of per-process series
	a, b string
	c    string
}

// Aggregator drains the maps into Snapshots.
type Aggregator struct {
	opts Options
	log  *slog.Logger
	snap atomic.Pointer[Snapshot]

	// Owned by the drain goroutine.
	procs map[int]*procState
	// launchers are the processes' launching threads (launchers.go).
	launchers map[int]*launchers
	// The snapshot's histogram families, with the data of exited processes.
	hists, ncclHists histFamily[HistKey]
	kernelHists      histFamily[KernelHistKey]
	retiredCalls     uint64
	admitted         map[tuple]struct{}
	refused          map[tuple]struct{}
	cardDrops        uint64
	// undeleted are exited processes already retired whose keys could not
	// be deleted yet: retried on every drain, never retired twice.
	undeleted  map[int]bool
	nccl       ncclState
	stragHists map[stragglerKey]*Hist // this drain's, per communicator
	pidData    map[int]*pidData       // the last drain's, reused
	// expired counts retained histogram series dropped after
	// RetainedExpiry; badComms counts comm values made label-safe.
	expired, badComms uint64
	// graphRefused counts graphs whose expansion was refused, by reason.
	graphRefused map[string]uint64
	// graphWork is each process's graph expansion bound this drain (graphWorkShare).
	graphWork int
	// tenants are the tenants refused keys (tenants.go), at most
	// maxTenants of them apart; tenantsOther sums those past it.
	tenants      map[uint64]*tenantState
	tenantsOther *tenantState
	// readFailures counts drains that went on without a map, by map.
	readFailures map[string]uint64
	// lingering are exited processes whose series are still exported,
	// oldest first; folded the per-container series they fold into
	// (exited.go).
	lingering []lingering
	folded    map[foldKey]*foldedSeries
	// exiting is the PID whose final series exit builds (it evicts no
	// other exited process's).
	exiting int
}

// New returns an Aggregator with an empty snapshot published.
func New(opts Options) *Aggregator {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.Interval <= 0 {
		opts.Interval = time.Second
	}
	if opts.GCInterval <= 0 {
		opts.GCInterval = time.Minute
	}
	if opts.StragglerInterval <= 0 {
		opts.StragglerInterval = opts.GCInterval
	}
	if opts.Monotonic == nil {
		opts.Monotonic = monotonicNs
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	a := &Aggregator{
		opts:         opts,
		log:          opts.Logger.With("component", "aggregate"),
		procs:        map[int]*procState{},
		graphRefused: map[string]uint64{},
		tenants:      map[uint64]*tenantState{},
		readFailures: map[string]uint64{},
		folded:       map[foldKey]*foldedSeries{},
		hists:        newHistFamily[HistKey](famHist),
		kernelHists:  newHistFamily[KernelHistKey](famKernelHist),
		ncclHists:    newHistFamily[HistKey](famNCCLHist),
		admitted:     map[tuple]struct{}{},
		refused:      map[tuple]struct{}{},
		undeleted:    map[int]bool{},
		nccl:         newNCCLState(),
		launchers:    map[int]*launchers{},
	}
	a.snap.Store(&Snapshot{Time: opts.Now(), Hists: map[HistKey]*Hist{}, KernelHists: map[KernelHistKey]*Hist{}, NCCLHists: map[HistKey]*Hist{}})
	return a
}

// Snapshot returns the latest published snapshot; never nil.
func (a *Aggregator) Snapshot() *Snapshot { return a.snap.Load() }

// Drain pacing: a drain's work grows with the map keys (measured in
// docs/BENCHMARK.md, "Userspace cost vs series and call rate"), so the pause
// after a drain grows with it, keeping the drain under drainShare of one CPU. Snapshots are then at
// most maxDrainPause old, well inside any scrape interval.
const (
	drainShare    = 0.05
	maxDrainPause = 5 * time.Second
)

// nextDrain is how long to wait after a drain that took took.
func (a *Aggregator) nextDrain(took time.Duration) time.Duration {
	return max(a.opts.Interval, min(maxDrainPause, time.Duration(float64(took)/drainShare)))
}

// Run drains every interval (longer after long drains, see nextDrain)
// until ctx ends.
func (a *Aggregator) Run(ctx context.Context) error {
	t := time.NewTimer(a.opts.Interval)
	defer t.Stop()
	gc := time.NewTicker(a.opts.GCInterval)
	defer gc.Stop()
	for {
		began := time.Now()
		if err := a.Drain(); err != nil {
			a.log.Warn("drain failed", "err", err)
		}
		t.Reset(a.nextDrain(time.Since(began)))
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-gc.C:
			a.GC()
		}
	}
}

// GC removes BPF state of exited processes that the drain cannot see
// because they never produced an aggregation key (e.g. a process whose
// allocations were tracked but whose calls were dropped at a full map).
// Exited processes with keys are handled by every drain, so series never
// wait for this pass.
func (a *Aggregator) GC() {
	n, err := a.opts.Source.DeleteDead(func(pid uint32) bool {
		if ps, ok := a.procs[int(pid)]; ok {
			return a.opts.Procs.Alive(int(pid), ps.start)
		}
		return a.opts.Procs.Alive(int(pid), 0)
	})
	if err != nil {
		a.log.Warn("gc of exited processes' BPF state", "err", err)
	}
	if n > 0 {
		a.log.Debug("gc removed BPF entries of exited processes", "entries", n)
	}
}

type pidData struct {
	agg    map[bpfobj.ProfiAggKey]bpfobj.ProfiAggVal
	launch map[bpfobj.ProfiLaunchKey]bpfobj.ProfiLaunchVal
	nccl   map[bpfobj.ProfiNcclKey]bpfobj.ProfiNcclVal
	// graph is the process's CUDA graph maps (nil: none); graphLaunch
	// and graphBytes what its replays ran (expandGraphs).
	graph       *graphState
	graphLaunch map[bpfobj.ProfiLaunchKey]bpfobj.ProfiLaunchVal
	graphBytes  map[graphBytesKey]uint64
}

func newPIDData() *pidData {
	return &pidData{
		agg: map[bpfobj.ProfiAggKey]bpfobj.ProfiAggVal{}, launch: map[bpfobj.ProfiLaunchKey]bpfobj.ProfiLaunchVal{},
		nccl: map[bpfobj.ProfiNcclKey]bpfobj.ProfiNcclVal{}, graphLaunch: map[bpfobj.ProfiLaunchKey]bpfobj.ProfiLaunchVal{},
		graphBytes: map[graphBytesKey]uint64{},
	}
}

// Drain reads the maps once and publishes a new Snapshot. Only the Run
// goroutine (or a test) may call it.
func (a *Aggregator) Drain() error {
	began := a.opts.Now()
	// The per-PID maps of the last drain are emptied and refilled: at
	// 5·10⁴ keys, growing new ones was half of a drain's allocations.
	byPID := map[int]*pidData{}
	get := func(pid uint32) *pidData {
		d := byPID[int(pid)]
		if d == nil {
			if d = a.pidData[int(pid)]; d != nil {
				clear(d.agg)
				clear(d.launch)
				clear(d.nccl)
				d.graph = nil
			} else {
				d = newPIDData()
			}
			byPID[int(pid)] = d
		}
		return d
	}
	defer func() { a.pidData = byPID }()
	if err := a.opts.Source.Aggregated(func(k bpfobj.ProfiAggKey, v *bpfobj.ProfiAggVal) { get(k.Pid).agg[k] = *v }); err != nil {
		return fmt.Errorf("read aggregated map: %w", err)
	}
	if err := a.opts.Source.Launches(func(k bpfobj.ProfiLaunchKey, v *bpfobj.ProfiLaunchVal) { get(k.Pid).launch[k] = *v }); err != nil {
		return fmt.Errorf("read launch map: %w", err)
	}
	if err := a.opts.Source.NCCL(func(k bpfobj.ProfiNcclKey, v *bpfobj.ProfiNcclVal) { get(k.Pid).nccl[k] = *v }); err != nil {
		return fmt.Errorf("read nccl_agg map: %w", err)
	}
	if err := a.readGraphs(get, func(pid uint32) *pidData { return byPID[int(pid)] }); err != nil {
		return fmt.Errorf("read graph maps: %w", err)
	}
	withGraphs := 0
	for _, d := range byPID {
		if d.graph != nil {
			withGraphs++
		}
	}
	a.graphWork = graphWorkShare(withGraphs)
	// One map's failed walk must not fail the drain (issue 30): the
	// communicator table is kept as it was, the failure counted.
	if seen, err := a.readComms(); err != nil {
		a.readFailures["nccl_comms"]++
		a.log.Warn("read nccl_comms map; communicators kept from the last drain", "tries", commReadTries, "err", err)
	} else {
		a.pruneComms(byPID, seen)
	}
	drops, err := a.opts.Source.Drops()
	if err != nil {
		return fmt.Errorf("read drops map: %w", err)
	}

	snap := &Snapshot{Time: began, Hists: map[HistKey]*Hist{}, KernelHists: map[KernelHistKey]*Hist{}, NCCLHists: map[HistKey]*Hist{}, Drops: drops}
	a.stragHists = map[stragglerKey]*Hist{}
	for _, d := range byPID {
		snap.AggregatedKeys += len(d.agg)
		snap.LaunchKeys += len(d.launch)
	}
	dead := map[uint32]bool{}
	pids := make([]int, 0, len(byPID))
	for pid := range byPID {
		pids = append(pids, pid)
	}
	sort.Ints(pids)
	for _, pid := range pids {
		d := byPID[pid]
		if a.undeleted[pid] {
			dead[uint32(pid)] = true
			continue
		}
		ps := a.process(pid)
		if ps == nil {
			// Exited: its final series stay exported (exited.go), its
			// histograms are retained, its keys go. One that no drain
			// saw alive is known by what BPF noted of it.
			a.adoptUnseen(pid)
			a.exit(pid, d, snap, began)
			dead[uint32(pid)] = true
			continue
		}
		if a.opts.Scale != nil {
			a.estimate(ps, d)
		}
		// Graph state but no key to export (its keys refused at a full
		// map or its quota) gives no part: nothing to show this drain.
		snap.Processes = append(snap.Processes, a.parts(ps, d, snap)...)
	}
	// Processes known from an earlier drain that have no keys any more.
	for pid := range a.procs {
		if _, ok := byPID[pid]; !ok {
			a.forget(pid)
		}
	}
	// Before the quotas of the dead go: their tenants are read once more.
	if err := a.readTenants(snap); err != nil {
		a.readFailures["tenant_quotas"]++
		a.log.Warn("read tenants' refusals; totals kept from the last drain", "err", err)
	}
	if len(dead) > 0 {
		if err := a.opts.Source.DeletePIDs(dead); err != nil {
			a.log.Warn("delete keys of exited processes; retrying next drain", "pids", len(dead), "err", err)
			for pid := range dead {
				a.undeleted[int(pid)] = true
			}
		} else {
			for pid := range dead {
				delete(a.undeleted, int(pid))
			}
		}
	}
	for pid := range a.undeleted {
		if _, ok := byPID[pid]; !ok {
			delete(a.undeleted, pid) // its keys are gone after all
		}
	}
	// Per-process data without a gpu label goes to a process's first entry.
	live := make(map[int]*Process, len(snap.Processes))
	for _, p := range snap.Processes {
		if live[p.Meta.PID] == nil {
			live[p.Meta.PID] = p
		}
	}
	inflight, err := a.watchInflight(live, a.opts.Monotonic())
	if err != nil {
		a.log.Warn("read in-flight NCCL calls", "err", err)
	}
	a.sequences(live, byPID, inflight)
	if err := a.noteLaunchers(live); err != nil {
		a.log.Warn("read launch_threads map", "err", err)
	}
	// Stamped right before the threads are read: the window is the span
	// of the reads (a drain can be long), not of the drains.
	a.sampleLaunchers(live, byPID, a.opts.Now())
	if err := a.cudaInflight(live, a.opts.Monotonic()); err != nil {
		a.log.Warn("read in-flight CUDA calls", "err", err)
	}
	a.stragglers(live, began)
	a.exitedSeries(snap, began)
	snap.NCCLStale = a.nccl.stale
	a.histograms(snap, began)
	snap.Events = a.retiredCalls
	for _, p := range snap.Processes {
		snap.Events += p.events
	}
	if prev := a.snap.Load(); prev != nil && !prev.Time.IsZero() {
		if dt := began.Sub(prev.Time).Seconds(); dt > 0 && drops[bpfobj.DropEventsRing] >= prev.Drops[bpfobj.DropEventsRing] {
			snap.RingDropRate = float64(drops[bpfobj.DropEventsRing]-prev.Drops[bpfobj.DropEventsRing]) / dt
		}
	}
	snap.CardinalityDrops = a.cardDrops
	snap.ExpiredSeries = a.expired
	snap.RejectedComms = a.badComms
	snap.GraphRefusals = maps.Clone(a.graphRefused)
	snap.ReadFailures = maps.Clone(a.readFailures)
	snap.Series = len(a.admitted)
	snap.DrainDuration = a.opts.Now().Sub(began)
	a.snap.Store(snap)
	if a.opts.Observe != nil {
		a.opts.Observe(snap.DrainDuration)
	}
	return nil
}

// histograms fills the snapshot's histogram families (no pid label):
// the retained data of exited processes plus every live process, per
// label set, within --max-time-series. Retained data whose label set no
// live process shares expires RetainedExpiry after its last exit.
func (a *Aggregator) histograms(snap *Snapshot, now time.Time) {
	liveHists, liveKernels, liveNCCL := map[HistKey]bool{}, map[KernelHistKey]bool{}, map[HistKey]bool{}
	for _, p := range snap.Processes {
		for op := range p.hists {
			liveHists[HistKey{Op: op, Namespace: p.Meta.Namespace, Pod: p.Meta.Pod, GPU: p.Meta.GPU}] = true
		}
		for kern := range p.khists {
			liveKernels[KernelHistKey{Kernel: kern, Namespace: p.Meta.Namespace, Pod: p.Meta.Pod, GPU: p.Meta.GPU}] = true
		}
		if p.NCCL != nil {
			for op := range p.NCCL.hists {
				liveNCCL[HistKey{Op: op, Namespace: p.Meta.Namespace, Pod: p.Meta.Pod, GPU: p.Meta.GPU}] = true
			}
		}
	}
	a.hists.expire(a, now, liveHists)
	a.kernelHists.expire(a, now, liveKernels)
	a.ncclHists.expire(a, now, liveNCCL)
	a.hists.addRetired(a, snap.Hists)
	a.kernelHists.addRetired(a, snap.KernelHists)
	a.ncclHists.addRetired(a, snap.NCCLHists)
	for _, p := range snap.Processes {
		for op, h := range p.hists {
			a.hists.add(a, snap.Hists, HistKey{Op: op, Namespace: p.Meta.Namespace, Pod: p.Meta.Pod, GPU: p.Meta.GPU}, h)
		}
		for kern, h := range p.khists {
			a.kernelHists.add(a, snap.KernelHists, KernelHistKey{Kernel: kern, Namespace: p.Meta.Namespace, Pod: p.Meta.Pod, GPU: p.Meta.GPU}, h)
		}
		if p.NCCL != nil {
			for op, h := range p.NCCL.hists {
				a.ncclHists.add(a, snap.NCCLHists, HistKey{Op: op, Namespace: p.Meta.Namespace, Pod: p.Meta.Pod, GPU: p.Meta.GPU}, h)
			}
			p.NCCL.hists = nil
		}
		p.hists, p.khists = nil, nil
	}
}

// process returns the state of a live process, reading its metadata at
// first sight; nil when it has exited (or its PID was reused).
func (a *Aggregator) process(pid int) *procState {
	if ps, ok := a.procs[pid]; ok {
		if a.opts.Procs.Alive(pid, ps.start) {
			a.label(ps)
			return ps
		}
		return nil
	}
	comm, start, ok := a.opts.Procs.Lookup(pid)
	if !ok {
		return nil
	}
	// The process chooses its comm (prctl PR_SET_NAME): any bytes.
	if safe, changed := discover.SafeLabel(comm, maxCommLen); changed {
		comm = safe
		a.badComms++
	}
	a.foldPID(pid, a.opts.Now())
	ps := &procState{meta: Meta{PID: pid, Comm: comm}, start: start, streams: map[uint64]string{}, kernels: map[string]bool{}}
	a.procs[pid] = ps
	a.label(ps)
	return ps
}

// clockTick is the unit of /proc/PID/stat's start time (USER_HZ, 100 on
// every architecture Linux runs profi on); BPF notes nanoseconds.
const clockTick = 10 * time.Millisecond

// adoptUnseen makes an exited process that no drain saw alive a known
// one, from what BPF noted of it (unseen_procs: its comm, start time and
// cgroup), so its counts keep its series and its pod (exit) instead of
// only the node's totals. A process whose identity was not noted (its
// entry evicted, or noted by no probe) is left to retire.
func (a *Aggregator) adoptUnseen(pid int) {
	if _, known := a.procs[pid]; known {
		return
	}
	id, ok := a.opts.Source.Unseen(uint32(pid))
	if !ok || id.Start == 0 {
		return
	}
	comm, changed := discover.SafeLabel(cString(id.Comm[:]), maxCommLen)
	if changed {
		a.badComms++
	}
	ps := &procState{meta: Meta{PID: pid, Comm: comm}, start: id.Start / uint64(clockTick), streams: map[uint64]string{},
		kernels: map[string]bool{}, podDone: true}
	if a.opts.Pods != nil {
		m := &ps.meta
		m.Namespace, m.Pod, m.Container = a.opts.Pods.PodOfCgroup("/" + cString(id.Parent[:]) + "/" + cString(id.Leaf[:]))
	}
	a.procs[pid] = ps
}

// cString is the NUL-terminated string at the start of b.
func cString[T ~int8 | ~uint8](b []T) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}

// label asks for the process's pod labels until they are final.
func (a *Aggregator) label(ps *procState) {
	if a.opts.Pods == nil || ps.podDone {
		return
	}
	m := &ps.meta
	m.Namespace, m.Pod, m.Container, ps.podDone = a.opts.Pods.Pod(m.PID, ps.start)
}

// estimate replaces a process's raw values by estimates: every drain adds
// each key's increase times Scale. Exact (scale 1) increases are added as
// they are, so a process that is never duty-cycled keeps exact counts.
func (a *Aggregator) estimate(ps *procState, d *pidData) {
	if ps.aggEst == nil {
		ps.aggEst = map[bpfobj.ProfiAggKey]*[2]bpfobj.ProfiAggVal{}
		ps.launchEst = map[bpfobj.ProfiLaunchKey]*[2]bpfobj.ProfiLaunchVal{}
	}
	scale := func(op uint32) float64 { return a.opts.Scale(ps.meta.PID, ops.Op(op)) }
	estimateInto(d.agg, ps.aggEst, func(k bpfobj.ProfiAggKey) float64 { return scale(k.Op) })
	estimateInto(d.launch, ps.launchEst, func(k bpfobj.ProfiLaunchKey) float64 { return scale(k.Op) })
}

// estimateInto replaces each raw value of cur by its estimate: est[k][0]
// is the last raw value, est[k][1] the estimate, which grows by the raw
// increase times scale(k).
func estimateInto[K comparable, V any, P interface {
	*V
	AddScaled(cur, last *V, f float64)
}](cur map[K]V, est map[K]*[2]V, scale func(K) float64) {
	for k, v := range cur {
		e := est[k]
		if e == nil {
			e = new([2]V)
			est[k] = e
		}
		P(&e[1]).AddScaled(&v, &e[0], scale(k))
		e[0] = v
		cur[k] = e[1]
	}
}

// retire folds an exited process's latency data into the retained
// histograms and forgets the process. d holds estimates already (exit)
// where the process was known and Options.Scale is set.
func (a *Aggregator) retire(pid int, d *pidData) {
	var meta Meta
	ps, known := a.procs[pid]
	if known {
		meta = ps.meta
	}
	gpuOf := func(dev uint32) string {
		if a.opts.GPUs == nil || !known {
			// Never seen alive: whoever has the PID now is another
			// process, whose GPU this data must not take.
			return meta.GPU
		}
		g, _, _ := a.opts.GPUs.GPU(pid, ps.start, dev)
		return g
	}
	now := a.opts.Now()
	for k, v := range d.agg {
		hk := HistKey{Op: ops.Name(k.Op), Namespace: meta.Namespace, Pod: meta.Pod, GPU: gpuOf(k.Dev)}
		a.hists.retire(hk, newHist(v.Timed, v.DurationNs, v.Buckets[:]), now)
		a.retiredCalls += v.Count
	}
	if known {
		for k, v := range d.launch {
			if v.Timed == 0 {
				continue
			}
			kern := a.kernel(ps, k, true)
			hk := KernelHistKey{Kernel: kern, Namespace: meta.Namespace, Pod: meta.Pod, GPU: gpuOf(k.Dev)}
			a.kernelHists.retire(hk, newHist(v.Timed, v.DurationNs, v.Buckets[:]), now)
		}
	}
	for _, v := range d.launch {
		a.retiredCalls += v.Count
	}
	for k, v := range d.nccl {
		a.retiredCalls += v.Count
		if v.Timed > 0 {
			a.ncclHists.retire(HistKey{Op: ops.Name(k.Op), Namespace: meta.Namespace, Pod: meta.Pod, GPU: gpuOf(k.Dev)}, newHist(v.Timed, v.DurationNs, v.Buckets[:]), now)
		}
	}
	// Its tuples stay admitted while its series linger (exit, exited.go).
	a.forgetState(pid)
}

// forget drops everything known about a process.
func (a *Aggregator) forget(pid int) {
	a.forgetState(pid)
	a.releaseTuples(pid)
}

// forgetState drops a process's state and the labelers' memory of it.
func (a *Aggregator) forgetState(pid int) {
	delete(a.procs, pid)
	if a.opts.Pods != nil {
		a.opts.Pods.Forget(pid)
	}
	if a.opts.GPUs != nil {
		a.opts.GPUs.Forget(pid)
	}
	a.nccl.forget(pid)
	delete(a.launchers, pid)
	if a.opts.Names != nil {
		a.opts.Names.Forget(pid)
	}
}

// releaseTuples removes pid's per-process tuples from --max-time-series'
// count (the histograms' carry no pid and stay).
func (a *Aggregator) releaseTuples(pid int) (released int) {
	for t := range a.admitted {
		if t.pid == pid && t.fam != famHist && t.fam != famKernelHist && t.fam != famNCCLHist {
			delete(a.admitted, t)
			released++
		}
	}
	for t := range a.refused {
		if t.pid == pid {
			delete(a.refused, t)
		}
	}
	return released
}

// admit applies --max-time-series: a tuple seen before stays; a new one
// is admitted only below the cap. A refused tuple's data is dropped,
// never added to another series.
func (a *Aggregator) admit(t tuple) bool {
	if _, ok := a.admitted[t]; ok {
		return true
	}
	// A live process's series take the room of exited ones (exited.go).
	for a.opts.MaxTimeSeries > 0 && len(a.admitted) >= a.opts.MaxTimeSeries &&
		t.pid > 0 && t.pid != a.exiting && a.evictExited() {
	}
	if len(a.admitted) < a.opts.MaxTimeSeries || a.opts.MaxTimeSeries <= 0 {
		a.admitted[t] = struct{}{}
		return true
	}
	if _, ok := a.refused[t]; !ok {
		a.refused[t] = struct{}{}
		a.cardDrops++
	}
	return false
}

// stream maps a stream handle to its label, collapsing handles beyond
// --max-streams-per-pid into "other" (never into "default").
// BPF admits at most as many streams per process in its keys and folds
// the others into bpfobj.StreamOther, labelled "other" here too.
func (a *Aggregator) stream(ps *procState, h uint64) string {
	if h == 0 || h == bpfobj.StreamOther {
		return bpfobj.StreamLabel(h)
	}
	if l, ok := ps.streams[h]; ok {
		return l // formatted once per stream, not at every drain
	}
	if len(ps.streams) < a.opts.MaxStreamsPerPID || a.opts.MaxStreamsPerPID <= 0 {
		l := bpfobj.StreamLabel(h)
		ps.streams[h] = l
		return l
	}
	return "other"
}

// sortedKeys returns m's keys sorted by cmp, in a slice of the right
// size (slices.SortedFunc grows it from empty).
func sortedKeys[K comparable, V any](m map[K]V, cmp func(K, K) int) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, cmp)
	return keys
}

// compareAggKeys orders keys so that caps admit the same tuples on every
// run (map iteration order is random).
func compareAggKeys(x, y bpfobj.ProfiAggKey) int {
	return cmp.Or(cmp.Compare(x.Op, y.Op), cmp.Compare(x.Stream, y.Stream), cmp.Compare(x.Kind, y.Kind), cmp.Compare(x.Err, y.Err), cmp.Compare(x.Dev, y.Dev))
}

func compareLaunchKeys(x, y bpfobj.ProfiLaunchKey) int {
	return cmp.Or(cmp.Compare(x.Op, y.Op), cmp.Compare(x.Stream, y.Stream), cmp.Compare(x.Func, y.Func), cmp.Compare(x.Phase, y.Phase), cmp.Compare(x.Dev, y.Dev), cmp.Compare(x.Captured, y.Captured))
}

// Direction returns the direction label of a memcpy kind.
func Direction(kind uint32) string { return bpfobj.Direction(kind) }

func opFamily(op uint32) ops.Family { return ops.FamilyOf(op) }

// build turns one process's map values on one GPU (meta's) into an
// exported Process.
func (a *Aggregator) build(ps *procState, meta Meta, d *pidData, snap *Snapshot) *Process {
	pid := ps.meta.PID
	g := meta.GPU + "/" + meta.GPUUUID
	p := &Process{
		Meta:     meta,
		Calls:    map[OpStream]uint64{},
		Errors:   map[OpCode]uint64{},
		Memcpy:   map[DirStream]uint64{},
		Memset:   map[OpStream]uint64{},
		Launches: map[Kernel]Launch{},
		Captured: map[Kernel]Launch{},
		Graph:    map[Kernel]Launch{},
		hists:    map[string]*Hist{},
		khists:   map[Kernel]*Hist{},
	}
	aggKeys := sortedKeys(d.agg, compareAggKeys)
	for _, k := range aggKeys {
		// Series are created on first data: memory series only for a process that allocates or frees.
		if f := opFamily(k.Op); f == ops.FamilyMalloc || f == ops.FamilyFree {
			p.memory = a.admit(tuple{fam: famMemory, pid: pid, gpu: g})
			break
		}
	}
	for _, k := range aggKeys {
		v := d.agg[k]
		op := ops.Name(k.Op)
		fam := opFamily(k.Op)
		stream := a.stream(ps, k.Stream)
		// Launch calls are counted from launch_agg (every launch, timed or
		// not); their timed entries here feed only errors and latency.
		if fam != ops.FamilyLaunch {
			p.events += v.Count
			if cs := (OpStream{op, stream}); a.admit(tuple{fam: famCalls, pid: pid, gpu: g, a: cs.Op, b: cs.Stream}) {
				p.Calls[cs] += v.Count
			}
		}
		if k.Err != 0 {
			if oc := (OpCode{op, fmt.Sprint(k.Err)}); a.admit(tuple{fam: famErrors, pid: pid, gpu: g, a: oc.Op, b: oc.Code}) {
				p.Errors[oc] += v.Count
			}
		}
		switch {
		case fam == ops.FamilyMemcpy && v.Bytes > 0:
			if ds := (DirStream{Direction(k.Kind), stream}); a.admit(tuple{fam: famMemcpy, pid: pid, gpu: g, a: ds.Direction, b: ds.Stream}) {
				p.Memcpy[ds] += v.Bytes
			}
		case fam == ops.FamilyMemset && v.Bytes > 0:
			if cs := (OpStream{op, stream}); a.admit(tuple{fam: famMemset, pid: pid, gpu: g, a: cs.Op, b: cs.Stream}) {
				p.Memset[cs] += v.Bytes
			}
		case fam == ops.FamilyMallocHost && v.Bytes > 0:
			if a.admit(tuple{fam: famHostMemory, pid: pid, gpu: g}) {
				p.hostMemory = true
				p.MallocHostBytes += v.Bytes
			}
		case fam == ops.FamilyMalloc && p.memory:
			p.MallocBytes += v.Bytes
		case fam == ops.FamilyFree && p.memory:
			p.FreedBytes += v.Bytes
		}
		mergeInto(p.hists, op, newHist(v.Timed, v.DurationNs, v.Buckets[:]))
	}
	for _, k := range sortedKeys(d.launch, compareLaunchKeys) {
		v := d.launch[k]
		op := ops.Name(k.Op)
		stream := a.stream(ps, k.Stream)
		p.events += v.Count
		if cs := (OpStream{op, stream}); a.admit(tuple{fam: famCalls, pid: pid, gpu: g, a: cs.Op, b: cs.Stream}) {
			p.Calls[cs] += v.Count
		}
		kern := a.kernel(ps, k, v.Timed > 0)
		// A launch on a capturing stream ran nothing: counted apart, and
		// neither in the launch geometry nor in the launch histograms.
		fam, dst := famLaunch, p.Launches
		if k.Captured != 0 {
			fam, dst = famCaptured, p.Captured
		}
		if !a.admit(tuple{fam: fam, pid: pid, gpu: g, a: kern.Name, b: kern.Class + "/" + kern.Phase}) {
			continue
		}
		addLaunch(dst, kern, v)
		if v.Timed > 0 && k.Captured == 0 {
			mergeInto(p.khists, kern, newHist(v.Timed, v.DurationNs, v.Buckets[:]))
		}
	}
	for _, k := range sortedKeys(d.graphLaunch, compareLaunchKeys) {
		v := d.graphLaunch[k]
		kern := a.kernel(ps, k, false)
		if a.admit(tuple{fam: famGraphLaunch, pid: pid, gpu: g, a: kern.Name, b: kern.Class + "/" + kern.Phase}) {
			addLaunch(p.Graph, kern, v)
		}
	}
	a.addGraphBytes(ps, p, d, g)
	a.buildNCCL(p, d.nccl)
	return p
}

func addLaunch(m map[Kernel]Launch, kern Kernel, v bpfobj.ProfiLaunchVal) {
	l := m[kern]
	l.Count += v.Count
	l.GridBlocks += v.GridBlocks
	l.BlockThreads += v.BlockThreads
	l.SharedBytes += v.SharedBytes
	m[kern] = l
}

// kernel labels a launch key: "anonymous" for entry-only launches
// (anonymous mode, which records no function); otherwise the normalized name as soon as a name source knows it
// (so placeholder series, unknown_…, move to the name once it arrives), and "other"
// beyond --max-kernels-per-pid.
func (a *Aggregator) kernel(ps *procState, k bpfobj.ProfiLaunchKey, timed bool) Kernel {
	kern := a.kernelName(ps, k, timed)
	kern.Phase = bpfobj.PhaseName(k.Phase)
	return kern
}

// kernelName is kernel without the phase.
func (a *Aggregator) kernelName(ps *procState, k bpfobj.ProfiLaunchKey, timed bool) Kernel {
	if k.Func == 0 && !timed {
		return Kernel{Name: "anonymous", Class: "other"}
	}
	name := ""
	if a.opts.Names != nil {
		name = a.opts.Names.Kernel(ps.meta.PID, ops.Op(k.Op), k.Func)
	}
	if name == "" && a.opts.Names != nil {
		name = a.opts.Names.Placeholder(ps.meta.PID, k.Func)
	}
	if name == "" {
		name = kernelname.Unknown(k.Func)
	}
	if !ps.kernels[name] {
		if len(ps.kernels) >= a.opts.MaxKernelsPerPID && a.opts.MaxKernelsPerPID > 0 {
			return Kernel{Name: "other", Class: "other"}
		}
		ps.kernels[name] = true
	}
	return Kernel{Name: name, Class: kernelname.Class(name)}
}
