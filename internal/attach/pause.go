package attach

import (
	"fmt"
	"slices"

	"github.com/profi-dev/profi/internal/attach/uprobe"
	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/ops"
)

// The overhead budget's duty cycle: the attached files it samples (Files)
// and the detaching and re-attaching of their Pausable probes (SetPaused).

// FileInfo is an attached, profiled library file and who maps it.
type FileInfo struct {
	Key    FileKey
	Lib    discover.Library
	PIDs   []int
	Paused bool
}

// Files returns the attached, profiled library files.
func (a *Attacher) Files() []FileInfo {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]FileInfo, 0, len(a.files))
	for key, f := range a.files {
		if profiled(f.target.Lib) {
			out = append(out, FileInfo{Key: key, Lib: f.target.Lib, PIDs: slices.Clone(f.target.PIDs), Paused: f.paused})
		}
	}
	return out
}

// SetPaused detaches (true) or re-attaches (false) the Pausable probes of
// an attached file: the duty cycle of the overhead budget. Detaching waits
// for RCU grace periods, so it happens outside the lock. A file no longer
// attached is not an error.
func (a *Attacher) SetPaused(key FileKey, paused bool) error {
	a.mu.Lock()
	f := a.files[key]
	if f == nil || f.paused == paused || a.closed {
		a.mu.Unlock()
		return nil
	}
	if paused {
		var closing []*uprobe.Links
		for _, ls := range f.sets {
			closing = append(closing, ls.hot[kindTimed], ls.hot[kindEntry])
			ls.hot = [2]*uprobe.Links{}
			for op, l := range ls.launches {
				if ops.Pausable(op) {
					closing = append(closing, l)
					delete(ls.launches, op)
				}
			}
		}
		f.paused = true
		a.mu.Unlock()
		for _, l := range closing {
			l.Close()
		}
		return nil
	}
	defer a.mu.Unlock()
	for pid, ls := range f.sets {
		for _, k := range []int{kindTimed, kindEntry} {
			_, hot := splitPausable(probesOfKind(f.rest, k))
			links, err := a.reattach(f, hot, pid)
			if err != nil {
				return fmt.Errorf("resume probes of %s: %w", f.target.Path, err)
			}
			ls.hot[k] = links
		}
		for op, lp := range f.launches {
			if lp.handed || !ops.Pausable(op) || ls.launches[op] != nil {
				continue
			}
			links, err := a.reattach(f, []ops.Probe{lp.probe}, pid)
			if err != nil {
				return fmt.Errorf("resume probes of %s: %w", f.target.Path, err)
			}
			if ls.launches == nil {
				ls.launches = map[ops.Op]*uprobe.Links{}
			}
			ls.launches[op] = links
		}
	}
	f.paused = false
	return nil
}
