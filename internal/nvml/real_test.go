//go:build cgo && linux

package nvml

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// driverPresent reports whether this machine has an NVIDIA driver, where
// the real library would (rightly) come up.
func driverPresent() bool {
	_, err := os.Stat("/proc/driver/nvidia/version")
	return err == nil
}

// TestRealLibraryAbsent runs the real go-nvml Library where no driver is
// installed: Init fails with ErrLibraryNotFound naming every path tried,
// and a Poller over it reports Up=false with that reason, without
// crashing.
func TestRealLibraryAbsent(t *testing.T) {
	if driverPresent() {
		t.Skip("an NVIDIA driver is present: NVML would initialise")
	}
	missing := filepath.Join(t.TempDir(), LibraryName)
	t.Setenv(EnvLibrary, missing)
	lib := NewLibrary()
	err := lib.Init()
	if !errors.Is(err, ErrLibraryNotFound) {
		t.Fatalf("Init() = %v, want ErrLibraryNotFound", err)
	}
	if !strings.Contains(err.Error(), missing) {
		t.Errorf("Init() = %q, want it to name %s", err, missing)
	}
	if err := lib.Shutdown(); err != nil {
		t.Errorf("Shutdown() before a successful Init = %v, want nil", err)
	}

	p, err := New(Options{Lib: lib, Interval: 10 * time.Millisecond, InitRetry: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	s := waitFor(t, p, func(s *Snapshot) bool { return strings.Contains(s.Reason, "not found") })
	if s.Up || len(s.GPUs) != 0 {
		t.Errorf("snapshot = %+v, want Up=false and no GPUs", s)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run() = %v", err)
	}
}

// TestRealSearchPaths: without the variable, the loader's own search comes
// first, then the Kubernetes driver locations.
func TestRealSearchPaths(t *testing.T) {
	if driverPresent() {
		t.Skip("an NVIDIA driver is present: NVML would initialise")
	}
	t.Setenv(EnvLibrary, "")
	err := NewLibrary().Init()
	if !errors.Is(err, ErrLibraryNotFound) {
		t.Fatalf("Init() = %v, want ErrLibraryNotFound", err)
	}
	for _, p := range SearchPaths() {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("Init() = %q, want it to name %s", err, p)
		}
	}
}

// gpuEnv turns the skip of the real-GPU test into a failure (a GPU lane
// cannot pass by skipping).
const gpuEnv = "PROFI_GPU"

// TestRealLibraryOnGPU polls the real driver: NVML comes up and every GPU
// has its identity and the fields every datacenter GPU supports.
func TestRealLibraryOnGPU(t *testing.T) {
	if !driverPresent() {
		if os.Getenv(gpuEnv) == "1" {
			t.Fatalf("%s=1 but no NVIDIA driver (/proc/driver/nvidia/version)", gpuEnv)
		}
		t.Skip("no NVIDIA driver")
	}
	logs := &logBuffer{}
	p, err := New(Options{Lib: NewLibrary(), Interval: 100 * time.Millisecond, Logger: logs.logger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run() = %v", err)
		}
	}()
	deadline := time.Now().Add(60 * time.Second) // nvmlInit wakes every GPU without persistence mode
	for !p.Snapshot().Up && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	s := p.Snapshot()
	if !s.Up {
		t.Fatalf("NVML not up: %s\n%s", s.Reason, logs)
	}
	t.Logf("library %s, driver %s, poll %v", s.Library, s.DriverVersion, s.PollDuration)
	if len(s.GPUs) == 0 {
		t.Fatal("no GPUs")
	}
	for _, g := range s.GPUs {
		t.Logf("GPU %d:\n%s", g.Index, dump(g))
		if !strings.HasPrefix(g.UUID, "GPU-") || g.Name == "" {
			t.Errorf("GPU %d identity = %q %q", g.Index, g.UUID, g.Name)
		}
		if g.Memory == nil || g.Memory.Total == 0 || g.TemperatureCelsius == nil || g.PowerWatts == nil || g.SMClockMHz == nil || g.Processes == nil {
			t.Errorf("GPU %d lacks a field every datacenter GPU has", g.Index)
		}
		if u := g.GPUUtilization; u != nil && (*u < 0 || *u > 1) {
			t.Errorf("GPU %d utilization %v outside 0-1", g.Index, *u)
		}
	}
	if w := logs.lines("level=WARN"); len(w) != 0 {
		t.Errorf("warnings: %q", w)
	}
}
