package collector

import (
	"time"

	"github.com/profi-dev/profi/internal/aggregate"
	"github.com/profi-dev/profi/internal/attach"
	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/config"
	"github.com/profi-dev/profi/internal/k8s"
)

// StatusDoc is the JSON body of /status: where a user finds out what is
// attached and why something is not.
type StatusDoc struct {
	Version           string                 `json:"version"`
	UptimeSeconds     float64                `json:"uptime_seconds"`
	KernelMode        string                 `json:"kernel_mode"`
	ProbeProfile      string                 `json:"probe_profile"`
	PIDFilter         int                    `json:"pid_filter"`
	BPFLoaded         bool                   `json:"bpf_loaded"`
	AttachedLibraries []attach.LibraryStatus `json:"attached_libraries"`
	AttachFailures    []attach.FailureStatus `json:"attach_failures"`
	LoaderHooks       []attach.LoaderHook    `json:"loader_hooks"`
	LastDiscovery     time.Time              `json:"last_discovery"`
	TrackedPIDs       []int                  `json:"tracked_pids"`
	EventsProcessed   uint64                 `json:"events_processed"`
	ExportedSeries    int                    `json:"exported_series"`
	Drops             map[string]uint64      `json:"drops"`
	LastDrain         time.Time              `json:"last_drain"`
	// Kubernetes is the pod watch state; absent without --node-name.
	Kubernetes *k8s.Status `json:"kubernetes,omitempty"`
	// RecentLaunches are the latest launches with --detailed-launches.
	RecentLaunches []aggregate.LaunchEvent `json:"recent_launches,omitempty"`
}

// Status assembles /status from the current state.
func Status(version string, cfg *config.Config, started time.Time, snap *aggregate.Snapshot, st attach.Status, c attach.Counters) StatusDoc {
	drops := map[string]uint64{
		"cardinality_limit": snap.CardinalityDrops,
		"events_ring":       snap.Drops[dropEventsRing],
		"orphan_return":     snap.Drops[dropOrphanReturn],
		"nested":            snap.Drops[dropNested],
		"runtime_to_driver": snap.Drops[bpfobj.DropRuntimeToDrv],
	}
	for d, name := range mapDropNames {
		drops[name] = snap.Drops[d]
	}
	tracked := c.TrackedPIDs
	if tracked == nil {
		tracked = []int{}
	}
	return StatusDoc{
		Version:           version,
		UptimeSeconds:     time.Since(started).Seconds(),
		KernelMode:        cfg.KernelMode,
		ProbeProfile:      cfg.ProbeProfile,
		PIDFilter:         cfg.PID,
		BPFLoaded:         true,
		AttachedLibraries: st.Attached,
		AttachFailures:    st.Failed,
		LoaderHooks:       st.LoaderHooks,
		LastDiscovery:     st.LastSync,
		TrackedPIDs:       tracked,
		EventsProcessed:   snap.Events,
		ExportedSeries:    snap.Series,
		Drops:             drops,
		LastDrain:         snap.Time,
	}
}
