package aggregate

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/ops"
)

// fakeClock is an injected Options.Now.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

// Retained histogram data of exited processes stays exported for
// RetainedExpiry after the last exit of its label set and is then dropped
// with its --max-time-series tuple, counted; data a live process shares
// a label set with never expires under it.
func TestRetainedHistogramsExpire(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
	src := newFakeSource()
	procs := newFakeProcs(map[int]fakeProc{100: {"a", 1}, 200: {"b", 2}})
	a := New(Options{Source: src, Procs: procs, Now: clock.now})

	src.add(akey(100, ops.OpCudaMalloc, 0, 0, 0), aval(2, 20, 64, 1))
	src.add(akey(100, ops.OpCudaFree, 0, 0, 0), aval(1, 10, 64, 1))
	src.add(akey(200, ops.OpCudaMalloc, 0, 0, 0), aval(3, 30, 32, 2))
	drain(t, a)

	delete(procs.live, 100) // exits at t0
	s := drain(t, a)
	want := map[HistKey]Hist{
		{Op: "cudaMalloc"}: hist(50, map[int]uint64{1: 2, 2: 3}),
		{Op: "cudaFree"}:   hist(10, map[int]uint64{1: 1}),
	}
	if got := hists(s); !reflect.DeepEqual(got, want) {
		t.Fatalf("after the exit: hists %+v, want %+v", got, want)
	}

	clock.t = clock.t.Add(RetainedExpiry - time.Second)
	if s = drain(t, a); len(s.Hists) != 2 || s.ExpiredSeries != 0 {
		t.Errorf("1 s before expiry: %d histograms, %d expired; want 2, 0", len(s.Hists), s.ExpiredSeries)
	}
	clock.t = clock.t.Add(time.Second)
	s = drain(t, a)
	// cudaFree had only the exited process: gone. cudaMalloc is shared
	// with the live 200: kept whole, or the series would go backwards.
	want = map[HistKey]Hist{{Op: "cudaMalloc"}: hist(50, map[int]uint64{1: 2, 2: 3})}
	if got := hists(s); !reflect.DeepEqual(got, want) {
		t.Errorf("at expiry: hists %+v, want %+v", got, want)
	}
	if s.ExpiredSeries != 1 {
		t.Errorf("ExpiredSeries = %d, want 1", s.ExpiredSeries)
	}
	// 200: memory and calls; one histogram series; 100's folded series
	// (exited.go: memory, calls of cudaMalloc and cudaFree), folded at the
	// drain before, --gc-interval after its exit.
	if s.Series != 6 {
		t.Errorf("Series = %d, want 6 (cudaFree's histogram tuple released)", s.Series)
	}

	delete(procs.live, 200) // exits: cudaMalloc's last process
	drain(t, a)
	clock.t = clock.t.Add(RetainedExpiry - time.Second)
	if s = drain(t, a); len(s.Hists) != 1 {
		t.Errorf("before the second expiry: %d histograms, want 1", len(s.Hists))
	}
	clock.t = clock.t.Add(time.Second)
	s = drain(t, a)
	// Expired: the two histograms and 100's folded series (RetainedExpiry
	// after its fold); 200's folded series (memory, calls) stays until
	// RetainedExpiry after its own fold.
	if len(s.Hists) != 0 || s.ExpiredSeries != 3 || s.Series != 2 {
		t.Errorf("after the second expiry: %d histograms, %d expired, %d series; want 0, 3, 2", len(s.Hists), s.ExpiredSeries, s.Series)
	}
}

// fakePods records the (pid, start) it is asked about and labels by start
// time, as k8s.Enricher does.
type fakePods struct {
	byStart  map[uint64]string // start time -> pod
	byCgroup map[string]string // cgroup leaf -> pod
	asked    [][2]uint64
}

func (f *fakePods) Pod(pid int, start uint64) (string, string, string, bool) {
	f.asked = append(f.asked, [2]uint64{uint64(pid), start})
	return "ns", f.byStart[start], "c", true
}

// PodOfCgroup labels by the cgroup path's last element.
func (f *fakePods) PodOfCgroup(path string) (string, string, string) {
	return "ns", f.byCgroup[path[strings.LastIndexByte(path, '/')+1:]], "c"
}

func (f *fakePods) Forget(int) {}

// A new process reusing a PID is asked about with its own start time and
// gets its own pod, not the old process's.
func TestPodLabelsFollowStartTime(t *testing.T) {
	t.Parallel()
	src := newFakeSource()
	procs := newFakeProcs(map[int]fakeProc{100: {"old", 1000}})
	pods := &fakePods{byStart: map[uint64]string{1000: "tenant-a", 2000: "tenant-b"}}
	a := New(Options{Source: src, Procs: procs, Pods: pods})
	src.add(akey(100, ops.OpCudaMalloc, 0, 0, 0), aval(1, 10, 8, 0))
	if p := process(t, drain(t, a), 100); p.Meta.Pod != "tenant-a" {
		t.Fatalf("old process pod %q", p.Meta.Pod)
	}
	procs.live[100] = fakeProc{"new", 2000}
	drain(t, a) // retires the old process
	src.add(akey(100, ops.OpCudaMalloc, 0, 0, 0), aval(1, 10, 8, 0))
	if p := process(t, drain(t, a), 100); p.Meta.Pod != "tenant-b" || p.Meta.Comm != "new" {
		t.Errorf("new process: pod %q comm %q; want tenant-b new", p.Meta.Pod, p.Meta.Comm)
	}
	if want := [][2]uint64{{100, 1000}, {100, 2000}}; !reflect.DeepEqual(pods.asked, want) {
		t.Errorf("asked %v, want %v", pods.asked, want)
	}
}

// A comm the process set to invalid UTF-8 or control characters is
// cleaned before it becomes a label, and counted.
func TestCommMadeLabelSafe(t *testing.T) {
	t.Parallel()
	src := newFakeSource()
	procs := newFakeProcs(map[int]fakeProc{100: {"bad\xff\n", 1}, 101: {"good", 1}})
	a := New(Options{Source: src, Procs: procs})
	src.add(akey(100, ops.OpCudaMalloc, 0, 0, 0), aval(1, 10, 8, 0))
	src.add(akey(101, ops.OpCudaMalloc, 0, 0, 0), aval(1, 10, 8, 0))
	s := drain(t, a)
	if got := process(t, s, 100).Meta.Comm; got != "bad??" {
		t.Errorf("comm %q, want %q", got, "bad??")
	}
	if s.RejectedComms != 1 {
		t.Errorf("RejectedComms = %d, want 1", s.RejectedComms)
	}
}
