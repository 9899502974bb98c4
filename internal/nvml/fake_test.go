package nvml

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"sync"
)

// fakeLib is a Library in memory. Every call is counted; calls can be made
// to block (a hung driver) and the number of calls running at once is
// recorded.
type fakeLib struct {
	mu        sync.Mutex
	initErr   error
	inits     int
	shutdowns int
	driver    string
	devs      []*fakeDev
	devErr    map[int]error // Device(i) fails
	eventsErr error         // NewEventSet fails
	pending   []Event       // XID events waiting
	// hang, when set, blocks the call named by hangAt until closed.
	hang   chan struct{}
	hangAt string
	hung   chan string // receives hangAt when a call starts blocking

	calls     map[string]int
	active    int
	maxActive int
}

func newFakeLib(devs ...*fakeDev) *fakeLib {
	l := &fakeLib{driver: "580.65.06", devs: devs, calls: map[string]int{}, hung: make(chan string, 16)}
	for _, d := range devs {
		d.lib = l
	}
	return l
}

// call records a call and blocks it if it is the one to hang.
func (l *fakeLib) call(name string) func() {
	l.mu.Lock()
	l.calls[name]++
	l.active++
	l.maxActive = max(l.maxActive, l.active)
	hang := l.hang
	if l.hangAt != name {
		hang = nil
	}
	l.mu.Unlock()
	if hang != nil {
		l.hung <- name
		<-hang
	}
	return func() {
		l.mu.Lock()
		l.active--
		l.mu.Unlock()
	}
}

// hangOn makes the next calls of name block until the returned release
// function runs.
func (l *fakeLib) hangOn(name string) (release func()) {
	ch := make(chan struct{})
	l.mu.Lock()
	l.hang, l.hangAt = ch, name
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		l.hang, l.hangAt = nil, ""
		l.mu.Unlock()
		close(ch)
	}
}

func (l *fakeLib) count(name string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.calls[name]
}

func (l *fakeLib) stats() (inits, shutdowns, maxActive int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.inits, l.shutdowns, l.maxActive
}

func (l *fakeLib) set(f func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f()
}

func (l *fakeLib) Init() error {
	defer l.call("Init")()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inits++
	return l.initErr
}

func (l *fakeLib) Shutdown() error {
	defer l.call("Shutdown")()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.shutdowns++
	return nil
}

func (l *fakeLib) Path() string { return "/fake/" + LibraryName }

func (l *fakeLib) DriverVersion() (string, error) {
	defer l.call("DriverVersion")()
	return l.driver, nil
}

func (l *fakeLib) DeviceCount() (int, error) {
	defer l.call("DeviceCount")()
	return len(l.devs), nil
}

func (l *fakeLib) Device(i int) (Device, error) {
	defer l.call("Device")()
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.devErr[i]; err != nil {
		return nil, err
	}
	return l.devs[i], nil
}

func (l *fakeLib) NewEventSet() (EventSet, error) {
	defer l.call("NewEventSet")()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.eventsErr != nil {
		return nil, l.eventsErr
	}
	return &fakeEvents{lib: l}, nil
}

type fakeEvents struct {
	lib   *fakeLib
	freed bool
}

func (e *fakeEvents) Register(d Device) error {
	defer e.lib.call("Register")()
	return d.(*fakeDev).errs["events"]
}

func (e *fakeEvents) Poll() (Event, error) {
	defer e.lib.call("Poll")()
	e.lib.mu.Lock()
	defer e.lib.mu.Unlock()
	if len(e.lib.pending) == 0 {
		return Event{}, ErrNoEvent
	}
	ev := e.lib.pending[0]
	e.lib.pending = e.lib.pending[1:]
	return ev, nil
}

func (e *fakeEvents) Free() error {
	defer e.lib.call("Free")()
	e.freed = true
	return nil
}

type fakeLink struct {
	active   bool
	err      error // of the state query
	counters [4]uint64
}

// fakeDev is one GPU in NVML's units. errs maps a method name (or
// "events", "ClockInfo/mem", "ECCErrors/uncorrected", "PCIeThroughput/rx")
// to the error it returns.
type fakeDev struct {
	lib        *fakeLib
	uuid, name string
	minor      *int // nil: not supported
	mig        bool
	migs       []MigDevice
	temp       int
	powerMW    uint32
	smMHz      uint32
	memMHz     uint32
	utilGPU    uint32
	utilMem    uint32
	mem        Memory
	eccCorr    uint64
	eccUncorr  uint64
	reasons    uint64
	procs      []ProcessInfo
	txKBs      uint32
	rxKBs      uint32
	links      []fakeLink
	errs       map[string]error
}

func (d *fakeDev) err(name string) error {
	d.lib.mu.Lock()
	defer d.lib.mu.Unlock()
	return d.errs[name]
}

func (d *fakeDev) UUID() (string, error) {
	defer d.lib.call("UUID")()
	return d.uuid, d.err("UUID")
}

func (d *fakeDev) Name() (string, error) {
	defer d.lib.call("Name")()
	return d.name, d.err("Name")
}

func (d *fakeDev) MinorNumber() (int, error) {
	defer d.lib.call("MinorNumber")()
	if d.minor == nil {
		return 0, ErrNotSupported
	}
	return *d.minor, d.err("MinorNumber")
}

func (d *fakeDev) MigMode() (bool, error) {
	defer d.lib.call("MigMode")()
	return d.mig, d.err("MigMode")
}

func (d *fakeDev) MigDevices() ([]MigDevice, error) {
	defer d.lib.call("MigDevices")()
	return d.migs, d.err("MigDevices")
}

func (d *fakeDev) Temperature() (int, error) {
	defer d.lib.call("Temperature")()
	d.lib.mu.Lock()
	defer d.lib.mu.Unlock()
	return d.temp, d.errs["Temperature"]
}

func (d *fakeDev) PowerUsage() (uint32, error) {
	defer d.lib.call("PowerUsage")()
	return d.powerMW, d.err("PowerUsage")
}

func (d *fakeDev) ClockInfo(c Clock) (uint32, error) {
	defer d.lib.call("ClockInfo")()
	if c == ClockMem {
		return d.memMHz, d.err("ClockInfo/mem")
	}
	return d.smMHz, d.err("ClockInfo/sm")
}

func (d *fakeDev) Utilization() (uint32, uint32, error) {
	defer d.lib.call("Utilization")()
	return d.utilGPU, d.utilMem, d.err("Utilization")
}

func (d *fakeDev) Memory() (Memory, error) {
	defer d.lib.call("Memory")()
	return d.mem, d.err("Memory")
}

func (d *fakeDev) ECCErrors(t ECCErrorType) (uint64, error) {
	defer d.lib.call("ECCErrors")()
	if t == ECCUncorrected {
		return d.eccUncorr, d.err("ECCErrors/uncorrected")
	}
	return d.eccCorr, d.err("ECCErrors/corrected")
}

func (d *fakeDev) ClockEventReasons() (uint64, error) {
	defer d.lib.call("ClockEventReasons")()
	return d.reasons, d.err("ClockEventReasons")
}

func (d *fakeDev) ComputeProcesses() ([]ProcessInfo, error) {
	defer d.lib.call("ComputeProcesses")()
	return d.procs, d.err("ComputeProcesses")
}

func (d *fakeDev) PCIeThroughput(c PCIeCounter) (uint32, error) {
	defer d.lib.call("PCIeThroughput")()
	if c == PCIeRX {
		return d.rxKBs, d.err("PCIeThroughput/rx")
	}
	return d.txKBs, d.err("PCIeThroughput/tx")
}

func (d *fakeDev) NVLinkActive(link int) (bool, error) {
	defer d.lib.call("NVLinkActive")()
	if err := d.err("NVLinkActive"); err != nil {
		return false, err
	}
	if link >= len(d.links) {
		return false, fmt.Errorf("link %d: invalid argument", link)
	}
	return d.links[link].active, d.links[link].err
}

func (d *fakeDev) NVLinkErrors(link int, c NVLinkCounter) (uint64, error) {
	defer d.lib.call("NVLinkErrors")()
	return d.links[link].counters[c], d.err("NVLinkErrors")
}

// allNotSupported returns errs that make every optional query of a
// device NotSupported.
func allNotSupported() map[string]error {
	m := map[string]error{}
	for _, k := range []string{"MigMode", "MigDevices", "Temperature", "PowerUsage", "ClockInfo/sm", "ClockInfo/mem",
		"Utilization", "Memory", "ECCErrors/corrected", "ECCErrors/uncorrected", "ClockEventReasons", "ComputeProcesses",
		"PCIeThroughput/tx", "PCIeThroughput/rx", "NVLinkActive", "NVLinkErrors", "events"} {
		m[k] = ErrNotSupported
	}
	return m
}

// logBuffer is a goroutine-safe log sink.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// lines returns the log lines containing every substring.
func (l *logBuffer) lines(subs ...string) []string {
	var out []string
	for _, line := range strings.Split(l.String(), "\n") {
		ok := line != ""
		for _, s := range subs {
			ok = ok && strings.Contains(line, s)
		}
		if ok {
			out = append(out, line)
		}
	}
	return out
}

func (l *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func (d *fakeDev) PCIBusID() (string, error) { return "", ErrNotSupported }

func (d *fakeDev) ProcessUtilization(uint64) ([]ProcessSample, error) { return nil, ErrNotSupported }

func (d *fakeDev) GPMSupported() (bool, error) { return false, ErrNotSupported }

func (d *fakeDev) GPMSample(uint32) (GPMSample, error) { return nil, ErrNotSupported }

func (l *fakeLib) GPMMetrics(GPMSample, GPMSample, []GPMMetric) (map[GPMMetric]float64, error) {
	return nil, ErrNotSupported
}
