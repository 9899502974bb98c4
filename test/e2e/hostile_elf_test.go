package e2e

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// hostileHeapBound is how much the agent's peak RSS (VmHWM) may grow
// while it handles the hostile file: elfsym reads it in 64 KiB pieces
// (about 130 KiB allocated, internal/elfsym TestHostileSparseDynsym);
// the rest is room for the scrapes made meanwhile. debug/elf parsing the
// same file grew it by about 1.5 GiB (issue 17).
const hostileHeapBound = 32 << 20

// vmKB returns a VmXXX field of /proc/PID/status in bytes.
func vmKB(t *testing.T, pid int, field string) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// A process maps a crafted libcudart.so.12: a 256 MiB-apparent .dynsym,
// a few KiB on disk (issue 17, "One crafted file OOM-kills the agent").
// The agent refuses the file with the cap in the reason, its peak RSS
// stays within hostileHeapBound, and /metrics and /health answer while it
// tries.
func TestHostileSparseLibrary(t *testing.T) {
	a := startAgent(t)
	path := filepath.Join(t.TempDir(), "libcudart.so.12")
	if err := testutil.WriteHostileELF(path, 256<<20); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	t.Logf("hostile file: %d bytes apparent, %d on disk", st.Size, st.Blocks*512)

	// Settle the agent (first pass, first scrape) before the baseline.
	if code, _, err := a.Get("/metrics"); err != nil || code != 200 {
		t.Fatalf("/metrics before: %d, %v", code, err)
	}
	baseHWM, baseRSS := vmKB(t, a.PID(), "VmHWM"), vmKB(t, a.PID(), "VmRSS")

	// This test process maps the file, as any tenant process may.
	fd, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	mem, err := syscall.Mmap(int(fd.Fd()), 0, 4096, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Munmap(mem) })

	var scrapes int
	var slowest time.Duration
	var reason, msg string
	err = testenv.Eventually(30*time.Second, func() error {
		for _, p := range []string{"/metrics", "/health"} {
			began := time.Now()
			code, _, err := a.Get(p)
			if err != nil || code != 200 {
				return fmt.Errorf("%s during the attach attempt: %d, %v", p, code, err)
			}
			slowest = max(slowest, time.Since(began))
			scrapes++
		}
		var s status
		if err := a.Status(&s); err != nil {
			return err
		}
		for _, f := range s.AttachFailures {
			if f.Path == path {
				reason, msg = f.Reason, f.Error
				return nil
			}
		}
		return fmt.Errorf("no attach failure for %s yet: %+v", path, s.AttachFailures)
	})
	if a.Exited() {
		t.Fatalf("agent exited: %s", a.Logs())
	}
	hwm, rss := vmKB(t, a.PID(), "VmHWM"), vmKB(t, a.PID(), "VmRSS")
	t.Logf("agent VmHWM %d MiB -> %d MiB, VmRSS %d MiB -> %d MiB; %d requests answered, slowest %v",
		baseHWM>>20, hwm>>20, baseRSS>>20, rss>>20, scrapes, slowest)
	if err != nil {
		t.Fatal(err)
	}
	if hwm-baseHWM > hostileHeapBound {
		t.Errorf("peak RSS grew by %d MiB, bound %d MiB", (hwm-baseHWM)>>20, hostileHeapBound>>20)
	}
	if reason != "not_elf" || !strings.Contains(msg, ".dynsym: 268435440 bytes, more than 67108864") {
		t.Errorf("failure %s: %q; want not_elf naming the .dynsym size and its cap", reason, msg)
	}
	// Each attempt is counted once: the counter equals the attempts that
	// /status reports (read on both sides of the scrape, so a retry in
	// between is seen and the check repeated).
	attempts := func() (int, error) {
		var s struct {
			Failures []struct {
				Path     string `json:"path"`
				Attempts int    `json:"attempts"`
			} `json:"attach_failures"`
		}
		if err := a.Status(&s); err != nil {
			return 0, err
		}
		for _, f := range s.Failures {
			if f.Path == path {
				return f.Attempts, nil
			}
		}
		return 0, fmt.Errorf("failure of %s gone from /status", path)
	}
	err = testenv.Eventually(15*time.Second, func() error {
		before, err := attempts()
		if err != nil {
			return err
		}
		mfs, err := a.Metrics()
		if err != nil {
			return err
		}
		after, err := attempts()
		if err != nil {
			return err
		}
		var notELF float64
		for _, s := range testutil.Samples(mfs["profi_system_attach_failures_total"]) {
			if s.Labels["library"] == "libcudart.so" && s.Labels["reason"] == "not_elf" {
				notELF = s.Value
			}
		}
		if before != after || notELF != float64(after) {
			return fmt.Errorf("profi_system_attach_failures_total{library=libcudart.so,reason=not_elf} = %v, attempts %d..%d", notELF, before, after)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}
