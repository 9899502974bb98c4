package attach

import (
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/ops"
	"github.com/profi-dev/profi/internal/testutil"
)

// A crafted libcudart (issue 17): a sparse .dynsym of 256 MiB apparent
// size is refused with the cap in the error, a not_elf failure; one of
// 48 MiB is scanned in bounded reads and defines nothing.
func TestAttachHostileSparseFile(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		size   int64
		reason string
		text   string
	}{
		{"256 MiB .dynsym", 256 << 20, ReasonNotELF, "ELF table over its cap: .dynsym: 268435440 bytes, more than 67108864"},
		{"48 MiB .dynsym", 48 << 20, ReasonSymbolNotFound, "defines none of the probed symbols"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "libcudart.so.12")
			if err := testutil.WriteHostileELF(path, tc.size); err != nil {
				t.Fatal(err)
			}
			a := New(Options{KernelMode: ops.KernelModeAnonymous, Now: (&clock{now: t0}).Now})
			var opens atomic.Int32
			a.Sync([]Target{target(FileKey{Dev: 1, Inode: 7}, discover.LibCudart, path, []int{5}, &opens, func() (*os.File, error) {
				return os.Open(path)
			})})
			fl := onlyFailure(t, a)
			if fl.Reason != tc.reason || !strings.Contains(fl.Error, tc.text) {
				t.Errorf("failure = %+v, want %s with %q", fl, tc.reason, tc.text)
			}
		})
	}
}

// A panic while opening or parsing a file is that file's attach failure.
func TestAttachPanicIsFailure(t *testing.T) {
	t.Parallel()
	a := New(Options{KernelMode: ops.KernelModeAnonymous, Now: (&clock{now: t0}).Now})
	var opens atomic.Int32
	a.Sync([]Target{target(FileKey{Dev: 1, Inode: 8}, discover.LibCudart, "/lib/libcudart.so.12", []int{5}, &opens, func() (*os.File, error) {
		panic("boom")
	})})
	fl := onlyFailure(t, a)
	if fl.Reason != ReasonOther || !strings.Contains(fl.Error, "open and parse /lib/libcudart.so.12: panic: boom") {
		t.Errorf("failure = %+v, want other with the panic", fl)
	}
	if c := a.Counters(); c.Failures[[2]string{"libcudart.so", ReasonOther}] != 1 {
		t.Errorf("Failures = %v, want one other", c.Failures)
	}
}

// Files are opened and parsed without the attacher's lock: while one is
// (its Open blocks here), Counters and Status, which /metrics and
// /status call, answer. Under the lock this test would deadlock.
func TestAttachParsesOutsideLock(t *testing.T) {
	t.Parallel()
	a := New(Options{KernelMode: ops.KernelModeAnonymous, Now: (&clock{now: t0}).Now})
	entered, release := make(chan struct{}), make(chan struct{})
	var opens atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.Sync([]Target{target(FileKey{Dev: 1, Inode: 9}, discover.LibCudart, "/lib/libcudart.so.12", []int{5}, &opens, func() (*os.File, error) {
			close(entered)
			<-release
			return nil, os.ErrPermission
		})})
	}()
	<-entered
	_ = a.Counters()
	if st := a.Status(); len(st.Failed) != 0 || len(st.Attached) != 0 {
		t.Errorf("status while parsing = %+v, want nothing yet", st)
	}
	close(release)
	<-done
	if fl := onlyFailure(t, a); fl.Reason != ReasonOpenFailed {
		t.Errorf("failure = %+v, want open_failed", fl)
	}
}
