package attach

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/profi-dev/profi/internal/attach/uprobe"
	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/ops"
)

// Reading a new library file for its attach, before Sync takes the
// lock (prepare): the files are tenant-controlled, and /metrics, /status
// and /health take the same lock.

// prepare opens and reads the symbols of each target file that Sync will
// attach, without holding a.mu.
func (a *Attacher) prepare(targets []Target, now time.Time) map[FileKey]*opened {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	a.tenantMemo = map[int]string{} // a pass reads each process's tenant once
	var todo []Target
	seen := make(map[FileKey]bool, len(targets)+len(a.static))
	held := a.held()
	for _, t := range append(slices.Clone(a.static), targets...) {
		if seen[t.Key] {
			continue
		}
		seen[t.Key] = true
		if len(a.probes(t.Lib, a.opts.KernelMode)) == 0 || a.quarantined[t.Key] || a.stopped {
			continue
		}
		if _, ok := a.files[t.Key]; ok {
			continue
		}
		if fl, ok := a.failed[t.Key]; ok && now.Before(fl.next) {
			continue
		}
		if _, ok := a.failed[t.Key]; !ok && a.overCap(t, held) != "" {
			continue // not opened: Sync counts it
		}
		if est, ok := a.linkCapped[capKey{file: t.Key}]; ok && a.overLinkCap(est, t.PIDs) != "" {
			continue // refused by a link cap at an earlier pass, still over it
		}
		held.add(t)
		todo = append(todo, t)
	}
	a.mu.Unlock()
	out := make(map[FileKey]*opened, len(todo))
	for _, t := range todo {
		out[t.Key] = a.open(t)
	}
	return out
}

// opened is a target file opened and parsed for attaching: the file
// (kept open, so the links go on the inode that was parsed) and its
// probed symbols, or why that failed.
type opened struct {
	file   *os.File
	syms   map[string]uprobe.Func
	reason string
	err    error
}

func (p *opened) close() {
	if p.file != nil {
		p.file.Close()
		p.file = nil
	}
}

// open opens t's file and reads the symbols of its probes. It takes no
// lock. A panic (the parser's own is already an error of DefinedFuncs)
// becomes an attach failure of that file, not the agent's end.
func (a *Attacher) open(t Target) (p *opened) {
	defer func() {
		if r := recover(); r != nil {
			p = &opened{reason: ReasonOther, err: fmt.Errorf("open and parse %s: panic: %v", t.Path, r)}
		}
	}()
	f, err := t.Open()
	if err != nil {
		if errors.Is(err, discover.ErrProcessGone) {
			return &opened{reason: ReasonProcessExited, err: fmt.Errorf("open %s: %w", t.Path, err)}
		}
		return &opened{reason: ReasonOpenFailed, err: fmt.Errorf("open %s: %w", t.Path, err)}
	}
	syms, err := uprobe.DefinedFuncs(f, a.probedSymbols(t.Lib), t.Static, uprobe.HostMachine())
	if err != nil {
		f.Close()
		return &opened{reason: ReasonNotELF, err: fmt.Errorf("read symbols of %s: %w", t.Path, err)}
	}
	return &opened{file: f, syms: syms}
}

// probedSymbols are the symbols any probe of lib may need: the global
// mode's and, for full-mode upgrades of single processes (reattach with
// the symbols read at attach), full mode's.
func (a *Attacher) probedSymbols(lib discover.Library) []string {
	var names []string
	for _, m := range []string{a.opts.KernelMode, ops.KernelModeFull} {
		for _, p := range a.probes(lib, m) {
			if !slices.Contains(names, p.Symbol) {
				names = append(names, p.Symbol)
			}
		}
	}
	return names
}
