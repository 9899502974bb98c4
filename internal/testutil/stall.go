package testutil

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"syscall"
	"time"
)

// StallOff is how long Stall keeps a process stopped each time: longer than
// any time window a probe could have used to pair two of its probes (the
// 50 ms a CPU-limited pod's CFS period leaves it off the CPU, at most).
const StallOff = 60 * time.Millisecond

// Staller stops a process again and again (Stall); the test decides how
// long, by protocol: it waits for as many stops as it needs (Wait), then
// ends them (Stop).
type Staller struct {
	done chan struct{}
	wg   sync.WaitGroup
	once sync.Once

	mu      sync.Mutex
	stalls  int
	exited  bool          // the process is gone: no more stops
	changed chan struct{} // closed and replaced at each stop and at exit
}

// Stall stops process pid (SIGSTOP) for StallOff at a time and lets it run
// between 0.1 and 2 ms in between, at random, as a pod throttled by its CPU
// limit is stopped at any instruction, between any two of its probes. It
// goes on until Stop.
func Stall(pid int) *Staller {
	s := &Staller{done: make(chan struct{}), changed: make(chan struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer func() { _ = syscall.Kill(pid, syscall.SIGCONT) }()
		for {
			select {
			case <-s.done:
				return
			case <-time.After(time.Duration(100+rand.IntN(1900)) * time.Microsecond):
			}
			if syscall.Kill(pid, syscall.SIGSTOP) != nil {
				s.note(true) // exited
				return
			}
			time.Sleep(StallOff)
			err := syscall.Kill(pid, syscall.SIGCONT)
			s.note(err != nil)
			if err != nil {
				return
			}
		}
	}()
	return s
}

// note records one more stop (or the process's exit) and wakes Wait.
func (s *Staller) note(exited bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if exited {
		s.exited = true
	} else {
		s.stalls++
	}
	close(s.changed)
	s.changed = make(chan struct{})
}

// Wait returns once the process has been stopped (and let run again) n
// times, or an error when it exited first.
func (s *Staller) Wait(n int) error {
	for {
		s.mu.Lock()
		stalls, exited, changed := s.stalls, s.exited, s.changed
		s.mu.Unlock()
		switch {
		case stalls >= n:
			return nil
		case exited:
			return fmt.Errorf("testutil: the stalled process exited after %d of %d stops", stalls, n)
		}
		<-changed
	}
}

// Stop ends the stops, leaves the process running and returns how many
// times it was stopped. It may be called again (a deferred Stop).
func (s *Staller) Stop() int {
	s.once.Do(func() { close(s.done) })
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stalls
}
