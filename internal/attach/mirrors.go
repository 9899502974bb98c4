package attach

import (
	"errors"

	"github.com/cilium/ebpf"

	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/discover"
)

// The process map pid_files (and the runtime files' facts): processMaps
// writes it and keeps its mirror; the Attacher's wantPIDFiles and
// wantRuntimeText say what it should hold, and syncProcessMaps moves it
// there at each pass.

// rtRange is a process's runtime range: its libcudart's code range and
// which attached file it is, carried in the pid_files value of every file
// the process maps (PF_RT_TEXT).
type rtRange struct {
	TextRange
	file   uint32
	handed bool // some of the file's launch ops are counted at the driver
}

// processMaps owns the pid_files map and its mirror (what was last
// written), the runtime ranges its values carry, and file_facts; it writes
// them in the one order the BPF side relies on (apply). A nil map (tests
// without BPF) skips its writes and leaves its mirror empty.
type processMaps struct {
	pidFilesMap *ebpf.Map
	factsMap    *ebpf.Map                                      // file_facts
	inodesMap   *ebpf.Map                                      // rt_inodes: BPF writes, pruneInodes deletes
	pidFiles    map[bpfobj.ProfiPidFile]bpfobj.ProfiPidFileVal // what pid_files holds
	flags       map[bpfobj.ProfiPidFile]uint8                  // its values' flags, as wanted (without the range's)
	rtText      map[uint32]rtRange                             // pid → range its values carry
	facts       map[uint32]uint8                               // file id → enum pid_file_flag bits
}

func newProcessMaps(pidFiles, facts, inodes *ebpf.Map) *processMaps {
	return &processMaps{
		pidFilesMap: pidFiles,
		factsMap:    facts,
		inodesMap:   inodes,
		pidFiles:    map[bpfobj.ProfiPidFile]bpfobj.ProfiPidFileVal{},
		flags:       map[bpfobj.ProfiPidFile]uint8{},
		rtText:      map[uint32]rtRange{},
		facts:       map[uint32]uint8{},
	}
}

// mapFailures counts the writes apply could not make, per map.
type mapFailures struct {
	pidFiles, facts int
}

// apply moves the maps to their wanted state, in this order:
//
//  1. the runtime ranges (text) into the values already there (putText);
//  2. files called: its answer, the wanted pid_files flags, may depend on
//     which processes have a range (hasText), and it may run what must
//     come between (the handover: its plan sets PF_RT_MARK, it rewrites
//     the values' handed flags through putText);
//  3. file_facts added and changed;
//  4. pid_files: each process's per-file values, then its "known" marker
//     (file 0); markers removed, then per-file values;
//  5. file_facts not wanted deleted, and the inodes of their files.
//
// A value carries the range and the flag saying so together, so a driver
// launch never sees one without the other (driver_launch_op in
// bpf/handover.h); a process is "known" only while its own files' values
// are there (hit_state in bpf/hits.h); and a file's facts and inodes, what
// unseen processes get, go only after its processes' values.
func (m *processMaps) apply(text map[uint32]rtRange, files func() map[bpfobj.ProfiPidFile]uint8, facts func() map[uint32]uint8) mapFailures {
	var f mapFailures
	f.pidFiles = m.putText(text)
	wantFiles := files()
	wantFacts := facts()
	f.facts = m.putFacts(wantFacts)
	f.pidFiles += m.syncFiles(wantFiles)
	f.facts += m.deleteFacts(wantFacts)
	return f
}

// putFacts adds and changes the file_facts entries of want.
func (m *processMaps) putFacts(want map[uint32]uint8) (failed int) {
	if m.factsMap == nil {
		return 0
	}
	for file, v := range want {
		if cur, ok := m.facts[file]; ok && cur == v {
			continue
		}
		if err := m.factsMap.Update(file, v, ebpf.UpdateAny); err != nil {
			failed++
			continue
		}
		m.facts[file] = v
	}
	return failed
}

// deleteFacts deletes the file_facts entries not in want, then every
// rt_inodes entry naming a file without facts: an inode's address is
// reused once its file is released, and must not name a file that went.
func (m *processMaps) deleteFacts(want map[uint32]uint8) (failed int) {
	if m.factsMap == nil {
		return 0
	}
	gone := false
	for file := range m.facts {
		if _, ok := want[file]; ok {
			continue
		}
		if err := m.factsMap.Delete(file); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			failed++
			continue
		}
		delete(m.facts, file)
		gone = true
	}
	if gone && m.inodesMap != nil {
		failed += m.pruneInodes()
	}
	return failed
}

// pruneInodes deletes the rt_inodes entries whose file has no facts.
func (m *processMaps) pruneInodes() (failed int) {
	var (
		inode uint64
		file  uint32
		stale []uint64
	)
	it := m.inodesMap.Iterate()
	for it.Next(&inode, &file) {
		if _, ok := m.facts[file]; !ok {
			stale = append(stale, inode)
		}
	}
	if it.Err() != nil {
		failed++
	}
	for _, k := range stale {
		if err := m.inodesMap.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			failed++
		}
	}
	return failed
}

// hasText reports whether pid's values carry a runtime range, and which.
func (m *processMaps) hasText(pid uint32) (rtRange, bool) {
	r, ok := m.rtText[pid]
	return r, ok
}

// value is what pid_files should hold for k with flags: the flags, and
// the process's runtime range with PF_RT_TEXT (and PF_HANDED) where it has
// one. The known marker (file 0) carries flags alone.
func (m *processMaps) value(k bpfobj.ProfiPidFile, flags uint8) bpfobj.ProfiPidFileVal {
	v := bpfobj.ProfiPidFileVal{Flags: uint32(flags)}
	r, ok := m.rtText[k.Pid]
	if !ok || k.File == 0 {
		return v
	}
	v.Flags |= uint32(bpfobj.ProfiPidFileFlagPF_RT_TEXT)
	if r.handed {
		v.Flags |= uint32(bpfobj.ProfiPidFileFlagPF_HANDED)
	}
	v.RtFile, v.RtStart, v.RtEnd = r.file, r.Start, r.End
	return v
}

// putText makes want the processes' runtime ranges and rewrites the
// values already there whose range or handed flag changed (step 1 of
// apply; also the handover's, which sets handed before it detaches a
// probe). A process without a range any more loses it here too.
func (m *processMaps) putText(want map[uint32]rtRange) (failed int) {
	m.rtText = want
	for k, flags := range m.flags {
		if err := m.putFile(k, flags); err != nil {
			failed++
		}
	}
	return failed
}

// putFile writes k's value for flags where it differs from what is there
// (also a full-mode upgrade's PF_FULL).
func (m *processMaps) putFile(k bpfobj.ProfiPidFile, flags uint8) error {
	v := m.value(k, flags)
	if cur, ok := m.pidFiles[k]; ok && cur == v {
		return nil
	}
	if m.pidFilesMap != nil {
		if err := m.pidFilesMap.Update(&k, &v, ebpf.UpdateAny); err != nil {
			return err
		}
		m.pidFiles[k] = v
	}
	m.flags[k] = flags
	return nil
}

// fileFlags are the flags wanted for k (without the range's); ok false
// when it has no value.
func (m *processMaps) fileFlags(k bpfobj.ProfiPidFile) (uint8, bool) {
	v, ok := m.flags[k]
	return v, ok
}

// syncFiles moves pid_files to want (step 4 of apply).
func (m *processMaps) syncFiles(want map[bpfobj.ProfiPidFile]uint8) (failed int) {
	del := func(k bpfobj.ProfiPidFile) {
		if m.pidFilesMap != nil {
			if err := m.pidFilesMap.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				failed++
				return
			}
			delete(m.pidFiles, k)
		}
		delete(m.flags, k)
	}
	for _, known := range []bool{false, true} {
		for k, v := range want {
			if (k.File == 0) == known {
				if err := m.putFile(k, v); err != nil {
					failed++
				}
			}
		}
	}
	for _, known := range []bool{true, false} {
		for k := range m.flags {
			if _, ok := want[k]; !ok && (k.File == 0) == known {
				del(k)
			}
		}
	}
	return failed
}

// wantRuntimeText is where libcudart's code is mapped in every process that
// maps an attached libcudart: the range its pid_files values carry, so a
// driver launch can tell whether the runtime made it (driver_launch_op in
// bpf/handover.h).
func (a *Attacher) wantRuntimeText() map[uint32]rtRange {
	want := map[uint32]rtRange{}
	if !a.opts.RuntimeRanges {
		return want
	}
	for _, f := range a.files {
		if f.target.Lib != discover.LibCudart {
			continue
		}
		for pid, r := range f.target.Text {
			if _, dup := want[uint32(pid)]; !dup { // a second libcudart in one process: keep the first
				want[uint32(pid)] = rtRange{r, f.id, f.handedAny()}
			}
		}
	}
	return want
}

// syncProcessMaps moves pid_files and file_facts to what the attached
// files say, in processMaps.apply's order; with handover, the
// runtime->driver handover runs where apply allows it: after the new
// ranges (they carry the file id), before the new pid_files values
// (PF_RT_MARK follows its plan). Called with a.mu held.
func (a *Attacher) syncProcessMaps(handover bool) {
	f := a.maps.apply(a.wantRuntimeText(), func() map[bpfobj.ProfiPidFile]uint8 {
		if handover {
			a.ho.sync(a)
		}
		return a.wantPIDFiles()
	}, a.wantFileFacts)
	if f.pidFiles > 0 {
		a.log.Warn("could not update the pid_files map; aliased library files may count calls twice, runtime launches fall back to markers", "failures", f.pidFiles)
	}
	if f.facts > 0 {
		a.log.Warn("could not update the file_facts or rt_inodes map; processes not registered yet count handed-over runtime launches as the driver's", "failures", f.facts)
	}
}

// wantFileFacts are the runtime facts of every attached runtime file
// (file_facts): what its processes get until a pass registers them
// (hit_flags in bpf/hits.h) and whether it has launch ops handed over.
func (a *Attacher) wantFileFacts() map[uint32]uint8 {
	const (
		rtShared = uint8(bpfobj.ProfiPidFileFlagPF_RT_SHARED)
		rtMark   = uint8(bpfobj.ProfiPidFileFlagPF_RT_MARK)
		handed   = uint8(bpfobj.ProfiPidFileFlagPF_HANDED)
	)
	want := map[uint32]uint8{}
	if !a.opts.RuntimeRanges {
		return want // no range, no facts: unseen processes use markers
	}
	for _, f := range a.files {
		if f.target.Lib != discover.LibCudart {
			continue
		}
		var v uint8
		if !f.target.Static {
			v |= rtShared
		}
		if f.marks() {
			v |= rtMark
		}
		if f.handedAny() {
			v |= handed
		}
		want[f.id] = v
	}
	return want
}

// wantPIDFiles are the flags pid_files should hold: which attached files
// each process maps, so that a file attached under two keys counts every
// call once (hit_state in bpf/hits.h), and in the same value whether
// full-mode upgrade probes serve the (pid, file) (PF_FULL: set by upgrade
// once its links exist, cleared by dropUpgrade before they close; kept
// here) and how a runtime file's launches are told apart when the process
// has a range (processMaps.value adds the range itself).
func (a *Attacher) wantPIDFiles() map[bpfobj.ProfiPidFile]uint8 {
	const (
		own      = uint8(bpfobj.ProfiPidFileFlagPF_OWN)
		full     = uint8(bpfobj.ProfiPidFileFlagPF_FULL)
		rtShared = uint8(bpfobj.ProfiPidFileFlagPF_RT_SHARED)
		rtMark   = uint8(bpfobj.ProfiPidFileFlagPF_RT_MARK)
	)
	want := map[bpfobj.ProfiPidFile]uint8{}
	for _, f := range a.files {
		if !profiled(f.target.Lib) {
			continue // its program counts nothing: no ownership needed
		}
		for _, pid := range f.target.PIDs {
			v := own
			if _, ok := f.upgrades[pid]; ok {
				v |= full
			}
			if _, ok := a.maps.hasText(uint32(pid)); ok && f.target.Lib == discover.LibCudart {
				if !f.target.Static {
					v |= rtShared
				}
				if f.marks() {
					v |= rtMark
				}
			}
			want[bpfobj.ProfiPidFile{Pid: uint32(pid), File: f.id}] = v
			want[bpfobj.ProfiPidFile{Pid: uint32(pid)}] = own
		}
	}
	return want
}
