package attach

import (
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"maps"
	"slices"
	"testing"

	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/ops"
)

// TestDecide is the handover rule against an explicit table of what BPF
// learned (rt_ops, rt_sites) and what must be handed to the driver.
func TestDecide(t *testing.T) {
	var (
		launch = ops.OpCudaLaunchKernel
		ptsz   = ops.OpCudaLaunchKernelPtsz
		handle = ops.OpCudaLaunchKernelHandle
		exc    = ops.OpCudaLaunchKernelExC
	)
	site := func(off uint64, drv ops.Op) rtSite { return rtSite{File: 1, DrvOp: uint32(drv), Off: off} }
	one := func(op ops.Op) siteOps { return siteOps{ops: map[ops.Op]bool{op: true}} }
	probes := []ops.Op{launch, ptsz, handle, exc}
	tests := []struct {
		name     string
		probes   []ops.Op // nil: launch, ptsz, handle, exc
		stats    map[ops.Op]opStats
		sites    map[rtSite]siteOps
		driverOK bool
		handed   []ops.Op
		counted  int
		settled  bool
	}{
		{name: "nothing seen"},
		{
			name:     "every launch reached the driver at its own site",
			stats:    map[ops.Op]opStats{launch: {merged: MinMerged}, ptsz: {merged: 40}},
			sites:    map[rtSite]siteOps{site(0x10, ops.OpCuLaunchKernel): one(launch), site(0x10, ops.OpCuLaunchKernelPtsz): one(ptsz)},
			driverOK: true,
			handed:   []ops.Op{launch, ptsz},
			counted:  2,
		},
		{
			name:     "too few launches yet",
			stats:    map[ops.Op]opStats{launch: {merged: MinMerged - 1}},
			sites:    map[rtSite]siteOps{site(0x10, ops.OpCuLaunchKernel): one(launch)},
			driverOK: true,
		},
		{
			name:     "a process without a probed driver",
			stats:    map[ops.Op]opStats{launch: {merged: 100}},
			sites:    map[rtSite]siteOps{site(0x10, ops.OpCuLaunchKernel): one(launch)},
			driverOK: false,
		},
		{
			name:     "one launch never reached the driver",
			stats:    map[ops.Op]opStats{launch: {merged: 100, unmerged: 1}, exc: {merged: 20}},
			sites:    map[rtSite]siteOps{site(0x10, ops.OpCuLaunchKernel): one(launch), site(0x20, ops.OpCuLaunchKernelEx): one(exc)},
			driverOK: true,
			handed:   []ops.Op{exc},
			counted:  1,
		},
		{
			name:     "another op still learning: not settled",
			stats:    map[ops.Op]opStats{launch: {unmerged: 1}, exc: {merged: 3}},
			sites:    map[rtSite]siteOps{site(0x20, ops.OpCuLaunchKernelEx): one(exc)},
			driverOK: true,
		},
		{
			name:     "one op launches some other way, the others not seen yet: not settled",
			stats:    map[ops.Op]opStats{launch: {unmerged: 1}},
			driverOK: true,
		},
		{
			name:     "a runtime whose every op launches some other way settles",
			stats:    map[ops.Op]opStats{launch: {unmerged: 100}, ptsz: {unmerged: 1, merged: 50}, handle: {unmerged: 2}, exc: {unmerged: 3}},
			driverOK: true,
			settled:  true,
		},
		{
			name:   "a site two ops share",
			probes: []ops.Op{launch, handle},
			stats:  map[ops.Op]opStats{launch: {merged: 100}, handle: {merged: 100}},
			sites: map[rtSite]siteOps{
				site(0x10, ops.OpCuLaunchKernel): {ops: map[ops.Op]bool{launch: true, handle: true}},
			},
			driverOK: true,
			settled:  true,
		},
		{
			name:     "a site marked mixed",
			probes:   []ops.Op{launch},
			stats:    map[ops.Op]opStats{launch: {merged: 100}},
			sites:    map[rtSite]siteOps{site(0x10, ops.OpCuLaunchKernel): {ops: map[ops.Op]bool{launch: true}, mixed: true}},
			driverOK: true,
			settled:  true,
		},
		{
			name: "CUDA 13: the tail-jump target goes with __cudaLaunchKernel",
			stats: map[ops.Op]opStats{
				handle: {merged: 100},
				launch: {tails: 100, tailOf: handle},
			},
			sites:    map[rtSite]siteOps{site(0x10, ops.OpCuLaunchKernel): one(handle)},
			driverOK: true,
			handed:   []ops.Op{launch, handle},
			counted:  1,
		},
		{
			name:   "a tail-jump target also called directly stays",
			probes: []ops.Op{launch, handle},
			stats: map[ops.Op]opStats{
				handle: {merged: 100},
				launch: {merged: 5, tails: 100, tailOf: handle},
			},
			sites: map[rtSite]siteOps{
				site(0x10, ops.OpCuLaunchKernel): {ops: map[ops.Op]bool{launch: true, handle: true}},
			},
			driverOK: true,
			settled:  true,
		},
		{
			name:   "a tail-jump target settles with its refused caller",
			probes: []ops.Op{launch, handle},
			stats: map[ops.Op]opStats{
				handle: {merged: 100, unmerged: 1},
				launch: {tails: 100, tailOf: handle},
			},
			sites:    map[rtSite]siteOps{site(0x10, ops.OpCuLaunchKernel): one(handle)},
			driverOK: true,
			settled:  true,
		},
		{
			name: "a tail-jump target whose caller is not handed stays",
			stats: map[ops.Op]opStats{
				handle: {merged: 3},
				launch: {tails: 3, tailOf: handle},
			},
			sites:    map[rtSite]siteOps{site(0x10, ops.OpCuLaunchKernel): one(handle)},
			driverOK: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.probes
			if p == nil {
				p = probes
			}
			plan := decide(p, tc.stats, tc.sites, tc.driverOK)
			got := slices.Sorted(maps.Keys(plan.handed))
			want := slices.Sorted(slices.Values(tc.handed))
			if !slices.Equal(got, want) {
				t.Errorf("handed %v, want %v", got, want)
			}
			if len(plan.counted) != tc.counted {
				t.Errorf("counted sites %v, want %d", plan.counted, tc.counted)
			}
			if plan.settled != tc.settled {
				t.Errorf("settled %v, want %v", plan.settled, tc.settled)
			}
			for k, op := range plan.counted {
				if !tc.sites[k].ops[op] {
					t.Errorf("site %+v counted as %v, learned %v", k, op, tc.sites[k].ops)
				}
			}
		})
	}
}

// What a released runtime file learned is kept by file and adds up over its
// attachments (issue 33): a file attached again under a new id decides as
// if it had learned everything itself, and a replaced file (another
// identity) starts from nothing.
func TestLearnedOutlivesRelease(t *testing.T) {
	launch, ptsz := ops.OpCudaLaunchKernel, ops.OpCudaLaunchKernelPtsz
	key := FileKey{Dev: 1, Inode: 2}
	a := New(Options{})
	first := &attached{id: 1, target: Target{Key: key}, ident: fileIdent{size: 10, mtime: 1, ctime: 1}}
	a.ho.remember(first,
		map[ops.Op]opStats{launch: {merged: 10}, ptsz: {merged: MinMerged}},
		map[rtSite]siteOps{{File: 1, DrvOp: uint32(ops.OpCuLaunchKernel), Off: 0x10}: {ops: map[ops.Op]bool{launch: true}},
			{File: 1, DrvOp: uint32(ops.OpCuLaunchKernelPtsz), Off: 0x20}: {ops: map[ops.Op]bool{ptsz: true}}})
	second := &attached{id: 7, target: Target{Key: key}, ident: first.ident, prior: a.ho.learnedFiles[key]}
	st, si := withPrior(second, map[ops.Op]opStats{launch: {merged: MinMerged - 10}}, nil)
	plan := decide([]ops.Op{launch, ptsz}, st, si, true)
	if !plan.handed[launch] || !plan.handed[ptsz] || len(plan.counted) != 2 {
		t.Fatalf("plan %+v, want both ops handed at 2 sites", plan)
	}
	for k := range plan.counted {
		if k.File != 7 {
			t.Errorf("site %+v keyed by file %d, want the new id 7", k, k.File)
		}
	}
	a.ho.remember(second, map[ops.Op]opStats{launch: {merged: MinMerged - 10}}, nil)
	if got := a.ho.learnedFiles[key].stats[launch].merged; got != MinMerged {
		t.Errorf("kept %d merged launches, want %d (10 + %d)", got, MinMerged, MinMerged-10)
	}
	if got := a.ho.learnedFiles[key].stats[ptsz].merged; got != MinMerged {
		t.Errorf("kept %d merged ptsz launches, want %d", got, MinMerged)
	}
	replaced := &attached{id: 8, target: Target{Key: key}, ident: fileIdent{size: 11, mtime: 2, ctime: 2},
		launches: map[ops.Op]*launchProbe{launch: {}}}
	a.ho.prior(replaced)
	if replaced.prior != nil || replaced.launches[launch].handed {
		t.Errorf("a replaced file started from its predecessor's learning")
	}
}

// handoverLog records, in order, what the handover did through its two
// interfaces.
type handoverLog []string

func (l *handoverLog) add(format string, args ...any) { *l = append(*l, fmt.Sprintf(format, args...)) }

// take returns the calls since the last take.
func (l *handoverLog) take() []string {
	got := *l
	*l = nil
	return got
}

// fakeHost is an attacher for the handover: files, runtime ranges and links as
// plain values; linking fails with linkErr.
type fakeHost struct {
	log     *handoverLog
	files   []*attached
	text    map[uint32]rtRange
	linkErr error
}

func (h *fakeHost) attachedFiles() iter.Seq[*attached] { return slices.Values(h.files) }

func (h *fakeHost) runtimeText(pid uint32) (rtRange, bool) {
	r, ok := h.text[pid]
	return r, ok
}

func (h *fakeHost) linkLaunch(f *attached, op ops.Op) error {
	if h.linkErr != nil {
		h.log.add("link %d %s failed", f.id, f.launches[op].probe.Symbol)
		return h.linkErr
	}
	h.log.add("link %d %s", f.id, f.launches[op].probe.Symbol)
	return nil
}

func (h *fakeHost) unlinkLaunch(f *attached, op ops.Op) {
	h.log.add("unlink %d %s", f.id, f.launches[op].probe.Symbol)
}

func (h *fakeHost) putRuntimeText() int {
	for _, f := range h.files {
		if len(f.launches) > 0 {
			h.log.add("pid_files %d handed=%v", f.id, f.handedAny())
		}
	}
	return 0
}

// fakeStore is rt_ops and rt_sites as BPF would have learned them, and
// rt_counted.
type fakeStore struct {
	log     *handoverLog
	stats   map[uint32]map[ops.Op]opStats
	sites   map[uint32]map[rtSite]siteOps
	counted map[rtSite]ops.Op
}

func (s *fakeStore) learned() (map[uint32]map[ops.Op]opStats, map[uint32]map[rtSite]siteOps, error) {
	return s.stats, s.sites, nil
}

func (s *fakeStore) count(k rtSite, op ops.Op) error {
	s.log.add("count %d/%#x", k.File, k.Off)
	s.counted[k] = op
	return nil
}

func (s *fakeStore) uncount(k rtSite) error {
	s.log.add("uncount %d/%#x", k.File, k.Off)
	delete(s.counted, k)
	return nil
}

func (s *fakeStore) forgetOp(file uint32, op ops.Op) {
	s.log.add("forget op %d", file)
	delete(s.stats[file], op)
}

func (s *fakeStore) forgetSite(k rtSite) {
	s.log.add("forget site %d/%#x", k.File, k.Off)
	delete(s.sites[k.File], k)
}

// TestHandoverOrder drives the handover through fakes of the attacher and
// of its BPF maps, and checks the order the BPF side relies on: an op's
// sites are in rt_counted and the pid_files values say "handed" before its probe
// detaches; its probe is attached again before its sites go; a probe that
// cannot be attached again keeps its sites. A released file's learning is
// kept (and forgotten in BPF), and its next attachment starts handed over.
func TestHandoverOrder(t *testing.T) {
	launch, ptsz := ops.OpCudaLaunchKernel, ops.OpCudaLaunchKernelPtsz
	key := FileKey{Dev: 1, Inode: 2}
	ident := fileIdent{size: 10, mtime: 1, ctime: 1}
	newRuntime := func(id uint32) *attached {
		return &attached{id: id, ident: ident,
			target: Target{Key: key, Lib: discover.LibCudart, PIDs: []int{100}},
			launches: map[ops.Op]*launchProbe{
				launch: {probe: ops.Probe{Symbol: "cudaLaunchKernel", Op: launch}},
				ptsz:   {probe: ops.Probe{Symbol: "cudaLaunchKernel_ptsz", Op: ptsz}},
			},
			counted: map[rtSite]ops.Op{}}
	}
	rt := newRuntime(1)
	drv := &attached{id: 2, target: Target{Key: FileKey{Dev: 1, Inode: 3}, Lib: discover.LibCuda, PIDs: []int{100}}}
	var log handoverLog
	launchSite := rtSite{File: 1, DrvOp: uint32(ops.OpCuLaunchKernel), Off: 0x10}
	ptszSite := rtSite{File: 1, DrvOp: uint32(ops.OpCuLaunchKernelPtsz), Off: 0x20}
	store := &fakeStore{log: &log,
		// launch has reached the driver often enough; ptsz still learns.
		stats: map[uint32]map[ops.Op]opStats{1: {launch: {merged: MinMerged}, ptsz: {merged: 3}}},
		sites: map[uint32]map[rtSite]siteOps{1: {
			launchSite: {ops: map[ops.Op]bool{launch: true}},
			ptszSite:   {ops: map[ops.Op]bool{ptsz: true}},
		}},
		counted: map[rtSite]ops.Op{}}
	host := &fakeHost{log: &log, files: []*attached{rt, drv}, text: map[uint32]rtRange{100: {file: 1}}}
	h := &handover{store: store, mode: ops.KernelModeAnonymous, log: slog.New(slog.DiscardHandler),
		learnedFiles: map[FileKey]*learnedFile{}}

	step := func(name string, want ...string) {
		t.Helper()
		if got := log.take(); !slices.Equal(got, want) {
			t.Errorf("%s: calls\n  %q\nwant\n  %q", name, got, want)
		}
	}

	h.sync(host)
	step("hand over", "count 1/0x10", "pid_files 1 handed=true", "unlink 1 cudaLaunchKernel")
	if !rt.launches[launch].handed || rt.launches[ptsz].handed || !maps.Equal(store.counted, map[rtSite]ops.Op{launchSite: launch}) {
		t.Fatalf("after hand over: handed %v/%v, rt_counted %v", rt.launches[launch].handed, rt.launches[ptsz].handed, store.counted)
	}
	h.sync(host)
	step("nothing new")

	// The process loses its runtime range (a process without a probed
	// driver would do the same): the driver can no longer count the op.
	delete(host.text, 100)
	host.linkErr = errors.New("no link")
	h.sync(host)
	step("take back, link fails", "link 1 cudaLaunchKernel failed")
	if !rt.launches[launch].handed || store.counted[launchSite] != launch {
		t.Fatalf("a probe that could not be attached again lost its sites: handed %v, rt_counted %v", rt.launches[launch].handed, store.counted)
	}
	host.linkErr = nil
	h.sync(host)
	step("take back", "link 1 cudaLaunchKernel", "pid_files 1 handed=false", "uncount 1/0x10")
	if rt.launches[launch].handed || len(store.counted) != 0 {
		t.Fatalf("after take back: handed %v, rt_counted %v", rt.launches[launch].handed, store.counted)
	}
	host.text[100] = rtRange{file: 1}
	h.sync(host)
	step("hand over again", "count 1/0x10", "pid_files 1 handed=true", "unlink 1 cudaLaunchKernel")

	// Release: rt_counted at once; the learning at the next pass, which
	// forgets it in BPF.
	h.release(rt)
	step("release", "uncount 1/0x10")
	host.files = []*attached{drv}
	h.sync(host)
	got := log.take()
	slices.Sort(got)
	if want := []string{"forget op 1", "forget op 1", "forget site 1/0x10", "forget site 1/0x20"}; !slices.Equal(got, want) {
		t.Errorf("after release: calls %q, want %q", got, want)
	}
	if l := h.learnedFiles[key]; l == nil || l.stats[launch].merged != MinMerged || l.stats[ptsz].merged != 3 {
		t.Fatalf("learning not kept: %+v", h.learnedFiles[key])
	}

	// Attached again under a new id: launch starts handed over, its site
	// keyed by the new id, before any probe is linked.
	again := newRuntime(3)
	h.prior(again)
	step("attached again", "count 3/0x10")
	if !again.launches[launch].handed || again.launches[ptsz].handed {
		t.Errorf("attached again: handed %v/%v, want launch only", again.launches[launch].handed, again.launches[ptsz].handed)
	}
}
