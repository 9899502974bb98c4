//go:build linux

package attach

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/ops"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// hostLoader is the dynamic loader a fresh process on this machine maps,
// as discovery reports it (path, device, inode).
func hostLoader(t *testing.T) discover.Mapping {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	var ld discover.Mapping
	err := testenv.Eventually(10*time.Second, func() error {
		res, err := (&discover.Scanner{PID: cmd.Process.Pid}).Scan()
		if err != nil {
			return err
		}
		for _, p := range res.Processes {
			for _, m := range p.Libs {
				if m.Lib == discover.LibLoader {
					ld = m
					return nil
				}
			}
		}
		return fmt.Errorf("sleep (pid %d) maps no dynamic loader yet", cmd.Process.Pid)
	})
	if err != nil {
		t.Skip(err)
	}
	return ld
}

// A pass that attaches a loader hook is followed by another pass at the
// triggered-pass interval, not --refresh-interval (an hour here) later: a
// process that mapped a CUDA library between the first scan and the
// hook's attach triggers nothing, and only a later scan can see it. A
// pass that finds the hook already attached asks for no follow-up.
func TestPassAfterNewLoaderHook(t *testing.T) {
	skipShort(t)
	ld := hostLoader(t)
	ld.PID = os.Getpid() // probes fire in this test process only (loaded)
	res := &discover.Result{Processes: []discover.Process{{PID: ld.PID, Libs: []discover.Mapping{ld}}}}
	scan := scanFunc(func() (*discover.Result, error) { return res, nil })

	a := New(loaded(t, ops.KernelModeAnonymous))
	a.Pass(scan, "/proc")
	if hooks := len(a.Status().LoaderHooks); hooks != 1 {
		t.Fatalf("%d loader hooks attached, want 1 (%s)", hooks, ld.Path)
	}
	if !a.hookedNow() {
		t.Fatal("a pass that attached a loader hook asks for no follow-up pass")
	}
	if a.hookedNow() {
		t.Fatal("the follow-up is asked for twice")
	}
	a.Pass(scan, "/proc")
	if a.hookedNow() {
		t.Fatal("a pass that found the hook attached already asks for a follow-up pass")
	}
	a.Close()

	// The loop runs the follow-up pass with the periodic one an hour away.
	passes := make(chan struct{}, 16)
	counted := scanFunc(func() (*discover.Result, error) {
		passes <- struct{}{}
		return res, nil
	})
	b := New(loaded(t, ops.KernelModeAnonymous))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- b.Run(ctx, LoopOptions{Scanner: counted, ProcRoot: "/proc", Interval: time.Hour, MinTriggerInterval: 10 * time.Millisecond})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	for i := range 2 {
		select {
		case <-passes:
		case <-time.After(10 * time.Second):
			t.Fatalf("pass %d did not run", i+1)
		}
	}
}
