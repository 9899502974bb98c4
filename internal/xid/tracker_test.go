package xid

import (
	"reflect"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/aggregate"
	"github.com/profi-dev/profi/internal/kmsg"
	"github.com/profi-dev/profi/internal/nvml"
	"github.com/profi-dev/profi/internal/status"
)

// An Xid line on GPU 1's bus is counted once (a record delivered twice has
// the same sequence number), on GPU 1, with the processes on GPU 1 and
// their in-flight CUDA and NCCL calls; a process on GPU 0 is not listed; a
// malformed line is counted apart; other lines are ignored.
func TestTrackerBlastRadius(t *testing.T) {
	t.Parallel()
	gpus := &nvml.Snapshot{Up: true, GPUs: []nvml.GPU{
		{Index: 0, UUID: "GPU-a", PCIBusID: "00000000:3B:00.0"},
		{Index: 1, UUID: "GPU-b", PCIBusID: "00000000:86:00.0", Processes: []nvml.Process{{PID: 30}, {PID: 20}, {PID: 40}}},
	}}
	procs := &aggregate.Snapshot{Processes: []*aggregate.Process{
		{Meta: aggregate.Meta{PID: 10, Comm: "a", Pod: "p0", GPUUUID: "GPU-a"}},
		{Meta: aggregate.Meta{PID: 20, Comm: "b", Namespace: "ns", Pod: "p1", Container: "c", GPUUUID: "GPU-b"},
			NCCL:         &aggregate.NCCL{Oldest: map[string]time.Duration{"ncclAllReduce": 1500 * time.Millisecond}},
			CUDAInFlight: map[string]time.Duration{"cudaStreamSync": 2 * time.Second, "cudaMemcpy": aggregate.UnsampledAge}},
		// Its calls went to GPU 0 so far; NVML has it on GPU 1 too.
		{Meta: aggregate.Meta{PID: 40, Comm: "d", Pod: "p2", GPUUUID: "GPU-a"},
			CUDAInFlight: map[string]time.Duration{"cudaMalloc": time.Second}},
	}}
	tr := NewTracker(func() *nvml.Snapshot { return gpus }, func() *aggregate.Snapshot { return procs }, 2)
	at := time.Unix(1000, 0)
	tr.now = func() time.Time { return at }
	line := "NVRM: Xid (PCI:0000:86:00): 79, pid=20, name=b, GPU has fallen off the bus."
	tr.Consume(kmsg.Record{Seq: 5, Time: time.Second, Message: "usb 1-1: hello"})
	tr.Consume(kmsg.Record{Seq: 7, Time: 2 * time.Second, Message: line})
	tr.Consume(kmsg.Record{Seq: 7, Time: 2 * time.Second, Message: line})
	tr.Consume(kmsg.Record{Seq: 8, Message: "NVRM: Xid (PCI:0000:86:00): x"})
	if got, want := tr.Counts(), map[Key]uint64{{GPU: 1, UUID: "GPU-b", Code: 79}: 1}; !reflect.DeepEqual(got, want) {
		t.Errorf("counts %v, want %v", got, want)
	}
	if tr.Malformed() != 1 {
		t.Errorf("malformed %d, want 1", tr.Malformed())
	}
	want := []status.Xid{{Source: SourceKernelLog, Seq: 7, Uptime: 2 * time.Second, Time: at, Code: 79, PCIBusID: "00000000:86:00.0", GPU: 1, GPUUUID: "GPU-b",
		DriverPID: 20, DriverName: "b", Detail: "GPU has fallen off the bus.", Processes: []status.XidProcess{
			{PID: 20, Comm: "b", Namespace: "ns", Pod: "p1", Container: "c", GPUUUID: "GPU-b", NCCLInFlight: map[string]float64{"ncclAllReduce": 1.5},
				CUDAInFlight: map[string]float64{"cudaStreamSync": 2, "cudaMemcpy": -1}},
			{PID: 30, GPUUUID: "GPU-b"},
			{PID: 40, Comm: "d", Pod: "p2", GPUUUID: "GPU-b", CUDAInFlight: map[string]float64{"cudaMalloc": 1}},
		}}}
	if got := tr.Recent(); !reflect.DeepEqual(got, want) {
		t.Errorf("recent\n%+v\nwant\n%+v", got, want)
	}
	// An unknown bus: counted on gpu -1; the last 2 are kept.
	tr.Consume(kmsg.Record{Seq: 9, Message: "NVRM: Xid (PCI:0000:99:00): 13, x"})
	tr.Consume(kmsg.Record{Seq: 10, Message: "NVRM: Xid (PCI:0000:3b:00): 94, y"})
	if got := tr.Counts()[Key{GPU: -1, Code: 13}]; got != 1 {
		t.Errorf("unknown bus counted %d, want 1", got)
	}
	if r := tr.Recent(); len(r) != 2 || r[0].Seq != 9 || r[1].Seq != 10 || r[1].GPU != 0 || len(r[1].Processes) != 2 || r[1].Processes[0].PID != 10 || r[1].Processes[1].PID != 40 {
		t.Errorf("recent %+v", r)
	}
}

// An Xid line of another facility than the kernel's (written to /dev/kmsg
// from userspace: any process could) is not counted, only counted as
// rejected; with TrustUser (the tests' --kmsg-trust-user) it counts.
func TestForgedXidRejected(t *testing.T) {
	t.Parallel()
	tr := NewTracker(nil, nil, 2)
	line := "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."
	tr.Consume(kmsg.Record{Seq: 1, Facility: kmsg.FacilityUser, Level: kmsg.LevelWarning, Message: line})
	if len(tr.Counts()) != 0 || len(tr.Recent()) != 0 {
		t.Errorf("a user-facility Xid was counted: %v %v", tr.Counts(), tr.Recent())
	}
	if got, want := tr.Rejected(), map[string]uint64{RejectedMalformed: 0, RejectedNotKernel: 1}; !reflect.DeepEqual(got, want) {
		t.Errorf("rejected %v, want %v", got, want)
	}
	tr.Consume(kmsg.Record{Seq: 2, Facility: kmsg.FacilityKernel, Message: line})
	tr.TrustUser = true
	tr.Consume(kmsg.Record{Seq: 3, Facility: kmsg.FacilityUser, Message: line})
	if got, want := tr.Counts(), map[Key]uint64{{GPU: -1, Code: 79}: 2}; !reflect.DeepEqual(got, want) {
		t.Errorf("counts %v, want %v (the kernel's line, then the trusted user's)", got, want)
	}
}

// An NVML XID event, where the kernel log is not read, gets the kernel
// log line's blast radius: the processes on that GPU (by UUID) with their
// calls in flight; while the kernel log is read, it is not listed twice.
func TestNVMLEventBlastRadius(t *testing.T) {
	t.Parallel()
	gpus := &nvml.Snapshot{Up: true, GPUs: []nvml.GPU{
		{Index: 0, UUID: "GPU-a", PCIBusID: "00000000:3B:00.0"},
		{Index: 1, UUID: "GPU-b", PCIBusID: "00000000:86:00.0", Processes: []nvml.Process{{PID: 30}, {PID: 20}}},
	}}
	procs := &aggregate.Snapshot{Processes: []*aggregate.Process{
		{Meta: aggregate.Meta{PID: 10, Comm: "a", GPUUUID: "GPU-a"}},
		{Meta: aggregate.Meta{PID: 20, Comm: "b", Namespace: "ns", Pod: "p1", Container: "c", GPUUUID: "GPU-b"},
			CUDAInFlight: map[string]time.Duration{"cudaMemcpy": 3 * time.Second}},
	}}
	tr := NewTracker(func() *nvml.Snapshot { return gpus }, func() *aggregate.Snapshot { return procs }, 4)
	at := time.Unix(2000, 0)
	tr.now = func() time.Time { return at }
	reading := true
	tr.KernelLogRunning = func() bool { return reading }
	tr.NVMLEvent(1, "GPU-b", 79)
	if r := tr.Recent(); len(r) != 0 {
		t.Fatalf("an NVML event listed while the kernel log is read: %+v", r)
	}
	reading = false
	tr.NVMLEvent(1, "GPU-b", 79)
	want := []status.Xid{{Source: SourceNVML, Time: at, Code: 79, PCIBusID: "00000000:86:00.0", GPU: 1, GPUUUID: "GPU-b", Processes: []status.XidProcess{
		{PID: 20, Comm: "b", Namespace: "ns", Pod: "p1", Container: "c", GPUUUID: "GPU-b", CUDAInFlight: map[string]float64{"cudaMemcpy": 3}},
		{PID: 30, GPUUUID: "GPU-b"},
	}}}
	if got := tr.Recent(); !reflect.DeepEqual(got, want) {
		t.Errorf("recent\n%+v\nwant\n%+v", got, want)
	}
	if len(tr.Counts()) != 0 {
		t.Errorf("an NVML event counted by the tracker: %v (the collector counts NVML's)", tr.Counts())
	}
}
