//go:build linux

package attach

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/ops"
)

// hostLoader is this machine's dynamic loader, resolved as maps shows it.
func hostLoader(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1"} {
		real, err := filepath.EvalSymlinks(p)
		if err != nil {
			continue
		}
		if lib, ok := discover.Classify(real); ok && lib == discover.LibLoader {
			return real
		}
	}
	t.Skip("no glibc dynamic loader on this machine")
	return ""
}

// A pass that attaches a loader hook is followed by another pass at the
// triggered-pass interval, not --refresh-interval (an hour here) later: a
// process that mapped a CUDA library between the first scan and the
// hook's attach triggers nothing, and only a later scan can see it. A
// pass that attaches no new hook is not followed.
func TestPassAfterNewLoaderHook(t *testing.T) {
	skipShort(t)
	ld := hostLoader(t)
	var st unix.Stat_t
	if err := unix.Stat(ld, &st); err != nil {
		t.Fatal(err)
	}
	pid := os.Getpid()
	res := &discover.Result{Processes: []discover.Process{{PID: pid, Libs: []discover.Mapping{
		{PID: pid, Lib: discover.LibLoader, Path: ld, Dev: st.Dev, Inode: st.Ino},
	}}}}
	passes := make(chan struct{}, 16)
	scan := scanFunc(func() (*discover.Result, error) {
		passes <- struct{}{}
		return res, nil
	})
	a := New(loaded(t, ops.KernelModeAnonymous))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- a.Run(ctx, LoopOptions{Scanner: scan, ProcRoot: "/proc", Interval: time.Hour, MinTriggerInterval: 10 * time.Millisecond})
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
	if hooks := len(a.Status().LoaderHooks); hooks != 1 {
		t.Fatalf("%d loader hooks attached, want 1 (%s)", hooks, ld)
	}
	select {
	case <-passes:
		t.Fatal("a third pass, after a pass that attached no new hook")
	case <-time.After(300 * time.Millisecond):
	}
}
