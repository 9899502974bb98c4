package attach

import (
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"maps"
	"os"
	"slices"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/ops"
)

// One trap per runtime launch (issue 18, ARCHITECTURE.md "One trap
// per launch"). NVIDIA's runtime implements its launches with the driver's
// exported launch functions, which it resolves with cuGetProcAddress
// (ARCHITECTURE.md, "Counting a call once"), so a probed runtime launch
// costs two traps: its own and the driver's. While a
// runtime file learns, BPF records, for each driver launch a runtime launch
// made, which runtime op entered the driver at which return address
// (rt_sites) and whether every launch of each op got there (rt_ops). Once
// an op has reached the driver MinMerged times, never failed to, and shares
// none of its sites with another op, its sites go into rt_counted (the
// driver entry counts those launches under the runtime op) and its runtime
// probe is detached. It is attached again, before its sites are removed,
// when a process maps the runtime without a probed driver, or a site turns
// out to be shared. The decision is per runtime file and op, from what was
// observed: a runtime that launches some other way keeps its probes.

// MinMerged is how many launches of a runtime op must have reached the
// driver, all of them, before the driver counts that op. BPF's
// RT_MIN_MERGED, where one CPU reaching it wakes the handover
// (WatchLearning).
const MinMerged = uint64(bpfobj.ProfiRtHandoverRT_MIN_MERGED)

// HandoverMaps are the BPF maps of the handover; nil Counted disables it.
// They are the handover's handoverStore.
type HandoverMaps struct {
	Sites   *ebpf.Map // rt_sites, per CPU: learned by BPF
	Ops     *ebpf.Map // rt_ops, per CPU: learned by BPF
	Counted *ebpf.Map // rt_counted: written here
}

// The handover plugs into the attacher through two small interfaces, and
// owns only what it decides: which launch ops are handed over
// (launchProbe.handed), the rt_counted entries written for them
// (attached.counted), whether a file settled, and what released files
// learned. The links, the files and the runtime ranges stay the attacher's.

// handoverHost is what the handover needs from the attacher: the attached
// files, the processes' runtime ranges, and the links of one runtime
// launch probe.
// The Attacher implements it (handover_host.go).
type handoverHost interface {
	// attachedFiles are every attached file, driver and runtime. The
	// handover reads their targets (library, PIDs), ids, pause state and
	// launch probes, and writes their handover fields.
	attachedFiles() iter.Seq[*attached]
	// runtimeText reports whether pid's pid_files values carry its
	// runtime range, and which.
	runtimeText(pid uint32) (rtRange, bool)
	// linkLaunch attaches f's runtime launch probe of op again;
	// unlinkLaunch detaches it.
	linkLaunch(f *attached, op ops.Op) error
	unlinkLaunch(f *attached, op ops.Op)
	// putRuntimeText writes the pid_files values again, their handed flag as
	// attached.handedAny says now; it returns the writes that failed.
	putRuntimeText() (failed int)
}

// handoverStore is the handover's access to its BPF maps: what BPF
// learned (rt_ops, rt_sites) and the sites the driver counts (rt_counted).
type handoverStore interface {
	// learned reads rt_ops and rt_sites, summed over CPUs, by runtime file id.
	learned() (map[uint32]map[ops.Op]opStats, map[uint32]map[rtSite]siteOps, error)
	// count and uncount write and delete one rt_counted entry.
	count(k rtSite, op ops.Op) error
	uncount(k rtSite) error
	// forgetOp and forgetSite delete what BPF learned (gone already is fine).
	forgetOp(file uint32, op ops.Op)
	forgetSite(k rtSite)
}

// handover is the runtime->driver handover's state. Its methods are
// called with the Attacher's mu held.
type handover struct {
	store handoverStore // nil: no handover
	mode  string        // kernel mode
	log   *slog.Logger
	// learnedFiles is what released runtime files learned, by file (at
	// most maxLearnedFiles); releasedRT are the runtime files released
	// since the last sync, whose learning it keeps there.
	learnedFiles map[FileKey]*learnedFile
	learnSeq     uint64
	releasedRT   []*attached
}

// newHandover returns the handover over m (none when m.Counted is nil)
// for kernel mode mode.
func newHandover(m HandoverMaps, mode string, log *slog.Logger) *handover {
	h := &handover{mode: mode, log: log, learnedFiles: map[FileKey]*learnedFile{}}
	if m.Counted != nil {
		h.store = m
	}
	return h
}

type rtSite = bpfobj.ProfiRtSite

// launchProbe is one runtime launch op of a file that may be handed to
// the driver, with its own links in each link set (linkSet.launches) so
// that it detaches alone.
type launchProbe struct {
	probe  ops.Probe
	handed bool
}

// candidate reports whether t's runtime launches may be counted at
// the driver: a shared libcudart (a static runtime shares its range with
// the application, whose own driver launches must stay driver launches) in
// anonymous mode (full mode times launches at the runtime).
func (h *handover) candidate(t Target) bool {
	return h.store != nil && t.Lib == discover.LibCudart && !t.Static &&
		h.mode == ops.KernelModeAnonymous
}

// isHandoverProbe: an entry-only runtime launch probe (launch_entry).
func isHandoverProbe(p ops.Probe) bool {
	return p.Return == "" && ops.Info(p.Op).RuntimeLaunch()
}

// opStats is what rt_ops says of one runtime op, summed over CPUs.
type opStats struct {
	merged, unmerged, tails uint64
	tailOf                  ops.Op // valid when tails > 0
}

// siteOps is what rt_sites says of one site: the runtime ops seen there.
type siteOps struct {
	ops   map[ops.Op]bool
	mixed bool
}

// learned reads rt_ops and rt_sites, by runtime file id.
func (m HandoverMaps) learned() (map[uint32]map[ops.Op]opStats, map[uint32]map[rtSite]siteOps, error) {
	stats := map[uint32]map[ops.Op]opStats{}
	sites := map[uint32]map[rtSite]siteOps{}
	var (
		ok  bpfobj.ProfiRtOpKey
		ov  []bpfobj.ProfiRtOpVal
		sk  rtSite
		sv  []bpfobj.ProfiRtSiteVal
		err error
	)
	it := m.Ops.Iterate()
	for it.Next(&ok, &ov) {
		var s opStats
		for _, v := range ov {
			s.merged += v.Merged
			s.unmerged += v.Unmerged
			s.tails += v.Tails
			if v.TailOf != 0 {
				s.tailOf = ops.Op(v.TailOf - 1)
			}
		}
		if stats[ok.File] == nil {
			stats[ok.File] = map[ops.Op]opStats{}
		}
		stats[ok.File][ops.Op(ok.Op)] = s
	}
	if err = it.Err(); err != nil {
		return nil, nil, fmt.Errorf("read rt_ops: %w", err)
	}
	it = m.Sites.Iterate()
	for it.Next(&sk, &sv) {
		s := siteOps{ops: map[ops.Op]bool{}}
		for _, v := range sv {
			if v.Op != 0 {
				s.ops[ops.Op(v.Op-1)] = true
			}
			s.mixed = s.mixed || v.Mixed != 0
		}
		if sites[sk.File] == nil {
			sites[sk.File] = map[rtSite]siteOps{}
		}
		sites[sk.File][sk] = s
	}
	if err = it.Err(); err != nil {
		return nil, nil, fmt.Errorf("read rt_sites: %w", err)
	}
	return stats, sites, nil
}

func (m HandoverMaps) count(k rtSite, op ops.Op) error {
	return m.Counted.Update(&k, uint32(op), ebpf.UpdateAny)
}

func (m HandoverMaps) uncount(k rtSite) error { return m.Counted.Delete(&k) }

func (m HandoverMaps) forgetOp(file uint32, op ops.Op) {
	k := bpfobj.ProfiRtOpKey{File: file, Op: uint32(op)}
	_ = m.Ops.Delete(&k)
}

func (m HandoverMaps) forgetSite(k rtSite) { _ = m.Sites.Delete(&k) }

// handoverPlan is what decide wants for one file: the ops counted at the
// driver (with the sites they are counted at), and whether the file has
// settled: it stops learning, for good, because none of its launch ops can
// be handed over any more (each launches some other way or shares sites
// with another op).
type handoverPlan struct {
	handed  map[ops.Op]bool
	counted map[rtSite]ops.Op
	settled bool
	// tails are tail-jump targets: detached before the op that jumps to
	// them and attached after it, so the jump is never seen without its
	// caller's marker (it would count as itself).
	tails map[ops.Op]bool
}

// decide is the handover rule for one runtime file. probes are its
// runtime launch ops; driverOK: every process that maps it has a probed
// driver and its range in its pid_files values. Pure, for tests.
func decide(probes []ops.Op, stats map[ops.Op]opStats, sites map[rtSite]siteOps, driverOK bool) handoverPlan {
	plan := handoverPlan{handed: map[ops.Op]bool{}, counted: map[rtSite]ops.Op{}, tails: map[ops.Op]bool{}}
	own := map[ops.Op][]rtSite{} // the sites of each op; nil when one is shared
	shared := map[ops.Op]bool{}
	for k, s := range sites {
		for op := range s.ops {
			if len(s.ops) > 1 || s.mixed {
				shared[op] = true
				continue
			}
			own[op] = append(own[op], k)
		}
	}
	refused := map[ops.Op]bool{}
	for _, op := range probes {
		st := stats[op]
		switch {
		case st.unmerged > 0 || shared[op]:
			refused[op] = true
		case driverOK && st.merged >= MinMerged && len(own[op]) > 0:
			plan.handed[op] = true
		}
	}
	// A tail-jump target never called directly (CUDA 13's cudaLaunchKernel
	// under __cudaLaunchKernel) goes with the op that jumps to it: its
	// launches are that op's at the driver.
	for _, op := range probes {
		st := stats[op]
		if st.merged == 0 && st.unmerged == 0 && st.tails > 0 {
			plan.tails[op] = true
			if plan.handed[st.tailOf] {
				plan.handed[op] = true
			}
		}
	}
	for op := range plan.handed {
		for _, k := range own[op] {
			plan.counted[k] = op
		}
	}
	// The file settles only when every op is refused (a tail-jump target
	// with its caller): an op not seen yet may still be handed over, and
	// what the first launches show of one op says nothing of the others
	// (a process whose first launch is rejected, before its other ops ran:
	// TestOneTrapPerLaunchEveryAPI/--errors). A rule on what has been seen
	// so far, never on when a pass happens to look.
	plan.settled = len(probes) > 0
	for _, op := range probes {
		withCaller := plan.tails[op] && refused[stats[op].tailOf]
		if !refused[op] && !withCaller {
			plan.settled = false
		}
	}
	return plan
}

// sync applies decide to every candidate runtime file of host. Called
// from syncProcessMaps: after the new ranges are written (they carry the
// file id), before the new pid_files values (PF_RT_MARK follows the plan).
func (h *handover) sync(host handoverHost) {
	if h.store == nil {
		return
	}
	stats, sites, err := h.store.learned()
	if err != nil {
		h.log.Warn("runtime launches stay counted by their own probes", "err", err)
		return
	}
	drivers := map[int]bool{}
	for f := range host.attachedFiles() {
		if f.target.Lib == discover.LibCuda {
			for _, pid := range f.target.PIDs {
				drivers[pid] = true
			}
		}
	}
	live := map[uint32]bool{}
	for f := range host.attachedFiles() {
		if len(f.launches) == 0 {
			continue
		}
		live[f.id] = true
		if f.paused {
			continue // the duty cycle owns its probes now
		}
		driverOK := len(f.target.PIDs) > 0
		for _, pid := range f.target.PIDs {
			if r, ok := host.runtimeText(uint32(pid)); !ok || r.file != f.id || !drivers[pid] {
				driverOK = false
			}
		}
		st, si := withPrior(f, stats[f.id], sites[f.id])
		h.apply(host, f, decide(slices.Sorted(maps.Keys(f.launches)), st, si, driverOK))
	}
	for _, f := range h.releasedRT {
		h.remember(f, stats[f.id], sites[f.id])
	}
	h.releasedRT = nil
	h.forgetLearned(stats, sites, live)
}

// apply moves f to plan, keeping every launch counted exactly once: an
// op's sites go into rt_counted before its probe detaches (the probe's
// marker makes the driver skip the launches it counts meanwhile), and its
// probe attaches again before its sites go.
func (h *handover) apply(host handoverHost, f *attached, plan handoverPlan) {
	f.settled = plan.settled
	// Tail-jump targets detach before their callers and attach after them
	// (plan.tails): give lists them first, take last.
	var give, take []ops.Op
	for _, tails := range []bool{true, false} {
		for op, lp := range f.launches {
			if plan.tails[op] == tails && plan.handed[op] && !lp.handed {
				give = append(give, op)
			}
			if plan.tails[op] != tails && !plan.handed[op] && lp.handed {
				take = append(take, op)
			}
		}
	}
	taken := 0
	for _, op := range take {
		lp := f.launches[op]
		if err := host.linkLaunch(f, op); err != nil {
			h.log.Warn("could not attach a runtime launch probe again; the driver keeps counting its launches", "path", f.target.Path, "op", lp.probe.Symbol, "err", err)
			continue
		}
		lp.handed = false
		taken++
		h.log.Info("runtime launches counted by the runtime's probe again", "path", f.target.Path, "op", lp.probe.Symbol)
	}
	// Probes attached again: pid_files says at once, before any site goes,
	// whether ops are still handed over. Left "handed" until the next
	// pass, the driver would judge a launch at a site no longer counted
	// by its marker's liveness alone, which arm64 cannot prove without
	// frame records: counted twice (bpf/handover.h, driver_launch_op).
	if taken > 0 {
		if n := host.putRuntimeText(); n > 0 {
			h.log.Warn("could not update the pid_files map; runtime launches fall back to markers", "failures", n)
		}
	}
	// Sites: add the plan's, then remove those of ops no longer handed.
	for k, op := range plan.counted {
		if cur, ok := f.counted[k]; ok && cur == op {
			continue
		}
		if err := h.store.count(k, op); err != nil {
			h.log.Warn("could not write rt_counted; runtime launches stay counted by their own probes", "err", err)
			return
		}
		f.counted[k] = op
	}
	for k, op := range f.counted {
		if cur, ok := plan.counted[k]; ok && cur == op {
			continue
		}
		if lp := f.launches[op]; lp != nil && lp.handed {
			continue // could not attach it again: its sites stay
		}
		if err := h.store.uncount(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			h.log.Warn("could not delete from rt_counted", "err", err)
			continue
		}
		delete(f.counted, k)
	}
	// The driver looks rt_counted up only for a process whose pid_files
	// value says the file has ops handed over: set before any detaches.
	for _, op := range give {
		f.launches[op].handed = true
	}
	if len(give) > 0 {
		if n := host.putRuntimeText(); n > 0 {
			h.log.Warn("could not update the pid_files map; runtime launches fall back to markers", "failures", n)
		}
	}
	for _, op := range give {
		host.unlinkLaunch(f, op) // one by one, in order
		h.log.Info("runtime launches counted at the driver: one trap per launch", "path", f.target.Path, "op", f.launches[op].probe.Symbol)
	}
}

// handedAny reports whether some of f's launch ops are counted at the driver.
func (f *attached) handedAny() bool {
	for _, lp := range f.launches {
		if lp.handed {
			return true
		}
	}
	return false
}

// marks reports whether f's runtime launches leave a marker with their op
// (PF_RT_MARK): while the file learns, and while some of its launch ops
// are counted at the driver, so the driver can tell the others'.
func (f *attached) marks() bool {
	return len(f.launches) > 0 && !f.settled
}

// forgetLearned deletes what BPF learned of runtime files no longer attached.
func (h *handover) forgetLearned(stats map[uint32]map[ops.Op]opStats, sites map[uint32]map[rtSite]siteOps, live map[uint32]bool) {
	for file, m := range stats {
		if live[file] {
			continue
		}
		for op := range m {
			h.store.forgetOp(file, op)
		}
	}
	for file, m := range sites {
		if live[file] {
			continue
		}
		for k := range m {
			h.store.forgetSite(k)
		}
	}
}

// dropCounted deletes f's rt_counted entries (f is being released or
// failed to attach).
func (h *handover) dropCounted(f *attached) {
	for k := range f.counted {
		_ = h.store.uncount(k)
		delete(f.counted, k)
	}
}

// release is f's release: its rt_counted entries go now, what it learned
// is kept at the next sync.
func (h *handover) release(f *attached) {
	h.dropCounted(f)
	if len(f.launches) > 0 {
		h.releasedRT = append(h.releasedRT, f)
	}
}

// A runtime file's learning outlives its attachment (issue 33): batch jobs
// and evaluation scripts start a process, launch for a second and exit, so
// the file is released between them and attached again, under a new id,
// for the next. What BPF learned of it is kept by file, and a file
// attached again starts from it: the ops it handed over are never
// attached, their sites are in rt_counted before the process is known
// (attachFile), and its first launch costs one trap.

// maxLearnedFiles bounds the runtime files whose learning is kept after
// their release; the oldest is forgotten first.
const maxLearnedFiles = 256

// fileIdent tells a file from another that later has its device and inode
// (deleted and replaced): its size and change times, from fstat.
type fileIdent struct{ size, mtime, ctime int64 }

func identOf(f *os.File) fileIdent {
	var st unix.Stat_t
	if f == nil || unix.Fstat(int(f.Fd()), &st) != nil {
		return fileIdent{}
	}
	return fileIdent{st.Size, st.Mtim.Nano(), st.Ctim.Nano()}
}

// siteKey is an rt_sites key without its file id.
type siteKey struct {
	drvOp uint32
	off   uint64
}

// learnedFile is what BPF learned of one runtime file (rt_ops and
// rt_sites, summed over CPUs and over the file's attachments).
type learnedFile struct {
	ident fileIdent
	stats map[ops.Op]opStats
	sites map[siteKey]siteOps
	seq   uint64 // age, for eviction
}

func newLearned(ident fileIdent) *learnedFile {
	return &learnedFile{ident: ident, stats: map[ops.Op]opStats{}, sites: map[siteKey]siteOps{}}
}

// add adds file id's stats and sites (as learned() returns them).
func (l *learnedFile) add(stats map[ops.Op]opStats, sites map[rtSite]siteOps) {
	for op, s := range stats {
		cur := l.stats[op]
		cur.merged += s.merged
		cur.unmerged += s.unmerged
		if s.tails > 0 {
			cur.tailOf = s.tailOf
		}
		cur.tails += s.tails
		l.stats[op] = cur
	}
	for k, s := range sites {
		sk := siteKey{k.DrvOp, k.Off}
		cur, ok := l.sites[sk]
		if !ok {
			cur = siteOps{ops: map[ops.Op]bool{}}
		}
		for op := range s.ops {
			cur.ops[op] = true
		}
		cur.mixed = cur.mixed || s.mixed
		l.sites[sk] = cur
	}
}

// forFile is l as learned() would say it of file id.
func (l *learnedFile) forFile(id uint32) (map[ops.Op]opStats, map[rtSite]siteOps) {
	sites := make(map[rtSite]siteOps, len(l.sites))
	for k, s := range l.sites {
		sites[rtSite{File: id, DrvOp: k.drvOp, Off: k.off}] = s
	}
	return maps.Clone(l.stats), sites
}

// with is l plus file id's stats and sites, l unchanged.
func (l *learnedFile) with(id uint32, stats map[ops.Op]opStats, sites map[rtSite]siteOps) *learnedFile {
	n := newLearned(l.ident)
	n.add(l.forFile(id))
	n.add(stats, sites)
	return n
}

// withPrior is what decide sees of file f: what its earlier attachments
// learned (f.prior) plus what this one did.
func withPrior(f *attached, stats map[ops.Op]opStats, sites map[rtSite]siteOps) (map[ops.Op]opStats, map[rtSite]siteOps) {
	if f.prior == nil {
		return stats, sites
	}
	return f.prior.with(f.id, stats, sites).forFile(f.id)
}

// remember keeps what released file f learned (stats and sites of its id,
// with its prior).
func (h *handover) remember(f *attached, stats map[ops.Op]opStats, sites map[rtSite]siteOps) {
	base := f.prior
	if base == nil {
		base = newLearned(f.ident)
	}
	l := base.with(f.id, stats, sites)
	l.ident = f.ident
	if len(l.stats) == 0 {
		return // nothing learned: nothing to start from
	}
	h.learnSeq++
	l.seq = h.learnSeq
	h.learnedFiles[f.target.Key] = l
	for len(h.learnedFiles) > maxLearnedFiles {
		var oldest FileKey
		first := true
		for k, v := range h.learnedFiles {
			if first || v.seq < h.learnedFiles[oldest].seq {
				oldest, first = k, false
			}
		}
		delete(h.learnedFiles, oldest)
	}
}

// prior is what file f, attached again, starts from: the plan of
// what its earlier attachments learned, as if every process had a probed
// driver (sync decides with the real processes in the same pass,
// and takes back what they do not allow): the ops it hands over are marked
// handed, to be left unattached, and their sites are in rt_counted under
// f's id. Called before f's launch probes are linked.
func (h *handover) prior(f *attached) {
	l := h.learnedFiles[f.target.Key]
	if l == nil || l.ident != f.ident || f.ident == (fileIdent{}) || len(f.launches) == 0 {
		return
	}
	f.prior = l
	stats, sites := l.forFile(f.id)
	plan := decide(slices.Sorted(maps.Keys(f.launches)), stats, sites, true)
	f.settled = plan.settled
	if len(plan.handed) == 0 {
		return
	}
	for k, op := range plan.counted {
		if err := h.store.count(k, op); err != nil {
			h.log.Warn("could not write rt_counted; runtime launches stay counted by their own probes", "err", err)
			h.dropCounted(f)
			return
		}
		f.counted[k] = op
	}
	for op := range plan.handed {
		f.launches[op].handed = true
	}
}
