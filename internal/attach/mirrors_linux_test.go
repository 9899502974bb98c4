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
	m := newProcessMaps(objs.PidFiles, objs.RtText)
	r := rtRange{TextRange: TextRange{Start: 0x1000, End: 0x2000}, file: 7}
	own := uint8(bpfobj.ProfiPidFileFlagPF_OWN)
	inMap := func(pid uint32) bool {
		var v bpfobj.ProfiTextRange
		return objs.RtText.Lookup(pid, &v) == nil
	}

	f := m.apply(map[uint32]rtRange{42: r}, func() map[bpfobj.ProfiPidFile]uint8 {
		if _, ok := m.hasText(42); !ok || !inMap(42) {
			t.Error("pid_files computed before rt_text holds the new range")
		}
		return map[bpfobj.ProfiPidFile]uint8{{Pid: 42, File: 7}: own, {Pid: 42}: own}
	})
	if f != (mapFailures{}) {
		t.Fatalf("failures %+v", f)
	}
	var v uint8
	if err := objs.PidFiles.Lookup(&bpfobj.ProfiPidFile{Pid: 42, File: 7}, &v); err != nil || v != own {
		t.Fatalf("pid_files (42, 7) = %d, %v; want %d", v, err, own)
	}

	f = m.apply(map[uint32]rtRange{}, func() map[bpfobj.ProfiPidFile]uint8 {
		if _, ok := m.hasText(42); !ok || !inMap(42) {
			t.Error("rt_text's stale range deleted before pid_files stopped naming it")
		}
		return map[bpfobj.ProfiPidFile]uint8{}
	})
	if f != (mapFailures{}) {
		t.Fatalf("failures %+v", f)
	}
	if _, ok := m.hasText(42); ok || inMap(42) {
		t.Error("rt_text still holds the stale range after apply")
	}
	if err := objs.PidFiles.Lookup(&bpfobj.ProfiPidFile{Pid: 42}, &v); err == nil {
		t.Error("pid_files still holds the stale known marker after apply")
	}
	if len(m.pidFiles) != 0 || len(m.rtText) != 0 {
		t.Errorf("mirrors not empty: %v, %v", m.pidFiles, m.rtText)
	}
}
