package testutil

import (
	"math/rand/v2"
	"sync"
	"syscall"
	"time"
)

// StallOff is how long Stall keeps a process stopped each time: longer than
// any time window a probe could have used to pair two of its probes (the
// 50 ms a CPU-limited pod's CFS period leaves it off the CPU, at most).
const StallOff = 60 * time.Millisecond

// Stall stops process pid (SIGSTOP) for StallOff at a time and lets it run
// between 0.1 and 2 ms in between, at random, as a pod throttled by its CPU
// limit is stopped at any instruction, between any two of its probes. It
// runs until the returned function is called, which leaves the process
// running and returns how many times it was stopped (a test that asserts
// exactness under stalls should also assert there were some).
func Stall(pid int) (stop func() int) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	stalls := 0
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer func() { _ = syscall.Kill(pid, syscall.SIGCONT) }()
		for {
			select {
			case <-done:
				return
			case <-time.After(time.Duration(100+rand.IntN(1900)) * time.Microsecond):
			}
			if syscall.Kill(pid, syscall.SIGSTOP) != nil {
				return // exited
			}
			stalls++
			time.Sleep(StallOff)
			if syscall.Kill(pid, syscall.SIGCONT) != nil {
				return
			}
		}
	}()
	return func() int {
		close(done)
		wg.Wait()
		return stalls
	}
}
