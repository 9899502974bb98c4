package breaker

import (
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/profi-dev/profi/internal/attach"
	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/discover"
)

type fakeFiles struct {
	files       map[uint32]attach.QuarantinedFile
	quarantined []uint32
	lifted      []attach.FileKey
	all         int
}

func (f *fakeFiles) Quarantine(id uint32) (attach.QuarantinedFile, bool) {
	q, ok := f.files[id]
	if ok {
		f.quarantined = append(f.quarantined, id)
	}
	return q, ok
}

func (f *fakeFiles) Unquarantine(k attach.FileKey) { f.lifted = append(f.lifted, k) }

func (f *fakeFiles) QuarantineAll() []attach.QuarantinedFile {
	f.all++
	var out []attach.QuarantinedFile
	for _, id := range slices.Sorted(maps.Keys(f.files)) {
		out = append(out, f.files[id])
	}
	return out
}

func event(pid uint32, file uint32, code int32, exit, hit time.Duration) *bpfobj.ProfiCrashEvent {
	ev := &bpfobj.ProfiCrashEvent{Pid: pid, Tid: pid, File: file, ExitCode: code, ExitNs: uint64(exit), HitNs: uint64(hit)}
	copy(ev.Comm[:], "work")
	return ev
}

// TestBreaker: only a fault exit within the window quarantines, once per
// file; the record, the metric and a lift are exact.
func TestBreaker(t *testing.T) {
	t.Parallel()
	files := &fakeFiles{files: map[uint32]attach.QuarantinedFile{
		3: {Key: attach.FileKey{Dev: 8<<8 | 1, Inode: 77}, Lib: discover.LibCudart, Path: "/l/libcudart.so.12", PIDs: []int{10, 11}, Links: 5},
		// The last pass ran after pid 12 died: it is not listed.
		4: {Key: attach.FileKey{Dev: 8<<8 | 1, Inode: 78}, Lib: discover.LibCuda, Path: "/l/libcuda.so.1", PIDs: []int{10, 13}},
	}}
	wall := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	mono := 100 * time.Second
	b := New(Options{Window: 5 * time.Second, Lift: time.Hour, Files: files,
		Now: func() time.Time { return wall }, Monotonic: func() time.Duration { return mono }})

	b.Handle(event(10, 3, 0x100, 99*time.Second, 98*time.Second))                    // exit(1): not a fault
	b.Handle(event(10, 3, 9, 99*time.Second, 98*time.Second))                        // SIGKILL
	b.Handle(event(10, 3, 15, 99*time.Second, 98*time.Second))                       // SIGTERM
	b.Handle(event(10, 3, 11, 99*time.Second, 90*time.Second))                       // SIGSEGV 9 s after the hit: outside
	b.Handle(event(10, 3, 11|0x80, 99*time.Second, 99*time.Second-time.Millisecond)) // SIGSEGV, core dumped
	b.Handle(event(11, 3, 4, 99*time.Second, 99*time.Second))                        // same file again: no second quarantine
	b.Handle(event(12, 9, 4, 99*time.Second, 99*time.Second))                        // unknown file
	b.Handle(event(12, 4, 7, 99*time.Second, 99*time.Second-5*time.Second))          // SIGBUS exactly at the window

	if !reflect.DeepEqual(files.quarantined, []uint32{3, 4}) {
		t.Errorf("quarantined %v, want [3 4]", files.quarantined)
	}
	st := b.Status()
	if len(st) != 2 {
		t.Fatalf("status %+v, want 2 quarantines", st)
	}
	q := st[0]
	lifts := wall.Add(time.Hour)
	if q.Library != "libcudart.so" || q.Path != "/l/libcudart.so.12" || q.File != "8:1/77" || q.Reason != "sigsegv" || q.Signal != "SIGSEGV" ||
		!q.CoreDumped || q.PID != 10 || q.Comm != "work" || !q.Time.Equal(wall.Add(-time.Second)) || q.SinceHitSeconds != 0.001 ||
		q.DetachSeconds != 1 || !reflect.DeepEqual(q.PIDs, []int{10, 11}) || q.LiftsAt == nil || !q.LiftsAt.Equal(lifts) {
		t.Errorf("quarantine %+v", q)
	}
	if st[1].Reason != "sigbus" || st[1].Library != "libcuda.so" || st[1].SinceHitSeconds != 5 || !reflect.DeepEqual(st[1].PIDs, []int{10, 12, 13}) {
		t.Errorf("second quarantine %+v", st[1])
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(b)
	want := `
# HELP profi_system_probe_quarantines_total Library files whose probes the crash breaker took off node-wide: a process that mapped the file died of a fault signal (reason) within --crash-window of a probe hit there; library "all": every probe on the node (reason kernel_warning, kernel_bug, kernel_oops: the kernel reported trouble in its uprobe code; unsafe_kernel: a known uprobe bug, at start-up).
# TYPE profi_system_probe_quarantines_total counter
profi_system_probe_quarantines_total{library="libcuda.so",reason="sigbus"} 1
profi_system_probe_quarantines_total{library="libcudart.so",reason="sigsegv"} 1
# HELP profi_system_probed_process_faults_total Probed processes that died of a fault signal (reason) more than --crash-window after their latest probe hit: no quarantine.
# TYPE profi_system_probed_process_faults_total counter
profi_system_probed_process_faults_total{reason="sigsegv"} 1
`
	want += `# HELP profi_system_probe_quarantined_files Library files whose probes are in quarantine now, by the signal that put them there.
# TYPE profi_system_probe_quarantined_files gauge
profi_system_probe_quarantined_files{library="libcuda.so",reason="sigbus"} 1
profi_system_probe_quarantined_files{library="libcudart.so",reason="sigsegv"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "profi_system_probe_quarantines_total", "profi_system_probed_process_faults_total", "profi_system_probe_quarantined_files"); err != nil {
		t.Error(err)
	}

	wall = wall.Add(time.Hour - time.Second)
	b.lift()
	if len(files.lifted) != 0 || len(b.Status()) != 2 {
		t.Fatalf("lifted %v before the time", files.lifted)
	}
	wall = wall.Add(time.Second)
	b.lift()
	if !reflect.DeepEqual(files.lifted, []attach.FileKey{{Dev: 8<<8 | 1, Inode: 77}, {Dev: 8<<8 | 1, Inode: 78}}) || len(b.Status()) != 0 {
		t.Errorf("lifted %v, status %v; want both files, none left", files.lifted, b.Status())
	}
	// After the lift, a new crash quarantines the file again.
	b.Handle(event(13, 3, 11, 99*time.Second, 99*time.Second))
	if !reflect.DeepEqual(files.quarantined, []uint32{3, 4, 3}) {
		t.Errorf("quarantined %v after the lift, want [3 4 3]", files.quarantined)
	}
}

// TestStopAll: a node-wide stop quarantines every file once, is reported
// as library "all" with the classified reason, and never lifts.
func TestStopAll(t *testing.T) {
	t.Parallel()
	files := &fakeFiles{files: map[uint32]attach.QuarantinedFile{
		3: {Lib: discover.LibCudart, PIDs: []int{10, 11}, Links: 5},
		4: {Lib: discover.LibCuda, PIDs: []int{11, 12}, Links: 2},
	}}
	wall := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	b := New(Options{Window: time.Second, Lift: time.Nanosecond, Files: files, Now: func() time.Time { return wall }, Monotonic: func() time.Duration { return 0 }})
	line := "WARNING: CPU: 1 PID: 10 at kernel/events/uprobes.c:1 handle_swbp+0x1/0x2"
	b.StopAll("kernel_warning", line)
	b.StopAll("kernel_oops", "Oops")
	b.lift()
	if files.all != 1 {
		t.Errorf("QuarantineAll called %d times, want 1", files.all)
	}
	st := b.Status()
	if len(st) != 1 || st[0].Library != LibraryAll || st[0].Reason != "kernel_warning" || st[0].KernelLog != line ||
		!reflect.DeepEqual(st[0].PIDs, []int{10, 11, 12}) || !st[0].Time.Equal(wall) || st[0].LiftsAt != nil {
		t.Fatalf("status %+v", st)
	}
	want := `
# HELP profi_system_probe_quarantines_total Library files whose probes the crash breaker took off node-wide: a process that mapped the file died of a fault signal (reason) within --crash-window of a probe hit there; library "all": every probe on the node (reason kernel_warning, kernel_bug, kernel_oops: the kernel reported trouble in its uprobe code; unsafe_kernel: a known uprobe bug, at start-up).
# TYPE profi_system_probe_quarantines_total counter
profi_system_probe_quarantines_total{library="all",reason="kernel_oops"} 1
profi_system_probe_quarantines_total{library="all",reason="kernel_warning"} 1
`
	if err := testutil.CollectAndCompare(b, strings.NewReader(want), "profi_system_probe_quarantines_total"); err != nil {
		t.Error(err)
	}
}
