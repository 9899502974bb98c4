package budget

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/profi-dev/profi/internal/attach"
	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/ops"
)

// Files are the attached library files and the switch of their hot
// probes (implemented by *attach.Attacher).
type Files interface {
	Files() []attach.FileInfo
	SetPaused(key attach.FileKey, paused bool) error
}

// Sources are the measurements the estimate needs.
type Sources interface {
	// Hits returns the cumulative probe hits per process (pid_hits).
	Hits() (map[uint32]uint64, error)
	// ForgetHits removes the counters of exited processes.
	ForgetHits(pids []uint32) error
	// ProgramRunTime returns the cumulative run time and run count of
	// profi's BPF programs (BPF run-time statistics).
	ProgramRunTime() (time.Duration, uint64, error)
	// CPUTime returns a process's cumulative CPU time and start time.
	CPUTime(pid int) (time.Duration, uint64, error)
}

// Options configure a Controller.
type Options struct {
	// Budget is the share of a process's CPU time its probes may cost,
	// e.g. 0.01 for --overhead-budget 1.
	Budget   float64
	TrapCost time.Duration // from Calibrate
	Files    Files
	Sources  Sources
	// Tick is the estimation period (default 1 s); Cycle the duty cycle
	// (default 10 s): hot probes are on for ratio × Cycle of each cycle.
	Tick, Cycle time.Duration
	// MinRatio is the lowest sampling ratio (default 0.05).
	MinRatio float64
	Logger   *slog.Logger
	Now      func() time.Time
}

// ProcStats is the estimate for one process.
type ProcStats struct {
	Hits      uint64        // probe hits counted since first seen
	Estimated time.Duration // estimated CPU time spent in profi's probes
	// Share is the estimated probe cost over the process's CPU time in
	// the last complete cycle; 0 before the first one.
	Share float64
	// Ratio is the sampling ratio now: the share of time its hot probes
	// are attached (1 = every call counted; below 1, counts of hot
	// operations are estimates).
	Ratio float64
	// libRatio is Ratio per library the process maps.
	libRatio map[discover.Library]float64
}

// Stats is what the controller publishes.
type Stats struct {
	TrapCost time.Duration // calibrated cost of one trap
	HitCost  time.Duration // trap cost + average BPF program run time
	Procs    map[int]ProcStats
	Paused   int // files whose hot probes are detached now
}

type procState struct {
	start     uint64
	hits      uint64 // last raw pid_hits value
	cpu       time.Duration
	est       time.Duration
	total     uint64
	cycleEst  time.Duration
	cycleCPU  time.Duration
	lastShare float64
}

type fileState struct {
	ratio    float64       // target share of each cycle with hot probes on
	on       time.Duration // hot probes attached so far in this cycle
	measured float64       // share of the last cycle they really were (1 at first)
	paused   bool
	pauseAt  time.Time
	lib      discover.Library
	pids     []int
}

// Controller runs the estimate and the duty cycle.
type Controller struct {
	opts  Options
	log   *slog.Logger
	stats atomic.Pointer[Stats]

	// Owned by Run.
	procs      map[int]*procState
	files      map[attach.FileKey]*fileState
	progRun    time.Duration
	progCount  uint64
	hitCost    time.Duration
	cycleStart time.Time
	lastTick   time.Time
}

// New returns a Controller; Run starts it.
func New(opts Options) *Controller {
	if opts.Tick <= 0 {
		opts.Tick = time.Second
	}
	if opts.Cycle < opts.Tick {
		opts.Cycle = 10 * time.Second
	}
	if opts.MinRatio <= 0 {
		opts.MinRatio = 0.05
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	c := &Controller{
		opts:    opts,
		log:     opts.Logger.With("component", "budget"),
		procs:   map[int]*procState{},
		files:   map[attach.FileKey]*fileState{},
		hitCost: opts.TrapCost,
	}
	c.stats.Store(&Stats{TrapCost: opts.TrapCost, HitCost: opts.TrapCost, Procs: map[int]ProcStats{}})
	return c
}

// Stats returns the latest published estimate; never nil.
func (c *Controller) Stats() *Stats { return c.stats.Load() }

// Scale returns the factor the aggregator multiplies op's counts in pid
// by: 1/sampling ratio for a hot operation of a duty-cycled library, 1
// for everything counted exactly.
func (c *Controller) Scale(pid int, op ops.Op) float64 {
	if !ops.Pausable(op) {
		return 1
	}
	p, ok := c.Stats().Procs[pid]
	if !ok {
		return 1
	}
	if r, ok := p.libRatio[ops.LibraryOf(op)]; ok && r > 0 {
		return 1 / r
	}
	return 1
}

// Run ticks until ctx ends, then re-attaches every paused probe.
func (c *Controller) Run(ctx context.Context) error {
	t := time.NewTicker(c.opts.Tick)
	defer t.Stop()
	c.cycleStart = c.opts.Now()
	c.lastTick = c.cycleStart
	for {
		select {
		case <-ctx.Done():
			for key, f := range c.files {
				if f.paused {
					c.setPaused(key, f, false)
				}
			}
			return nil
		case <-t.C:
			c.Tick()
		}
	}
}

// Tick runs one estimation step and, at a cycle's end, the budget
// decision. Only Run (or a test) calls it.
func (c *Controller) Tick() {
	now := c.opts.Now()
	c.updateHitCost()
	c.syncFiles()
	c.estimate()
	if !c.lastTick.IsZero() {
		for _, f := range c.files {
			if !f.paused {
				f.on += now.Sub(c.lastTick)
			}
		}
	}
	c.lastTick = now
	if elapsed := now.Sub(c.cycleStart); elapsed >= c.opts.Cycle {
		for _, f := range c.files {
			f.measured = min(1, float64(f.on)/float64(elapsed))
			f.on = 0
		}
		c.decide()
		c.cycleStart = now
		for key, f := range c.files {
			if f.ratio < 1 {
				f.pauseAt = now.Add(time.Duration(f.ratio * float64(c.opts.Cycle)))
			}
			if f.paused {
				c.setPaused(key, f, false)
			}
		}
	}
	for key, f := range c.files {
		if f.ratio < 1 && !f.paused && !now.Before(f.pauseAt) {
			c.setPaused(key, f, true)
		}
	}
	c.publish()
}

func (c *Controller) setPaused(key attach.FileKey, f *fileState, paused bool) {
	if err := c.opts.Files.SetPaused(key, paused); err != nil {
		c.log.Warn("duty cycle: switching hot probes failed", "file", key, "paused", paused, "err", err)
		return
	}
	f.paused = paused
}

// updateHitCost refreshes the average BPF program run time per hit.
func (c *Controller) updateHitCost() {
	run, n, err := c.opts.Sources.ProgramRunTime()
	if err != nil {
		c.log.Debug("BPF run-time statistics unavailable; cost per hit is the trap cost", "err", err)
		return
	}
	// A few runs make a noisy average (one preempted run can be 100×
	// the rest): the previous value stays until enough runs arrive.
	const minRuns = 100
	if n >= c.progCount+minRuns && run >= c.progRun {
		c.hitCost = c.opts.TrapCost + (run-c.progRun)/time.Duration(n-c.progCount)
	} else if n >= c.progCount && run >= c.progRun {
		return // accumulate until enough runs
	}
	c.progRun, c.progCount = run, n
}

// estimate adds each process's new hits × cost per hit and its CPU time.
// The processes are those with hits and those mapping an attached file
// (no hits yet is a real zero: pid_hits counts from the attach).
func (c *Controller) estimate() {
	hits, err := c.opts.Sources.Hits()
	if err != nil {
		c.log.Warn("read probe hits", "err", err)
		return
	}
	pids := map[int]bool{}
	for pid := range hits {
		pids[int(pid)] = true
	}
	for _, f := range c.files {
		for _, pid := range f.pids {
			pids[pid] = true
		}
	}
	var gone []uint32
	for pid := range pids {
		raw := hits[uint32(pid)]
		cpu, start, err := c.opts.Sources.CPUTime(pid)
		if err != nil {
			delete(c.procs, pid)
			if _, ok := hits[uint32(pid)]; ok {
				gone = append(gone, uint32(pid))
			}
			continue
		}
		p := c.procs[pid]
		if p == nil || p.start != start {
			// First sight (or a reused PID): hits so far count in the
			// estimate; the share starts from the CPU time read now.
			est := time.Duration(raw) * c.hitCost
			c.procs[pid] = &procState{start: start, hits: raw, total: raw, est: est, cpu: cpu}
			continue
		}
		dh := raw - p.hits
		if raw < p.hits {
			dh = raw // the LRU map evicted and re-created the entry
		}
		est := time.Duration(dh) * c.hitCost
		p.hits, p.total = raw, p.total+dh
		p.est += est
		p.cycleEst += est
		if cpu > p.cpu {
			p.cycleCPU += cpu - p.cpu
		}
		p.cpu = cpu
	}
	for pid := range c.procs {
		if !pids[pid] {
			delete(c.procs, pid)
		}
	}
	if len(gone) > 0 {
		if err := c.opts.Sources.ForgetHits(gone); err != nil {
			c.log.Debug("forget hits of exited processes", "err", err)
		}
	}
}

// syncFiles follows the attached files; a released file forgets its state.
func (c *Controller) syncFiles() {
	seen := map[attach.FileKey]bool{}
	for _, fi := range c.opts.Files.Files() {
		seen[fi.Key] = true
		f := c.files[fi.Key]
		if f == nil {
			f = &fileState{ratio: 1, measured: 1}
			c.files[fi.Key] = f
		}
		f.lib, f.pids, f.paused = fi.Lib, fi.PIDs, fi.Paused
	}
	for key := range c.files {
		if !seen[key] {
			delete(c.files, key)
		}
	}
}

// decide sets each file's sampling ratio from the worst process that maps
// it. Over the last cycle a process spent est in probes (hot probes on for
// a share r of it) out of cpu: its own work is B = cpu − est and its probe
// cost at full rate P = est/r. With the probes on for a share r', its
// share is r'P/(B + r'P), which equals the budget b at r' = bB/((1−b)P);
// the 0.9 keeps it below.
func (c *Controller) decide() {
	need := map[int]float64{} // ratio each process can afford
	for pid, p := range c.procs {
		p.lastShare = 0
		if p.cycleCPU > 0 {
			p.lastShare = float64(p.cycleEst) / float64(p.cycleCPU)
		}
		if p.cycleEst > 0 {
			r := c.procRatio(pid)
			full := float64(p.cycleEst) / r
			base := max(0, float64(p.cycleCPU-p.cycleEst))
			need[pid] = 0.9 * c.opts.Budget * base / ((1 - min(c.opts.Budget, 0.99)) * full)
		}
		p.cycleEst, p.cycleCPU = 0, 0
	}
	for key, f := range c.files {
		want := 1.0
		for _, pid := range f.pids {
			if r, ok := need[pid]; ok {
				want = min(want, r)
			}
		}
		old := f.ratio
		f.ratio = min(1, max(c.opts.MinRatio, want))
		if f.ratio != old {
			c.log.Info("overhead budget: sampling ratio changed", "file", key, "lib", f.lib, "pids", f.pids, "budget", c.opts.Budget, "from", old, "to", f.ratio)
		}
	}
}

// procRatio is the share of the last cycle a process's hot probes really
// were attached (the lowest over its files; detaching and the tick make
// it differ from the target).
func (c *Controller) procRatio(pid int) float64 {
	r := 1.0
	for _, f := range c.files {
		if slices.Contains(f.pids, pid) {
			r = min(r, f.measured)
		}
	}
	return max(r, 1e-3)
}

func (c *Controller) publish() {
	s := &Stats{TrapCost: c.opts.TrapCost, HitCost: c.hitCost, Procs: make(map[int]ProcStats, len(c.procs))}
	ratios := map[int]map[discover.Library]float64{}
	for _, f := range c.files {
		if f.paused {
			s.Paused++
		}
		for _, pid := range f.pids {
			if ratios[pid] == nil {
				ratios[pid] = map[discover.Library]float64{}
			}
			if r, ok := ratios[pid][f.lib]; !ok || f.ratio < r {
				ratios[pid][f.lib] = f.ratio
			}
		}
	}
	for pid, p := range c.procs {
		ps := ProcStats{Hits: p.total, Estimated: p.est, Share: p.lastShare, Ratio: 1, libRatio: ratios[pid]}
		for _, r := range ratios[pid] {
			ps.Ratio = min(ps.Ratio, r)
		}
		s.Procs[pid] = ps
	}
	c.stats.Store(s)
}
