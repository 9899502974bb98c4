package attach

import (
	"slices"
	"testing"

	"github.com/profi-dev/profi/internal/discover"
)

// --probe-traced-processes per architecture: auto leaves traced processes
// unprobed on arm64 only (docs/OPERATIONS.md, "Traced processes").
func TestExcludesTraced(t *testing.T) {
	for _, tc := range []struct {
		policy, goarch string
		want           bool
	}{
		{TracedAuto, "arm64", true},
		{TracedAuto, "amd64", false},
		{TracedNever, "arm64", true},
		{TracedNever, "amd64", true},
		{TracedAlways, "arm64", false},
		{TracedAlways, "amd64", false},
	} {
		if got := ExcludesTraced(tc.policy, tc.goarch); got != tc.want {
			t.Errorf("ExcludesTraced(%q, %q) = %v, want %v", tc.policy, tc.goarch, got, tc.want)
		}
	}
}

// The PID filters of a file's link sets: one for every process until a
// process that maps it is left unprobed, then one per probed process; the
// loader hook none; --pid keeps its own filter unless that process is traced.
func TestWantFilters(t *testing.T) {
	for _, tc := range []struct {
		name    string
		exclude bool
		pid     int // Options.PID
		lib     discover.Library
		pids    []int
		tracers map[int]int
		want    []int
	}{
		{"no tracer", true, 0, discover.LibCudart, []int{3, 1, 2}, nil, []int{0}},
		{"traced, policy probes it", false, 0, discover.LibCudart, []int{3, 1, 2}, map[int]int{2: 99}, []int{0}},
		{"one traced", true, 0, discover.LibCudart, []int{3, 1, 2, 3}, map[int]int{2: 99}, []int{1, 3}},
		{"every process traced", true, 0, discover.LibCudart, []int{2}, map[int]int{2: 99}, nil},
		{"loader hook", true, 0, discover.LibLoader, []int{1, 2}, map[int]int{2: 99}, nil},
		{"--pid traced", true, 2, discover.LibCudart, []int{2}, map[int]int{2: 99}, nil},
		{"--pid, another traced", true, 1, discover.LibCudart, []int{1, 2}, map[int]int{2: 99}, []int{1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := New(Options{ExcludeTraced: tc.exclude, PID: tc.pid})
			got := a.wantFilters(&Target{Lib: tc.lib, PIDs: tc.pids, Tracers: tc.tracers})
			if !slices.Equal(got, tc.want) {
				t.Errorf("wantFilters = %v, want %v", got, tc.want)
			}
		})
	}
}
