package attach

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/ops"
	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// clock is a settable Options.Now.
type clock struct{ now time.Time }

func (c *clock) Now() time.Time          { return c.now }
func (c *clock) Advance(d time.Duration) { c.now = c.now.Add(d) }

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// target returns a Target whose Open is open, counting its calls.
func target(key FileKey, lib discover.Library, path string, pids []int, opens *atomic.Int32, open func() (*os.File, error)) Target {
	return Target{Key: key, Lib: lib, Path: path, PIDs: pids, Open: func() (*os.File, error) {
		opens.Add(1)
		return open()
	}}
}

func goneOpen() (*os.File, error) {
	return nil, fmt.Errorf("open in root of pid 10: %w", discover.ErrProcessGone)
}

func textFile(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "libcudart.so.12")
	if err := os.WriteFile(p, []byte("this is not a shared object\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// onlyFailure returns the single failure in the Status.
func onlyFailure(t *testing.T, a *Attacher) FailureStatus {
	t.Helper()
	st := a.Status()
	if len(st.Attached) != 0 {
		t.Errorf("attached = %+v, want none", st.Attached)
	}
	if len(st.Failed) != 1 {
		t.Fatalf("failures = %+v, want one", st.Failed)
	}
	return st.Failed[0]
}

func TestAttachFailureReasons(t *testing.T) {
	t.Parallel()
	notELF := textFile(t)
	badELF := filepath.Join(t.TempDir(), "libcudart.so.12")
	if err := os.WriteFile(badELF, []byte("\x7fELF but not really"), 0o644); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(t.TempDir(), "libcudart.so.12")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		open    func() (*os.File, error)
		reason  string
		errText string
	}{
		{"process gone", goneOpen, ReasonProcessExited, "process gone"},
		{"permission denied", func() (*os.File, error) { return nil, os.ErrPermission }, ReasonOpenFailed, "permission denied"},
		{"missing file", func() (*os.File, error) { return os.Open(filepath.Join(t.TempDir(), "nope")) }, ReasonOpenFailed, "no such file"},
		{"text file", func() (*os.File, error) { return os.Open(notELF) }, ReasonNotELF, "not an ELF file"},
		{"empty file", func() (*os.File, error) { return os.Open(empty) }, ReasonNotELF, "not an ELF file"},
		{"ELF magic only", func() (*os.File, error) { return os.Open(badELF) }, ReasonNotELF, "parse ELF"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var opens atomic.Int32
			clk := &clock{now: t0}
			a := New(Options{KernelMode: ops.KernelModeAnonymous, Now: clk.Now})
			key := FileKey{Dev: 0x801, Inode: 500}
			a.Sync([]Target{target(key, discover.LibCudart, "/usr/lib/libcudart.so.12", []int{10}, &opens, tc.open)})
			fl := onlyFailure(t, a)
			if fl.Reason != tc.reason || !strings.Contains(fl.Error, tc.errText) || !strings.Contains(fl.Error, "/usr/lib/libcudart.so.12") {
				t.Errorf("failure reason %q, error %q; want %q with %q and the path", fl.Reason, fl.Error, tc.reason, tc.errText)
			}
			want := FailureStatus{
				Library: "libcudart.so", Path: "/usr/lib/libcudart.so.12", File: key.String(), PIDs: []int{10},
				Reason: fl.Reason, Error: fl.Error, Attempts: 1, NextRetry: t0.Add(time.Second),
			}
			if !reflect.DeepEqual(fl, want) {
				t.Errorf("failure = %+v, want %+v", fl, want)
			}
			c := a.Counters()
			if want := map[[2]string]uint64{{"libcudart.so", tc.reason}: 1}; !reflect.DeepEqual(c.Failures, want) {
				t.Errorf("Failures = %v, want %v", c.Failures, want)
			}
			if len(c.Attached) != 0 || len(c.TrackedPIDs) != 0 {
				t.Errorf("a failed attach counts as attached: %+v", c)
			}
			if opens.Load() != 1 {
				t.Errorf("Open called %d times, want 1", opens.Load())
			}
		})
	}
}

func TestAttachBackoff(t *testing.T) {
	t.Parallel()
	var opens atomic.Int32
	clk := &clock{now: t0}
	a := New(Options{KernelMode: ops.KernelModeAnonymous, RetryBase: time.Second, RetryMax: 8 * time.Second, Now: clk.Now})
	key := FileKey{Dev: 1, Inode: 2}
	tg := target(key, discover.LibCudart, "/lib/libcudart.so.12", []int{10}, &opens, goneOpen)

	// attempt n fails at the given time and waits RetryBase<<(n-1), at most RetryMax.
	steps := []struct {
		wait     time.Duration // since the previous step
		opens    int32
		attempts int
		next     time.Duration // since t0
	}{
		{0, 1, 1, 1 * time.Second},
		{500 * time.Millisecond, 1, 1, 1 * time.Second}, // still waiting
		{500 * time.Millisecond, 2, 2, 3 * time.Second},
		{1999 * time.Millisecond, 2, 2, 3 * time.Second},
		{1 * time.Millisecond, 3, 3, 7 * time.Second},
		{4 * time.Second, 4, 4, 15 * time.Second},
		{8 * time.Second, 5, 5, 23 * time.Second}, // capped at 8s
		{8 * time.Second, 6, 6, 31 * time.Second},
	}
	for i, s := range steps {
		clk.Advance(s.wait)
		a.Sync([]Target{tg})
		fl := onlyFailure(t, a)
		if opens.Load() != s.opens || fl.Attempts != s.attempts || !fl.NextRetry.Equal(t0.Add(s.next)) {
			t.Errorf("step %d: opens %d, attempts %d, next retry t0+%v; want %d, %d, t0+%v",
				i, opens.Load(), fl.Attempts, fl.NextRetry.Sub(t0), s.opens, s.attempts, s.next)
		}
		if fl.Reason != ReasonProcessExited {
			t.Errorf("step %d: reason %q", i, fl.Reason)
		}
	}
	if got, want := a.Counters().Failures, map[[2]string]uint64{{"libcudart.so", ReasonProcessExited}: 6}; !reflect.DeepEqual(got, want) {
		t.Errorf("Failures = %v, want %v (one per attempt)", got, want)
	}

	// While waiting, the failure follows the PIDs that map the file.
	tg.PIDs = []int{12, 11, 12}
	a.Sync([]Target{tg})
	if fl := onlyFailure(t, a); !reflect.DeepEqual(fl.PIDs, []int{11, 12}) || fl.Attempts != 6 {
		t.Errorf("failure PIDs %v, attempts %d; want [11 12], 6", fl.PIDs, fl.Attempts)
	}

	// A target no process maps any more drops its failure entry (the counter stays).
	a.Sync(nil)
	if st := a.Status(); len(st.Failed) != 0 || len(st.Attached) != 0 {
		t.Errorf("status after the target went away = %+v", st)
	}
	if got := a.Counters().Failures[[2]string{"libcudart.so", ReasonProcessExited}]; got != 6 {
		t.Errorf("failure counter = %d after the target went away, want 6", got)
	}

	// When it comes back, the backoff starts over.
	a.Sync([]Target{tg})
	if fl := onlyFailure(t, a); fl.Attempts != 1 || !fl.NextRetry.Equal(clk.now.Add(time.Second)) || opens.Load() != 7 {
		t.Errorf("after return: attempts %d, next retry now+%v, opens %d; want 1, 1s, 7", fl.Attempts, fl.NextRetry.Sub(clk.now), opens.Load())
	}
}

func TestAttachBackoffDefaults(t *testing.T) {
	t.Parallel()
	clk := &clock{now: t0}
	// No RetryBase or RetryMax: 1s doubling up to 5 minutes.
	a := New(Options{Now: clk.Now})
	var opens atomic.Int32
	tg := target(FileKey{Dev: 1, Inode: 1}, discover.LibCudart, "/l", []int{1}, &opens, goneOpen)
	var waits []time.Duration
	for range 12 {
		a.Sync([]Target{tg})
		fl := onlyFailure(t, a)
		waits = append(waits, fl.NextRetry.Sub(clk.now))
		clk.now = fl.NextRetry
	}
	want := []time.Duration{1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300}
	for i := range want {
		want[i] *= time.Second
	}
	if !reflect.DeepEqual(waits, want) {
		t.Errorf("waits = %v, want %v", waits, want)
	}
}

func TestSyncMergesTargetsOfOneFile(t *testing.T) {
	t.Parallel()
	var opens atomic.Int32
	a := New(Options{Now: (&clock{now: t0}).Now})
	key := FileKey{Dev: 7, Inode: 7}
	a.Sync([]Target{
		target(key, discover.LibCudart, "/a/libcudart.so.12", []int{1}, &opens, goneOpen),
		target(key, discover.LibCudart, "/b/libcudart.so.12", []int{2}, &opens, goneOpen),
	})
	fl := onlyFailure(t, a)
	if opens.Load() != 1 || fl.Attempts != 1 || !reflect.DeepEqual(fl.PIDs, []int{1, 2}) || fl.Path != "/a/libcudart.so.12" {
		t.Errorf("opens %d, failure %+v; want one attempt for PIDs [1 2] under the first path", opens.Load(), fl)
	}
	if got := a.Counters().Failures; !reflect.DeepEqual(got, map[[2]string]uint64{{"libcudart.so", ReasonProcessExited}: 1}) {
		t.Errorf("Failures = %v", got)
	}
}

// TestOpenEither: a file seen under two paths opens through the second
// only when the first's processes are gone.
func TestOpenEither(t *testing.T) {
	t.Parallel()
	denied := errors.New("permission denied")
	ok := func() (*os.File, error) { return os.Stdin, nil }
	fail := func() (*os.File, error) { return nil, denied }
	tests := []struct {
		name          string
		first, second func() (*os.File, error)
		want          error
		wantFile      bool
	}{
		{"first opens", ok, fail, nil, true},
		{"first gone", goneOpen, ok, nil, true},
		{"both gone", goneOpen, goneOpen, discover.ErrProcessGone, false},
		{"first fails otherwise", fail, ok, denied, false},
		{"no second", goneOpen, nil, discover.ErrProcessGone, false},
		{"no first", nil, ok, nil, true},
	}
	for _, tc := range tests {
		f, err := openEither(tc.first, tc.second)()
		if !errors.Is(err, tc.want) || (tc.want == nil && err != nil) || (f != nil) != tc.wantFile {
			t.Errorf("%s: %v, %v; want file %v, error %v", tc.name, f, err, tc.wantFile, tc.want)
		}
	}
}

func TestAddStatic(t *testing.T) {
	t.Parallel()
	t.Run("missing file", func(t *testing.T) {
		t.Parallel()
		a := New(Options{})
		a.AddStatic(discover.LibCudart, filepath.Join(t.TempDir(), "libcudart.so"))
		a.Sync(nil)
		st := a.Status()
		if len(st.Attached) != 0 || len(st.Failed) != 0 {
			t.Errorf("status = %+v, want nothing attached or pending", st)
		}
		c := a.Counters()
		if want := map[[2]string]uint64{{"libcudart.so", ReasonOpenFailed}: 1}; !reflect.DeepEqual(c.Failures, want) {
			t.Errorf("Failures = %v, want %v", c.Failures, want)
		}
		if len(c.Attached) != 0 {
			t.Errorf("Attached = %v, want none", c.Attached)
		}
	})
	t.Run("not ELF, kept without targets", func(t *testing.T) {
		t.Parallel()
		clk := &clock{now: t0}
		a := New(Options{Now: clk.Now})
		path := textFile(t)
		a.AddStatic(discover.LibCudart, path)
		a.Sync(nil)
		fl := onlyFailure(t, a)
		if fl.Reason != ReasonNotELF || fl.Path != path || len(fl.PIDs) != 0 {
			t.Errorf("failure = %+v", fl)
		}
		// Static targets stay (and retry) whatever the scan finds.
		clk.Advance(time.Second)
		a.Sync(nil)
		if fl := onlyFailure(t, a); fl.Attempts != 2 {
			t.Errorf("attempts = %d, want 2", fl.Attempts)
		}
	})
}

func TestSymbolNotFound(t *testing.T) {
	t.Parallel()
	fx := fixtures(t)
	// A real shared object that defines none of the probed symbols.
	a := New(Options{KernelMode: ops.KernelModeAnonymous, Now: (&clock{now: t0}).Now})
	var opens atomic.Int32
	a.Sync([]Target{target(FileKey{Dev: 1, Inode: 9}, discover.LibCudart, "/w", []int{5}, &opens, func() (*os.File, error) {
		return os.Open(fx.Workload)
	})})
	fl := onlyFailure(t, a)
	if fl.Reason != ReasonSymbolNotFound || !strings.Contains(fl.Error, "defines none of the probed symbols") {
		t.Errorf("failure = %+v, want symbol_not_found", fl)
	}
}

// TestLibraryWithoutProbesIsNoFailure: a library discovery reports but no
// probe set exists for (a future one); it must not be counted as an attach
// failure (nor retried and logged forever).
func TestLibraryWithoutProbesIsNoFailure(t *testing.T) {
	t.Parallel()
	fx := fixtures(t)
	a := New(Options{KernelMode: ops.KernelModeAnonymous})
	var opens atomic.Int32
	for _, lib := range []discover.Library{"libfuture.so"} {
		a.Sync([]Target{target(FileKey{Dev: 1, Inode: 1}, lib, "/l", []int{5}, &opens, func() (*os.File, error) {
			return os.Open(fx.Cudart)
		})})
	}
	if st := a.Status(); len(st.Failed) != 0 {
		t.Errorf("failures = %+v, want none", st.Failed)
	}
	if c := a.Counters(); len(c.Failures) != 0 {
		t.Errorf("Failures = %v, want none", c.Failures)
	}
}

func TestClosedAttacherIgnoresSync(t *testing.T) {
	t.Parallel()
	var opens atomic.Int32
	a := New(Options{})
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	a.Sync([]Target{target(FileKey{Dev: 1, Inode: 1}, discover.LibCudart, "/l", []int{1}, &opens, goneOpen)})
	if opens.Load() != 0 {
		t.Errorf("Open called %d times after Close", opens.Load())
	}
	if st := a.Status(); len(st.Failed) != 0 || !st.LastSync.IsZero() {
		t.Errorf("status after Close = %+v", st)
	}
}

// fakeScanner returns fixed results.
type fakeScanner struct {
	res *discover.Result
	err error
}

func (s fakeScanner) Scan() (*discover.Result, error) { return s.res, s.err }

func TestPass(t *testing.T) {
	t.Parallel()
	clk := &clock{now: t0}
	a := New(Options{Now: clk.Now})
	procRoot := t.TempDir() // no process directories: every process is gone
	res := &discover.Result{
		Processes: []discover.Process{
			{PID: 10, Libs: []discover.Mapping{mapping(10, discover.LibCudart, "/l/libcudart.so.12", 1, 2)}},
			{PID: 11, Libs: []discover.Mapping{mapping(11, discover.LibCudart, "/l/libcudart.so.12", 1, 2)}},
		},
		Problems: []discover.Problem{{PID: 3, Err: errors.New("bad line")}, {PID: 4, Err: errors.New("unreadable")}},
	}
	a.Pass(fakeScanner{res: res}, procRoot)
	fl := onlyFailure(t, a)
	if fl.Reason != ReasonProcessExited || !reflect.DeepEqual(fl.PIDs, []int{10, 11}) {
		t.Errorf("failure = %+v, want process_exited for [10 11]", fl)
	}
	if got := a.Counters().ScanProblems; got != 2 {
		t.Errorf("ScanProblems = %d, want 2", got)
	}
	if st := a.Status(); !st.LastSync.Equal(t0) {
		t.Errorf("LastSync = %v, want %v", st.LastSync, t0)
	}

	// A failed scan keeps the state as it is (no detach on a transient error).
	clk.Advance(time.Hour)
	a.Pass(fakeScanner{err: errors.New("readdir /proc: EIO")}, procRoot)
	if fl2 := onlyFailure(t, a); !reflect.DeepEqual(fl2, fl) {
		t.Errorf("failed scan changed the state: %+v -> %+v", fl, fl2)
	}
	if st := a.Status(); !st.LastSync.Equal(t0) {
		t.Errorf("a failed scan moved LastSync to %v", st.LastSync)
	}
	if got := a.Counters().ScanProblems; got != 2 {
		t.Errorf("ScanProblems = %d after a failed scan, want 2", got)
	}
}

// fixtures builds the stub libraries (gcc needed).
func fixtures(t *testing.T) *testutil.Fixtures {
	t.Helper()
	fx, err := testutil.BuildFixtures(testutil.SharedDir())
	if errors.Is(err, testutil.ErrNoCompiler) && os.Getenv(testenv.E2EEnv) != "1" {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return fx
}
