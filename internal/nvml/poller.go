package nvml

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"time"
)

// Defaults of Options.
const (
	DefaultInterval    = 5 * time.Second
	DefaultTimeout     = 5 * time.Second
	DefaultInitTimeout = 30 * time.Second
	DefaultInitRetry   = 60 * time.Second
)

// Options configure a Poller.
type Options struct {
	// Lib is the NVML implementation: NewLibrary() in the agent, a fake
	// in tests. Required.
	Lib Library
	// Interval is the poll period (--nvml-interval); DefaultInterval when 0.
	Interval time.Duration
	// Timeout bounds one poll (every NVML call of it); DefaultTimeout when 0.
	Timeout time.Duration
	// InitTimeout bounds nvmlInit and the device inventory, which wake
	// every GPU when persistence mode is off; DefaultInitTimeout when 0.
	InitTimeout time.Duration
	// InitRetry is the pause after a failed initialisation (library
	// absent, driver not loaded); DefaultInitRetry when 0.
	InitRetry time.Duration
	// Logger; nothing is logged when nil.
	Logger *slog.Logger
	// GPM is GPMAuto (when ""), GPMOn or GPMOff (--gpm).
	GPM string
	// GPMInterval is the period of the GPM samples (--gpm-interval), the
	// window each GPM value covers; Interval when 0 (a sample is taken at
	// the first poll at or after it is due).
	GPMInterval time.Duration
}

// Poller polls NVML every Interval and publishes a Snapshot. Every NVML
// call runs on a separate goroutine under a timeout: a call that does not
// return in time (a hung driver) turns the snapshot to Up=false, and no
// other call starts until it returns, so a stuck driver never stalls the
// agent nor piles up goroutines.
type Poller struct {
	opts Options
	log  *slog.Logger
	snap atomic.Pointer[Snapshot]
	w    *worker // used by one step goroutine at a time
}

// New returns a Poller; Run starts it. Until the first poll, its Snapshot
// is Up=false.
func New(o Options) (*Poller, error) {
	if o.Lib == nil {
		return nil, errors.New("nvml: Options.Lib is nil")
	}
	for name, d := range map[string]*time.Duration{
		"Interval": &o.Interval, "Timeout": &o.Timeout, "InitTimeout": &o.InitTimeout, "InitRetry": &o.InitRetry,
	} {
		if *d < 0 {
			return nil, fmt.Errorf("nvml: Options.%s is negative (%s)", name, *d)
		}
	}
	if o.Interval == 0 {
		o.Interval = DefaultInterval
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	if o.InitTimeout == 0 {
		o.InitTimeout = DefaultInitTimeout
	}
	if o.InitRetry == 0 {
		o.InitRetry = DefaultInitRetry
	}
	if o.GPMInterval < 0 {
		return nil, fmt.Errorf("nvml: Options.GPMInterval is negative (%s)", o.GPMInterval)
	}
	if o.GPMInterval == 0 {
		o.GPMInterval = o.Interval
	}
	switch o.GPM {
	case "":
		o.GPM = GPMAuto
	case GPMAuto, GPMOn, GPMOff:
	default:
		return nil, fmt.Errorf("nvml: Options.GPM is %q, want auto, on or off", o.GPM)
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	log = log.With("component", "nvml")
	p := &Poller{opts: o, log: log, w: newWorker(o.Lib, log, o.GPM, o.GPMInterval)}
	p.snap.Store(&Snapshot{Reason: "not polled yet", Time: time.Now()})
	return p, nil
}

// Snapshot returns the latest snapshot; never nil.
func (p *Poller) Snapshot() *Snapshot { return p.snap.Load() }

// OnXid makes fn hear of each XID event counted (the GPU's index and UUID,
// the code), on the poll's goroutine: the Xid tracker lists the processes
// on that GPU then (the blast radius). Call it before Run.
func (p *Poller) OnXid(fn func(index int, uuid string, xid uint64)) { p.w.onXid = fn }

// stepKind is what a step goroutine does.
type stepKind int

const (
	stepInit stepKind = iota
	stepPoll
	stepShutdown
)

func (k stepKind) String() string {
	return [...]string{"init", "poll", "shutdown"}[k]
}

// stepResult is what a step goroutine hands back.
type stepResult struct {
	kind    stepKind
	err     error     // init: why it failed
	snap    *Snapshot // poll
	started time.Time
}

// Run polls until ctx ends. It returns nil: NVML being absent or hung is a
// state (Snapshot.Up=false), not an error. On return NVML is shut down,
// unless a call is still stuck, in which case its goroutine is abandoned
// (nothing can interrupt a C call).
func (p *Poller) Run(ctx context.Context) error {
	done := make(chan stepResult, 1)
	next := time.NewTimer(0)
	defer next.Stop()
	var (
		inFlight *stepResult // the step running, nil when idle
		stuck    bool        // inFlight overran its timeout
		deadline <-chan time.Time
		timeout  *time.Timer
		limit    time.Duration // of inFlight
		lastInit string        // reason of the last init failure logged
	)
	start := func(k stepKind) {
		inFlight = &stepResult{kind: k, started: time.Now()}
		limit = p.opts.Timeout
		if k == stepInit {
			limit = p.opts.InitTimeout
		}
		timeout = time.NewTimer(limit)
		deadline = timeout.C
		go func(k stepKind) { done <- p.w.step(k) }(k)
	}
	for {
		select {
		case <-ctx.Done():
			p.stop(inFlight, stuck, deadline, done)
			if timeout != nil {
				timeout.Stop()
			}
			return nil

		case <-next.C:
			if p.w.initialised {
				start(stepPoll)
			} else {
				start(stepInit)
			}

		case <-deadline:
			deadline, stuck = nil, true
			reason := fmt.Sprintf("NVML %s did not return within %s (hung driver?)", inFlight.kind, limit)
			p.snap.Store(&Snapshot{Reason: reason, Time: time.Now()})
			p.log.Warn("NVML call did not return in time; GPU metrics off and no new call until it returns",
				"step", inFlight.kind.String(), "timeout", limit)

		case r := <-done:
			timeout.Stop()
			deadline, inFlight = nil, nil
			if stuck {
				// Late: keep Up=false until a poll finishes in time.
				stuck = false
				p.log.Info("stuck NVML call returned", "step", r.kind.String(), "after", time.Since(r.started).Round(time.Millisecond))
				if r.kind == stepInit && r.err != nil {
					next.Reset(p.opts.InitRetry)
				} else {
					next.Reset(p.opts.Interval)
				}
				continue
			}
			switch r.kind {
			case stepInit:
				if r.err != nil {
					reason := r.err.Error()
					p.snap.Store(&Snapshot{Reason: reason, Time: r.started})
					if reason != lastInit {
						lastInit = reason
						p.log.Warn("NVML unavailable; GPU metrics off, retrying", "err", r.err, "retry", p.opts.InitRetry)
					} else {
						p.log.Debug("NVML still unavailable", "err", r.err)
					}
					next.Reset(p.opts.InitRetry)
					continue
				}
				lastInit = ""
				p.log.Info("NVML initialised", "library", p.w.path, "driver", p.w.driver, "gpus", len(p.w.devs))
				next.Reset(0)
			case stepPoll:
				p.snap.Store(r.snap)
				if !r.snap.Up { // the driver went away: initialise again later
					p.log.Warn("NVML lost; GPU metrics off, initialising again", "err", r.snap.Reason, "retry", p.opts.InitRetry)
					next.Reset(p.opts.InitRetry)
					continue
				}
				next.Reset(max(0, p.opts.Interval-time.Since(r.started)))
			}
		}
	}
}

// stop finishes Run: it waits for a step in flight (within its timeout),
// then shuts NVML down under the poll timeout.
func (p *Poller) stop(inFlight *stepResult, stuck bool, deadline <-chan time.Time, done chan stepResult) {
	defer p.snap.Store(&Snapshot{Reason: "stopped", Time: time.Now()})
	if inFlight != nil {
		if stuck {
			p.log.Warn("abandoning a stuck NVML call at shutdown", "step", inFlight.kind.String())
			return
		}
		select {
		case <-done:
		case <-deadline:
			p.log.Warn("abandoning a stuck NVML call at shutdown", "step", inFlight.kind.String())
			return
		}
	}
	if !p.w.initialised {
		return
	}
	t := time.NewTimer(p.opts.Timeout)
	defer t.Stop()
	go func() { done <- p.w.step(stepShutdown) }()
	select {
	case <-done:
	case <-t.C:
		p.log.Warn("nvmlShutdown did not return in time; abandoned")
	}
}
