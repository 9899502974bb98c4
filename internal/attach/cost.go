package attach

import (
	"cmp"
	"log/slog"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/profi-dev/profi/internal/attach/uprobe"
	"github.com/profi-dev/profi/internal/ops"
	"github.com/profi-dev/profi/internal/status"
)

// What the links cost the node, and the caps on it (issue 47 items 2 and
// 4; docs/OPERATIONS.md, "Descriptors and teardown"). A link holds
// descriptors while it lives (uprobe.Links.Descriptors) and takes time to
// release: classic links one after the other in the kernel (its
// event_mutex), uprobe_multi links in parallel. The caps count every link
// the agent holds: each file's sets, the per-process sets of files a
// traced process maps, the full-mode upgrades and the links still being
// released. A new file whose links would go past a cap is not attached
// (LimitDescriptors, LimitTeardown), nor a per-process set; both are
// counted once and tried again at each pass.

// Limit labels of the link caps (profi_system_limit_refusals_total).
const (
	LimitDescriptors = "probe_descriptors"
	LimitTeardown    = "teardown"
)

// multiParallel is how many uprobe_multi releases the estimate takes to
// overlap: measured on 6.18, one link alone 32 ms, 160 links of 32 files
// released in parallel in 0.33 s, 2,560 of 512 files in 1.35 s (the
// estimate: 5.1 s; docs/OPERATIONS.md).
const multiParallel = 16

// LinkBudget is what the links cost now against the caps (/status
// probe_links, the profi_system_probe_* self metrics).
type LinkBudget = status.ProbeLinks

// MaxDescriptors is the descriptor cap of --max-probe-descriptors n: n,
// or for 0 three quarters of the agent's descriptor limit (RLIMIT_NOFILE,
// raised to its hard limit by Go at start), the rest left to everything
// else the agent opens (procfs, sockets, maps).
func MaxDescriptors(n int) int {
	if n > 0 {
		return n
	}
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil || lim.Cur == unix.RLIM_INFINITY {
		return 0
	}
	return int(min(lim.Cur/4*3, 1<<30))
}

// descriptors is what n links of the agent's kind hold.
func (a *Attacher) descriptors(n int) int {
	if a.opts.UprobeMulti {
		return n
	}
	return 2 * n
}

// teardown is the estimated time n links of the agent's kind take to go.
func (a *Attacher) teardown(n int) time.Duration {
	per := time.Duration(a.linkRelease.Load())
	if !a.opts.UprobeMulti {
		return time.Duration(n) * per
	}
	return time.Duration((n+multiParallel-1)/multiParallel) * per
}

// heldLinks counts every link held, those being released included.
// Called with a.mu held.
func (a *Attacher) heldLinks() int {
	n := int(a.releasing.Load())
	for _, f := range a.files {
		n += f.allLinks()
	}
	return n
}

// overLinkCap is the link cap that n more links for processes pids would
// go past, or "": within each cap's room anyone links; past it, a tenant
// below its guarantee (shares.go). Called with a.mu held.
func (a *Attacher) overLinkCap(n int, pids []int) string {
	if n == 0 {
		return ""
	}
	held := a.heldLinks()
	var links map[string]int
	below := func(guarantee int, units func(int) int) bool {
		if links == nil {
			links = a.linkHoldings()
		}
		for _, pid := range pids {
			if units(links[a.tenantOf(pid)]) < guarantee {
				return true
			}
		}
		return false
	}
	if !shareOf(a.opts.MaxDescriptors).admits(a.descriptors(held), a.descriptors(n), func(g int) bool { return below(g, a.descriptors) }) {
		return LimitDescriptors
	}
	if !shareOf(a.teardownLinks()).admits(held, n, func(g int) bool { return below(g, func(l int) int { return l }) }) {
		return LimitTeardown
	}
	return ""
}

// teardownLinks is how many links --max-teardown allows (at least one),
// from the time one takes to go; 0: no cap, or that time not known yet.
func (a *Attacher) teardownLinks() int {
	per := a.linkRelease.Load()
	if a.opts.MaxTeardown <= 0 || per <= 0 {
		return 0
	}
	n := int(int64(a.opts.MaxTeardown) / per)
	if a.opts.UprobeMulti {
		n *= multiParallel
	}
	return max(n, 1)
}

// estimateLinks is how many links one set of probes takes in a file that
// defines syms, at most: classic, one per probe and one per return probe;
// uprobe_multi, one per program and budget class, and each runtime launch
// probe of a handover candidate (apart: linked alone, handover.go) one.
// Known refusals are not linked.
func estimateLinks(probes []ops.Probe, syms map[string]uprobe.Func, multi, candidate bool) int {
	type group struct {
		prog   string
		hot    bool
		launch ops.Op
	}
	groups := map[group]bool{}
	n := 0
	for _, p := range probes {
		if fn, ok := syms[p.Symbol]; !ok || fn.Refused != nil {
			continue
		}
		if !multi {
			n++
			if p.Return != "" {
				n++
			}
			continue
		}
		g := group{prog: p.Entry, hot: ops.Pausable(p.Op)}
		if candidate && isHandoverProbe(p) {
			g.launch = p.Op
		}
		groups[g] = true
		if p.Return != "" {
			groups[group{prog: p.Return, hot: g.hot}] = true
		}
	}
	return n + len(groups)
}

// setLinks is how many links one more set of f's probes takes: as many as
// a set it has, else the estimate.
func (a *Attacher) setLinks(f *attached) int {
	for _, s := range f.sets {
		if n := s.Len(); n > 0 {
			return n
		}
	}
	return estimateLinks(f.probes, f.syms, a.opts.UprobeMulti, f.launches != nil)
}

// refuseLinks counts and logs one refusal of a link cap, once per key
// while it holds, and keeps the links it would take (so that a refused
// file is not opened again while they still do not fit).
func (a *Attacher) refuseLinks(key capKey, links int, limit string, attrs ...any) {
	_, was := a.linkCapped[key]
	a.linkCapped[key] = links
	if was {
		return
	}
	a.limitRefused[limit]++
	a.log.Warn("probes not linked: a link cap was reached", append(attrs, slog.String("limit", limit),
		slog.Int("links", links), slog.Int("links_held", a.heldLinks()), slog.Int("max_descriptors", a.opts.MaxDescriptors),
		slog.Duration("max_teardown", a.opts.MaxTeardown), slog.Duration("link_release", time.Duration(a.linkRelease.Load())))...)
}

// capKey is a file, one process's set of it (pid > 0) or one process's
// full-mode upgrade of it (upgrade), refused by a link cap.
type capKey struct {
	file    FileKey
	pid     int
	upgrade bool
}

// released records a batch of links released: its time, and, from it, the
// time per link (classic links go one at a time; a uprobe_multi batch's
// links overlap, so only batches of one say what one costs).
func (a *Attacher) released(links int, took time.Duration) {
	a.lastRelease.Store(&releaseRecord{links: links, took: took})
	if links == 0 || a.opts.UprobeMulti && links > 1 {
		return
	}
	per := int64(took) / int64(links)
	old := a.linkRelease.Load()
	if old == 0 {
		a.linkRelease.Store(per)
		return
	}
	a.linkRelease.Store((3*old + per) / 4)
}

type releaseRecord struct {
	links int
	took  time.Duration
}

// closeSetLater releases a set a failed attach linked, in the
// background (a classic set takes seconds to go: release.go), counted as
// releasing until it is gone.
func (a *Attacher) closeSetLater(ls *linkSet) {
	n := ls.Len()
	if n == 0 {
		return
	}
	a.releasing.Add(int64(n))
	a.closing.Go(func() {
		ls.close()
		a.releasing.Add(-int64(n))
	})
}

// linkBudget is what the links cost now against the caps, with each
// tenant's share if tenants (/status; not for each scrape). Called with
// a.mu held.
func (a *Attacher) linkBudget(tenants bool) LinkBudget {
	held := a.heldLinks()
	b := LinkBudget{
		Links: held, Descriptors: a.descriptors(held), Releasing: int(a.releasing.Load()),
		MaxDescriptors: a.opts.MaxDescriptors, MaxTeardownSeconds: a.opts.MaxTeardown.Seconds(),
		LinkReleaseSeconds: time.Duration(a.linkRelease.Load()).Seconds(), TeardownSeconds: a.teardown(held).Seconds(),
	}
	if r := a.lastRelease.Load(); r != nil {
		b.LastRelease = &status.LinkRelease{Links: r.links, Seconds: r.took.Seconds()}
	}
	if !tenants {
		return b
	}
	files := a.held().tenants()
	for tn, n := range a.linkHoldings() {
		b.Tenants = append(b.Tenants, status.TenantLinks{Tenant: tn, Files: files[tn], Links: n, Descriptors: a.descriptors(n)})
	}
	slices.SortFunc(b.Tenants, func(x, y status.TenantLinks) int {
		return cmp.Or(cmp.Compare(y.Descriptors, x.Descriptors), cmp.Compare(x.Tenant, y.Tenant))
	})
	return b
}
