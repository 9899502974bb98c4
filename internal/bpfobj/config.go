//go:build linux

package bpfobj

import "github.com/profi-dev/profi/internal/config"

// OptionsOf is what the agent's configuration loads: the agent and
// `profi check` load the same object.
func OptionsOf(cfg *config.Config) Options {
	return Options{
		Aggregated:       cfg.AggregatedSize,
		LaunchAgg:        cfg.LaunchAggSize,
		Inflight:         cfg.EntriesSize,
		MallocSizes:      cfg.MallocSizesSize,
		MaxStreamsPerPID: uint32(cfg.MaxStreamsPerPID),
		SampleRate:       uint32(cfg.SampleRate),
		Detailed:         cfg.DetailedLaunches,
		CountHits:        cfg.OverheadBudget > 0,
		NVTX:             cfg.EnableNVTX,
		KernelMode:       cfg.KernelMode,
		NoUprobeMulti:    cfg.NoUprobeMulti,
		CrashBreaker:     cfg.CrashWindow > 0,
	}
}
