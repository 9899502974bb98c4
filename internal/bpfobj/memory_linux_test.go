//go:build linux

package bpfobj

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/profi-dev/profi/internal/testutil"
)

// The kernel memory a load charges to the agent's memory cgroup (issue
// 44: about 106 MiB once, when an init container was killed at 128Mi;
// docs/BENCHMARK.md, "Verifier cost"): a child process in a memory cgroup
// of its own loads one configuration; the cgroup's kernel memory is read
// before, at its peak (the verifier's state while it runs) and after
// (maps and programs held). Reported, not asserted: the chart's limits
// come from these numbers.

const memHelperEnv = "PROFI_LOAD_MEMORY_CGROUP"

// memCgroup is a fresh memory cgroup: its directory and how to read its
// kernel memory now and at its peak (bytes).
type memCgroup struct {
	dir        string
	now, peak  func() (uint64, error)
	resetPeak  func() error
	kernelOnly bool // v1's kmem counters; v2's peak counts user memory too
}

func readUint(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
}

// v2Kernel is memory.stat's "kernel" line.
func v2Kernel(dir string) (uint64, error) {
	b, err := os.ReadFile(filepath.Join(dir, "memory.stat"))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "kernel "); ok {
			return strconv.ParseUint(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("no kernel line in %s/memory.stat", dir)
}

// openMemCgroup finds dir's memory cgroup (see memCgroup), or why not.
func openMemCgroup(dir string) (*memCgroup, error) {
	if _, err := os.Stat(filepath.Join(dir, "memory.kmem.usage_in_bytes")); err == nil {
		return &memCgroup{
			dir:  dir,
			now:  func() (uint64, error) { return readUint(filepath.Join(dir, "memory.kmem.usage_in_bytes")) },
			peak: func() (uint64, error) { return readUint(filepath.Join(dir, "memory.kmem.max_usage_in_bytes")) },
			resetPeak: func() error {
				return os.WriteFile(filepath.Join(dir, "memory.kmem.max_usage_in_bytes"), []byte("0"), 0)
			},
			kernelOnly: true,
		}, nil
	}
	if _, err := os.Stat(filepath.Join(dir, "memory.peak")); err == nil {
		return &memCgroup{
			dir:       dir,
			now:       func() (uint64, error) { return v2Kernel(dir) },
			peak:      func() (uint64, error) { return readUint(filepath.Join(dir, "memory.peak")) },
			resetPeak: func() error { return nil }, // a fresh cgroup's peak: its helper's own memory, subtracted
		}, nil
	}
	return nil, fmt.Errorf("%s has neither cgroup v1 kmem counters nor cgroup v2 memory.peak", dir)
}

// newMemCgroup makes a memory cgroup for the helper: in cgroup v1's
// memory hierarchy (its kmem counters), else below the cgroup v2 root
// where it enables the memory controller for its children.
func newMemCgroup(t *testing.T, n int) (string, error) {
	parent := "/sys/fs/cgroup/memory"
	if _, err := os.Stat(filepath.Join(parent, "memory.kmem.usage_in_bytes")); err != nil {
		parent = "/sys/fs/cgroup"
		ctl, err := os.ReadFile(filepath.Join(parent, "cgroup.subtree_control"))
		if err != nil || !strings.Contains(string(ctl), "memory") {
			return "", fmt.Errorf("no cgroup v1 memory hierarchy, and no memory controller for a child of %s (%q, %v)", parent, ctl, err)
		}
	}
	dir := filepath.Join(parent, fmt.Sprintf("profi-load-memory-%d-%d", os.Getpid(), n))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", err
	}
	t.Cleanup(func() { _ = os.Remove(dir) })
	return dir, nil
}

func TestLoadKernelMemory(t *testing.T) {
	if os.Getenv(memHelperEnv) != "" {
		return // the helper's process runs TestLoadKernelMemoryHelper only
	}
	testutil.RequireBPF(t)
	for i, name := range []string{"anonymous, breaker", "anonymous, breaker, preallocated", "full, every option", "classic uprobes"} {
		// A cgroup each: the last one's objects are freed after its
		// process exits, while the next would be measured.
		dir, err := newMemCgroup(t, i)
		if err != nil {
			t.Logf("kernel memory at load not measured here: %v", err)
			return
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestLoadKernelMemoryHelper$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), memHelperEnv+"="+dir, "PROFI_LOAD_MEMORY_CONFIG="+name)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: helper: %v\n%s", name, err, out)
		}
		var before, peak, after uint64
		var kind string
		for line := range strings.Lines(string(out)) {
			if _, err := fmt.Sscanf(strings.TrimSpace(line), "kmem %s before=%d peak=%d after=%d", &kind, &before, &peak, &after); err == nil {
				break
			}
		}
		if peak == 0 {
			t.Fatalf("%s: helper printed no measurement:\n%s", name, out)
		}
		mib := func(v uint64) float64 { return float64(v) / (1 << 20) }
		alloc := "preallocated hash maps"
		if strings.Contains(string(out), "hash maps allocated at run time") {
			alloc = "hash maps allocated at run time"
		}
		t.Logf("%s (%s): kernel memory charged by the load: %.1f MiB at its peak (%s), %.1f MiB held after (maps and programs)",
			name, alloc, mib(peak-min(before, peak)), kind, mib(after-min(before, after)))
	}
}

// TestLoadKernelMemoryHelper is TestLoadKernelMemory's child: it joins
// the cgroup, then loads.
func TestLoadKernelMemoryHelper(t *testing.T) {
	dir := os.Getenv(memHelperEnv)
	if dir == "" {
		return // run by TestLoadKernelMemory, in its cgroup (no skip: the VM lanes fail a skipped test)
	}
	cg, err := openMemCgroup(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
		t.Fatal(err)
	}
	name := os.Getenv("PROFI_LOAD_MEMORY_CONFIG")
	base, prealloc := strings.CutSuffix(name, ", preallocated")
	opts, ok := loadConfigurations()[base]
	opts.Preallocate = prealloc
	if !ok {
		t.Fatalf("no configuration %q", os.Getenv("PROFI_LOAD_MEMORY_CONFIG"))
	}
	if err := cg.resetPeak(); err != nil {
		t.Fatal(err)
	}
	before, err := cg.now()
	if err != nil {
		t.Fatal(err)
	}
	if !cg.kernelOnly {
		// v2's peak counts this process's own memory: start from it.
		if before, err = cg.peak(); err != nil {
			t.Fatal(err)
		}
	}
	objs, err := Load(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer objs.Close()
	peak, err := cg.peak()
	if err != nil {
		t.Fatal(err)
	}
	after, err := cg.now()
	if err != nil {
		t.Fatal(err)
	}
	kind := "kmem"
	if !cg.kernelOnly {
		kind = "memory.peak"
	}
	fmt.Printf("kmem %s before=%d peak=%d after=%d\n", kind, before, peak, after)
	if objs.RunTimeAlloc {
		fmt.Println("hash maps allocated at run time")
	}
}
