package aggregate

import (
	"fmt"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/ops"
)

// podLaunches sums the kernel launches of every exported entry (live,
// exited, folded) of pod, and the pids they are under.
func podLaunches(s *Snapshot, pod string) (uint64, map[int]bool) {
	var n uint64
	pids := map[int]bool{}
	for _, p := range s.Exported() {
		if p.Meta.Pod != pod {
			continue
		}
		for _, l := range p.Launches {
			n += l.Count
		}
		pids[p.Meta.PID] = true
	}
	return n, pids
}

// An exited process's series stay, with everything it did up to its exit
// (also after the last drain), while its container lives; --gc-interval
// after the container's last exit, all its exited processes fold in one
// drain into new series per comm (pid 0, exported as pid=""). The pod's sum
// never goes backwards and always equals what its processes did.
func TestExitedSeriesStayWhileTheContainerLives(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
	src := newFakeSource()
	procs := newFakeProcs(map[int]fakeProc{100: {"worker", 1}, 101: {"worker", 2}, 102: {"server", 3}})
	pods := &fakePods{byStart: map[uint64]string{1: "job", 2: "job", 3: "job"}}
	a := New(Options{Source: src, Procs: procs, Pods: pods, Now: clock.now, GCInterval: time.Minute})

	total := uint64(0)
	launch := func(pid uint32, n uint64) {
		src.addLaunch(lkey(pid, 0), bpfobj.ProfiLaunchVal{Count: n})
		total += n
	}
	step := func(what string, wantPIDs ...int) *Snapshot {
		t.Helper()
		s := drain(t, a)
		got, pids := podLaunches(s, "job")
		if got != total {
			t.Errorf("%s: pod job's launches %d, want %d", what, got, total)
		}
		if len(pids) != len(wantPIDs) {
			t.Errorf("%s: pids %v, want %v", what, pids, wantPIDs)
		}
		for _, p := range wantPIDs {
			if !pids[p] {
				t.Errorf("%s: pids %v, want %v", what, pids, wantPIDs)
			}
		}
		return s
	}

	launch(100, 30000)
	launch(101, 10)
	launch(102, 5)
	step("all live", 100, 101, 102)

	// 100 launches more and exits before the next drain: counted in full.
	launch(100, 7)
	delete(procs.live, 100)
	s := step("100 exited", 100, 101, 102)
	if len(s.Exited) != 1 || s.Exited[0].Meta.PID != 100 || s.Exited[0].Meta.Pod != "job" || s.Exited[0].HasActiveMemory() {
		t.Errorf("exited %+v, want pid 100 of pod job, counters only", s.Exited)
	}
	clock.t = clock.t.Add(30 * time.Second)
	launch(101, 3)
	delete(procs.live, 101)
	step("101 exited", 100, 101, 102)

	// Long past --gc-interval, but 102 still runs in the container.
	clock.t = clock.t.Add(10 * time.Minute)
	step("the container lives", 100, 101, 102)

	launch(102, 2)
	delete(procs.live, 102)
	step("102 exited", 100, 101, 102)
	clock.t = clock.t.Add(59 * time.Second)
	step("59 s after the container's last exit", 100, 101, 102)

	// --gc-interval after the last exit: the whole container folds at once.
	clock.t = clock.t.Add(time.Second)
	s = step("folded", 0)
	byComm := map[string]uint64{}
	for _, p := range s.Exited {
		if p.Meta.PID != 0 || p.Meta.Namespace != "ns" || p.Meta.Container != "c" {
			t.Errorf("exited entry %+v, want folded series of ns/job/c", p.Meta)
		}
		byComm[p.Meta.Comm] += p.Launches[Kernel{Name: "anonymous", Class: "other"}].Count
	}
	if byComm["worker"] != 30020 || byComm["server"] != 7 || len(byComm) != 2 {
		t.Errorf("folded launches by comm %v, want worker 30020 (100 and 101), server 7", byComm)
	}

	// RetainedExpiry after the fold, the pod long gone: they expire.
	clock.t = clock.t.Add(RetainedExpiry)
	total = 0
	if s = step("expired"); s.ExpiredSeries != 2 {
		t.Errorf("ExpiredSeries %d, want 2", s.ExpiredSeries)
	}
}

// A PID reused by a new process while the old one's series linger: the old
// series fold at once, so no two entries share a label set and the new
// process starts from zero.
func TestExitedSeriesPIDReuse(t *testing.T) {
	t.Parallel()
	src := newFakeSource()
	procs := newFakeProcs(map[int]fakeProc{100: {"old", 1000}})
	a := New(Options{Source: src, Procs: procs})
	src.add(akey(100, ops.OpCudaMalloc, 0, 0, 0), aval(5, 50, 500, 0))
	drain(t, a)

	delete(procs.live, 100)
	if s := drain(t, a); len(s.Exited) != 1 || s.Exited[0].Meta.PID != 100 {
		t.Fatalf("exited %+v, want pid 100", s.Exited)
	}
	procs.live[100] = fakeProc{"new", 2000}
	src.add(akey(100, ops.OpCudaMalloc, 0, 0, 0), aval(2, 20, 200, 0))
	s := drain(t, a)
	seen := map[int]int{}
	for _, p := range s.Exported() {
		seen[p.Meta.PID]++
	}
	if seen[100] != 1 || seen[0] != 1 {
		t.Fatalf("entries by pid %v, want one live 100 and one folded", seen)
	}
	if p := process(t, s, 100); p.Meta.Comm != "new" || p.Calls[OpStream{"cudaMalloc", "default"}] != 2 {
		t.Errorf("new process %+v, want comm new with its own 2 calls", viewOf(p))
	}
	if f := s.Exited[0]; f.Meta.Comm != "old" || f.Calls[OpStream{"cudaMalloc", "default"}] != 5 {
		t.Errorf("folded %+v, want the old process's 5 calls", f)
	}
}

// More exited processes than the bounds: the oldest fold at once, none
// is lost. Node-wide (MaxLingering, processes in containers of their own)
// and per container (MaxExitedPerContainer, one comm outside any pod).
func TestExitedSeriesBounded(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		n         int
		comm      func(pid int) string
		wantOwn   int
		wantFolds int
	}{
		{"node", MaxLingering + 88, func(pid int) string { return fmt.Sprint("job-", pid) }, MaxLingering, 88},
		{"container", MaxExitedPerContainer + 36, func(int) string { return "dataloader" }, MaxExitedPerContainer, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := newFakeSource()
			live := map[int]fakeProc{}
			for pid := 1; pid <= tc.n; pid++ {
				live[pid] = fakeProc{tc.comm(pid), uint64(pid)}
				src.addLaunch(lkey(uint32(pid), 0), bpfobj.ProfiLaunchVal{Count: 3})
			}
			procs := newFakeProcs(live)
			a := New(Options{Source: src, Procs: procs})
			drain(t, a)
			for pid := 1; pid <= tc.n; pid++ {
				delete(procs.live, pid)
			}
			s := drain(t, a)
			var launches uint64
			own, folds := 0, 0
			for _, p := range s.Exited {
				if p.Meta.PID != 0 {
					own++
				} else {
					folds++
				}
				for _, l := range p.Launches {
					launches += l.Count
				}
			}
			if own != tc.wantOwn || folds != tc.wantFolds || launches != uint64(3*tc.n) {
				t.Errorf("%d exited processes with their own series, %d folded series, %d launches; want %d, %d, %d",
					own, folds, launches, tc.wantOwn, tc.wantFolds, 3*tc.n)
			}
		})
	}
}

// A PID reused by a process that exits before any drain sees it alive: the
// new keys are not the lingering process's, which folds; the unknown
// process's tuples are released, the folded series keep theirs.
func TestExitedSeriesPIDReusedByUnseenProcess(t *testing.T) {
	t.Parallel()
	src := newFakeSource()
	procs := newFakeProcs(map[int]fakeProc{100: {"old", 1000}})
	a := New(Options{Source: src, Procs: procs})
	src.add(akey(100, ops.OpCudaMalloc, 0, 0, 0), aval(5, 50, 500, 0))
	drain(t, a)
	delete(procs.live, 100)
	if s := drain(t, a); len(s.Exited) != 1 || s.Series != 3 {
		t.Fatalf("exited %d entries, %d series; want 1 lingering, 3 (memory, calls, histogram)", len(s.Exited), s.Series)
	}
	src.add(akey(100, ops.OpCudaFree, 0, 0, 0), aval(2, 20, 200, 0)) // the new process's, gone already
	s := drain(t, a)
	if len(s.Exited) != 1 || s.Exited[0].Meta.PID != 0 || s.Exited[0].Calls[OpStream{"cudaMalloc", "default"}] != 5 ||
		s.Exited[0].Calls[OpStream{"cudaFree", "default"}] != 0 {
		t.Fatalf("exited %+v, want the old process folded with its own 5 calls only", s.Exited)
	}
	// Folded memory and calls, the two histograms.
	if s.Series != 4 {
		t.Errorf("Series %d, want 4", s.Series)
	}
}

// identity is a BPF note (unseen_procs) of a process that started at
// start clock ticks, in cgroup parent/leaf.
func identity(comm string, start uint64, parent, leaf string) bpfobj.ProfiProcIdentity {
	id := bpfobj.ProfiProcIdentity{Start: start * uint64(clockTick)}
	copy(id.Comm[:], comm)
	for i, c := range []byte(parent) {
		id.Parent[i] = int8(c)
	}
	for i, c := range []byte(leaf) {
		id.Leaf[i] = int8(c)
	}
	return id
}

// A process that exited before any drain saw it alive (issue 46: a 40 ms
// batch step) keeps its series, with its comm, start time and pod from
// what BPF noted of it, like any exited process; one BPF did not note is
// in the node's totals only. Its PID taken later by another process gets
// none of its counts.
func TestExitedUnseenProcessKeepsItsSeries(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
	src := newFakeSource()
	src.unseen = map[uint32]bpfobj.ProfiProcIdentity{
		200: identity("batch-step", 4242, "kubepods-pod1.slice", "cri-containerd-c1.scope"),
	}
	procs := newFakeProcs(map[int]fakeProc{})
	pods := &fakePods{byCgroup: map[string]string{"cri-containerd-c1.scope": "job"}}
	a := New(Options{Source: src, Procs: procs, Pods: pods, Now: clock.now, GCInterval: time.Minute})
	src.addLaunch(lkey(200, 0), bpfobj.ProfiLaunchVal{Count: 30000})
	src.addLaunch(lkey(201, 0), bpfobj.ProfiLaunchVal{Count: 7}) // not noted

	s := drain(t, a)
	if len(s.Exited) != 1 {
		t.Fatalf("exited %+v, want pid 200 only", s.Exited)
	}
	e := s.Exited[0]
	if e.Meta.PID != 200 || e.Meta.Comm != "batch-step" || e.Meta.Pod != "job" || e.Meta.Namespace != "ns" || e.Meta.Container != "c" {
		t.Errorf("exited meta %+v, want pid 200, comm batch-step, ns/job/c", e.Meta)
	}
	if got, _ := podLaunches(s, "job"); got != 30000 {
		t.Errorf("pod job's launches %d, want 30000", got)
	}
	if s.Events != 30007 {
		t.Errorf("calls of exited processes %d, want 30007 (the unnoted one's only there)", s.Events)
	}
	// Its keys went; the PID's next process is another one.
	procs.live[200] = fakeProc{"server", 9999}
	src.launch = map[bpfobj.ProfiLaunchKey]bpfobj.ProfiLaunchVal{}
	src.addLaunch(lkey(200, 0), bpfobj.ProfiLaunchVal{Count: 3})
	s = drain(t, a)
	for _, p := range s.Processes {
		if p.Meta.PID == 200 {
			var n uint64
			for _, l := range p.Launches {
				n += l.Count
			}
			if p.Meta.Comm != "server" || n != 3 {
				t.Errorf("PID 200's new process: comm %q, %d launches; want server, 3", p.Meta.Comm, n)
			}
		}
	}
}

// A process that holds device memory and launches nothing: how long it
// has launched no kernel (eagerly or by a graph replay) grows from the
// drain that saw its last launch, or from its first sight; a launch sets
// it back to zero; a process without device memory gets no gauge.
func TestHeldIdle(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
	src := newFakeSource()
	procs := newFakeProcs(map[int]fakeProc{300: {"holder", 1}, 301: {"nomem", 2}})
	a := New(Options{Source: src, Procs: procs, Now: clock.now})
	src.add(akey(300, ops.OpCudaMalloc, 0, 0, 0), aval(1, 10, 1<<30, 0))
	src.addLaunch(lkey(300, 0), bpfobj.ProfiLaunchVal{Count: 5})
	src.addLaunch(lkey(301, 0), bpfobj.ProfiLaunchVal{Count: 5})
	idle := func(s *Snapshot, pid int) (time.Duration, bool) {
		for _, p := range s.Processes {
			if p.Meta.PID == pid {
				return p.IdleFor, p.HoldsIdle()
			}
		}
		t.Fatalf("no process %d", pid)
		return 0, false
	}
	steps := []struct {
		after  time.Duration
		launch uint64
		want   time.Duration
	}{
		{0, 0, 0},
		{10 * time.Second, 0, 10 * time.Second},
		{20 * time.Second, 0, 30 * time.Second},
		{5 * time.Second, 1, 0}, // a launch
		{7 * time.Second, 0, 7 * time.Second},
	}
	for i, st := range steps {
		clock.t = clock.t.Add(st.after)
		if st.launch > 0 {
			src.addLaunch(lkey(300, 0), bpfobj.ProfiLaunchVal{Count: st.launch})
		}
		s := drain(t, a)
		if got, holds := idle(s, 300); !holds || got != st.want {
			t.Errorf("step %d: idle %v (exported %v), want %v", i, got, holds, st.want)
		}
		if _, holds := idle(s, 301); holds {
			t.Errorf("step %d: a process without device memory has the held-idle gauge", i)
		}
	}
}
