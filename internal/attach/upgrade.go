package attach

import (
	"fmt"
	"slices"

	"github.com/profi-dev/profi/internal/attach/uprobe"
	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/ops"
)

// Full-mode upgrades of single processes (pods annotated profi/mode:
// full): PID-filtered links of the probes full mode adds, and their
// PF_FULL bit in pid_files.

// SetFullMode sets which processes get full kernel mode whatever the
// global mode (pods annotated profi/mode: full): PID-filtered full-mode
// probes (timed launches, name sources) are attached for them at each
// Sync, so only they pay the extra traps. full is asked at every Sync, so
// a process whose pod is annotated (or whose pod reaches the watch's cache)
// later is upgraded at the next discovery pass; it must not call back into
// the Attacher.
func (a *Attacher) SetFullMode(full func(pid int) bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.fullMode = full
}

// SetFullModePIDs upgrades exactly these processes (SetFullMode with a
// fixed set).
func (a *Attacher) SetFullModePIDs(pids []int) {
	set := make(map[int]bool, len(pids))
	for _, p := range pids {
		set[p] = true
	}
	a.SetFullMode(func(pid int) bool { return set[pid] })
}

// upgradeProbes are the probes full mode adds to, or changes in, the
// probe set of the global mode.
func (a *Attacher) upgradeProbes(lib discover.Library) []ops.Probe {
	base := a.probes(lib, a.opts.KernelMode)
	var out []ops.Probe
	for _, p := range a.probes(lib, ops.KernelModeFull) {
		if !slices.Contains(base, p) {
			out = append(out, p)
		}
	}
	return out
}

// syncUpgrades attaches PID-filtered full-mode probes for upgraded
// processes and removes those of processes no longer upgraded. The
// PF_FULL bit of pid_files is set after the links exist and cleared before
// they close, so a launch is never left to probes that are not there.
func (a *Attacher) syncUpgrades() {
	for _, f := range a.files {
		want := map[int]bool{}
		if a.opts.KernelMode != ops.KernelModeFull && a.fullMode != nil {
			for _, pid := range f.target.PIDs {
				if a.fullMode(pid) && a.probed(f, pid) {
					want[pid] = true
				}
			}
		}
		for pid := range f.upgrades {
			if !want[pid] {
				a.dropUpgrade(f, pid)
			}
		}
		for k := range a.linkCapped {
			if k.file == f.target.Key && k.upgrade && !want[k.pid] {
				delete(a.linkCapped, k)
			}
		}
		for pid := range want {
			if _, ok := f.upgrades[pid]; ok {
				continue
			}
			ck := capKey{file: f.target.Key, pid: pid, upgrade: true}
			if n := estimateLinks(a.upgradeProbes(f.target.Lib), f.syms, a.opts.UprobeMulti, false); a.overLinkCap(n, []int{pid}) != "" {
				a.refuseLinks(ck, n, a.overLinkCap(n, []int{pid}), "lib", f.target.Lib, "path", f.target.Path, "pid", pid, "full_mode", true)
				continue
			}
			delete(a.linkCapped, ck)
			if err := a.upgrade(f, pid); err != nil {
				a.log.Warn("full-mode upgrade failed; retried at the next scan", "lib", f.target.Lib, "pid", pid, "err", err)
			}
		}
	}
}

func (a *Attacher) upgrade(f *attached, pid int) error {
	probes := a.upgradeProbes(f.target.Lib)
	if len(probes) == 0 {
		return nil
	}
	links, err := a.reattach(f, probes, pid)
	if err != nil {
		return err
	}
	k := bpfobj.ProfiPidFile{Pid: uint32(pid), File: f.id}
	v, _ := a.maps.fileFlags(k)
	if err := a.maps.putFile(k, v|uint8(bpfobj.ProfiPidFileFlagPF_OWN|bpfobj.ProfiPidFileFlagPF_FULL)); err != nil {
		links.Close()
		return fmt.Errorf("mark pid %d upgraded: %w", pid, err)
	}
	if f.upgrades == nil {
		f.upgrades = map[int]*uprobe.Links{}
	}
	f.upgrades[pid] = links
	a.log.Info("process upgraded to full kernel mode", "lib", f.target.Lib, "pid", pid, "links", links.Len())
	return nil
}

func (a *Attacher) dropUpgrade(f *attached, pid int) {
	k := bpfobj.ProfiPidFile{Pid: uint32(pid), File: f.id}
	if v, ok := a.maps.fileFlags(k); ok && v&uint8(bpfobj.ProfiPidFileFlagPF_FULL) != 0 {
		if err := a.maps.putFile(k, v&^uint8(bpfobj.ProfiPidFileFlagPF_FULL)); err != nil {
			// The links close anyway: the process's launches go uncounted
			// by launch_entry until the next pass rewrites the value.
			a.log.Warn("unmark upgraded pid", "pid", pid, "err", err)
		}
	}
	f.upgrades[pid].Close()
	delete(f.upgrades, pid)
}
