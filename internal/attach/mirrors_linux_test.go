package attach

import (
	"testing"

	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/testutil"
)

// TestProcessMapsOrder: a process's runtime range travels in the
// pid_files value of every file it maps, with PF_RT_TEXT, written whole:
// within apply, the wanted flags are computed (and the handover runs)
// once the new ranges are known; a change of the handed flag (putText,
// as the handover calls it before it detaches a probe) is in the map when
// putText returns; a range that goes leaves every value at once. Checked
// on the real maps, whose contents the mirrors must match.
func TestProcessMapsOrder(t *testing.T) {
	testutil.RequireBPF(t)
	objs, err := bpfobj.Load(bpfobj.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer objs.Close()
	m := newProcessMaps(objs.PidFiles, objs.FileFacts, objs.RtInodes)
	r := rtRange{TextRange: TextRange{Start: 0x1000, End: 0x2000}, file: 7}
	const (
		own    = uint8(bpfobj.ProfiPidFileFlagPF_OWN)
		shared = uint8(bpfobj.ProfiPidFileFlagPF_RT_SHARED)
		text   = uint32(bpfobj.ProfiPidFileFlagPF_RT_TEXT)
		handed = uint32(bpfobj.ProfiPidFileFlagPF_HANDED)
	)
	runtime, driver, known := bpfobj.ProfiPidFile{Pid: 42, File: 7}, bpfobj.ProfiPidFile{Pid: 42, File: 9}, bpfobj.ProfiPidFile{Pid: 42}
	lookup := func(k bpfobj.ProfiPidFile) (bpfobj.ProfiPidFileVal, bool) {
		var v bpfobj.ProfiPidFileVal
		return v, objs.PidFiles.Lookup(&k, &v) == nil
	}
	expect := func(k bpfobj.ProfiPidFile, want bpfobj.ProfiPidFileVal) {
		t.Helper()
		if v, ok := lookup(k); !ok || v != want {
			t.Errorf("pid_files %+v = %+v (there: %v); want %+v", k, v, ok, want)
		}
	}
	withRange := func(flags uint32) bpfobj.ProfiPidFileVal {
		return bpfobj.ProfiPidFileVal{Flags: flags, RtFile: 7, RtStart: 0x1000, RtEnd: 0x2000}
	}
	wantFiles := map[bpfobj.ProfiPidFile]uint8{runtime: own | shared, driver: own, known: own}

	f := m.apply(map[uint32]rtRange{42: r}, func() map[bpfobj.ProfiPidFile]uint8 {
		if _, ok := m.hasText(42); !ok {
			t.Error("pid_files flags computed before the new range is known")
		}
		return wantFiles
	}, func() map[uint32]uint8 { return map[uint32]uint8{7: shared} })
	if f != (mapFailures{}) {
		t.Fatalf("failures %+v", f)
	}
	expect(runtime, withRange(uint32(own|shared)|text))
	expect(driver, withRange(uint32(own)|text)) // the driver's entry reads it
	expect(known, bpfobj.ProfiPidFileVal{Flags: uint32(own)})
	var fv uint8
	if err := objs.FileFacts.Lookup(uint32(7), &fv); err != nil || fv != shared {
		t.Fatalf("file_facts 7 = %d, %v; want %d", fv, err, shared)
	}

	// The handover hands an op over: every value says so before putText returns.
	r.handed = true
	if n := m.putText(map[uint32]rtRange{42: r}); n != 0 {
		t.Fatalf("putText: %d failures", n)
	}
	expect(runtime, withRange(uint32(own|shared)|text|handed))
	expect(driver, withRange(uint32(own)|text|handed))

	// The runtime goes (released, quarantined): its range leaves every value.
	f = m.apply(map[uint32]rtRange{}, func() map[bpfobj.ProfiPidFile]uint8 {
		if v, _ := lookup(driver); v.Flags&text != 0 {
			t.Error("the driver's value still carries a range that went when the flags are computed")
		}
		return map[bpfobj.ProfiPidFile]uint8{driver: own, known: own}
	}, func() map[uint32]uint8 { return nil })
	if f != (mapFailures{}) {
		t.Fatalf("failures %+v", f)
	}
	expect(driver, bpfobj.ProfiPidFileVal{Flags: uint32(own)})
	if _, ok := lookup(runtime); ok {
		t.Error("pid_files still holds the released runtime's value")
	}
	// Inodes BPF noted for file 7 (as unseen_text does) went with its facts.
	if err := objs.FileFacts.Lookup(uint32(7), &fv); err == nil {
		t.Error("file_facts still holds the released file")
	}

	for _, inode := range []uint64{0xffff0001, 0xffff0002} {
		if err := objs.RtInodes.Put(inode, uint32(7)); err != nil {
			t.Fatal(err)
		}
	}
	f = m.apply(map[uint32]rtRange{}, func() map[bpfobj.ProfiPidFile]uint8 { return nil },
		func() map[uint32]uint8 { return map[uint32]uint8{7: shared} })
	f2 := m.apply(map[uint32]rtRange{}, func() map[bpfobj.ProfiPidFile]uint8 { return nil },
		func() map[uint32]uint8 { return nil })
	if f != (mapFailures{}) || f2 != (mapFailures{}) {
		t.Fatalf("failures %+v, %+v", f, f2)
	}
	if _, ok := lookup(known); ok {
		t.Error("pid_files still holds the stale known marker after apply")
	}
	var file uint32
	if err := objs.RtInodes.Lookup(uint64(0xffff0001), &file); err == nil {
		t.Error("rt_inodes still names the released file")
	}
	if len(m.pidFiles) != 0 || len(m.flags) != 0 || len(m.rtText) != 0 || len(m.facts) != 0 {
		t.Errorf("mirrors not empty: %v, %v, %v, %v", m.pidFiles, m.flags, m.rtText, m.facts)
	}
}
