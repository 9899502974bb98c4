//go:build linux

package bpfobj

import (
	"testing"

	"github.com/cilium/ebpf"

	"github.com/profi-dev/profi/internal/testutil"
)

func TestLoadSizes(t *testing.T) {
	testutil.RequireBPF(t)
	tests := []struct {
		name    string
		sizes   Options
		want    Options // resulting max_entries
		streams uint32  // pid_streams' max_entries
	}{
		{
			name:    "defaults",
			sizes:   Options{},
			want:    Options{Aggregated: 2048, LaunchAgg: 8192, Inflight: 10240, MallocSizes: 131072},
			streams: 16384,
		},
		{
			// make bench-scale's: 4 processes of 12,500 streams.
			name:    "many streams",
			sizes:   Options{LaunchAgg: 65536},
			want:    Options{Aggregated: 2048, LaunchAgg: 65536, Inflight: 10240, MallocSizes: 131072},
			streams: 67584,
		},
		{
			name:    "custom",
			sizes:   Options{Aggregated: 100, LaunchAgg: 200, Inflight: 300, MallocSizes: 400},
			want:    Options{Aggregated: 100, LaunchAgg: 200, Inflight: 300, MallocSizes: 400},
			streams: 16384,
		},
		{
			name:    "partly custom",
			sizes:   Options{LaunchAgg: 16},
			want:    Options{Aggregated: 2048, LaunchAgg: 16, Inflight: 10240, MallocSizes: 131072},
			streams: 16384,
		},
		{
			// Every optional code path loaded: the NVTX phase lookup, hit
			// counting, detailed launches, sampling, the crash breaker
			// (its CO-RE read of task_struct resolved against this kernel).
			name:    "nvtx and every option",
			sizes:   Options{NVTX: true, CountHits: true, Detailed: true, SampleRate: 10, CrashBreaker: true},
			want:    Options{Aggregated: 2048, LaunchAgg: 8192, Inflight: 10240, MallocSizes: 131072},
			streams: 16384,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := Load(tc.sizes)
			if err != nil {
				t.Fatal(err)
			}
			defer objs.Close()
			for _, m := range []struct {
				name string
				m    *ebpf.Map
				want uint32
			}{
				{"aggregated", objs.Aggregated, tc.want.Aggregated},
				{"launch_agg", objs.LaunchAgg, tc.want.LaunchAgg},
				{"inflight", objs.Inflight, tc.want.Inflight},
				{"malloc_sizes", objs.MallocSizes, tc.want.MallocSizes},
				{"drops", objs.Drops, uint32(NumDrops)},
				{"pid_streams", objs.PidStreams, tc.streams},
			} {
				if got := m.m.MaxEntries(); got != m.want {
					t.Errorf("%s MaxEntries = %d, want %d", m.name, got, m.want)
				}
			}
			for name, p := range map[string]*ebpf.Program{
				ProfiProgTimedEntry: objs.TimedEntry, ProfiProgTimedReturn: objs.TimedReturn, ProfiProgLaunchEntry: objs.LaunchEntry,
			} {
				if p == nil || p.FD() < 0 {
					t.Errorf("program %s not loaded", name)
				}
			}
		})
	}
}

// TestLoadConfigurations loads the object in every setting that changes
// what the verifier sees (the VM kernel matrix runs it on each kernel,
// test/vm): each kernel mode, with and without NVTX, the overhead budget's
// hit counting, detailed launches and sampling, and classic uprobe
// programs where the kernel has uprobe_multi.
// loadConfigurations are the load-time configurations every test loads.
func loadConfigurations() map[string]Options {
	return map[string]Options{
		"kernel mode off":       {KernelMode: "off"},
		"kernel mode anonymous": {KernelMode: "anonymous"},
		"kernel mode full":      {KernelMode: "full"},
		"full, every option":    {KernelMode: "full", NVTX: true, CountHits: true, Detailed: true, SampleRate: 10, MaxStreamsPerPID: 4, CrashBreaker: true},
		"off, every option":     {KernelMode: "off", NVTX: true, CountHits: true, Detailed: true, SampleRate: 10},
		"classic uprobes":       {NoUprobeMulti: true},
		"classic, every option": {NoUprobeMulti: true, KernelMode: "full", NVTX: true, CountHits: true, Detailed: true, SampleRate: 10, CrashBreaker: true},
		"anonymous, breaker":    {KernelMode: "anonymous", CrashBreaker: true},
		// 5.15 and 5.16: the helper's call must be left out, or the verifier refuses it.
		"without bpf_find_vma": {NoUprobeMulti: true, NoFindVMA: true},
	}
}

func TestLoadConfigurations(t *testing.T) {
	testutil.RequireBPF(t)
	for name, sizes := range loadConfigurations() {
		t.Run(name, func(t *testing.T) {
			objs, err := Load(sizes)
			if err != nil {
				t.Fatal(err)
			}
			defer objs.Close()
			if sizes.NoUprobeMulti && objs.UprobeMulti {
				t.Error("loaded for uprobe_multi links, want classic uprobes")
			}
			if !sizes.NoUprobeMulti && objs.UprobeMulti != (HaveUprobeMulti() == nil) {
				t.Errorf("UprobeMulti = %v, but the kernel's uprobe_multi probe says %v", objs.UprobeMulti, HaveUprobeMulti())
			}
			for name, p := range objs.Programs() {
				if p.FD() < 0 {
					t.Errorf("program %s not loaded", name)
				}
			}
		})
	}
}
