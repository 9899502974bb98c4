package attach

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
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

// A process mapping 1,000 copies of a runtime (issue 30 item 5: 10,069
// descriptors; 3,000 reached the machine's limit) had every copy opened,
// parsed and attached. Files beyond a process's cap are refused unopened
// and counted once each; a file that a process with room also maps (the
// victim) is still attached; the node's cap bounds several such processes.
func TestAttachFileCaps(t *testing.T) {
	t.Parallel()
	var opens atomic.Int32
	denied := func() (*os.File, error) { return nil, os.ErrPermission } // each a failure kept for retry: held like a file
	const hostile, victim = 5, 6
	var targets []Target
	for i := range 1000 {
		targets = append(targets, target(FileKey{Dev: 1, Inode: uint64(1000 + i)}, discover.LibCudart, fmt.Sprintf("/copies/%d/libcudart.so.12", i), []int{hostile}, &opens, denied))
	}
	targets = append(targets,
		target(FileKey{Dev: 1, Inode: 1}, discover.LibCudart, "/lib/libcudart.so.12", []int{hostile, victim}, &opens, denied),
		target(FileKey{Dev: 1, Inode: 2}, discover.LibCuda, "/lib/libcuda.so.1", []int{victim}, &opens, denied))
	a := New(Options{KernelMode: ops.KernelModeAnonymous, Now: (&clock{now: t0}).Now, MaxFilesPerPID: 64, MaxFiles: 1024})
	a.Sync(targets)
	if got := opens.Load(); got != 64+2 {
		t.Errorf("files opened: %d, want 66 (the hostile process's 64 and the victim's 2)", got)
	}
	c := a.Counters()
	if want := map[string]uint64{LimitFilesPerPID: 1000 - 64}; !reflect.DeepEqual(c.LimitRefusals, want) {
		t.Errorf("refusals = %v, want %v", c.LimitRefusals, want)
	}
	// The next pass counts nothing again and opens nothing refused.
	a.Sync(targets)
	if c := a.Counters(); opens.Load() != 66 || c.LimitRefusals[LimitFilesPerPID] != 936 || c.CappedFiles != 936 {
		t.Errorf("second pass: %d opens, refusals %v, %d capped; want 66, 936, 936", opens.Load(), c.LimitRefusals, c.CappedFiles)
	}

	// Three processes of 64 copies each under a node cap of 100: its room
	// is 88 (the reserve 100/8 = 12), each process its own tenant here,
	// the guarantee 6 (shares.go). The first takes 64, the second 24 (the
	// room), the third, below its guarantee, 6 of the reserve.
	opens.Store(0)
	targets = targets[:0]
	for p := range 3 {
		for i := range 64 {
			targets = append(targets, target(FileKey{Dev: 2, Inode: uint64(p*100 + i)}, discover.LibCudart, fmt.Sprintf("/p%d/%d/libcudart.so.12", p, i), []int{10 + p}, &opens, denied))
		}
	}
	b := New(Options{KernelMode: ops.KernelModeAnonymous, Now: (&clock{now: t0}).Now, MaxFilesPerPID: 64, MaxFiles: 100})
	b.Sync(targets)
	if c := b.Counters(); opens.Load() != 64+24+6 || c.LimitRefusals[LimitFiles] != 3*64-94 {
		t.Errorf("node cap: %d opens, refusals %v; want 94, 98 at attached_files", opens.Load(), c.LimitRefusals)
	}
}

// The node's file cap is shared (issue 47: 17 processes mapping 64 copies
// of a runtime each took all 1,023 attachable files, and a victim started
// after them was not probed at all). Under --max-attached-files 1024 the
// room is 896 and the reserve 128, each tenant's guarantee 64: the
// hostile pod's 17 processes get the room, a second hostile pod its
// guarantee, and a victim pod, started last, both its files.
func TestAttachFileShares(t *testing.T) {
	t.Parallel()
	var opens atomic.Int32
	denied := func() (*os.File, error) { return nil, os.ErrPermission } // each a failure kept for retry: held like a file
	tenants := map[int]string{}
	var targets []Target
	for p := range 17 {
		pid := 100 + p
		tenants[pid] = "pod:hostile"
		for i := range 64 {
			targets = append(targets, target(FileKey{Dev: 1, Inode: uint64(p*1000 + i)}, discover.LibCudart, fmt.Sprintf("/h/%d/%d/libcudart.so.12", p, i), []int{pid}, &opens, denied))
		}
	}
	for p := range 2 {
		pid := 200 + p
		tenants[pid] = "pod:second"
		for i := range 64 {
			targets = append(targets, target(FileKey{Dev: 2, Inode: uint64(p*1000 + i)}, discover.LibCudart, fmt.Sprintf("/s/%d/%d/libcudart.so.12", p, i), []int{pid}, &opens, denied))
		}
	}
	const victim = 300
	tenants[victim] = "pod:victim"
	targets = append(targets,
		target(FileKey{Dev: 3, Inode: 1}, discover.LibCudart, "/v/libcudart.so.12", []int{victim}, &opens, denied),
		target(FileKey{Dev: 3, Inode: 2}, discover.LibCuda, "/v/libcuda.so.1", []int{victim}, &opens, denied))
	a := New(Options{KernelMode: ops.KernelModeAnonymous, Now: (&clock{now: t0}).Now, MaxFilesPerPID: 64, MaxFiles: 1024,
		TenantOf: func(pid int) string { return tenants[pid] }})
	for pass := range 2 {
		a.Sync(targets)
		if got := opens.Load(); got != 896+64+2 {
			t.Errorf("pass %d: %d files opened, want 962 (the room 896 to the hostile pod, the guarantee 64 to the second, the victim's 2)", pass, got)
		}
		if c := a.Counters(); c.LimitRefusals[LimitFiles] != 17*64-896+2*64-64 {
			t.Errorf("pass %d: refusals %v, want 256 at attached_files (192 of the hostile pod's, 64 of the second's)", pass, c.LimitRefusals)
		}
	}
	var victimHeld int
	for _, f := range a.Status().Failed {
		if slices.Equal(f.PIDs, []int{victim}) {
			victimHeld++
		}
	}
	if victimHeld != 2 {
		t.Errorf("the victim's files held: %d, want 2", victimHeld)
	}
}
