package attach

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/ops"
	"github.com/profi-dev/profi/internal/status"
	"github.com/profi-dev/profi/internal/testutil"
)

// copies writes n copies of src (n distinct files, as n container images
// each carrying the runtime are).
func copies(t *testing.T, src string, n int) []string {
	t.Helper()
	dir := t.TempDir()
	var out []string
	for i := range n {
		p := filepath.Join(dir, fmt.Sprintf("%d", i), "libcudart.so.12")
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := testutil.CopyFile(src, p); err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

// linkObjects loads the objects for uprobe_multi links where the kernel
// has them (a classic runtime file takes 11 s to release: release.go),
// else for classic uprobes.
func linkObjects(t *testing.T) *bpfobj.Objects {
	t.Helper()
	skipShort(t)
	testutil.RequireBPF(t)
	o, err := bpfobj.Load(bpfobj.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = o.Close() })
	return o
}

// perDescriptors is how many descriptors one link of o's kind holds.
func perDescriptors(o *bpfobj.Objects) int {
	if o.UprobeMulti {
		return 1
	}
	return 2
}

// teardownUnits is how many link release times n links of o's kind are
// estimated to take: classic links one after the other, uprobe_multi
// links multiParallel at a time (docs/OPERATIONS.md, "Descriptors and
// teardown").
func teardownUnits(o *bpfobj.Objects, n int) int {
	if o.UprobeMulti {
		return (n + 15) / 16
	}
	return n
}

// attachedPaths are the paths of a's attached files, in order.
func attachedPaths(a *Attacher) []string {
	var out []string
	for _, l := range a.Status().Attached {
		out = append(out, l.Path)
	}
	slices.Sort(out)
	return out
}

// The link caps (issue 47 items 2 and 4; cost.go): one runtime file's
// links, their descriptors as the kernel counts them and the estimate the
// caps use agree; four copies under a cap of two
// and a half files' descriptors, or teardown time, get two attached and
// two refused, each counted once; once a file's links are released, the
// next pass attaches one more.
func TestLinkCaps(t *testing.T) {
	o := linkObjects(t)
	fd := perDescriptors(o)
	fx := fixtures(t)
	paths := copies(t, fx.Cudart, 4)
	targets := func(ps []string) []Target {
		var out []Target
		for _, p := range ps {
			out = append(out, fileTarget(t, discover.LibCudart, p, []int{os.Getpid()}, new(atomic.Int32)))
		}
		return out
	}
	base := Options{Programs: o.Programs(), KernelMode: ops.KernelModeAnonymous, PID: os.Getpid(), UprobeMulti: o.UprobeMulti}

	one := New(base)
	before := fdCount(t)
	tg := targets(paths[:1])
	one.Sync(tg)
	b := one.Status().ProbeLinks
	per := b.Links
	f := one.files[tg[0].Key]
	if f == nil || per == 0 {
		t.Fatalf("one file: not attached (%d links): %+v", per, one.Status().Failed)
	}
	if est := estimateLinks(one.probes(discover.LibCudart, ops.KernelModeAnonymous), f.syms, o.UprobeMulti, false); est != per {
		t.Errorf("estimate %d links, linked %d", est, per)
	}
	if used := fdCount(t) - before; used != fd*per || b.Descriptors != used {
		t.Errorf("one file: %d descriptors counted, %d opened, want both %d", b.Descriptors, used, fd*per)
	}
	t.Logf("uprobe_multi %v: one runtime file, %d links", o.UprobeMulti, per)
	_ = one.Close()

	for _, tc := range []struct {
		name, limit string
		caps        Options
		fit         int
	}{
		// Caps of two and a half files: their room (seven eighths,
		// shares.go) holds two, the third would go past the cap.
		{"descriptors", LimitDescriptors, Options{MaxDescriptors: fd * (2*per + per/2)}, 2},
		{"teardown", LimitTeardown, Options{MaxTeardown: time.Duration(teardownUnits(o, 2*per+per/2)) * time.Second, LinkRelease: time.Second}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := base
			opts.MaxDescriptors, opts.MaxTeardown, opts.LinkRelease = tc.caps.MaxDescriptors, tc.caps.MaxTeardown, tc.caps.LinkRelease
			a := New(opts)
			defer a.Close()
			for pass := range 2 {
				a.Sync(targets(paths))
				c := a.Counters()
				if got, want := attachedPaths(a), paths[:tc.fit]; !slices.Equal(got, want) {
					t.Errorf("pass %d: attached %v, want %v", pass, got, want)
				}
				refused := uint64(len(paths) - tc.fit)
				if c.LimitRefusals[tc.limit] != refused || c.CappedFiles != int(refused) || c.Links.Links != tc.fit*per {
					t.Errorf("pass %d: refusals %v, %d capped, %d links; want %d at %s, %d, %d", pass, c.LimitRefusals, c.CappedFiles, c.Links.Links, refused, tc.limit, refused, tc.fit*per)
				}
			}
			if tc.limit != LimitDescriptors {
				return // a release refines the measured time per link: the teardown cap moves
			}
			a.Sync(targets(paths[1:])) // the first file goes; its links are releasing
			a.closing.Wait()
			a.Sync(targets(paths[1:]))
			if got, want := attachedPaths(a), paths[1:3]; !slices.Equal(got, want) {
				t.Errorf("after a release: attached %v, want %v", got, want)
			}
			c := a.Counters()
			if c.LimitRefusals[tc.limit] != 2 || c.CappedFiles != 1 {
				t.Errorf("after a release: refusals %v, %d capped; want 2 (none again), 1", c.LimitRefusals, c.CappedFiles)
			}
			if r := c.Links.LastRelease; r == nil || r.Links != per {
				t.Errorf("last release %+v, want %d links", r, per)
			}
		})
	}
}

// A file a traced process maps gets one link set per probed process
// (traced.go): each costs a whole set, so the caps count them. Under a cap
// of one and a half sets the second process's set is refused, counted
// once and shown as unprobed for that reason; when that process goes, so
// does the refusal.
func TestLinkCapPerProcessSets(t *testing.T) {
	o := linkObjects(t)
	fd := perDescriptors(o)
	fx := fixtures(t)
	path := copies(t, fx.Cudart, 1)[0]
	probe := New(Options{Programs: o.Programs(), KernelMode: ops.KernelModeAnonymous, PID: os.Getpid(), UprobeMulti: o.UprobeMulti})
	probe.Sync([]Target{fileTarget(t, discover.LibCudart, path, []int{os.Getpid()}, new(atomic.Int32))})
	per := probe.Status().ProbeLinks.Links
	_ = probe.Close()

	child := exec.Command("sleep", "60")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
	const traced = 1 << 30 // a pid never probed: no link is made for it
	a := New(Options{Programs: o.Programs(), KernelMode: ops.KernelModeAnonymous, ExcludeTraced: true, MaxDescriptors: fd * (per + per/2), UprobeMulti: o.UprobeMulti})
	defer a.Close()
	tg := fileTarget(t, discover.LibCudart, path, []int{traced, os.Getpid(), child.Process.Pid}, new(atomic.Int32))
	tg.Tracers = map[int]int{traced: 1}
	for range 2 {
		a.Sync([]Target{tg})
	}
	probed := min(os.Getpid(), child.Process.Pid)
	refused := max(os.Getpid(), child.Process.Pid)
	st := a.Status()
	if len(st.Attached) != 1 {
		t.Fatalf("attached %d files, want 1: %+v", len(st.Attached), st.Failed)
	}
	l := st.Attached[0]
	want := []Unprobed{{PID: traced, Reason: ReasonTraced, TracerPID: 1}, {PID: refused, Reason: ReasonLinkCap}}
	if !slices.Equal(l.ProbedPIDs, []int{probed}) || !slices.Equal(l.Unprobed, want) {
		t.Errorf("probed %v, unprobed %+v; want [%d], %+v", l.ProbedPIDs, l.Unprobed, probed, want)
	}
	if c := a.Counters(); c.LimitRefusals[LimitDescriptors] != 1 || c.Links.Links != per || c.CappedFiles != 0 {
		t.Errorf("refusals %v, %d links, %d files capped; want 1 at %s, %d, 0", c.LimitRefusals, c.Links.Links, c.CappedFiles, LimitDescriptors, per)
	}
	tg.PIDs = []int{traced, probed}
	a.Sync([]Target{tg})
	if l := a.Status().Attached[0]; len(l.Unprobed) != 1 || len(a.linkCapped) != 0 {
		t.Errorf("after the refused process left: unprobed %+v, %d refusals held; want the traced one, 0", l.Unprobed, len(a.linkCapped))
	}
}

// The link caps are shared like the file cap (shares.go): under a cap of
// eight files' descriptors a hostile tenant mapping ten copies gets the
// room, seven, and a victim tenant started after it, holding nothing, its
// file from the reserve (the eighth).
func TestLinkCapReserve(t *testing.T) {
	o := linkObjects(t)
	fd := perDescriptors(o)
	fx := fixtures(t)
	paths := copies(t, fx.Cudart, 11)
	const hostile, victim = 1<<30 + 1, 1<<30 + 2 // tenants only: the links filter on this process
	probe := New(Options{Programs: o.Programs(), KernelMode: ops.KernelModeAnonymous, PID: os.Getpid(), UprobeMulti: o.UprobeMulti})
	probe.Sync([]Target{fileTarget(t, discover.LibCudart, paths[10], []int{os.Getpid()}, new(atomic.Int32))})
	per := probe.Status().ProbeLinks.Links
	_ = probe.Close()
	a := New(Options{Programs: o.Programs(), KernelMode: ops.KernelModeAnonymous, PID: os.Getpid(), UprobeMulti: o.UprobeMulti,
		MaxDescriptors: 8 * fd * per, TenantOf: func(pid int) string { return map[int]string{hostile: "pod:hostile", victim: "pod:victim"}[pid] }})
	defer a.Close()
	var tg []Target
	for _, p := range paths[:9] {
		tg = append(tg, fileTarget(t, discover.LibCudart, p, []int{hostile}, new(atomic.Int32)))
	}
	a.Sync(tg)
	tg = append(tg, fileTarget(t, discover.LibCudart, paths[9], []int{victim}, new(atomic.Int32)))
	a.Sync(tg)
	if got, want := attachedPaths(a), append(slices.Clone(paths[:7]), paths[9]); !slices.Equal(got, want) {
		t.Errorf("attached %v, want %v (the hostile's first seven, the victim's)", got, want)
	}
	if c := a.Counters(); c.LimitRefusals[LimitDescriptors] != 2 || c.Links.Descriptors != 8*fd*per {
		t.Errorf("refusals %v, %d descriptors; want 2 at %s, %d", c.LimitRefusals, c.Links.Descriptors, LimitDescriptors, 8*fd*per)
	}
	want := []status.TenantLinks{
		{Tenant: "pod:hostile", Files: 7, Links: 7 * per, Descriptors: 7 * per * fd},
		{Tenant: "pod:victim", Files: 1, Links: per, Descriptors: per * fd},
	}
	if got := a.Status().ProbeLinks.Tenants; !slices.Equal(got, want) {
		t.Errorf("/status probe_links.tenants %+v, want %+v", got, want)
	}
}
