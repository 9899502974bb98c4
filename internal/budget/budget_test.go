package budget

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/attach"
	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/ops"
)

type fakeFiles struct {
	files  []attach.FileInfo
	paused map[attach.FileKey]bool
	calls  []bool // SetPaused arguments, in order
}

func (f *fakeFiles) Files() []attach.FileInfo {
	out := make([]attach.FileInfo, len(f.files))
	for i, fi := range f.files {
		fi.Paused = f.paused[fi.Key]
		out[i] = fi
	}
	return out
}

func (f *fakeFiles) SetPaused(key attach.FileKey, paused bool) error {
	f.paused[key] = paused
	f.calls = append(f.calls, paused)
	return nil
}

type fakeSources struct {
	hits    map[uint32]uint64
	cpu     map[int]time.Duration
	run     time.Duration
	runs    uint64
	forgot  []uint32
	noStats bool
}

func (s *fakeSources) Hits() (map[uint32]uint64, error) {
	out := map[uint32]uint64{}
	for k, v := range s.hits {
		out[k] = v
	}
	return out, nil
}

func (s *fakeSources) ForgetHits(pids []uint32) error {
	s.forgot = append(s.forgot, pids...)
	return nil
}

func (s *fakeSources) ProgramRunTime() (time.Duration, uint64, error) {
	if s.noStats {
		return 0, 0, errors.New("no statistics")
	}
	return s.run, s.runs, nil
}

func (s *fakeSources) CPUTime(pid int) (time.Duration, uint64, error) {
	c, ok := s.cpu[pid]
	if !ok {
		return 0, 0, discover.ErrProcessGone
	}
	return c, 1, nil
}

var (
	rtFile  = attach.FileKey{Dev: 1, Inode: 10}
	drvFile = attach.FileKey{Dev: 1, Inode: 11}
)

// harness drives a controller on a fake clock, one tick per second.
type harness struct {
	t     *testing.T
	now   time.Time
	c     *Controller
	files *fakeFiles
	src   *fakeSources
}

func newHarness(t *testing.T, budget float64) *harness {
	h := &harness{
		t:   t,
		now: time.Unix(1000, 0),
		files: &fakeFiles{
			files: []attach.FileInfo{
				{Key: rtFile, Lib: discover.LibCudart, PIDs: []int{7}},
				{Key: drvFile, Lib: discover.LibCuda, PIDs: []int{7, 8}},
			},
			paused: map[attach.FileKey]bool{},
		},
		src: &fakeSources{hits: map[uint32]uint64{}, cpu: map[int]time.Duration{}},
	}
	h.c = New(Options{Budget: budget, TrapCost: 5 * time.Microsecond, Files: h.files, Sources: h.src,
		Tick: time.Second, Cycle: 10 * time.Second, Now: func() time.Time { return h.now }})
	h.c.cycleStart, h.c.lastTick = h.now, h.now
	return h
}

// second advances one second of a process that works l[1] of CPU time
// and, while its hot probes are attached, spends l[0] more in probes.
func (h *harness) second(load map[int][2]time.Duration) {
	h.now = h.now.Add(time.Second)
	for pid, l := range load {
		hits := uint64(l[0] / (5*time.Microsecond + 500*time.Nanosecond))
		if h.files.paused[rtFile] {
			hits = 0
		}
		h.src.hits[uint32(pid)] += hits
		h.src.runs += hits
		h.src.run += time.Duration(hits) * 500 * time.Nanosecond
		h.src.cpu[pid] += l[1] + time.Duration(hits)*(5*time.Microsecond+500*time.Nanosecond)
	}
	h.c.Tick()
}

func TestEstimateAddsHitsTimesCost(t *testing.T) {
	h := newHarness(t, 0.5)
	h.src.cpu[7] = time.Second
	h.src.hits[7] = 1000 // hits since the attach, before the first sight
	h.c.Tick()           // no run-time statistics yet: 1000 × the 5 µs trap

	// 20 000 hits at 5 µs trap + 0.5 µs program = 110 ms of a 1 s CPU second.
	h.second(map[int][2]time.Duration{7: {110 * time.Millisecond, time.Second}})
	st := h.c.Stats()
	if st.HitCost != 5500*time.Nanosecond {
		t.Errorf("hit cost = %v, want 5.5µs (trap + average program run time)", st.HitCost)
	}
	p := st.Procs[7]
	if p.Hits != 21000 || p.Estimated != 115*time.Millisecond {
		t.Errorf("pid 7: hits %d, estimated %v; want 21000, 115ms", p.Hits, p.Estimated)
	}
	if p.Ratio != 1 {
		t.Errorf("ratio = %v, want 1 (under budget)", p.Ratio)
	}
}

func TestDutyCycleKeepsShareUnderBudget(t *testing.T) {
	h := newHarness(t, 0.02) // 2 %
	h.src.cpu[7] = 0
	h.c.Tick()
	// 900 ms of work per second, plus 100 ms in probes while attached.
	load := map[int][2]time.Duration{7: {100 * time.Millisecond, 900 * time.Millisecond}}
	for range 10 {
		h.second(load)
	}
	p := h.c.Stats().Procs[7]
	if math.Abs(p.Share-0.1) > 0.001 {
		t.Fatalf("share after the first cycle = %v, want 0.1", p.Share)
	}
	// Probes on for r of the time cost r·P of B + r·P: at the 2 % budget
	// (× 0.9), r = 0.9 × 0.02 × B / (0.98 × P) with B = 0.9 s, P = 0.1 s.
	want := 0.9 * 0.02 * 0.9 / (0.98 * 0.1)
	if math.Abs(p.Ratio-want) > 1e-3 {
		t.Fatalf("ratio = %v, want %v", p.Ratio, want)
	}
	if got := h.c.Scale(7, ops.OpCudaLaunchKernel); math.Abs(got-1/p.Ratio) > 1e-9 {
		t.Errorf("Scale(launch) = %v, want 1/%v", got, p.Ratio)
	}
	if got := h.c.Scale(7, ops.OpCudaMalloc); got != 1 {
		t.Errorf("Scale(malloc) = %v, want 1 (never paused)", got)
	}
	if got := h.c.Scale(9, ops.OpCudaLaunchKernel); got != 1 {
		t.Errorf("Scale(unknown pid) = %v, want 1", got)
	}
	if h.files.paused[rtFile] {
		t.Fatal("paused at the cycle start; want the hot probes on for the first 1.65 s")
	}
	h.second(load)
	if h.files.paused[rtFile] {
		t.Fatal("paused after 1 s; want on until 1.65 s")
	}
	h.second(load)
	if !h.files.paused[rtFile] || !h.files.paused[drvFile] {
		t.Fatalf("after 2 s: paused %v; want both files of pid 7 paused", h.files.paused)
	}
	if h.c.Stats().Paused != 2 {
		t.Errorf("Stats.Paused = %d, want 2", h.c.Stats().Paused)
	}
	for range 8 {
		h.second(load)
	}
	// Second cycle: probes were on 2 s (the 1 s tick rounds 1.65 up):
	// 0.2 s of 9.2 s, 2.2 %. The model, fed the measured on-time, keeps
	// the ratio; the new cycle re-attached the probes.
	p = h.c.Stats().Procs[7]
	if math.Abs(p.Share-0.2/9.2) > 0.001 || math.Abs(p.Ratio-want) > 1e-3 {
		t.Errorf("second cycle: share %v, ratio %v; want %v, %v", p.Share, p.Ratio, 0.2/9.2, want)
	}
	if h.files.paused[rtFile] {
		t.Error("not resumed at the start of the next cycle")
	}
}

func TestRatioRecoversWhenLoadDrops(t *testing.T) {
	h := newHarness(t, 0.02)
	h.src.cpu[7] = 0
	h.c.Tick()
	for range 10 {
		h.second(map[int][2]time.Duration{7: {100 * time.Millisecond, 900 * time.Millisecond}})
	}
	if p := h.c.Stats().Procs[7]; p.Ratio >= 1 {
		t.Fatalf("ratio = %v under load, want below 1", p.Ratio)
	}
	for range 30 {
		h.second(map[int][2]time.Duration{7: {0, time.Second}})
	}
	if p := h.c.Stats().Procs[7]; p.Ratio != 1 {
		t.Errorf("ratio after an idle period = %v, want back to 1", p.Ratio)
	}
}

func TestExitedProcessIsForgotten(t *testing.T) {
	h := newHarness(t, 0.02)
	h.src.cpu[7] = 0
	h.c.Tick()
	h.second(map[int][2]time.Duration{7: {time.Millisecond, time.Second}})
	delete(h.src.cpu, 7)
	h.c.Tick()
	if _, ok := h.c.Stats().Procs[7]; ok {
		t.Error("exited pid 7 still published")
	}
	if len(h.src.forgot) != 1 || h.src.forgot[0] != 7 {
		t.Errorf("ForgetHits got %v, want [7]", h.src.forgot)
	}
}

func TestNoStatisticsFallsBackToTrapCost(t *testing.T) {
	h := newHarness(t, 0.5)
	h.src.noStats = true
	h.c.Tick()
	if got := h.c.Stats().HitCost; got != 5*time.Microsecond {
		t.Errorf("hit cost without statistics = %v, want the trap cost 5µs", got)
	}
}
