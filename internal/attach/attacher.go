package attach

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/profi-dev/profi/internal/attach/uprobe"
	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/ops"
)

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

// rtRange is an rt_text value: a process's runtime code and the runtime
// file's id.
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
	// and which runtime files' processes have their range in rt_text
	// (PF_RT_TEXT).
	PIDFiles *ebpf.Map
	// RuntimeText is the BPF map of libcudart's code range per process
	// (rt_text), for the runtime->driver launch guard; may be nil.
	RuntimeText *ebpf.Map
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
	// Inflight are the BPF maps of calls in flight keyed by pid_tgid
	// (inflight, nccl_inflight): a process's entries are deleted when its
	// probes come back after it was left unprobed. May be empty.
	Inflight []*ebpf.Map
}

// Limit labels of the file caps (profi_system_limit_refusals_total).
const (
	LimitFilesPerPID = "attached_files_per_pid"
	LimitFiles       = "attached_files"
)

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
	// loadChecksSkipped counts library-load events over the check rate limit.
	loadChecksSkipped atomic.Uint64
	// triggersCoalesced counts pass triggers merged into a pass already
	// due (Run, WatchLoads).
	triggersCoalesced atomic.Uint64
	// lastPass is when Run last finished a discovery pass (unix nanos;
	// New's time before the first), for /health.
	lastPass atomic.Int64
	// scanProblems counts malformed or unreadable per-process procfs data.
	scanProblems uint64
	nextID       uint32
	maps         *processMaps       // pid_files and rt_text, and their mirrors
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
	gone        map[uint32]Target
	// stopped: QuarantineAll ran; nothing is attached again.
	stopped bool
	// capped are the files the caps refuse (seen at the last pass, each
	// counted once in limitRefused, by limit).
	capped       map[FileKey]bool
	limitRefused map[string]uint64
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
		maps:    newProcessMaps(opts.PIDFiles, opts.RuntimeText),
		refused: map[FileKey]uprobe.Refusals{},

		quarantined:  map[FileKey]bool{},
		gone:         map[uint32]Target{},
		capped:       map[FileKey]bool{},
		limitRefused: map[string]uint64{},
	}
	a.linker = &uprobe.Linker{Programs: opts.Programs, Multi: opts.UprobeMulti, Log: a.log}
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
		held.add(t)
		p := prepared[t.Key]
		delete(prepared, t.Key)
		if p == nil {
			p = a.open(t) // the state changed since prepare: rare, still bounded
		}
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
	a.syncFilters()
	a.syncProcessMaps(true)
	a.syncUpgrades()
}

// wantsAttach reports whether Sync attaches target t now, and updates
// the process lists of files already attached or waiting for a retry.
// Called with a.mu held.
func (a *Attacher) wantsAttach(t Target, now time.Time) bool {
	if len(ops.Probes(t.Lib, a.opts.KernelMode, a.opts.Profile)) == 0 {
		return false // nothing to attach for this library (yet): not a failure
	}
	if a.quarantined[t.Key] || a.stopped {
		return false
	}
	if f, ok := a.files[t.Key]; ok {
		f.target.PIDs, f.target.Text, f.target.Tracers = t.PIDs, t.Text, t.Tracers
		return false
	}
	if fl, ok := a.failed[t.Key]; ok && now.Before(fl.next) {
		fl.target.PIDs, fl.target.Tracers = t.PIDs, t.Tracers
		return false
	}
	return true
}

// heldFiles are the files attached or being retried, in all and per
// process: what the caps count.
type heldFiles struct {
	all    int
	perPID map[int]int
}

func (h *heldFiles) add(t Target) {
	h.all++
	for _, pid := range t.PIDs {
		h.perPID[pid]++
	}
}

// held counts the files attached or being retried. Called with a.mu held.
func (a *Attacher) held() *heldFiles {
	h := &heldFiles{perPID: map[int]int{}}
	for _, f := range a.files {
		h.add(f.target)
	}
	for _, fl := range a.failed {
		h.add(fl.target)
	}
	return h
}

// overCap is the cap that refuses new file t, or "": the node's, or, when
// every process that maps it holds its share already, the per-process
// one (a file a process with room maps is attached: a victim sharing a
// file with a process at its cap keeps it). Called with a.mu held.
func (a *Attacher) overCap(t Target, h *heldFiles) string {
	if a.opts.MaxFiles > 0 && h.all >= a.opts.MaxFiles {
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

// prepare opens and reads the symbols of each target file that Sync will
// attach, without holding a.mu.
func (a *Attacher) prepare(targets []Target, now time.Time) map[FileKey]*opened {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	var todo []Target
	seen := make(map[FileKey]bool, len(targets)+len(a.static))
	held := a.held()
	for _, t := range append(slices.Clone(a.static), targets...) {
		if seen[t.Key] {
			continue
		}
		seen[t.Key] = true
		if len(ops.Probes(t.Lib, a.opts.KernelMode, a.opts.Profile)) == 0 || a.quarantined[t.Key] || a.stopped {
			continue
		}
		if _, ok := a.files[t.Key]; ok {
			continue
		}
		if fl, ok := a.failed[t.Key]; ok && now.Before(fl.next) {
			continue
		}
		if _, ok := a.failed[t.Key]; !ok && a.overCap(t, held) != "" {
			continue // not opened: Sync counts it
		}
		held.add(t)
		todo = append(todo, t)
	}
	a.mu.Unlock()
	out := make(map[FileKey]*opened, len(todo))
	for _, t := range todo {
		out[t.Key] = a.open(t)
	}
	return out
}

// opened is a target file opened and parsed for attaching: the file
// (kept open, so the links go on the inode that was parsed) and its
// probed symbols, or why that failed.
type opened struct {
	file   *os.File
	syms   map[string]uprobe.Func
	reason string
	err    error
}

func (p *opened) close() {
	if p.file != nil {
		p.file.Close()
		p.file = nil
	}
}

// open opens t's file and reads the symbols of its probes. It takes no
// lock. A panic (the parser's own is already an error of DefinedFuncs)
// becomes an attach failure of that file, not the agent's end.
func (a *Attacher) open(t Target) (p *opened) {
	defer func() {
		if r := recover(); r != nil {
			p = &opened{reason: ReasonOther, err: fmt.Errorf("open and parse %s: panic: %v", t.Path, r)}
		}
	}()
	f, err := t.Open()
	if err != nil {
		if errors.Is(err, discover.ErrProcessGone) {
			return &opened{reason: ReasonProcessExited, err: fmt.Errorf("open %s: %w", t.Path, err)}
		}
		return &opened{reason: ReasonOpenFailed, err: fmt.Errorf("open %s: %w", t.Path, err)}
	}
	syms, err := uprobe.DefinedFuncs(f, probedSymbols(t.Lib, a.opts.KernelMode, a.opts.Profile), t.Static, uprobe.HostMachine())
	if err != nil {
		f.Close()
		return &opened{reason: ReasonNotELF, err: fmt.Errorf("read symbols of %s: %w", t.Path, err)}
	}
	return &opened{file: f, syms: syms}
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
	a.closing.Add(1)
	go func() {
		defer a.closing.Done()
		for _, f := range files {
			f.closeLinks()
		}
	}()
}

// SetFullMode sets which processes get full kernel mode whatever the
// global mode (pods annotated profi/mode: full): PID-filtered full-mode
// probes (timed launches, name sources) are attached for them at each
// Sync, so only they pay the extra traps. full is asked at every Sync, so
// a process whose pod is annotated (or whose pod reaches the watch's cache)
// later is upgraded at the next discovery pass; it must not call back into
// the Attacher.
func (a *Attacher) SetFullMode(full func(pid int) bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.fullMode = full
}

// SetFullModePIDs upgrades exactly these processes (SetFullMode with a
// fixed set).
func (a *Attacher) SetFullModePIDs(pids []int) {
	set := make(map[int]bool, len(pids))
	for _, p := range pids {
		set[p] = true
	}
	a.SetFullMode(func(pid int) bool { return set[pid] })
}

// upgradeProbes are the probes full mode adds to, or changes in, the
// probe set of the global mode.
func upgradeProbes(lib discover.Library, mode, profile string) []ops.Probe {
	base := ops.Probes(lib, mode, profile)
	var out []ops.Probe
	for _, p := range ops.Probes(lib, ops.KernelModeFull, profile) {
		if !slices.Contains(base, p) {
			out = append(out, p)
		}
	}
	return out
}

// syncUpgrades attaches PID-filtered full-mode probes for upgraded
// processes and removes those of processes no longer upgraded. The
// PF_FULL bit of pid_files is set after the links exist and cleared before
// they close, so a launch is never left to probes that are not there.
func (a *Attacher) syncUpgrades() {
	for _, f := range a.files {
		want := map[int]bool{}
		if a.opts.KernelMode != ops.KernelModeFull && a.fullMode != nil {
			for _, pid := range f.target.PIDs {
				if a.fullMode(pid) && a.probed(f, pid) {
					want[pid] = true
				}
			}
		}
		for pid := range f.upgrades {
			if !want[pid] {
				a.dropUpgrade(f, pid)
			}
		}
		for pid := range want {
			if _, ok := f.upgrades[pid]; ok {
				continue
			}
			if err := a.upgrade(f, pid); err != nil {
				a.log.Warn("full-mode upgrade failed; retried at the next scan", "lib", f.target.Lib, "pid", pid, "err", err)
			}
		}
	}
}

func (a *Attacher) upgrade(f *attached, pid int) error {
	probes := upgradeProbes(f.target.Lib, a.opts.KernelMode, a.opts.Profile)
	if len(probes) == 0 {
		return nil
	}
	links, err := a.reattach(f, probes, pid)
	if err != nil {
		return err
	}
	k := bpfobj.ProfiPidFile{Pid: uint32(pid), File: f.id}
	v, _ := a.maps.fileFlags(k)
	if err := a.maps.putFile(k, v|uint8(bpfobj.ProfiPidFileFlagPF_OWN|bpfobj.ProfiPidFileFlagPF_FULL)); err != nil {
		links.Close()
		return fmt.Errorf("mark pid %d upgraded: %w", pid, err)
	}
	if f.upgrades == nil {
		f.upgrades = map[int]*uprobe.Links{}
	}
	f.upgrades[pid] = links
	a.log.Info("process upgraded to full kernel mode", "lib", f.target.Lib, "pid", pid, "links", links.Len())
	return nil
}

func (a *Attacher) dropUpgrade(f *attached, pid int) {
	k := bpfobj.ProfiPidFile{Pid: uint32(pid), File: f.id}
	if v, ok := a.maps.fileFlags(k); ok && v&uint8(bpfobj.ProfiPidFileFlagPF_FULL) != 0 {
		if err := a.maps.putFile(k, v&^uint8(bpfobj.ProfiPidFileFlagPF_FULL)); err != nil {
			// The links close anyway: the process's launches go uncounted
			// by launch_entry until the next pass rewrites the value.
			a.log.Warn("unmark upgraded pid", "pid", pid, "err", err)
		}
	}
	f.upgrades[pid].Close()
	delete(f.upgrades, pid)
}

// wantRuntimeText is where libcudart's code is mapped in every process that
// maps an attached libcudart: what rt_text should hold, so a driver launch
// can tell whether the runtime made it (driver_launch_op in bpf/handover.h).
func (a *Attacher) wantRuntimeText() map[uint32]rtRange {
	want := map[uint32]rtRange{}
	if a.opts.RuntimeText == nil {
		return want
	}
	for _, f := range a.files {
		if f.target.Lib != discover.LibCudart {
			continue
		}
		for pid, r := range f.target.Text {
			if _, dup := want[uint32(pid)]; !dup { // a second libcudart in one process: keep the first
				want[uint32(pid)] = rtRange{r, f.id, f.handedAny()}
			}
		}
	}
	return want
}

// syncProcessMaps moves pid_files and rt_text to what the attached files
// say, in processMaps.apply's order; with handover, the runtime->driver
// handover runs where apply allows it: after rt_text's new entries (they
// carry the file id), before pid_files (PF_RT_MARK follows its plan).
// Called with a.mu held.
func (a *Attacher) syncProcessMaps(handover bool) {
	f := a.maps.apply(a.wantRuntimeText(), func() map[bpfobj.ProfiPidFile]uint8 {
		if handover {
			a.ho.sync(a)
		}
		return a.wantPIDFiles()
	})
	if f.rtTextPut > 0 {
		a.log.Warn("could not update the rt_text map; runtime launches fall back to the timing guard", "failures", f.rtTextPut)
	}
	if f.pidFiles > 0 {
		a.log.Warn("could not update the pid_files map; aliased library files may count calls twice", "failures", f.pidFiles)
	}
	if f.rtTextDelete > 0 {
		a.log.Warn("could not delete from the rt_text map", "failures", f.rtTextDelete)
	}
}

// wantPIDFiles is what pid_files should hold: which attached files each
// process maps, so that a file attached under two keys counts every call
// once (hit_flags in bpf/hits.h), and in the same value whether full-mode upgrade probes
// serve the (pid, file) (PF_FULL: set by upgrade once its links exist,
// cleared by dropUpgrade before they close; kept here) and whether rt_text
// holds a runtime file's process's range (PF_RT_TEXT: only once the
// entry is written, processMaps.apply).
func (a *Attacher) wantPIDFiles() map[bpfobj.ProfiPidFile]uint8 {
	const (
		own      = uint8(bpfobj.ProfiPidFileFlagPF_OWN)
		full     = uint8(bpfobj.ProfiPidFileFlagPF_FULL)
		rtText   = uint8(bpfobj.ProfiPidFileFlagPF_RT_TEXT)
		rtShared = uint8(bpfobj.ProfiPidFileFlagPF_RT_SHARED)
		rtMark   = uint8(bpfobj.ProfiPidFileFlagPF_RT_MARK)
	)
	want := map[bpfobj.ProfiPidFile]uint8{}
	for _, f := range a.files {
		if !profiled(f.target.Lib) {
			continue // its program counts nothing: no ownership needed
		}
		for _, pid := range f.target.PIDs {
			v := own
			if _, ok := f.upgrades[pid]; ok {
				v |= full
			}
			if _, ok := a.maps.hasText(uint32(pid)); ok && f.target.Lib == discover.LibCudart {
				v |= rtText
				if !f.target.Static {
					v |= rtShared
				}
				if f.marks() {
					v |= rtMark
				}
			}
			want[bpfobj.ProfiPidFile{Pid: uint32(pid), File: f.id}] = v
			want[bpfobj.ProfiPidFile{Pid: uint32(pid)}] = own
		}
	}
	return want
}

// merge adds the PIDs of a second target for an already seen file.
func (a *Attacher) merge(t Target) {
	if f, ok := a.files[t.Key]; ok {
		f.target.PIDs = append(f.target.PIDs, t.PIDs...)
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
	}
}

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
			a.counts[failureKey{string(t.Lib), reason}] += uint64(requiredProbes(t.Lib, a.opts.KernelMode, a.opts.Profile))
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

// attachFile attaches every probe whose symbol the file (opened and
// parsed by open) defines. It is all or nothing for the symbols present:
// on any error the links made so far are closed.
func (a *Attacher) attachFile(t Target, p *opened) (*attached, string, error) {
	defer p.close()
	if p.err != nil {
		return nil, p.reason, p.err
	}
	f, syms := p.file, p.syms
	// The kernel resolves this magic link to the file already opened safely
	// inside the process's root, so symlinks in the container cannot
	// redirect the probe to another file.
	fdPath := fmt.Sprintf("/proc/self/fd/%d", f.Fd())
	ex, err := link.OpenExecutable(fdPath)
	if err != nil {
		return nil, ReasonNotELF, fmt.Errorf("open executable %s: %w", t.Path, err)
	}

	a.nextID++
	att := &attached{target: t, id: a.nextID, syms: syms, sets: map[int]*linkSet{}, ident: identOf(f)}
	all := ops.Probes(t.Lib, a.opts.KernelMode, a.opts.Profile)
	rest := all
	if a.ho.candidate(t) {
		rest = nil
		att.launches, att.counted = map[ops.Op]*launchProbe{}, map[rtSite]ops.Op{}
		for _, p := range all {
			if _, ok := syms[p.Symbol]; ok && isHandoverProbe(p) {
				att.launches[p.Op] = &launchProbe{probe: p}
			} else {
				rest = append(rest, p)
			}
		}
	}
	att.rest = rest
	// The first PID filter's set is linked here, all or nothing; the
	// others, when processes that map the file are left unprobed, by
	// syncFilters in the same pass. None: every process that maps it is
	// left unprobed, nothing is linked.
	filters := a.wantFilters(&t)
	set := a.set(ex, t, syms, att.id, a.opts.PID)
	// Ops an earlier attachment of the file handed over stay unattached.
	a.ho.prior(att)
	if len(filters) > 0 {
		set.PID = filters[0]
		ls := &linkSet{}
		for _, k := range []int{kindTimed, kindEntry} {
			if reason, err := a.linkKind(att, ls, set, k); err != nil {
				ls.close()
				a.ho.dropCounted(att)
				return nil, reason, err
			}
		}
		att.sets[filters[0]] = ls
	}
	for _, p := range all {
		sym, ok := syms[p.Symbol]
		var r *uprobe.Refusal
		if ok {
			r = set.Refused.Refusal(sym)
		}
		switch {
		case r != nil:
			att.refused = append(att.refused, refusedProbe(p, sym, r))
		case ok:
			att.probes = append(att.probes, p)
		case p.Optional:
			att.absent = append(att.absent, p.Symbol)
		default:
			att.missing = append(att.missing, p.Symbol)
		}
	}
	if len(att.probes) == 0 {
		att.closeLinks()
		a.ho.dropCounted(att)
		if len(att.refused) > 0 {
			return nil, ReasonProbeRefused, &allRefusedError{path: t.Path, refused: att.refused}
		}
		return nil, ReasonSymbolNotFound, fmt.Errorf("%s defines none of the probed symbols %v", t.Path, att.missing)
	}
	return att, "", nil
}

// allRefusedError: the kernel refuses a uprobe on every probed function
// the file defines.
type allRefusedError struct {
	path    string
	refused []RefusedProbe
}

func (e *allRefusedError) Error() string {
	return fmt.Sprintf("the kernel refuses a uprobe on every probed function of %s: %s", e.path, strings.Join(refusedNames(e.refused), ", "))
}

// refusedNames are "symbol+offset (reason)" of refused probes, for logs.
func refusedNames(r []RefusedProbe) []string {
	out := make([]string, len(r))
	for i, p := range r {
		out[i] = fmt.Sprintf("%s+%d (%s)", p.Symbol, p.Offset, p.Reason)
	}
	return out
}

// refusedProbe is the /status entry of probe p refused at sym.
func refusedProbe(p ops.Probe, sym uprobe.Func, r *uprobe.Refusal) RefusedProbe {
	return RefusedProbe{
		Symbol:     p.Symbol,
		Operation:  ops.Name(uint32(p.Op)),
		Reason:     r.Reason,
		Offset:     sym.Offset,
		FileOffset: sym.ProbeAddr(),
		Code:       hex.EncodeToString(r.Code),
		Error:      r.Err,
	}
}

// set is the probe set of file t (opened as ex) for the linker, with the
// file's known refusals.
func (a *Attacher) set(ex *link.Executable, t Target, syms map[string]uprobe.Func, id uint32, pid int) uprobe.Set {
	if a.refused[t.Key] == nil {
		a.refused[t.Key] = uprobe.Refusals{}
	}
	return uprobe.Set{Exe: ex, Path: t.Path, Funcs: syms, FileID: id, PID: pid, Refused: a.refused[t.Key]}
}

// splitPausable splits probes into those the overhead budget never
// pauses and those it may (Pausable).
func splitPausable(probes []ops.Probe) (cold, hot []ops.Probe) {
	for _, p := range probes {
		if ops.Pausable(p.Op) {
			hot = append(hot, p)
		} else {
			cold = append(cold, p)
		}
	}
	return cold, hot
}

// FileInfo is an attached, profiled library file and who maps it.
type FileInfo struct {
	Key    FileKey
	Lib    discover.Library
	PIDs   []int
	Paused bool
}

// Files returns the attached, profiled library files.
func (a *Attacher) Files() []FileInfo {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]FileInfo, 0, len(a.files))
	for key, f := range a.files {
		if profiled(f.target.Lib) {
			out = append(out, FileInfo{Key: key, Lib: f.target.Lib, PIDs: slices.Clone(f.target.PIDs), Paused: f.paused})
		}
	}
	return out
}

// SetPaused detaches (true) or re-attaches (false) the Pausable probes of
// an attached file: the duty cycle of the overhead budget. Detaching waits
// for RCU grace periods, so it happens outside the lock. A file no longer
// attached is not an error.
func (a *Attacher) SetPaused(key FileKey, paused bool) error {
	a.mu.Lock()
	f := a.files[key]
	if f == nil || f.paused == paused || a.closed {
		a.mu.Unlock()
		return nil
	}
	if paused {
		var closing []*uprobe.Links
		for _, ls := range f.sets {
			closing = append(closing, ls.hot[kindTimed], ls.hot[kindEntry])
			ls.hot = [2]*uprobe.Links{}
			for op, l := range ls.launches {
				if ops.Pausable(op) {
					closing = append(closing, l)
					delete(ls.launches, op)
				}
			}
		}
		f.paused = true
		a.mu.Unlock()
		for _, l := range closing {
			l.Close()
		}
		return nil
	}
	defer a.mu.Unlock()
	for pid, ls := range f.sets {
		for _, k := range []int{kindTimed, kindEntry} {
			_, hot := splitPausable(probesOfKind(f.rest, k))
			links, err := a.reattach(f, hot, pid)
			if err != nil {
				return fmt.Errorf("resume probes of %s: %w", f.target.Path, err)
			}
			ls.hot[k] = links
		}
		for op, lp := range f.launches {
			if lp.handed || !ops.Pausable(op) || ls.launches[op] != nil {
				continue
			}
			links, err := a.reattach(f, []ops.Probe{lp.probe}, pid)
			if err != nil {
				return fmt.Errorf("resume probes of %s: %w", f.target.Path, err)
			}
			if ls.launches == nil {
				ls.launches = map[ops.Op]*uprobe.Links{}
			}
			ls.launches[op] = links
		}
	}
	f.paused = false
	return nil
}

// reattach attaches probes of an already attached file again, with the
// symbols and offsets read at the first attach.
func (a *Attacher) reattach(f *attached, probes []ops.Probe, pid int) (*uprobe.Links, error) {
	ex, done, err := a.executable(f)
	if err != nil {
		return nil, err
	}
	defer done()
	links, _, err := a.linker.Link(a.set(ex, f.target, f.syms, f.id, pid), probes)
	return links, err
}

func requiredProbes(lib discover.Library, mode, profile string) int {
	n := 0
	for _, p := range ops.Probes(lib, mode, profile) {
		if !p.Optional {
			n++
		}
	}
	return n
}

// closeLinks detaches every probe of f.
func (f *attached) closeLinks() {
	for pid, ls := range f.sets {
		ls.close()
		delete(f.sets, pid)
	}
}

// marks reports whether f's runtime launches leave a marker with their op
// (PF_RT_MARK): while the file learns, and while some of its launch ops
// are counted at the driver, so the driver can tell the others'.
func (f *attached) marks() bool {
	return len(f.launches) > 0 && !f.settled
}

// Close detaches everything. The Attacher is unusable afterwards.
func (a *Attacher) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	// Files close in parallel: each detach waits for RCU grace periods,
	// and an agent that tracked hundreds of files would stop for minutes.
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
	return nil
}

// Counters are cumulative failure counts and the current attach state.
type Counters struct {
	// Failures by library and reason (profi_system_attach_failures_total).
	Failures map[[2]string]uint64
	// Attached library files by library (profi_system_discovery_attached_libraries).
	Attached map[discover.Library]int
	// TrackedPIDs are the processes, seen at the last scan, that map an attached library.
	TrackedPIDs []int
	// ScanProblems counts per-process procfs problems (malformed maps lines, unreadable files).
	ScanProblems uint64
	// LoadChecksSkipped counts library-load events not checked (rate limit);
	// those processes wait for the periodic rescan.
	LoadChecksSkipped uint64
	// Layers are what profi probes of each tracked process (Layers).
	Layers map[int][]Layer
	// TriggersCoalesced counts library-load triggers merged into a pass
	// already due or held back by MinTriggeredPassInterval.
	TriggersCoalesced uint64
	// LimitRefusals count the files the caps refused, each once while it
	// stays mapped, by limit (LimitFilesPerPID, LimitFiles).
	LimitRefusals map[string]uint64
	// CappedFiles are the files the caps refuse now.
	CappedFiles int
	// SwitchGaps are the entry-only gaps of link-set switches by library
	// (profi_system_probe_switch_gaps_total, ..._gap_seconds_total).
	SwitchGaps map[discover.Library]SwitchGaps
}

// Counters returns a copy of the counters.
func (a *Attacher) Counters() Counters {
	c := a.counters()
	c.Layers = Layers(a.Status())
	return c
}

func (a *Attacher) counters() Counters {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := Counters{Failures: map[[2]string]uint64{}, Attached: map[discover.Library]int{}, ScanProblems: a.scanProblems, LoadChecksSkipped: a.loadChecksSkipped.Load(), TriggersCoalesced: a.triggersCoalesced.Load()}
	for k, v := range a.counts {
		c.Failures[[2]string{k.lib, k.reason}] = v
	}
	c.LimitRefusals = maps.Clone(a.limitRefused)
	c.SwitchGaps = maps.Clone(a.gaps)
	c.CappedFiles = len(a.capped)
	pids := map[int]bool{}
	for _, f := range a.files {
		if !profiled(f.target.Lib) {
			continue // a hook, not a profiled library
		}
		c.Attached[f.target.Lib]++
		for _, p := range f.target.PIDs {
			pids[p] = true
		}
	}
	for p := range pids {
		c.TrackedPIDs = append(c.TrackedPIDs, p)
	}
	sort.Ints(c.TrackedPIDs)
	return c
}

// probedSymbols are the symbols any probe of lib may need: the global
// mode's and, for full-mode upgrades of single processes (reattach with
// the symbols read at attach), full mode's.
func probedSymbols(lib discover.Library, mode, profile string) []string {
	var names []string
	for _, m := range []string{mode, ops.KernelModeFull} {
		for _, p := range ops.Probes(lib, m, profile) {
			if !slices.Contains(names, p.Symbol) {
				names = append(names, p.Symbol)
			}
		}
	}
	return names
}
