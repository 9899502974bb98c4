package e2e

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/profi-dev/profi/internal/attach"
	pstatus "github.com/profi-dev/profi/internal/status"
	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// mapperEnv re-runs the test binary as a process that maps every file
// below a directory executable, as the dynamic loader maps a library, and
// waits for its stdin to close (mapFiles): the hostile processes of
// TestVictimAfterRuntimeCopies, which need no CUDA call to hold files.
const mapperEnv = "PROFI_E2E_MAP_FILES"

func mapFiles(dir string) int {
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return err
		}
		_, err = unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ|unix.PROT_EXEC, unix.MAP_PRIVATE)
		return err
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "map files:", err)
		return 1
	}
	fmt.Printf("ready %d\n", os.Getpid())
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// refusedFiles are the files the node's and the per-process caps refused
// (a process whose loader is hooked holds that file too, so its 64th copy
// meets the per-process cap: which cap refuses a file depends on the
// order of the pass, their sum does not).
func refusedFiles(st pstatus.Doc) uint64 {
	return st.Refusals[attach.LimitFiles] + st.Refusals[attach.LimitFilesPerPID]
}

// Issue 47: 16 processes of one tenant map 64 copies of a runtime each,
// all of --max-attached-files 1024; a victim in another tenant starts
// after them. On main before the shares of the attach budget the victim
// was not probed at all (0 of its calls counted). The hostile tenant gets
// the room, 896 files (seven eighths), its other 128 refused and counted;
// the victim's runtime and driver come from the reserve and its calls,
// launches and bytes are exact (docs/OPERATIONS.md, "Shares of the attach
// budget").
func TestVictimAfterRuntimeCopies(t *testing.T) {
	const procs, copies, room = 16, 64, 896 // room: 1024 less its eighth, the explicit share of docs/OPERATIONS.md
	a := startAgent(t, "--max-attached-files", "1024", "--max-attached-files-per-pid", "64")
	dir := t.TempDir()
	hostileCg := inNewCgroup(t, "copies-hostile")
	hostile := map[int]bool{}
	var hostiles []*testutil.Workload
	for p := range procs {
		d := filepath.Join(dir, strconv.Itoa(p))
		for i := range copies {
			path := filepath.Join(d, strconv.Itoa(i), "libcudart.so.12")
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := testutil.CopyFile(fixtures.Cudart, path); err != nil {
				t.Fatal(err)
			}
		}
		w := startWorkload(t, os.Args[0], nil, hostileCg, testutil.WithEnv(append(os.Environ(), mapperEnv+"="+d)))
		hostile[w.PID] = true
		hostiles = append(hostiles, w)
	}
	var st pstatus.Doc
	held := func() (n int) {
		for _, l := range st.AttachedLibraries {
			if len(l.PIDs) == 1 && hostile[l.PIDs[0]] {
				n++
			}
		}
		return n
	}
	if err := testenv.Eventually(60*time.Second, func() error {
		if err := a.Status(&st); err != nil {
			return err
		}
		// The loader hooks (ld.so) are files of the cap too.
		want := room - len(st.LoaderHooks)
		if n, refused := held(), refusedFiles(st); n != want || refused != uint64(procs*copies-want) {
			return fmt.Errorf("the hostile tenant holds %d files, %d refused, %d loader hooks; want %d and %d", n, refused, len(st.LoaderHooks), want, procs*copies-want)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	victim := startWorkload(t, fixtures.Workload, defaultArgs, inNewCgroup(t, "copies-victim"))
	waitAttached(t, a, victim.PID)
	gt := runPhase(t, victim)
	requireExact(t, a, expected([]*testutil.GroundTruth{gt}), victim.PID)
	if err := a.Status(&st); err != nil {
		t.Fatal(err)
	}
	want := room - len(st.LoaderHooks)
	if n, refused := held(), refusedFiles(st); n != want || refused != uint64(procs*copies-want) {
		t.Errorf("after the victim: the hostile tenant holds %d files, %d refused; want %d and %d (none of the victim's)", n, refused, want, procs*copies-want)
	}
	t.Logf("%d hostile processes mapping %d runtime copies each: %d files attached (and %d loader hooks), %d refused; the victim (pid %d) exact: %d calls, %d launches",
		procs, copies, want, len(st.LoaderHooks), procs*copies-want, victim.PID, gt.TotalCalls(), gt.Launches)

	// The hostile processes exit together: their files are released in
	// the background, every link counted until it is gone.
	for _, w := range hostiles {
		if err := w.Stop(); err != nil {
			t.Fatal(err)
		}
	}
	if err := testenv.Eventually(120*time.Second, func() error {
		if err := a.Status(&st); err != nil {
			return err
		}
		if n := held(); n != 0 || st.ProbeLinks == nil || st.ProbeLinks.Releasing != 0 {
			return fmt.Errorf("%d hostile files still attached, probe links %+v", n, st.ProbeLinks)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if r := st.ProbeLinks.LastRelease; r != nil {
		t.Logf("the hostile files released: %d links in %.2f s", r.Links, r.Seconds)
	}
}
