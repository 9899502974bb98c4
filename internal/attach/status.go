package attach

import (
	"slices"

	"sort"
	"time"

	"github.com/profi-dev/profi/internal/ops"
)

// ProbeStatus describes one attached probe.
type ProbeStatus struct {
	Symbol    string `json:"symbol"`
	Operation string `json:"operation"`
	Return    bool   `json:"return_probe"`
	Traps     int    `json:"traps_per_call"`
	// Offset is where the probe sits past the symbol: 4 when it skips an
	// endbr64 to land on an emulated push (one trap instead of two).
	Offset uint64 `json:"offset"`
}

// LibraryStatus is an attached library file.
type LibraryStatus struct {
	Library string        `json:"library"`
	Path    string        `json:"path"`
	File    string        `json:"file"` // dev major:minor/inode
	PIDs    []int         `json:"pids"`
	Probes  []ProbeStatus `json:"probes"`
	Missing []string      `json:"missing_symbols,omitempty"`
	Absent  []string      `json:"absent_optional_symbols,omitempty"`
	// FullModePIDs are processes upgraded to full kernel mode on this file.
	FullModePIDs []int `json:"full_mode_pids,omitempty"`
	// Paused is set while the overhead budget has detached the file's
	// Pausable probes (duty cycling); their counts are then estimates.
	Paused bool `json:"paused,omitempty"`
	// UprobeMulti is set when the probes are uprobe_multi links.
	UprobeMulti bool      `json:"uprobe_multi,omitempty"`
	AttachedAt  time.Time `json:"attached_at"`
}

// FailureStatus is a library file whose attach failed and waits for a retry.
type FailureStatus struct {
	Library   string    `json:"library"`
	Path      string    `json:"path"`
	File      string    `json:"file"`
	PIDs      []int     `json:"pids"`
	Reason    string    `json:"reason"`
	Error     string    `json:"error"`
	Attempts  int       `json:"attempts"`
	NextRetry time.Time `json:"next_retry"`
}

// LoaderHook is a dynamic loader hooked to announce library loads.
type LoaderHook struct {
	Path      string `json:"path"`
	File      string `json:"file"`
	Processes int    `json:"processes"`
}

// Status is the attach state for /status.
type Status struct {
	Attached []LibraryStatus `json:"attached_libraries"`
	// LoaderHooks are the ld.so files whose library loads trigger a check
	// of the loading process (event-driven discovery).
	LoaderHooks []LoaderHook    `json:"loader_hooks"`
	Failed      []FailureStatus `json:"attach_failures"`
	LastSync    time.Time       `json:"last_sync"`
}

// Status returns a copy of the attach state, sorted by path.
func (a *Attacher) Status() Status {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := Status{Attached: []LibraryStatus{}, LoaderHooks: []LoaderHook{}, Failed: []FailureStatus{}, LastSync: a.lastSync}
	for key, f := range a.files {
		if !profiled(f.target.Lib) {
			s.LoaderHooks = append(s.LoaderHooks, LoaderHook{Path: f.target.Path, File: key.String(), Processes: len(f.target.PIDs)})
			continue
		}
		ls := LibraryStatus{
			Library:      string(f.target.Lib),
			Path:         f.target.Path,
			File:         key.String(),
			PIDs:         sortedPIDs(f.target.PIDs),
			Missing:      slices.Clone(f.missing),
			Absent:       slices.Clone(f.absent),
			FullModePIDs: upgradedPIDs(f),
			Paused:       f.paused,
			UprobeMulti:  f.links.multi || f.hot != nil && f.hot.multi,
			AttachedAt:   f.attachedAt,
		}
		for _, p := range f.probes {
			ls.Probes = append(ls.Probes, ProbeStatus{Symbol: p.Symbol, Operation: ops.Name(uint32(p.Op)), Return: p.Timed(), Traps: p.Traps(), Offset: f.syms[p.Symbol].offset})
		}
		s.Attached = append(s.Attached, ls)
	}
	for key, fl := range a.failed {
		if !profiled(fl.target.Lib) {
			continue // see LoaderHooks; not a profiled library
		}
		s.Failed = append(s.Failed, FailureStatus{
			Library:   string(fl.target.Lib),
			Path:      fl.target.Path,
			File:      key.String(),
			PIDs:      sortedPIDs(fl.target.PIDs),
			Reason:    fl.reason,
			Error:     fl.err.Error(),
			Attempts:  fl.attempts,
			NextRetry: fl.next,
		})
	}
	sort.Slice(s.Attached, func(i, j int) bool {
		return s.Attached[i].Path+s.Attached[i].File < s.Attached[j].Path+s.Attached[j].File
	})
	sort.Slice(s.Failed, func(i, j int) bool { return s.Failed[i].Path+s.Failed[i].File < s.Failed[j].Path+s.Failed[j].File })
	return s
}

func sortedPIDs(p []int) []int {
	out := slices.Clone(p)
	if out == nil {
		out = []int{}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func upgradedPIDs(f *attached) []int {
	if len(f.upgrades) == 0 {
		return nil
	}
	out := make([]int, 0, len(f.upgrades))
	for pid := range f.upgrades {
		out = append(out, pid)
	}
	slices.Sort(out)
	return out
}
