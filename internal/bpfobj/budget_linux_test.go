//go:build linux

package bpfobj

import (
	_ "embed"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/profi-dev/profi/internal/testutil"
)

// The verifier's cost of loading the object, as a budget kept in the
// repository (issue 44): each program's instructions processed and peak
// states, the most over every load configuration, on each kernel and
// architecture the budget names (testdata/verifier-budget.json). A program
// that grows past its budget fails here: state explosions cost the agent's
// container kernel memory at every start (docs/BENCHMARK.md, "Verifier
// cost"). A kernel without an entry gets its numbers logged, to be added
// (go test -run TestLoadVerifierBudget -update-verifier-budget on it; the
// VM lanes' numbers are in their serial logs).

var updateBudget = flag.Bool("update-verifier-budget", false, "write this kernel's measured verifier cost into testdata/verifier-budget.json")

// budgetFile is the budget, built into the test binary: the VM lanes run
// it without the repository.
//
//go:embed testdata/verifier-budget.json
var budgetFile []byte

// verifierCost is one program's cost.
type verifierCost struct {
	Insns      int `json:"insns"`
	PeakStates int `json:"peak_states"`
}

// The verifier's statistics line (BPF_LOG_STATS).
var statsLine = regexp.MustCompile(`processed (\d+) insns \(limit \d+\).*peak_states (\d+)`)

// budgetKernel is the budget's key for this kernel: "6.18/amd64".
func budgetKernel(t *testing.T) string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	rel := unix.ByteSliceToString(u.Release[:])
	parts := strings.SplitN(rel, ".", 3)
	if len(parts) < 2 {
		t.Fatalf("kernel release %q", rel)
	}
	minor := strings.TrimFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' })
	return parts[0] + "." + minor + "/" + runtime.GOARCH
}

func TestLoadVerifierBudget(t *testing.T) {
	testutil.RequireBPF(t)
	worst := map[string]verifierCost{}
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range loadConfigurations() {
			if !yield(k) {
				return
			}
		}
	}) {
		opts := loadConfigurations()[name]
		opts.VerifierStats = true
		before, memOK := cgroupMemory()
		objs, err := Load(opts)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if after, ok := cgroupMemory(); ok && memOK {
			// The cgroup's charge (kernel memory the load allocated:
			// verifier state while it ran is freed, maps and programs stay),
			// this test process's own allocations included.
			t.Logf("%s: memory cgroup grew %.1f MiB while it loaded (objects held)", name, float64(int64(after)-int64(before))/(1<<20))
		}
		for prog, p := range objs.Programs() {
			m := statsLine.FindStringSubmatch(p.VerifierLog)
			if m == nil {
				objs.Close()
				t.Fatalf("%s: program %s: no statistics line in its verifier log:\n%s", name, prog, p.VerifierLog)
			}
			insns, _ := strconv.Atoi(m[1])
			peak, _ := strconv.Atoi(m[2])
			w := worst[prog]
			worst[prog] = verifierCost{max(w.Insns, insns), max(w.PeakStates, peak)}
		}
		objs.Close()
	}
	kernel := budgetKernel(t)
	var lines []string
	for _, prog := range slices.Sorted(func(yield func(string) bool) {
		for k := range worst {
			if !yield(k) {
				return
			}
		}
	}) {
		lines = append(lines, fmt.Sprintf("%s %d insns, %d peak states", prog, worst[prog].Insns, worst[prog].PeakStates))
	}
	t.Logf("verifier cost on %s, the most over %d configurations:\n  %s", kernel, len(loadConfigurations()), strings.Join(lines, "\n  "))

	path := filepath.Join("testdata", "verifier-budget.json")
	budgets := map[string]map[string]verifierCost{}
	if err := json.Unmarshal(budgetFile, &budgets); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if *updateBudget {
		budgets[kernel] = worst
		b, err := json.MarshalIndent(budgets, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	budget, ok := budgets[kernel]
	if !ok {
		t.Logf("no verifier budget for %s in %s: numbers above only", kernel, path)
		return
	}
	for prog, got := range worst {
		b, ok := budget[prog]
		switch {
		case !ok:
			t.Errorf("program %s has no budget on %s (%d insns, %d peak states): add it", prog, kernel, got.Insns, got.PeakStates)
		case got.Insns > b.Insns || got.PeakStates > b.PeakStates:
			t.Errorf("program %s on %s: %d insns, %d peak states; budget %d and %d", prog, kernel, got.Insns, got.PeakStates, b.Insns, b.PeakStates)
		}
	}
}

// cgroupMemory is this process's cgroup v2 memory.current; ok false where
// it cannot be read (cgroup v1, no memory controller).
func cgroupMemory() (uint64, bool) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		path, ok := strings.CutPrefix(line, "0::")
		if !ok {
			continue
		}
		v, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", path, "memory.current"))
		if err != nil {
			return 0, false
		}
		n, err := strconv.ParseUint(strings.TrimSpace(string(v)), 10, 64)
		return n, err == nil
	}
	return 0, false
}
