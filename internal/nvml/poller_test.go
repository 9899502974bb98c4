package nvml

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

// start runs a Poller over lib until the test ends.
func start(t *testing.T, lib Library, o Options) (*Poller, *logBuffer, func()) {
	t.Helper()
	logs := &logBuffer{}
	o.Lib, o.Logger = lib, logs.logger()
	if o.Interval == 0 {
		o.Interval = 5 * time.Millisecond
	}
	if o.InitRetry == 0 {
		o.InitRetry = 5 * time.Millisecond
	}
	p, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run() = %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Run did not return within 5s of cancel")
		}
	}
	t.Cleanup(stop)
	return p, logs, stop
}

func up(s *Snapshot) bool { return s.Up }

// h100 is a fully featured GPU in NVML's units.
func h100() *fakeDev {
	return &fakeDev{
		uuid: "GPU-aaaaaaaa-0000-0000-0000-000000000000", name: "NVIDIA H100 80GB HBM3",
		temp: 41, powerMW: 123456, smMHz: 1980, memMHz: 2619,
		utilGPU: 87, utilMem: 35,
		mem:     Memory{Total: 85899345920, Free: 80000000000, Used: 5899345920},
		eccCorr: 3, eccUncorr: 1,
		reasons: ReasonSWPowerCap | ReasonSWThermal | ReasonSyncBoost,
		procs: []ProcessInfo{
			{PID: 4242, UsedBytes: 1 << 30, GPUInstanceID: NoInstance},
			{PID: 17, UsedBytes: MemoryNotAvailable, GPUInstanceID: NoInstance},
		},
		txKBs: 1000, rxKBs: 250,
		links: []fakeLink{
			{active: true, counters: [4]uint64{1, 2, 3, 4}},
			{active: false, counters: [4]uint64{100, 100, 100, 100}}, // inactive: not summed
			{active: true, counters: [4]uint64{10, 20, 30, 40}},
			{err: ErrNotSupported}, // ends the walk
			{active: true, counters: [4]uint64{1000, 1000, 1000, 1000}},
		},
		errs: map[string]error{},
	}
}

func TestPollMapsValues(t *testing.T) {
	t.Parallel()
	lib := newFakeLib(h100())
	p, _, _ := start(t, lib, Options{})
	s := waitFor(t, p, up)

	if s.Reason != "" || s.Library != "/fake/"+LibraryName || s.DriverVersion != "580.65.06" {
		t.Errorf("snapshot header = %q %q %q", s.Reason, s.Library, s.DriverVersion)
	}
	if s.PollDuration <= 0 {
		t.Errorf("PollDuration = %v, want > 0", s.PollDuration)
	}
	want := GPU{
		Index: 0, UUID: "GPU-aaaaaaaa-0000-0000-0000-000000000000", Name: "NVIDIA H100 80GB HBM3",
		MIGEnabled:         new(false),
		TemperatureCelsius: new(41.0),
		PowerWatts:         new(123.456),
		SMClockMHz:         new(1980.0),
		MemClockMHz:        new(2619.0),
		GPUUtilization:     new(0.87),
		MemoryUtilization:  new(0.35),
		Memory:             &Memory{Total: 85899345920, Free: 80000000000, Used: 5899345920},
		ECCCorrected:       new(uint64(3)),
		ECCUncorrected:     new(uint64(1)),
		Throttle:           &Throttle{Power: true, Thermal: true, SyncBoost: true, Raw: 0x34},
		Processes: []Process{
			{PID: 17},
			{PID: 4242, UsedBytes: 1 << 30, MemoryKnown: true},
		},
		PCIeTXBytesPerSecond: new(1024000.0),
		PCIeRXBytesPerSecond: new(256000.0),
		NVLinkErrors:         map[NVLinkCounter]uint64{NVLinkReplay: 11, NVLinkRecovery: 22, NVLinkCRCFlit: 33, NVLinkCRCData: 44},
		XIDErrors:            map[uint64]uint64{},
		Instances:            []Instance{{UUID: "GPU-aaaaaaaa-0000-0000-0000-000000000000", ProcessUtilization: StateNotSupported, GPM: StateNotSupported}},
	}
	if len(s.GPUs) != 1 {
		t.Fatalf("GPUs = %d, want 1", len(s.GPUs))
	}
	if got := s.GPUs[0]; !reflect.DeepEqual(got, want) {
		t.Errorf("GPU =\n%s\nwant\n%s", dump(got), dump(want))
	}
}

// dump prints a GPU with its pointers followed.
func dump(g GPU) string {
	v := reflect.ValueOf(g)
	var b strings.Builder
	for i := range v.NumField() {
		f := v.Field(i)
		if f.Kind() == reflect.Pointer && !f.IsNil() {
			f = f.Elem()
		}
		fmt.Fprintf(&b, "  %s: %+v\n", v.Type().Field(i).Name, f)
	}
	return b.String()
}

func TestNotSupportedFieldsAreSkipped(t *testing.T) {
	t.Parallel()
	bare := &fakeDev{uuid: "GPU-bbbb", name: "Tesla T4", errs: allNotSupported()}
	lib := newFakeLib(h100(), bare)
	p, logs, _ := start(t, lib, Options{})
	s := waitFor(t, p, up)
	if len(s.GPUs) != 2 {
		t.Fatalf("GPUs = %d, want 2", len(s.GPUs))
	}
	if want := (GPU{Index: 1, UUID: "GPU-bbbb", Name: "Tesla T4",
		Instances: []Instance{{UUID: "GPU-bbbb", ProcessUtilization: StateNotSupported, GPM: StateNotSupported}}}); !reflect.DeepEqual(s.GPUs[1], want) {
		t.Errorf("GPU 1 =\n%s\nwant only its identity:\n%s", dump(s.GPUs[1]), dump(want))
	}
	if s.GPUs[0].TemperatureCelsius == nil {
		t.Error("GPU 0 lost its fields")
	}
	if w := logs.lines("level=WARN"); len(w) != 0 {
		t.Errorf("NotSupported logged warnings: %q", w)
	}
	// No NVLink on the bare GPU: one state query, then the walk stops.
	if n := lib.count("NVLinkErrors"); n == 0 {
		t.Error("the H100's NVLink counters were never read")
	}
}

func TestFailedFieldSkippedAndLoggedOnce(t *testing.T) {
	t.Parallel()
	d := h100()
	d.errs["PowerUsage"] = &Error{Code: 15, Text: "GPU is lost"}
	lib := newFakeLib(d)
	p, logs, _ := start(t, lib, Options{})
	waitFor(t, p, up)
	polls := lib.count("PowerUsage")
	for lib.count("PowerUsage") < polls+3 {
		time.Sleep(time.Millisecond)
	}
	s := p.Snapshot()
	if s.GPUs[0].PowerWatts != nil || s.GPUs[0].TemperatureCelsius == nil {
		t.Errorf("power = %v, temperature = %v: want only power skipped", s.GPUs[0].PowerWatts, s.GPUs[0].TemperatureCelsius)
	}
	if w := logs.lines("level=WARN", "field=power"); len(w) != 1 {
		t.Errorf("warnings for the failing field = %q, want exactly one", w)
	}
}

func TestNVMLAbsent(t *testing.T) {
	t.Parallel()
	lib := newFakeLib()
	lib.initErr = fmt.Errorf("%w (tried libnvidia-ml.so.1)", ErrLibraryNotFound)
	p, logs, stop := start(t, lib, Options{InitRetry: 2 * time.Millisecond})
	s := waitFor(t, p, func(s *Snapshot) bool { return s.Reason != "not polled yet" })
	if s.Up || len(s.GPUs) != 0 || !strings.Contains(s.Reason, "NVML library not found") {
		t.Errorf("snapshot = %+v, want Up=false, no GPUs, the reason", s)
	}
	for {
		if inits, _, _ := lib.stats(); inits >= 4 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	stop()
	if w := logs.lines("level=WARN"); len(w) != 1 || !strings.Contains(w[0], "NVML library not found") {
		t.Errorf("warnings = %q, want one line with the reason", w)
	}
	if _, shutdowns, _ := lib.stats(); shutdowns != 0 {
		t.Errorf("Shutdown called %d times on a library never initialised", shutdowns)
	}
	if c := lib.count("DeviceCount"); c != 0 {
		t.Errorf("DeviceCount called %d times without NVML", c)
	}
}

// TestInitRecovers: NVML appears later (the driver container started).
func TestInitRecovers(t *testing.T) {
	t.Parallel()
	lib := newFakeLib(h100())
	lib.initErr = errors.New("driver not loaded")
	p, logs, _ := start(t, lib, Options{})
	waitFor(t, p, func(s *Snapshot) bool { return strings.Contains(s.Reason, "driver not loaded") })
	lib.set(func() { lib.initErr = nil })
	s := waitFor(t, p, up)
	if len(s.GPUs) != 1 {
		t.Errorf("GPUs = %d after recovery, want 1", len(s.GPUs))
	}
	if len(logs.lines("level=INFO", "NVML initialised", "gpus=1")) != 1 {
		t.Errorf("no initialised line:\n%s", logs)
	}
}

func TestHungPoll(t *testing.T) {
	t.Parallel()
	lib := newFakeLib(h100())
	const timeout = 50 * time.Millisecond
	p, logs, _ := start(t, lib, Options{Interval: time.Millisecond, Timeout: timeout})
	waitFor(t, p, up)

	release := lib.hangOn("Temperature")
	<-lib.hung
	calls := lib.count("Temperature")
	hungAt := time.Now()
	s := waitFor(t, p, func(s *Snapshot) bool { return !s.Up })
	if d := time.Since(hungAt); d > time.Second {
		t.Errorf("Up turned false %v after the call hung, timeout %v", d, timeout)
	}
	if len(s.GPUs) != 0 || !strings.Contains(s.Reason, "poll did not return within") {
		t.Errorf("snapshot while hung = %+v", s)
	}
	// Many intervals pass: no other call starts while the stuck one runs.
	time.Sleep(20 * timeout)
	if got := lib.count("Temperature"); got != calls {
		t.Errorf("Temperature called %d times while stuck, want %d (no new poll)", got, calls)
	}
	if got := lib.count("PowerUsage"); got != calls-1 {
		t.Errorf("PowerUsage called %d times, want %d: the stuck poll went on, or another started", got, calls-1)
	}
	if p.Snapshot().Up {
		t.Error("Up turned true while the call is stuck")
	}
	if len(logs.lines("level=WARN", "did not return in time")) != 1 {
		t.Errorf("want one warning for the hang:\n%s", logs)
	}

	release()
	waitFor(t, p, up)
	if _, _, maxActive := lib.stats(); maxActive != 1 {
		t.Errorf("%d NVML calls ran at once, want 1", maxActive)
	}
	if len(logs.lines("stuck NVML call returned")) != 1 {
		t.Errorf("want one line for the return:\n%s", logs)
	}
}

func TestHungInit(t *testing.T) {
	t.Parallel()
	lib := newFakeLib(h100())
	release := lib.hangOn("Init")
	p, _, stop := start(t, lib, Options{InitTimeout: 20 * time.Millisecond})
	<-lib.hung
	s := waitFor(t, p, func(s *Snapshot) bool { return strings.Contains(s.Reason, "init did not return within") })
	if s.Up {
		t.Error("Up while init hangs")
	}
	time.Sleep(100 * time.Millisecond)
	if n := lib.count("Init"); n != 1 {
		t.Errorf("Init called %d times while the first is stuck, want 1", n)
	}
	release()
	waitFor(t, p, up)
	stop()
	if inits, shutdowns, maxActive := lib.stats(); inits != 1 || shutdowns != 1 || maxActive != 1 {
		t.Errorf("inits, shutdowns, max concurrent calls = %d, %d, %d; want 1, 1, 1", inits, shutdowns, maxActive)
	}
}

// TestStopWhileStuck: Run returns on cancel even with a call stuck forever.
func TestStopWhileStuck(t *testing.T) {
	t.Parallel()
	lib := newFakeLib(h100())
	p, _, stop := start(t, lib, Options{Timeout: 10 * time.Millisecond})
	waitFor(t, p, up)
	release := lib.hangOn("Memory")
	defer release()
	<-lib.hung
	waitFor(t, p, func(s *Snapshot) bool { return !s.Up })
	stop() // fails the test if Run does not return
	if _, shutdowns, _ := lib.stats(); shutdowns != 0 {
		t.Errorf("Shutdown ran %d times during a stuck call", shutdowns)
	}
	if s := p.Snapshot(); s.Up || s.Reason != "stopped" {
		t.Errorf("snapshot after Run = %+v", s)
	}
}

func TestShutdownOnStop(t *testing.T) {
	t.Parallel()
	lib := newFakeLib(h100())
	p, _, stop := start(t, lib, Options{})
	waitFor(t, p, up)
	stop()
	if _, shutdowns, _ := lib.stats(); shutdowns != 1 {
		t.Errorf("Shutdown ran %d times, want 1", shutdowns)
	}
	if n := lib.count("Free"); n != 1 {
		t.Errorf("event set freed %d times, want 1", n)
	}
}

func TestXIDEvents(t *testing.T) {
	t.Parallel()
	a := h100()
	b := &fakeDev{uuid: "GPU-bbbb", name: "NVIDIA A100", mig: true,
		migs: []MigDevice{{UUID: "MIG-1111", GPUInstanceID: 1}, {UUID: "MIG-2222", GPUInstanceID: 2}}, errs: map[string]error{}}
	c := &fakeDev{uuid: "GPU-cccc", name: "old", errs: map[string]error{"events": ErrNotSupported}}
	lib := newFakeLib(a, b, c)
	p, _, _ := start(t, lib, Options{})
	waitFor(t, p, up)
	lib.set(func() {
		lib.pending = []Event{
			{UUID: a.uuid, XID: 79}, {UUID: a.uuid, XID: 79}, {UUID: a.uuid, XID: 48},
			{UUID: "MIG-2222", XID: 31}, // a MIG device: counted on its GPU
			{UUID: "GPU-unknown", XID: 13},
		}
	})
	s := waitFor(t, p, func(s *Snapshot) bool { return len(s.GPUs) == 3 && s.GPUs[1].XIDErrors[31] == 1 })
	if got, want := s.GPUs[0].XIDErrors, map[uint64]uint64{79: 2, 48: 1}; !reflect.DeepEqual(got, want) {
		t.Errorf("GPU 0 XIDs = %v, want %v", got, want)
	}
	if s.GPUs[2].XIDErrors != nil {
		t.Errorf("GPU 2 (events not supported) XIDs = %v, want nil", s.GPUs[2].XIDErrors)
	}
	// Counts are cumulative and the published maps are copies.
	lib.set(func() { lib.pending = []Event{{UUID: a.uuid, XID: 48}} })
	s2 := waitFor(t, p, func(s *Snapshot) bool { return s.GPUs[0].XIDErrors[48] == 2 })
	if s.GPUs[0].XIDErrors[48] != 1 || s2.GPUs[0].XIDErrors[79] != 2 {
		t.Errorf("older snapshot changed (%v) or counts lost (%v)", s.GPUs[0].XIDErrors, s2.GPUs[0].XIDErrors)
	}
}

func TestEventsUnsupported(t *testing.T) {
	t.Parallel()
	lib := newFakeLib(h100())
	lib.eventsErr = ErrNotSupported
	p, logs, _ := start(t, lib, Options{})
	s := waitFor(t, p, up)
	if s.GPUs[0].XIDErrors != nil {
		t.Errorf("XIDs = %v without event support", s.GPUs[0].XIDErrors)
	}
	if w := logs.lines("level=WARN"); len(w) != 0 {
		t.Errorf("warnings = %q", w)
	}
}

func TestProcessesMIG(t *testing.T) {
	t.Parallel()
	d := &fakeDev{uuid: "GPU-mig", name: "NVIDIA A100", mig: true,
		migs: []MigDevice{{UUID: "MIG-1", GPUInstanceID: 1}, {UUID: "MIG-2", GPUInstanceID: 2}},
		procs: []ProcessInfo{
			{PID: 9, UsedBytes: 100, GPUInstanceID: 2},
			{PID: 5, UsedBytes: 10, GPUInstanceID: 1},
			{PID: 9, UsedBytes: 50, GPUInstanceID: 1},
			{PID: 9, UsedBytes: MemoryNotAvailable, GPUInstanceID: 1},
			{PID: 7, UsedBytes: 1, GPUInstanceID: 99}, // instance unknown to the inventory
		},
		errs: map[string]error{}}
	lib := newFakeLib(d)
	p, _, _ := start(t, lib, Options{})
	s := waitFor(t, p, up)
	g := s.GPUs[0]
	if g.MIGEnabled == nil || !*g.MIGEnabled || !reflect.DeepEqual(g.MIGDevices, d.migs) {
		t.Errorf("MIG = %v %v", g.MIGEnabled, g.MIGDevices)
	}
	want := []Process{
		{PID: 5, UsedBytes: 10, MemoryKnown: true, MIGUUIDs: []string{"MIG-1"}},
		{PID: 7, UsedBytes: 1, MemoryKnown: true},
		{PID: 9, UsedBytes: 150, MemoryKnown: true, MIGUUIDs: []string{"MIG-2", "MIG-1"}},
	}
	if !reflect.DeepEqual(g.Processes, want) {
		t.Errorf("processes = %+v, want %+v", g.Processes, want)
	}
}

func TestNoProcessesIsEmptyNotNil(t *testing.T) {
	t.Parallel()
	d := h100()
	d.procs = nil
	p, _, _ := start(t, newFakeLib(d), Options{})
	if s := waitFor(t, p, up); s.GPUs[0].Processes == nil {
		t.Error("Processes = nil for a GPU that supports the query and runs nothing")
	}
}

func TestDeviceSkippedWithoutHandle(t *testing.T) {
	t.Parallel()
	lib := newFakeLib(h100(), &fakeDev{uuid: "GPU-2", errs: map[string]error{}}, &fakeDev{uuid: "GPU-3", errs: map[string]error{"UUID": errors.New("boom")}})
	lib.devErr = map[int]error{1: errors.New("insufficient power")}
	p, _, _ := start(t, lib, Options{})
	s := waitFor(t, p, up)
	if len(s.GPUs) != 1 || s.GPUs[0].Index != 0 {
		t.Errorf("GPUs = %+v, want only GPU 0", s.GPUs)
	}
}

func TestThrottleFromReasons(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		bits uint64
		want Throttle
	}{
		{"none", 0, Throttle{}},
		{"idle", ReasonGPUIdle, Throttle{Idle: true}},
		{"sw power cap", ReasonSWPowerCap, Throttle{Power: true}},
		{"sw thermal", ReasonSWThermal, Throttle{Thermal: true}},
		{"hw thermal", ReasonHWSlowdown | ReasonHWThermal, Throttle{HWThermal: true}},
		{"power brake", ReasonHWSlowdown | ReasonHWPowerBrake, Throttle{HWPower: true}},
		{"hw slowdown alone", ReasonHWSlowdown, Throttle{HWPower: true}},
		{"both hw", ReasonHWSlowdown | ReasonHWThermal | ReasonHWPowerBrake, Throttle{HWThermal: true, HWPower: true}},
		{"sync boost", ReasonSyncBoost, Throttle{SyncBoost: true}},
		{"applications clocks only", 0x2, Throttle{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.want.Raw = tc.bits
			if got := ThrottleFromReasons(tc.bits); got != tc.want {
				t.Errorf("ThrottleFromReasons(%#x) = %+v, want %+v", tc.bits, got, tc.want)
			}
		})
	}
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	if _, err := New(Options{}); err == nil {
		t.Error("New without Lib succeeded")
	}
	if _, err := New(Options{Lib: newFakeLib(), Timeout: -time.Second}); err == nil || !strings.Contains(err.Error(), "Timeout") {
		t.Errorf("New with a negative timeout = %v", err)
	}
	p, err := New(Options{Lib: newFakeLib()})
	if err != nil {
		t.Fatal(err)
	}
	if s := p.Snapshot(); s == nil || s.Up || s.Reason == "" {
		t.Errorf("snapshot before Run = %+v, want Up=false with a reason", s)
	}
	if p.opts.Interval != DefaultInterval || p.opts.Timeout != DefaultTimeout || p.opts.InitRetry != DefaultInitRetry || p.opts.InitTimeout != DefaultInitTimeout {
		t.Errorf("defaults not applied: %+v", p.opts)
	}
}

func TestSearchPaths(t *testing.T) {
	t.Setenv(EnvLibrary, "")
	got := SearchPaths()
	if len(got) != 5 || got[0] != LibraryName {
		t.Fatalf("SearchPaths() = %q", got)
	}
	for _, want := range []string{"/run/nvidia/driver/usr/lib64/", "/home/kubernetes/bin/nvidia/lib64/", "/usr/local/nvidia/lib64/"} {
		found := false
		for _, p := range got {
			found = found || p == want+LibraryName
		}
		if !found {
			t.Errorf("SearchPaths() = %q, want %s", got, want+LibraryName)
		}
	}
	t.Setenv(EnvLibrary, "/opt/driver/libnvidia-ml.so.1")
	if got := SearchPaths(); !reflect.DeepEqual(got, []string{"/opt/driver/libnvidia-ml.so.1"}) {
		t.Errorf("SearchPaths() with %s = %q", EnvLibrary, got)
	}
}

// TestDriverGone: the driver is unloaded under a running poller (a GPU
// operator upgrade): Up turns false, NVML is shut down and initialised
// again once the driver is back.
func TestDriverGone(t *testing.T) {
	t.Parallel()
	d := h100()
	lib := newFakeLib(d)
	p, logs, _ := start(t, lib, Options{})
	waitFor(t, p, up)
	gone := fmt.Errorf("%w: Driver Not Loaded", ErrDriverGone)
	lib.set(func() {
		d.errs["Temperature"] = gone
		lib.initErr = gone
	})
	s := waitFor(t, p, func(s *Snapshot) bool { return !s.Up })
	if !strings.Contains(s.Reason, "Driver Not Loaded") || len(s.GPUs) != 0 {
		t.Errorf("snapshot = %+v", s)
	}
	lib.set(func() {
		delete(d.errs, "Temperature")
		lib.initErr = nil
	})
	waitFor(t, p, up)
	if inits, shutdowns, _ := lib.stats(); inits < 2 || shutdowns < 1 {
		t.Errorf("inits, shutdowns = %d, %d; want a shutdown and a new init", inits, shutdowns)
	}
	if w := logs.lines("level=WARN", "field="); len(w) != 0 {
		t.Errorf("a gone driver logged field warnings: %q", w)
	}
}

// TestStopWhileShutdownHangs: a cancel during a poll waits for it, and a
// hung nvmlShutdown does not keep Run from returning.
func TestStopWhileShutdownHangs(t *testing.T) {
	t.Parallel()
	lib := newFakeLib(h100())
	p, _, stop := start(t, lib, Options{Timeout: 20 * time.Millisecond})
	waitFor(t, p, up)
	release := lib.hangOn("Shutdown")
	defer release()
	stop()     // fails the test if Run does not return
	<-lib.hung // Shutdown was called (and hangs)
	if n := lib.count("Shutdown"); n != 1 {
		t.Errorf("Shutdown called %d times, want 1", n)
	}
}
