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

type tenantFile struct {
	id     uint32
	tenant uint64
}

type fakeFiles struct {
	files       map[uint32]attach.QuarantinedFile
	quarantined []uint32
	tenants     []tenantFile
	lifted      []attach.FileKey
	tenantsBack []attach.FileKey
	all         int
}

func (f *fakeFiles) QuarantineTenant(id uint32, tenant uint64) (attach.QuarantinedFile, bool) {
	q, ok := f.files[id]
	if ok {
		f.tenants = append(f.tenants, tenantFile{id, tenant})
	}
	return q, ok
}

func (f *fakeFiles) UnquarantineTenant(k attach.FileKey, tenant uint64) {
	f.tenantsBack = append(f.tenantsBack, k)
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

// Evidence bits (enum fault_why, bpf/types.h).
const (
	xol       = 1
	probedIns = 2
	retSys    = 8
)

// event is a fault death of pid in tenant with the evidence of its
// latest kernel-raised fault (signal fsig, why).
func event(pid, file uint32, tenant uint64, code int32, fsig, why uint8, exit, hit time.Duration) *bpfobj.ProfiCrashEvent {
	ev := &bpfobj.ProfiCrashEvent{Pid: pid, Tid: pid, File: file, Tenant: tenant, ExitCode: code, ExitNs: uint64(exit), HitNs: uint64(hit),
		FaultSig: fsig, FaultWhy: why, FaultCode: 1, FaultIp: 0x7f0000001000}
	copy(ev.Comm[:], "work")
	return ev
}

// TestBreaker: only a death the evidence ties to a probe acts; the first
// in a file quarantines it for the tenant, one in a second tenant
// node-wide; records, metrics and the doubling lifts are exact.
func TestBreaker(t *testing.T) {
	t.Parallel()
	cudart := attach.FileKey{Dev: 8<<8 | 1, Inode: 77}
	files := &fakeFiles{files: map[uint32]attach.QuarantinedFile{
		3: {Key: cudart, Lib: discover.LibCudart, Path: "/l/libcudart.so.12", PIDs: []int{10, 11}, Links: 5},
		// The last pass ran after pid 12 died: it is not listed.
		4: {Key: attach.FileKey{Dev: 8<<8 | 1, Inode: 78}, Lib: discover.LibCuda, Path: "/l/libcuda.so.1", PIDs: []int{10, 13}},
	}}
	wall := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	mono := 100 * time.Second
	b := New(Options{Lift: time.Hour, Files: files,
		Now: func() time.Time { return wall }, Monotonic: func() time.Duration { return mono }})
	s := time.Second
	const tenantA, tenantB, tenantC = 1001, 1002, 1003

	// Not the probes': no action, counted attributed="false".
	b.Handle(event(10, 3, tenantA, 0x100, 0, 0, 99*s, 98*s))     // exit(1): not a fault
	b.Handle(event(10, 3, tenantA, 9, 0, 0, 99*s, 98*s))         // SIGKILL
	b.Handle(event(10, 3, tenantA, 11, 0, 0, 99*s, 99*s))        // SIGSEGV sent with kill: no kernel fault on record
	b.Handle(event(10, 3, tenantA, 11, 11, 0, 99*s, 99*s))       // its own NULL store: nothing points at a probe
	b.Handle(event(10, 3, tenantA, 11|0x80, 4, xol, 99*s, 99*s)) // an earlier SIGILL in [uprobes], handled; the death is another signal
	b.Handle(event(10, 3, tenantA, 31, 0, 0, 99*s, 99*s))        // a seccomp kill elsewhere
	if len(files.quarantined)+len(files.tenants) != 0 {
		t.Fatalf("unattributed deaths quarantined: node %v, tenant %v", files.quarantined, files.tenants)
	}

	// Attributed: tenant A, then again A (nothing more), then B: node-wide.
	b.Handle(event(10, 3, tenantA, 11|0x80, 11, xol, 99*s, 99*s-time.Millisecond))
	b.Handle(event(11, 3, tenantA, 4, 4, probedIns, 99*s, 99*s))
	if !reflect.DeepEqual(files.tenants, []tenantFile{{3, tenantA}}) || len(files.quarantined) != 0 {
		t.Fatalf("after tenant A: tenant %v node %v, want tenant [{3 %d}] only", files.tenants, files.quarantined, tenantA)
	}
	st := b.Status()
	if len(st) != 1 {
		t.Fatalf("status %+v, want 1 quarantine", st)
	}
	q := st[0]
	lifts := wall.Add(time.Hour)
	if q.Library != "libcudart.so" || q.Path != "/l/libcudart.so.12" || q.File != "8:1/77" || q.Reason != "sigsegv" || q.Signal != "SIGSEGV" ||
		q.Scope != ScopeTenant || q.Tenant != tenantA || !reflect.DeepEqual(q.Evidence, []string{"out_of_line_page"}) || q.FaultIP != 0x7f0000001000 || q.SiCode != 1 ||
		!q.CoreDumped || q.PID != 10 || q.Comm != "work" || !q.Time.Equal(wall.Add(-time.Second)) || q.SinceHitSeconds != 0.001 ||
		q.DetachSeconds != 1 || !reflect.DeepEqual(q.PIDs, []int{10, 11}) || q.LiftsAt == nil || !q.LiftsAt.Equal(lifts) {
		t.Errorf("tenant quarantine %+v", q)
	}
	b.Handle(event(12, 3, tenantB, 4, 4, probedIns, 99*s, 99*s))
	b.Handle(event(13, 3, tenantC, 4, 4, probedIns, 99*s, 99*s)) // already off node-wide
	if !reflect.DeepEqual(files.quarantined, []uint32{3}) || !reflect.DeepEqual(files.tenantsBack, []attach.FileKey{cudart}) {
		t.Fatalf("after tenant B: node %v, tenant quarantines lifted %v; want node [3], tenant A's lifted", files.quarantined, files.tenantsBack)
	}
	// A seccomp kill in the return probe's system call (SIGSYS, no si_code).
	b.Handle(event(12, 4, tenantA, 31, 31, retSys, 99*s, 99*s-5*s))
	st = b.Status()
	if len(st) != 2 || st[0].Scope != ScopeNode || st[0].Reason != "sigill" || st[0].PID != 12 || !st[0].LiftsAt.Equal(wall.Add(2*time.Hour)) ||
		st[1].Scope != ScopeTenant || st[1].Reason != "sigsys" || st[1].Library != "libcuda.so" || st[1].SinceHitSeconds != 5 ||
		!reflect.DeepEqual(st[1].Evidence, []string{"uretprobe_syscall"}) || !reflect.DeepEqual(st[1].PIDs, []int{10, 12, 13}) {
		t.Errorf("status %+v", st)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(b)
	want := `
# HELP profi_system_probe_quarantines_total Library files the crash breaker quarantined: a probed process died of a fault signal (reason) that a probe explains (scope tenant: the file is left unprobed in that process's tenant; scope node: crashes in two tenants took its probes off node-wide); library "all": every probe on the node (reason kernel_warning, kernel_bug, kernel_oops: the kernel reported trouble in its uprobe code; unsafe_kernel: a known uprobe bug, at start-up).
# TYPE profi_system_probe_quarantines_total counter
profi_system_probe_quarantines_total{library="libcuda.so",reason="sigsys",scope="tenant"} 1
profi_system_probe_quarantines_total{library="libcudart.so",reason="sigill",scope="node"} 1
profi_system_probe_quarantines_total{library="libcudart.so",reason="sigsegv",scope="tenant"} 1
# HELP profi_system_probed_process_faults_total Probed processes that died of a fault signal (reason), attributed="true" when a probe explains the fault (the breaker acted), "false" otherwise (a fault of the process's own, or a signal sent with kill, tgkill or sigqueue: nothing quarantined).
# TYPE profi_system_probed_process_faults_total counter
profi_system_probed_process_faults_total{attributed="false",reason="sigsegv"} 3
profi_system_probed_process_faults_total{attributed="false",reason="sigsys"} 1
profi_system_probed_process_faults_total{attributed="true",reason="sigill"} 3
profi_system_probed_process_faults_total{attributed="true",reason="sigsegv"} 1
profi_system_probed_process_faults_total{attributed="true",reason="sigsys"} 1
# HELP profi_system_probe_quarantined_files Library files in quarantine now, by the signal that put them there and scope (tenant, node).
# TYPE profi_system_probe_quarantined_files gauge
profi_system_probe_quarantined_files{library="libcuda.so",reason="sigsys",scope="tenant"} 1
profi_system_probe_quarantined_files{library="libcudart.so",reason="sigill",scope="node"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "profi_system_probe_quarantines_total", "profi_system_probed_process_faults_total", "profi_system_probe_quarantined_files"); err != nil {
		t.Error(err)
	}

	// Lifts: the tenant quarantine of libcuda after an hour, libcudart's
	// node-wide one (its second quarantine) after two.
	wall = wall.Add(time.Hour - time.Second)
	b.lift()
	if len(files.lifted) != 0 || len(b.Status()) != 2 {
		t.Fatalf("lifted %v before the time", files.lifted)
	}
	wall = wall.Add(time.Second)
	b.lift()
	if len(files.lifted) != 0 || !reflect.DeepEqual(files.tenantsBack, []attach.FileKey{cudart, {Dev: 8<<8 | 1, Inode: 78}}) || len(b.Status()) != 1 {
		t.Fatalf("after an hour: lifted %v, tenant quarantines lifted %v, status %+v", files.lifted, files.tenantsBack, b.Status())
	}
	wall = wall.Add(time.Hour)
	b.lift()
	if !reflect.DeepEqual(files.lifted, []attach.FileKey{cudart}) || len(b.Status()) != 0 {
		t.Fatalf("after two hours: lifted %v, status %+v", files.lifted, b.Status())
	}
	// After the lift, a new attributed crash quarantines the file for its
	// tenant again, for four hours (its third quarantine).
	b.Handle(event(14, 3, tenantC, 11, 11, xol, 99*s, 99*s))
	if st := b.Status(); len(st) != 1 || st[0].Scope != ScopeTenant || !st[0].LiftsAt.Equal(wall.Add(4*time.Hour)) {
		t.Errorf("after the lift: %+v", st)
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
	b := New(Options{Lift: time.Nanosecond, Files: files, Now: func() time.Time { return wall }, Monotonic: func() time.Duration { return 0 }})
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
# HELP profi_system_probe_quarantines_total Library files the crash breaker quarantined: a probed process died of a fault signal (reason) that a probe explains (scope tenant: the file is left unprobed in that process's tenant; scope node: crashes in two tenants took its probes off node-wide); library "all": every probe on the node (reason kernel_warning, kernel_bug, kernel_oops: the kernel reported trouble in its uprobe code; unsafe_kernel: a known uprobe bug, at start-up).
# TYPE profi_system_probe_quarantines_total counter
profi_system_probe_quarantines_total{library="all",reason="kernel_oops",scope="node"} 1
profi_system_probe_quarantines_total{library="all",reason="kernel_warning",scope="node"} 1
`
	if err := testutil.CollectAndCompare(b, strings.NewReader(want), "profi_system_probe_quarantines_total"); err != nil {
		t.Error(err)
	}
}
