package attach

import (
	"errors"

	"github.com/cilium/ebpf"

	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/discover"
)

// The process maps, pid_files and rt_text: processMaps writes them and
// keeps their mirrors, in the one order the BPF side relies on (apply);
// the Attacher's wantPIDFiles and wantRuntimeText say what they should
// hold, and syncProcessMaps moves them there at each pass.

// rtRange is a process's rt_text entry: its libcudart's code range and
// which attached file it is.
type rtRange struct {
	TextRange
	file   uint32
	handed bool // some of the file's launch ops are counted at the driver
}

// processMaps owns the pid_files and rt_text maps and their mirrors (what
// was last written), and writes both in the one order the BPF side relies
// on (apply). Either map may be nil (tests without BPF): its writes are
// then skipped and its mirror stays empty.
type processMaps struct {
	pidFilesMap *ebpf.Map
	rtTextMap   *ebpf.Map
	factsMap    *ebpf.Map                     // file_facts
	inodesMap   *ebpf.Map                     // rt_inodes: BPF writes, pruneInodes deletes
	pidFiles    map[bpfobj.ProfiPidFile]uint8 // key → enum pid_file_flag bits
	rtText      map[uint32]rtRange            // pid → range
	facts       map[uint32]uint8              // file id → enum pid_file_flag bits
}

func newProcessMaps(pidFiles, rtText, facts, inodes *ebpf.Map) *processMaps {
	return &processMaps{
		pidFilesMap: pidFiles,
		rtTextMap:   rtText,
		factsMap:    facts,
		inodesMap:   inodes,
		pidFiles:    map[bpfobj.ProfiPidFile]uint8{},
		rtText:      map[uint32]rtRange{},
		facts:       map[uint32]uint8{},
	}
}

// mapFailures counts the writes apply could not make, per map.
type mapFailures struct {
	rtTextPut, rtTextDelete, pidFiles, facts int
}

// apply moves both maps to their wanted state, in this order:
//
//  1. rt_text entries added and changed (text);
//  2. files called: its answer, the wanted pid_files, may depend on which
//     rt_text entries now exist (hasText: PF_RT_TEXT says "rt_text holds
//     this process's range"), and it may run what must come between
//     (the handover: its plan sets PF_RT_MARK, it rewrites rt_text's
//     handed flags through putText);
//  3. pid_files: each process's per-file values, then its "known" marker
//     (file 0); markers removed, then per-file values;
//  4. rt_text entries not in text deleted.
//
// So an rt_text entry is there before any pid_files value says it is and
// goes only after none does: a runtime launch that skips its marker always
// finds the range at the driver (driver_launch_op in bpf/handover.h); and
// a process is "known" only while its own files' values are there
// (hit_flags in bpf/hits.h).
//
// file_facts, what unseen processes get, follow the same plan: the
// handover's handed flags through putFacts with rt_text's (putText), the
// rest with pid_files (step 3); a file's facts and its inodes go after
// its processes' pid_files values.
func (m *processMaps) apply(text map[uint32]rtRange, files func() map[bpfobj.ProfiPidFile]uint8, facts func() map[uint32]uint8) mapFailures {
	var f mapFailures
	f.rtTextPut = m.putText(text)
	wantFiles := files()
	wantFacts := facts()
	f.facts = m.putFacts(wantFacts)
	f.pidFiles = m.syncFiles(wantFiles)
	f.facts += m.deleteFacts(wantFacts)
	f.rtTextDelete = m.deleteText(text)
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

// hasText reports whether rt_text holds pid's range, and which.
func (m *processMaps) hasText(pid uint32) (rtRange, bool) {
	r, ok := m.rtText[pid]
	return r, ok
}

// putText adds and changes the rt_text entries of want (step 1 of apply;
// also the handover's, which sets handed before it detaches a probe).
func (m *processMaps) putText(want map[uint32]rtRange) (failed int) {
	if m.rtTextMap == nil {
		return 0
	}
	for pid, r := range want {
		if cur, ok := m.rtText[pid]; ok && cur == r {
			continue
		}
		v := bpfobj.ProfiTextRange{Start: r.Start, End: r.End, File: r.file}
		if r.handed {
			v.Handed = 1
		}
		if err := m.rtTextMap.Update(pid, &v, ebpf.UpdateAny); err != nil {
			failed++
			continue
		}
		m.rtText[pid] = r
	}
	return failed
}

// deleteText deletes the rt_text entries not in want (step 4 of apply).
func (m *processMaps) deleteText(want map[uint32]rtRange) (failed int) {
	if m.rtTextMap == nil {
		return 0
	}
	for pid := range m.rtText {
		if _, ok := want[pid]; ok {
			continue
		}
		if err := m.rtTextMap.Delete(pid); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			failed++
			continue
		}
		delete(m.rtText, pid)
	}
	return failed
}

// fileFlags is the value pid_files holds for k; ok false when none.
func (m *processMaps) fileFlags(k bpfobj.ProfiPidFile) (uint8, bool) {
	v, ok := m.pidFiles[k]
	return v, ok
}

// putFile writes one pid_files value (a full-mode upgrade's PF_FULL).
func (m *processMaps) putFile(k bpfobj.ProfiPidFile, v uint8) error {
	if m.pidFilesMap == nil {
		return nil
	}
	if err := m.pidFilesMap.Update(&k, v, ebpf.UpdateAny); err != nil {
		return err
	}
	m.pidFiles[k] = v
	return nil
}

// syncFiles moves pid_files to want (step 3 of apply).
func (m *processMaps) syncFiles(want map[bpfobj.ProfiPidFile]uint8) (failed int) {
	if m.pidFilesMap == nil {
		return 0
	}
	put := func(k bpfobj.ProfiPidFile, v uint8) {
		if err := m.putFile(k, v); err != nil {
			failed++
		}
	}
	del := func(k bpfobj.ProfiPidFile) {
		if err := m.pidFilesMap.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			failed++
			return
		}
		delete(m.pidFiles, k)
	}
	for _, known := range []bool{false, true} {
		for k, v := range want {
			if cur, ok := m.pidFiles[k]; (!ok || cur != v) && (k.File == 0) == known {
				put(k, v)
			}
		}
	}
	for _, known := range []bool{true, false} {
		for k := range m.pidFiles {
			if _, ok := want[k]; !ok && (k.File == 0) == known {
				del(k)
			}
		}
	}
	return failed
}

// wantRuntimeText is where libcudart's code is mapped in every process that
// maps an attached libcudart: what rt_text should hold, so a driver launch
// can tell whether the runtime made it (driver_launch_op in bpf/handover.h).
func (a *Attacher) wantRuntimeText() map[uint32]rtRange {
	want := map[uint32]rtRange{}
	if a.opts.RuntimeText == nil {
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

// syncProcessMaps moves pid_files and rt_text to what the attached files
// say, in processMaps.apply's order; with handover, the runtime->driver
// handover runs where apply allows it: after rt_text's new entries (they
// carry the file id), before pid_files (PF_RT_MARK follows its plan).
// Called with a.mu held.
func (a *Attacher) syncProcessMaps(handover bool) {
	f := a.maps.apply(a.wantRuntimeText(), func() map[bpfobj.ProfiPidFile]uint8 {
		if handover {
			a.ho.sync(a)
		}
		return a.wantPIDFiles()
	}, a.wantFileFacts)
	if f.rtTextPut > 0 {
		a.log.Warn("could not update the rt_text map; runtime launches fall back to the timing guard", "failures", f.rtTextPut)
	}
	if f.pidFiles > 0 {
		a.log.Warn("could not update the pid_files map; aliased library files may count calls twice", "failures", f.pidFiles)
	}
	if f.rtTextDelete > 0 {
		a.log.Warn("could not delete from the rt_text map", "failures", f.rtTextDelete)
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
	if a.opts.RuntimeText == nil {
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

// wantPIDFiles is what pid_files should hold: which attached files each
// process maps, so that a file attached under two keys counts every call
// once (hit_flags in bpf/hits.h), and in the same value whether full-mode upgrade probes
// serve the (pid, file) (PF_FULL: set by upgrade once its links exist,
// cleared by dropUpgrade before they close; kept here) and whether rt_text
// holds a runtime file's process's range (PF_RT_TEXT: only once the
// entry is written, processMaps.apply).
func (a *Attacher) wantPIDFiles() map[bpfobj.ProfiPidFile]uint8 {
	const (
		own      = uint8(bpfobj.ProfiPidFileFlagPF_OWN)
		full     = uint8(bpfobj.ProfiPidFileFlagPF_FULL)
		rtText   = uint8(bpfobj.ProfiPidFileFlagPF_RT_TEXT)
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
				v |= rtText
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
