package attach

import (
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/cilium/ebpf/link"

	"github.com/profi-dev/profi/internal/attach/uprobe"
	"github.com/profi-dev/profi/internal/ops"
)

// A file's attach: from the file open read and the ops table to its
// attached record and first link set, and what it lacks or the kernel
// refuses (/status refused_probes); and the probe sets the linker gets
// for the later links of an attached file (set, reattach: pause,
// full-mode upgrade, handover, link-set switches).

// attachFile attaches every probe whose symbol the file (opened and
// parsed by open) defines. It is all or nothing for the symbols present:
// on any error the links made so far are closed.
func (a *Attacher) attachFile(t Target, p *opened) (*attached, string, error) {
	defer p.close()
	if p.err != nil {
		return nil, p.reason, p.err
	}
	f, syms := p.file, p.syms
	// The kernel resolves this magic link to the file already opened safely
	// inside the process's root, so symlinks in the container cannot
	// redirect the probe to another file.
	fdPath := fmt.Sprintf("/proc/self/fd/%d", f.Fd())
	ex, err := link.OpenExecutable(fdPath)
	if err != nil {
		return nil, ReasonNotELF, fmt.Errorf("open executable %s: %w", t.Path, err)
	}

	a.nextID++
	att := &attached{target: t, id: a.nextID, syms: syms, sets: map[int]*linkSet{}, ident: identOf(f)}
	all := a.probes(t.Lib, a.opts.KernelMode)
	rest := all
	if a.ho.candidate(t) {
		rest = nil
		att.launches, att.counted = map[ops.Op]*launchProbe{}, map[rtSite]ops.Op{}
		for _, p := range all {
			if _, ok := syms[p.Symbol]; ok && isHandoverProbe(p) {
				att.launches[p.Op] = &launchProbe{probe: p}
			} else {
				rest = append(rest, p)
			}
		}
	}
	att.rest = rest
	// The first PID filter's set is linked here, all or nothing; the
	// others, when processes that map the file are left unprobed, by
	// syncFilters in the same pass. None: every process that maps it is
	// left unprobed, nothing is linked.
	filters := a.wantFilters(&t)
	set := a.set(ex, t, syms, att.id, a.opts.PID)
	// Ops an earlier attachment of the file handed over stay unattached.
	a.ho.prior(att)
	if len(filters) > 0 {
		set.PID = filters[0]
		ls := &linkSet{}
		for _, k := range []int{kindTimed, kindEntry} {
			if reason, err := a.linkKind(att, ls, set, k); err != nil {
				a.closeSetLater(ls)
				a.ho.dropCounted(att)
				return nil, reason, err
			}
		}
		att.sets[filters[0]] = ls
	}
	for _, p := range all {
		sym, ok := syms[p.Symbol]
		var r *uprobe.Refusal
		if ok {
			r = set.Refused.Refusal(sym)
		}
		switch {
		case r != nil:
			att.refused = append(att.refused, refusedProbe(p, sym, r))
		case ok:
			att.probes = append(att.probes, p)
		case p.Optional:
			att.absent = append(att.absent, p.Symbol)
		default:
			att.missing = append(att.missing, p.Symbol)
		}
	}
	if len(att.probes) == 0 {
		for _, ls := range att.sets {
			a.closeSetLater(ls)
		}
		a.ho.dropCounted(att)
		if len(att.refused) > 0 {
			return nil, ReasonProbeRefused, &allRefusedError{path: t.Path, refused: att.refused}
		}
		return nil, ReasonSymbolNotFound, fmt.Errorf("%s defines none of the probed symbols %v", t.Path, att.missing)
	}
	return att, "", nil
}

// allRefusedError: the kernel refuses a uprobe on every probed function
// the file defines.
type allRefusedError struct {
	path    string
	refused []RefusedProbe
}

func (e *allRefusedError) Error() string {
	return fmt.Sprintf("the kernel refuses a uprobe on every probed function of %s: %s", e.path, strings.Join(refusedNames(e.refused), ", "))
}

// refusedNames are "symbol+offset (reason)" of refused probes, for logs.
func refusedNames(r []RefusedProbe) []string {
	out := make([]string, len(r))
	for i, p := range r {
		out[i] = fmt.Sprintf("%s+%d (%s)", p.Symbol, p.Offset, p.Reason)
	}
	return out
}

// refusedProbe is the /status entry of probe p refused at sym.
func refusedProbe(p ops.Probe, sym uprobe.Func, r *uprobe.Refusal) RefusedProbe {
	return RefusedProbe{
		Symbol:     p.Symbol,
		Operation:  ops.Name(uint32(p.Op)),
		Reason:     r.Reason,
		Offset:     sym.Offset,
		FileOffset: sym.ProbeAddr(),
		Code:       hex.EncodeToString(r.Code),
		Error:      r.Err,
	}
}

// set is the probe set of file t (opened as ex) for the linker, with the
// file's known refusals.
func (a *Attacher) set(ex *link.Executable, t Target, syms map[string]uprobe.Func, id uint32, pid int) uprobe.Set {
	if a.refused[t.Key] == nil {
		a.refused[t.Key] = uprobe.Refusals{}
	}
	return uprobe.Set{Exe: ex, Path: t.Path, Funcs: syms, FileID: id, PID: pid, Refused: a.refused[t.Key]}
}

// reattach attaches probes of an already attached file again, with the
// symbols and offsets read at the first attach.
func (a *Attacher) reattach(f *attached, probes []ops.Probe, pid int) (*uprobe.Links, error) {
	ex, done, err := a.executable(f)
	if err != nil {
		return nil, err
	}
	defer done()
	links, _, err := a.linker.Link(a.set(ex, f.target, f.syms, f.id, pid), probes)
	return links, err
}
