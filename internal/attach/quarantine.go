package attach

import (
	"github.com/profi-dev/profi/internal/discover"
)

// The crash breaker's side of the attacher: taking one file's probes off
// one tenant's processes (QuarantineTenant) or the node (Quarantine), every
// file's (QuarantineAll), and lifting either (UnquarantineTenant,
// Unquarantine).

// QuarantinedFile is a library file whose probes Quarantine took off.
type QuarantinedFile struct {
	Key  FileKey
	Lib  discover.Library
	Path string
	PIDs []int // the processes that mapped it at the last pass
	// Links is how many links were closed (0: the file was not attached).
	Links int
}

// goneIDs bounds the memory of released files' ids (Quarantine of a file
// released between a crash and its report).
const goneIDs = 64

// Quarantine detaches, node-wide, every probe of the library file whose
// probes carry file id id (their cookie's file), and keeps the file off
// until Unquarantine: no later pass attaches it, whichever process maps it
// (the crash breaker, ARCHITECTURE.md "Crash circuit breaker"). The links
// close before it returns (each waits for RCU grace periods, outside the
// lock). ok is false when no file with that id was ever attached.
func (a *Attacher) Quarantine(id uint32) (q QuarantinedFile, ok bool) {
	a.mu.Lock()
	var f *attached
	for key, af := range a.files {
		if af.id == id {
			f, q.Key = af, key
			break
		}
	}
	if f == nil {
		t, seen := a.gone[id]
		if !seen {
			a.mu.Unlock()
			return q, false
		}
		q.Key, q.Lib, q.Path = t.Key, t.Lib, t.Path
		a.quarantined[t.Key] = true
		a.mu.Unlock()
		return q, true
	}
	q.Lib, q.Path, q.PIDs = f.target.Lib, f.target.Path, sortedPIDs(f.target.PIDs)
	q.Links = f.allLinks()
	for pid := range f.upgrades {
		a.dropUpgrade(f, pid)
	}
	a.quarantined[q.Key] = true
	delete(a.files, q.Key)
	delete(a.failed, q.Key)
	a.ho.dropCounted(f)
	// Hits of the links until they are gone are refused in BPF: the file
	// id leaves pid_files here (and with a runtime file, its processes'
	// ranges from their other files' values).
	a.syncProcessMaps(false)
	a.mu.Unlock()
	f.closeLinks()
	return q, true
}

// QuarantineAll takes every probe on the node off, the loader hooks
// included, and keeps them off until the agent restarts: no later pass
// attaches any file (the kernel-warning watch: the kernel itself reported
// trouble in its uprobe code, so no file of ours is safe). It returns the
// files it detached.
func (a *Attacher) QuarantineAll() []QuarantinedFile {
	a.mu.Lock()
	a.stopped = true
	ids := make([]uint32, 0, len(a.files))
	for _, f := range a.files {
		ids = append(ids, f.id)
	}
	a.mu.Unlock()
	out := make([]QuarantinedFile, 0, len(ids))
	for _, id := range ids {
		if q, ok := a.Quarantine(id); ok {
			out = append(out, q)
		}
	}
	return out
}

// Stopped reports whether QuarantineAll ran.
func (a *Attacher) Stopped() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stopped
}

// Unquarantine lets passes attach the file again (a quarantine that
// lifts: --quarantine-lift).
func (a *Attacher) Unquarantine(key FileKey) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.quarantined, key)
}

// QuarantineTenant leaves the processes of one tenant (the tenant BPF
// admitted them under, pid_quotas: their cgroup v2) unprobed in the file
// with id id, with no breakpoint in their memory: the file's probes become
// per-process links for the other processes that map it, as for a traced
// process (traced.go). A process of the tenant is known to be one once it
// made a probed call (Options.Tenant); until then it is probed. ok is
// false when no file with that id is attached.
func (a *Attacher) QuarantineTenant(id uint32, tenant uint64) (q QuarantinedFile, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for key, f := range a.files {
		if f.id != id {
			continue
		}
		q = QuarantinedFile{Key: key, Lib: f.target.Lib, Path: f.target.Path, PIDs: sortedPIDs(f.target.PIDs)}
		if a.tenantsOff[key] == nil {
			a.tenantsOff[key] = map[uint64]bool{}
		}
		a.tenantsOff[key][tenant] = true
		before := f.linkCount()
		a.syncFilters()
		q.Links = max(before-f.linkCount(), 0)
		return q, true
	}
	return q, false
}

// UnquarantineTenant probes the tenant's processes in the file again
// (from the next pass).
func (a *Attacher) UnquarantineTenant(key FileKey, tenant uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.tenantsOff[key], tenant)
	if len(a.tenantsOff[key]) == 0 {
		delete(a.tenantsOff, key)
	}
}

// rememberGone keeps a released file's id for Quarantine. Called with
// a.mu held.
func (a *Attacher) rememberGone(f *attached) {
	if len(a.gone) >= goneIDs {
		for id := range a.gone {
			delete(a.gone, id)
			break
		}
	}
	a.gone[f.id] = f.target
}
