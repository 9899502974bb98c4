package attach

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/profi-dev/profi/internal/attach/uprobe"
	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/ops"
)

// The Attacher's types and lifecycle (New, AddStatic, Close) and the
// policy of a pass (Sync): which files are attached, refused by a cap,
// retried or released. What it calls on the way has a file per concern.

// Reasons of profi_system_attach_failures_total (docs/INTERFACE.md 5.7).
const (
	ReasonSymbolNotFound    = uprobe.ReasonSymbolNotFound
	ReasonProcessExited     = uprobe.ReasonProcessExited
	ReasonOpenFailed        = "open_failed"
	ReasonNotELF            = "not_elf"
	ReasonUnsupportedKernel = uprobe.ReasonUnsupportedKernel
	ReasonOther             = uprobe.ReasonOther
	// ReasonProbeRefused counts each probed function the kernel refuses a
	// uprobe on (and that could not be moved), once per library file: the
	// file is attached without it (refused_probes in /status).
	ReasonProbeRefused = "probe_refused"
)

// FileKey identifies a library file: the uprobe lives on the inode.
type FileKey struct {
	Dev   uint64
	Inode uint64
}

func (k FileKey) String() string {
	return fmt.Sprintf("%x:%x/%d", unix.Major(k.Dev), unix.Minor(k.Dev), k.Inode)
}

// Target is a library file that some processes map.
type Target struct {
	Key  FileKey
	Lib  discover.Library
	Path string // as the mapping process sees it
	PIDs []int  // processes that map it
	// Text is where the file's code is mapped in each process, when known.
	Text map[int]TextRange
	// Static: an executable probed as a statically linked runtime
	// (discover.Mapping.Static); its symbols may be in .symtab only.
	Static bool
	// Tracers are the processes of PIDs that have a tracer, and its PID
	// (read only when Options.ExcludeTraced).
	Tracers map[int]int
	// Open opens the file for reading its symbols and attaching, e.g.
	// inside the process's root. The file is closed after the attach.
	Open func() (*os.File, error)
}

// TextRange is an executable mapping [Start, End).
type TextRange struct{ Start, End uint64 }

// Options configure an Attacher.
type Options struct {
	Programs   map[string]*ebpf.Program // by program name
	KernelMode string
	Profile    string        // --probe-profile
	PID        int           // uprobe PID filter; 0 = every process
	RetryBase  time.Duration // first retry delay after a failure
	RetryMax   time.Duration // cap of the exponential backoff
	Logger     *slog.Logger
	Now        func() time.Time // for tests; time.Now when nil
	// PIDFiles is the BPF map of which attached files each process maps
	// (see pid_files in bpf/maps.h); nil in tests without BPF. Its values
	// also say which (pid, file) full-mode upgrade probes serve (PF_FULL)
	// and where a process's libcudart code is (PF_RT_TEXT).
	PIDFiles *ebpf.Map
	// RuntimeRanges writes each process's libcudart code range into its
	// pid_files values, for the runtime->driver launch guard.
	RuntimeRanges bool
	// FileFacts (file_facts) are the runtime facts of each attached
	// runtime file, what a process gets before a pass registers it;
	// RuntimeInodes (rt_inodes) name the runtime file of an inode, noted
	// by BPF and pruned here when a file goes (bpf/maps.h). Either may be
	// nil: unseen processes' launches are then told apart by markers only.
	FileFacts     *ebpf.Map
	RuntimeInodes *ebpf.Map
	// Handover: the maps that let the driver count runtime launches
	// (handover.go); zero disables it.
	Handover HandoverMaps
	// Budget: --overhead-budget is on. Its duty cycle samples and scales
	// per library, and a runtime launch handed to the driver would trap
	// in the driver's: no handover then (ARCHITECTURE.md, "One trap per
	// launch").
	Budget bool
	// UprobeMulti: Programs were loaded for uprobe_multi links
	// (bpfobj.Objects.UprobeMulti), so the probes of one program are one
	// link per file, budget class and PID filter instead of one link per
	// symbol: a new library costs a handful of links, not dozens. False:
	// classic uprobes, one per function. Decided once, at load.
	UprobeMulti bool
	// NVTX (--enable-nvtx-tracing): the load-triggered check looks for
	// NVTX libraries too (the discovery pass's Scanner must set NVTX).
	NVTX bool
	// MaxFilesPerPID (--max-attached-files-per-pid) and MaxFiles
	// (--max-attached-files) cap the library files attached or being
	// retried: a new file is refused when every process mapping it holds
	// MaxFilesPerPID already, or the node MaxFiles (issue 30: 1,000
	// mapped copies of a runtime cost 10,069 descriptors). 0: no cap.
	MaxFilesPerPID, MaxFiles int
	// ExcludeTraced (--probe-traced-processes, ExcludesTraced): a process
	// with a tracer is left unprobed, with no breakpoint in its memory
	// (traced.go); the discovery pass's Scanner must set Tracers.
	ExcludeTraced bool
	// NoReturnProbes: the kernel's return probes can kill a probed
	// process (kbugs.Result.NoReturnProbes): no probe with a return probe
	// is attached; a whole probe goes, never its return half, since the
	// timed entry programs leave state only the return clears.
	NoReturnProbes bool
	// Tenant is the tenant BPF admitted a process under (pid_quotas: its
	// cgroup v2 id), false if it has made no probed call yet; for the
	// crash breaker's tenant quarantines (QuarantineTenant). May be nil.
	Tenant func(pid int) (uint64, bool)
	// TenantOf names a process's tenant for the shares of the attach
	// budget (shares.go): its pod, else its cgroup; "" or nil: the
	// process alone.
	TenantOf func(pid int) string
	// Inflight are the BPF maps of calls in flight keyed by pid_tgid
	// (inflight, nccl_inflight): a process's entries are deleted when its
	// probes come back after it was left unprobed. May be empty.
	Inflight []*ebpf.Map
	// MaxDescriptors (--max-probe-descriptors) caps the descriptors every
	// link holds; MaxTeardown (--max-teardown) the estimated time to
	// release them all, from LinkRelease, the time one link takes to go
	// (uprobe.Linker.MeasureRelease; refined by each release). New files
	// and per-process sets past either are refused (cost.go). 0: no cap
	// (LinkRelease 0: the teardown cap waits for a first release).
	MaxDescriptors int
	MaxTeardown    time.Duration
	LinkRelease    time.Duration
}

// Limit labels of the file caps (profi_system_limit_refusals_total).
const (
	LimitFilesPerPID = "attached_files_per_pid"
	LimitFiles       = "attached_files"
)

// Limits are the limit labels of every cap the Attacher applies, for the
// self metrics (each always present).
var Limits = []string{LimitFilesPerPID, LimitFiles, LimitDescriptors, LimitTeardown}

type attached struct {
	id   uint32                 // goes into every probe's cookie
	syms map[string]uprobe.Func // functions the file defines, with probe offsets
	// upgrades are PID-filtered full-mode links for processes upgraded
	// to full mode (SetFullModePIDs), by pid.
	upgrades map[int]*uprobe.Links
	target   Target
	// sets are the file's links by uprobe PID filter: one for every
	// process (Options.PID), or, while a process that maps the file is
	// left unprobed, one per probed process (traced.go).
	sets map[int]*linkSet
	// rest are the probes linked in every set (all but launches).
	rest       []ops.Probe
	paused     bool
	probes     []ops.Probe
	missing    []string       // required symbols the file lacks (counted as failures)
	absent     []string       // optional symbols the file lacks (normal)
	refused    []RefusedProbe // probed functions the kernel refuses (counted as failures)
	attachedAt time.Time
	// launches are the runtime launch probes of a handover candidate
	// (handover.go), each with its own links, so that each can be handed
	// to the driver alone; counted mirrors the rt_counted entries written
	// for them; settled: the file stopped learning.
	launches map[ops.Op]*launchProbe
	counted  map[rtSite]ops.Op
	settled  bool
	// unprobed are the processes mapping the file left unprobed at the
	// last pass (pid -> tracer); switches counts the changes between
	// one set for every process and per-process sets.
	unprobed map[int]int
	switches uint64
	// ident tells this file from a later one with its key; prior is what
	// its earlier attachments learned (handover.prior), nil if none.
	ident fileIdent
	prior *learnedFile
}

type failure struct {
	target   Target
	reason   string
	err      error
	attempts int
	next     time.Time
	refused  []RefusedProbe // reason ReasonProbeRefused: every function refused
}

type failureKey struct{ lib, reason string }

// permanent is the retry time of failures that no retry can fix.
var permanent = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)

// Attacher owns every uprobe link.
type Attacher struct {
	opts Options
	log  *slog.Logger

	mu     sync.Mutex
	files  map[FileKey]*attached
	failed map[FileKey]*failure
	static []Target
	counts map[failureKey]uint64
	// gaps are the entry-only gaps of link-set switches, by library
	// (traced.go; profi_system_probe_switch_gaps_total).
	gaps     map[discover.Library]SwitchGaps
	closed   bool
	lastSync time.Time
	// newHook: a pass attached a loader hook; Run follows it with
	// another pass (hookedNow).
	newHook bool
	// loadChecksSkipped counts library-load events over the check rate limit.
	loadChecksSkipped atomic.Uint64
	// triggersCoalesced counts pass triggers merged into a pass already
	// due (Run, WatchLoads).
	triggersCoalesced atomic.Uint64
	// handoverWakeups and handoverLimited count the learning records
	// that ran the handover and those over its rate limit (WatchLearning).
	handoverWakeups, handoverLimited atomic.Uint64
	// lastPass is when Run last finished a discovery pass (unix nanos;
	// New's time before the first), for /health.
	lastPass atomic.Int64
	// scanProblems counts malformed or unreadable per-process procfs data.
	scanProblems uint64
	nextID       uint32
	maps         *processMaps       // pid_files and file_facts, and their mirrors
	fullMode     func(pid int) bool // processes upgraded to full mode; nil: none
	// refused are the probe addresses the kernel refused when tried, per
	// file seen at the last pass: never offered again while the file
	// stays mapped.
	refused map[FileKey]uprobe.Refusals
	linker  *uprobe.Linker
	closing sync.WaitGroup // background closes of released files
	// quarantined are the files the crash breaker took the probes off
	// (Quarantine): never attached while there; gone are the ids of
	// released files, for a Quarantine that arrives after the release.
	quarantined map[FileKey]bool
	// tenantsOff are the tenants whose processes the crash breaker left
	// unprobed, by file (QuarantineTenant).
	tenantsOff map[FileKey]map[uint64]bool
	gone       map[uint32]Target
	// stopped: QuarantineAll ran; nothing is attached again.
	stopped bool
	// capped are the files the caps refuse (seen at the last pass, each
	// counted once in limitRefused, by limit).
	capped       map[FileKey]bool
	limitRefused map[string]uint64
	// linkCapped are the files and per-process sets the link caps refuse
	// (cost.go), each counted once in limitRefused; releasing counts the
	// links being released in the background; linkRelease is the time
	// one link takes to go (nanoseconds; 0: not known), lastRelease the
	// last batch released.
	linkCapped  map[capKey]int
	releasing   atomic.Int64
	linkRelease atomic.Int64
	lastRelease atomic.Pointer[releaseRecord]
	// tenantMemo are the tenants of processes read this pass (shares.go).
	tenantMemo map[int]string
	// ho is the runtime->driver handover (handover.go); a.files are its
	// host's (handover_host.go).
	ho *handover
}

// New returns an Attacher; it attaches nothing until Sync.
func New(opts Options) *Attacher {
	if opts.Budget {
		opts.Handover = HandoverMaps{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.RetryBase <= 0 {
		opts.RetryBase = time.Second
	}
	if opts.RetryMax < opts.RetryBase {
		opts.RetryMax = 5 * time.Minute
	}
	a := &Attacher{
		opts:    opts,
		log:     opts.Logger.With("component", "attach"),
		files:   map[FileKey]*attached{},
		failed:  map[FileKey]*failure{},
		counts:  map[failureKey]uint64{},
		gaps:    map[discover.Library]SwitchGaps{},
		maps:    newProcessMaps(opts.PIDFiles, opts.FileFacts, opts.RuntimeInodes),
		refused: map[FileKey]uprobe.Refusals{},

		quarantined:  map[FileKey]bool{},
		tenantsOff:   map[FileKey]map[uint64]bool{},
		gone:         map[uint32]Target{},
		capped:       map[FileKey]bool{},
		limitRefused: map[string]uint64{},
		linkCapped:   map[capKey]int{},
	}
	a.linker = &uprobe.Linker{Programs: opts.Programs, Multi: opts.UprobeMulti, Log: a.log}
	a.linkRelease.Store(int64(opts.LinkRelease))
	if opts.MaxTeardown > 0 && opts.LinkRelease == 0 {
		// The teardown cap needs what one link takes to go here: two
		// trial links, about 0.2 s with classic uprobes (cost.go).
		if d, err := a.linker.MeasureRelease(2); err != nil {
			a.log.Warn("could not measure a link's release: the teardown cap waits for a first release", "err", err)
		} else {
			a.linkRelease.Store(int64(d))
			a.log.Info("link release measured", "per_link", d.String(), "uprobe_multi", opts.UprobeMulti, "max_teardown", opts.MaxTeardown.String())
		}
	}
	a.ho = newHandover(opts.Handover, opts.KernelMode, a.log)
	a.lastPass.Store(time.Now().UnixNano())
	return a
}

// AddStatic registers a library path in the agent's own mount namespace
// (--cudart). It stays attached for the agent's life, whether or not a
// process maps it. A missing or unreadable file is counted and logged; it
// never counts as attached.
func (a *Attacher) AddStatic(lib discover.Library, path string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		a.counts[failureKey{string(lib), ReasonOpenFailed}]++
		a.log.Info("static library not attached", "lib", lib, "path", path, "err", err)
		return
	}
	a.static = append(a.static, Target{
		Key:  FileKey{Dev: st.Dev, Inode: st.Ino},
		Lib:  lib,
		Path: path,
		Open: func() (*os.File, error) { return os.Open(path) },
	})
}

// Sync makes the links match targets: attaches files not attached yet
// (unless they wait for a retry) and releases files no target maps any
// more. Static targets are always kept.
//
// New files are opened and their symbols read before the lock is taken
// (prepare): the files are tenant-controlled, and /metrics, /status and
// /health take the same lock.
func (a *Attacher) Sync(targets []Target) {
	now := a.opts.Now()
	prepared := a.prepare(targets, now)
	defer func() {
		for _, p := range prepared { // those a concurrent change made unneeded
			p.close()
		}
	}()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return
	}
	a.lastSync = now
	seen := make(map[FileKey]bool, len(targets)+len(a.static))
	held := a.held()
	for _, t := range append(slices.Clone(a.static), targets...) {
		if seen[t.Key] {
			a.merge(t)
			continue
		}
		seen[t.Key] = true
		if !a.wantsAttach(t, now) {
			continue
		}
		if _, retry := a.failed[t.Key]; !retry {
			if limit := a.overCap(t, held); limit != "" {
				if !a.capped[t.Key] {
					a.capped[t.Key] = true
					a.limitRefused[limit]++
					a.log.Warn("library file not attached: cap reached", "limit", limit, "lib", t.Lib, "path", t.Path, "pids", t.PIDs,
						"max_per_pid", a.opts.MaxFilesPerPID, "max", a.opts.MaxFiles)
				}
				continue
			}
		}
		delete(a.capped, t.Key)
		ck := capKey{file: t.Key}
		if est, ok := a.linkCapped[ck]; ok && a.overLinkCap(est, t.PIDs) != "" {
			continue // refused and counted already; not opened again (prepare)
		}
		p := prepared[t.Key]
		delete(prepared, t.Key)
		if p == nil {
			p = a.open(t) // the state changed since prepare: rare, still bounded
		}
		if p.err == nil {
			est := estimateLinks(a.probes(t.Lib, a.opts.KernelMode), p.syms, a.opts.UprobeMulti, a.ho.candidate(t))
			if limit := a.overLinkCap(est, t.PIDs); limit != "" {
				a.refuseLinks(ck, est, limit, "lib", t.Lib, "path", t.Path, "pids", t.PIDs)
				p.close()
				continue
			}
		}
		delete(a.linkCapped, ck)
		held.add(t)
		a.attach(t, p, now)
	}
	var released []*attached
	for key, f := range a.files {
		if !seen[key] {
			a.log.Info("library unmapped by every process, detaching", "lib", f.target.Lib, "path", f.target.Path, "file", key)
			for pid := range f.upgrades {
				a.dropUpgrade(f, pid)
			}
			released = append(released, f)
			delete(a.files, key)
		}
	}
	for _, f := range released {
		a.ho.release(f)
		a.rememberGone(f)
	}
	a.release(released)
	for key := range a.failed {
		if !seen[key] {
			delete(a.failed, key)
		}
	}
	for key := range a.refused {
		if !seen[key] {
			delete(a.refused, key)
		}
	}
	for key := range a.capped {
		if !seen[key] {
			delete(a.capped, key)
		}
	}
	for key := range a.linkCapped {
		if !seen[key.file] {
			delete(a.linkCapped, key)
		}
	}
	a.syncFilters()
	a.syncProcessMaps(true)
	a.syncUpgrades()
}

// wantsAttach reports whether Sync attaches target t now, and updates
// the process lists of files already attached or waiting for a retry.
// Called with a.mu held.
func (a *Attacher) wantsAttach(t Target, now time.Time) bool {
	if len(a.probes(t.Lib, a.opts.KernelMode)) == 0 {
		return false // nothing to attach for this library (yet): not a failure
	}
	if a.quarantined[t.Key] || a.stopped {
		return false
	}
	// Open goes with the PIDs: it opens through their roots, and the
	// processes that mapped the file at its attach may all be gone while
	// the file stays attached for the others (per-process links and
	// full-mode upgrades open it again).
	if f, ok := a.files[t.Key]; ok {
		f.target.PIDs, f.target.Text, f.target.Tracers, f.target.Open = t.PIDs, t.Text, t.Tracers, t.Open
		return false
	}
	if fl, ok := a.failed[t.Key]; ok && now.Before(fl.next) {
		fl.target.PIDs, fl.target.Tracers, fl.target.Open = t.PIDs, t.Tracers, t.Open
		return false
	}
	return true
}

// heldFiles are the files attached or being retried, in all and per
// process, and, once a cap past its room asks (tenants), per tenant (a
// file several tenants map counts for each): what the caps count. The
// tenants are read from /proc only then, not at every pass.
type heldFiles struct {
	all       int
	perPID    map[int]int
	pids      [][]int // each file's processes, for tenants
	perTenant map[string]int
	tenantOf  func(pid int) string
}

func (h *heldFiles) add(t Target) {
	h.all++
	for _, pid := range t.PIDs {
		h.perPID[pid]++
	}
	h.pids = append(h.pids, t.PIDs)
	if h.perTenant != nil {
		h.count(t.PIDs)
	}
}

func (h *heldFiles) count(pids []int) {
	for _, tn := range tenantsOf(pids, h.tenantOf) {
		h.perTenant[tn]++
	}
}

// tenants are the files each tenant holds.
func (h *heldFiles) tenants() map[string]int {
	if h.perTenant == nil {
		h.perTenant = map[string]int{}
		for _, pids := range h.pids {
			h.count(pids)
		}
	}
	return h.perTenant
}

// held counts the files attached or being retried. Called with a.mu held.
func (a *Attacher) held() *heldFiles {
	h := &heldFiles{perPID: map[int]int{}, tenantOf: a.tenantOf}
	for _, f := range a.files {
		h.add(f.target)
	}
	for _, fl := range a.failed {
		h.add(fl.target)
	}
	return h
}

// overCap is the cap that refuses new file t, or "": the node's (past its
// room, unless a process that maps t belongs to a tenant below its
// guarantee: shares.go), or, when every process that maps it holds its
// share already, the per-process one (a file a process with room maps is
// attached: a victim sharing a file with a process at its cap keeps it).
// Called with a.mu held.
func (a *Attacher) overCap(t Target, h *heldFiles) string {
	if !shareOf(a.opts.MaxFiles).admits(h.all, 1, func(guarantee int) bool {
		return a.belowGuarantee(t.PIDs, h.tenants(), guarantee)
	}) {
		return LimitFiles
	}
	if a.opts.MaxFilesPerPID <= 0 || len(t.PIDs) == 0 {
		return ""
	}
	for _, pid := range t.PIDs {
		if h.perPID[pid] < a.opts.MaxFilesPerPID {
			return ""
		}
	}
	return LimitFilesPerPID
}

// merge adds the PIDs of a second target for an already seen file, and
// its way to open the file after the first's.
func (a *Attacher) merge(t Target) {
	if f, ok := a.files[t.Key]; ok {
		f.target.PIDs = append(f.target.PIDs, t.PIDs...)
		f.target.Open = openEither(f.target.Open, t.Open)
		if f.target.Text == nil {
			f.target.Text = map[int]TextRange{}
		}
		for pid, r := range t.Text {
			f.target.Text[pid] = r
		}
		f.target.Tracers = mergeTracers(f.target.Tracers, t.Tracers)
	} else if fl, ok := a.failed[t.Key]; ok {
		fl.target.PIDs = append(fl.target.PIDs, t.PIDs...)
		fl.target.Tracers = mergeTracers(fl.target.Tracers, t.Tracers)
		fl.target.Open = openEither(fl.target.Open, t.Open)
	}
}

// openEither opens with first, and with second when first's processes
// are gone.
func openEither(first, second func() (*os.File, error)) func() (*os.File, error) {
	if first == nil {
		return second
	}
	if second == nil {
		return first
	}
	return func() (*os.File, error) {
		f, err := first()
		if err != nil && errors.Is(err, discover.ErrProcessGone) {
			return second()
		}
		return f, err
	}
}

// attach attaches t's file (p: opened by prepare, or open) and records
// the outcome: the file attached, or a failure with its reason, retry
// time and counts.
func (a *Attacher) attach(t Target, p *opened, now time.Time) {
	att, reason, err := a.attachFile(t, p)
	if err != nil {
		fl := a.failed[t.Key]
		if fl == nil {
			fl = &failure{}
			a.failed[t.Key] = fl
		}
		fl.target, fl.reason, fl.err, fl.refused = t, reason, err, nil
		fl.attempts++
		fl.next = now.Add(min(a.opts.RetryBase<<min(fl.attempts-1, 20), a.opts.RetryMax))
		var all *allRefusedError
		switch {
		case !profiled(t.Lib):
			// Only the attach-speed hook is lost, not a profiled library:
			// no failure counted, and the periodic rescan still works.
			a.log.Debug("loader hook not attached", "path", t.Path, "reason", reason, "err", err)
		case reason == ReasonSymbolNotFound:
			// The file's symbols cannot change: no retry while it stays mapped.
			fl.next = permanent
			a.counts[failureKey{string(t.Lib), reason}] += uint64(a.requiredProbes(t.Lib))
			a.log.Warn("library defines none of the probed symbols; not retried", "lib", t.Lib, "path", t.Path, "pids", t.PIDs)
		case errors.As(err, &all):
			// The verdicts are the file's bytes' or cached: no retry.
			fl.next, fl.refused = permanent, all.refused
			a.counts[failureKey{string(t.Lib), reason}] += uint64(len(all.refused))
			a.log.Warn("the kernel refuses a uprobe on every probed function of the library; not retried", "lib", t.Lib, "path", t.Path, "pids", t.PIDs, "refused", refusedNames(all.refused))
		default:
			a.counts[failureKey{string(t.Lib), reason}]++
			a.log.Warn("attach failed", "lib", t.Lib, "path", t.Path, "pids", t.PIDs, "reason", reason, "attempt", fl.attempts, "retry_in", fl.next.Sub(now), "err", err)
		}
		return
	}
	delete(a.failed, t.Key)
	att.attachedAt = now
	a.files[t.Key] = att
	if !profiled(t.Lib) {
		a.newHook = true
		a.log.Debug("loader hook attached", "path", t.Path, "file", t.Key)
		return
	}
	if len(att.missing) > 0 {
		a.counts[failureKey{string(t.Lib), ReasonSymbolNotFound}] += uint64(len(att.missing))
		a.log.Warn("library attached without some symbols", "lib", t.Lib, "path", t.Path, "missing", att.missing)
	}
	if len(att.refused) > 0 {
		a.counts[failureKey{string(t.Lib), ReasonProbeRefused}] += uint64(len(att.refused))
		a.log.Warn("library attached without the functions the kernel refuses a uprobe on; their calls are not counted", "lib", t.Lib, "path", t.Path, "refused", refusedNames(att.refused))
	}
	a.log.Info("library attached", "lib", t.Lib, "path", t.Path, "file", t.Key, "pids", t.PIDs, "probes", len(att.probes))
}

// profiled reports whether lib's calls are counted. The dynamic loader is
// only hooked (library-load events): it never makes a process tracked, an
// attach failure, or a pid_files owner.
func profiled(lib discover.Library) bool { return lib != discover.LibLoader }

// probes are lib's probes in kernel mode mode: the table's for the
// profile, without those with a return probe on a kernel whose return
// probes can kill a process (Options.NoReturnProbes).
func (a *Attacher) probes(lib discover.Library, mode string) []ops.Probe {
	all := ops.Probes(lib, mode, a.opts.Profile)
	if !a.opts.NoReturnProbes {
		return all
	}
	return slices.DeleteFunc(slices.Clone(all), func(p ops.Probe) bool { return p.Return != "" })
}

// requiredProbes is the number of lib's probes that are not optional:
// the failures a file that defines none of them counts.
func (a *Attacher) requiredProbes(lib discover.Library) int {
	n := 0
	for _, p := range a.probes(lib, a.opts.KernelMode) {
		if !p.Optional {
			n++
		}
	}
	return n
}

// release closes the links of files no process maps any more, in the
// background: each detach waits for RCU grace periods (seconds for a
// library's set under load), and holding the lock that long kept new
// libraries from attaching and scrapes from answering. Hits of the old
// links until they are gone are refused in BPF: their file id has left
// pid_files.
func (a *Attacher) release(files []*attached) {
	if len(files) == 0 {
		return
	}
	// Counted as releasing until each file's links are gone: they hold
	// their descriptors until then (cost.go).
	n := 0
	for _, f := range files {
		n += f.allLinks()
	}
	a.releasing.Add(int64(n))
	a.closing.Add(1)
	go func() {
		defer a.closing.Done()
		began := time.Now()
		// The files close in parallel, as at Close: when a batch job's
		// processes exit together, a thousand uprobe_multi files closed
		// one after the other took 40 s (classic links still go one at a
		// time in the kernel).
		var wg sync.WaitGroup
		for _, f := range files {
			wg.Go(func() {
				links := f.allLinks()
				f.closeLinks()
				a.releasing.Add(-int64(links))
			})
		}
		wg.Wait()
		a.released(n, time.Since(began))
	}()
}

// Close detaches everything. The Attacher is unusable afterwards.
func (a *Attacher) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	// Files close in parallel: each detach waits for RCU grace periods,
	// and an agent that tracked hundreds of files would stop for minutes
	// (classic links still go one at a time in the kernel: cost.go).
	links, began := a.heldLinks(), time.Now()
	var wg sync.WaitGroup
	for key, f := range a.files {
		for pid := range f.upgrades {
			a.dropUpgrade(f, pid)
		}
		a.ho.dropCounted(f)
		wg.Go(f.closeLinks)
		delete(a.files, key)
	}
	wg.Wait()
	a.closing.Wait()
	a.linker.Close()
	a.closed = true
	a.log.Info("every probe detached", "links", links, "took", time.Since(began).String(), "estimate", a.teardown(links).String())
	return nil
}
