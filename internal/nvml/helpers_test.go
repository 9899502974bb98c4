package nvml

import (
	"testing"
	"time"
)

// waitFor polls p's snapshot until cond holds (5 s at most).
func waitFor(t *testing.T, p *Poller, cond func(*Snapshot) bool) *Snapshot {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s := p.Snapshot()
		if cond(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within 5s; last snapshot %+v", s)
		}
		time.Sleep(time.Millisecond)
	}
}
