package attach

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
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

// Triggers within MinTriggerInterval of the last pass are coalesced into
// one held-back pass and counted: five load triggers right after a pass
// cause no pass before the interval ends.
func TestTriggeredPassesCoalesce(t *testing.T) {
	t.Parallel()
	a := New(Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	passes := 0
	first := make(chan struct{})
	scan := scanFunc(func() (*discover.Result, error) {
		if passes++; passes == 1 {
			close(first)
		}
		return &discover.Result{}, nil
	})
	trigger := make(chan struct{}) // unbuffered: a send returns once Run took it
	done := make(chan error)
	go func() {
		done <- a.Run(ctx, LoopOptions{Scanner: scan, Interval: time.Hour, Trigger: trigger, MinTriggerInterval: time.Hour})
	}()
	<-first
	for range 5 {
		trigger <- struct{}{}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if passes != 1 {
		t.Errorf("passes = %d, want 1 (the triggered pass is held back)", passes)
	}
	if got := a.Counters().TriggersCoalesced; got != 4 {
		t.Errorf("TriggersCoalesced = %d, want 4 (the first trigger waits, four join it)", got)
	}
}

// A trigger after the interval has passed starts a pass at once: each of
// three triggers, one per pass, is its own pass and nothing is coalesced.
func TestTriggeredPassAfterInterval(t *testing.T) {
	t.Parallel()
	a := New(Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	scanned := make(chan struct{}, 10)
	scan := scanFunc(func() (*discover.Result, error) {
		scanned <- struct{}{}
		return &discover.Result{}, nil
	})
	trigger := make(chan struct{})
	done := make(chan error)
	go func() {
		done <- a.Run(ctx, LoopOptions{Scanner: scan, Interval: time.Hour, Trigger: trigger, MinTriggerInterval: time.Nanosecond})
	}()
	<-scanned
	for range 3 {
		trigger <- struct{}{}
		<-scanned
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := a.Counters().TriggersCoalesced; got != 0 {
		t.Errorf("TriggersCoalesced = %d, want 0", got)
	}
}

// A target's Open tries every process's root: the first process exiting
// (its /proc entry still there, its root gone, not yet a zombie: the
// crash breaker acts at a death) does not make the file unopenable while
// another process maps it.
func TestTargetOpenSkipsExitingProcess(t *testing.T) {
	t.Parallel()
	procRoot := t.TempDir()
	if err := os.MkdirAll(filepath.Join(procRoot, "10"), 0o755); err != nil { // exiting: no root
		t.Fatal(err)
	}
	lib := filepath.Join(procRoot, "20", "root", "lib", "libcudart.so.12")
	if err := os.MkdirAll(filepath.Dir(lib), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lib, []byte("elf"), 0o644); err != nil {
		t.Fatal(err)
	}
	res := &discover.Result{Processes: []discover.Process{
		{PID: 10, Libs: []discover.Mapping{{PID: 10, Lib: discover.LibCudart, Path: "/lib/libcudart.so.12", Dev: 1, Inode: 2}}},
		{PID: 20, Libs: []discover.Mapping{{PID: 20, Lib: discover.LibCudart, Path: "/lib/libcudart.so.12", Dev: 1, Inode: 2}}},
	}}
	ts := Targets(res, procRoot)
	if len(ts) != 1 || !slices.Equal(ts[0].PIDs, []int{10, 20}) {
		t.Fatalf("targets %+v, want one file of pids 10 and 20", ts)
	}
	f, err := ts[0].Open()
	if err != nil {
		t.Fatalf("open through pid 20's root: %v", err)
	}
	defer f.Close()
	if b, err := io.ReadAll(f); err != nil || string(b) != "elf" {
		t.Errorf("read %q, %v; want the file", b, err)
	}
}
