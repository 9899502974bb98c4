package attach

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/discover"
)

// scanFunc is a Scanner from a function.
type scanFunc func() (*discover.Result, error)

func (f scanFunc) Scan() (*discover.Result, error) { return f() }

// TestLastPass checks the heartbeat /health reads: New's time before the
// first pass, then the end of each pass, failed scans included.
func TestLastPass(t *testing.T) {
	t.Parallel()
	before := time.Now()
	a := New(Options{})
	created := a.LastPass()
	if created.Before(before) || created.After(time.Now()) {
		t.Fatalf("LastPass before any pass = %v, want New's time (after %v)", created, before)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var scanned time.Time
	scan := scanFunc(func() (*discover.Result, error) {
		scanned = time.Now()
		cancel() // one pass: Run returns after it
		return nil, errors.New("procfs unreadable")
	})
	if err := a.Run(ctx, LoopOptions{Scanner: scan, Interval: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if got := a.LastPass(); got.Before(scanned) {
		t.Errorf("LastPass after a failed pass = %v, want after the scan at %v", got, scanned)
	}
}
