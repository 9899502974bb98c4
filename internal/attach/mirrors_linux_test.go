package attach

import (
	"testing"

	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/testutil"
)

// TestProcessMapsOrder: within apply, the wanted pid_files are computed
// (and the handover runs) while rt_text holds every entry it will hold
// and every entry it held: a new range is there before any PF_RT_TEXT can
// name it, a stale one goes only after pid_files stopped naming it.
// Checked on the real maps, whose contents the mirrors must match.
func TestProcessMapsOrder(t *testing.T) {
	testutil.RequireBPF(t)
	objs, err := bpfobj.Load(bpfobj.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer objs.Close()
	m := newProcessMaps(objs.PidFiles, objs.RtText, objs.FileFacts, objs.RtInodes)
	r := rtRange{TextRange: TextRange{Start: 0x1000, End: 0x2000}, file: 7}
	own := uint8(bpfobj.ProfiPidFileFlagPF_OWN)
	shared := uint8(bpfobj.ProfiPidFileFlagPF_RT_SHARED)
	inMap := func(pid uint32) bool {
		var v bpfobj.ProfiTextRange
		return objs.RtText.Lookup(pid, &v) == nil
	}

	f := m.apply(map[uint32]rtRange{42: r}, func() map[bpfobj.ProfiPidFile]uint8 {
		if _, ok := m.hasText(42); !ok || !inMap(42) {
			t.Error("pid_files computed before rt_text holds the new range")
		}
		return map[bpfobj.ProfiPidFile]uint8{{Pid: 42, File: 7}: own, {Pid: 42}: own}
	}, func() map[uint32]uint8 { return map[uint32]uint8{7: shared} })
	if f != (mapFailures{}) {
		t.Fatalf("failures %+v", f)
	}
	var v uint8
	if err := objs.PidFiles.Lookup(&bpfobj.ProfiPidFile{Pid: 42, File: 7}, &v); err != nil || v != own {
		t.Fatalf("pid_files (42, 7) = %d, %v; want %d", v, err, own)
	}
	if err := objs.FileFacts.Lookup(uint32(7), &v); err != nil || v != shared {
		t.Fatalf("file_facts 7 = %d, %v; want %d", v, err, shared)
	}
	// Inodes BPF noted for file 7 (as unseen_text does) go with its facts.
	for _, inode := range []uint64{0xffff0001, 0xffff0002} {
		if err := objs.RtInodes.Put(inode, uint32(7)); err != nil {
			t.Fatal(err)
		}
	}

	f = m.apply(map[uint32]rtRange{}, func() map[bpfobj.ProfiPidFile]uint8 {
		if _, ok := m.hasText(42); !ok || !inMap(42) {
			t.Error("rt_text's stale range deleted before pid_files stopped naming it")
		}
		return map[bpfobj.ProfiPidFile]uint8{}
	}, func() map[uint32]uint8 { return nil })
	if f != (mapFailures{}) {
		t.Fatalf("failures %+v", f)
	}
	if _, ok := m.hasText(42); ok || inMap(42) {
		t.Error("rt_text still holds the stale range after apply")
	}
	if err := objs.PidFiles.Lookup(&bpfobj.ProfiPidFile{Pid: 42}, &v); err == nil {
		t.Error("pid_files still holds the stale known marker after apply")
	}
	if err := objs.FileFacts.Lookup(uint32(7), &v); err == nil {
		t.Error("file_facts still holds the released file")
	}
	var file uint32
	if err := objs.RtInodes.Lookup(uint64(0xffff0001), &file); err == nil {
		t.Error("rt_inodes still names the released file")
	}
	if len(m.pidFiles) != 0 || len(m.rtText) != 0 || len(m.facts) != 0 {
		t.Errorf("mirrors not empty: %v, %v, %v", m.pidFiles, m.rtText, m.facts)
	}
}
