//go:build cgo && linux

package nvml

import (
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// symbols are the NVML entry points the real Library calls beyond
// initialisation. go-nvml binds them lazily: calling one the loaded library
// does not export would end the process in the dynamic loader, so each
// method first checks that its symbol exists and reports ErrNotSupported
// otherwise (an older driver).
var symbols = []string{
	"nvmlSystemGetDriverVersion",
	"nvmlDeviceGetUUID",
	"nvmlDeviceGetName",
	"nvmlDeviceGetMinorNumber",
	"nvmlDeviceGetMigMode",
	"nvmlDeviceGetMaxMigDeviceCount",
	"nvmlDeviceGetMigDeviceHandleByIndex",
	"nvmlDeviceGetGpuInstanceId",
	"nvmlDeviceGetTemperatureV",
	"nvmlDeviceGetTemperature",
	"nvmlDeviceGetPowerUsage",
	"nvmlDeviceGetClockInfo",
	"nvmlDeviceGetUtilizationRates",
	"nvmlDeviceGetMemoryInfo",
	"nvmlDeviceGetTotalEccErrors",
	"nvmlDeviceGetCurrentClocksEventReasons",
	"nvmlDeviceGetCurrentClocksThrottleReasons",
	"nvmlDeviceGetComputeRunningProcesses",
	"nvmlDeviceGetPcieThroughput",
	"nvmlDeviceGetNvLinkState",
	"nvmlDeviceGetNvLinkErrorCounter",
	"nvmlEventSetCreate",
	"nvmlEventSetFree",
	"nvmlEventSetWait_v2",
	"nvmlEventSetWait",
	"nvmlDeviceGetSupportedEventTypes",
	"nvmlDeviceRegisterEvents",
	"nvmlDeviceGetPciInfo_v3",
	"nvmlDeviceGetPciInfo_v2",
	"nvmlDeviceGetPciInfo",
	"nvmlDeviceGetProcessUtilization",
	"nvmlGpmQueryDeviceSupport",
	"nvmlGpmSampleAlloc",
	"nvmlGpmSampleFree",
	"nvmlGpmSampleGet",
	"nvmlGpmMigSampleGet",
	"nvmlGpmMetricsGet",
}

// library is the real Library: go-nvml over a dlopen'ed libnvidia-ml.so.1.
type library struct {
	lib  nvml.Interface // nil until a library file was loaded
	path string
	has  map[string]bool // symbols the loaded library exports
}

// NewLibrary returns the real NVML library. Nothing is loaded until Init,
// which tries SearchPaths in order.
func NewLibrary() Library { return &library{} }

// Path is the library file loaded; empty before.
func (l *library) Path() string { return l.path }

// Init loads the first library of SearchPaths that exists and initialises
// NVML. Once a file is loaded the search stops for good: go-nvml binds
// symbols process-wide, so a failing nvmlInit (driver not loaded, version
// mismatch) is retried on the same file, never by loading a second one.
func (l *library) Init() error {
	if l.lib == nil {
		var tried []string
		for _, path := range SearchPaths() {
			lib := nvml.New(nvml.WithLibraryPath(path))
			ret := lib.Init()
			if ret == nvml.ERROR_LIBRARY_NOT_FOUND {
				tried = append(tried, path)
				continue
			}
			l.lib, l.path = lib, path
			l.lookupSymbols()
			if err := check(ret); err != nil {
				return fmt.Errorf("nvmlInit (%s): %w", path, err)
			}
			return nil
		}
		return fmt.Errorf("%w (tried %s)", ErrLibraryNotFound, strings.Join(tried, ", "))
	}
	if err := check(l.lib.Init()); err != nil {
		return fmt.Errorf("nvmlInit (%s): %w", l.path, err)
	}
	return nil
}

func (l *library) lookupSymbols() {
	l.has = make(map[string]bool, len(symbols))
	ext := l.lib.Extensions()
	for _, s := range symbols {
		l.has[s] = ext.LookupSymbol(s) == nil
	}
}

func (l *library) Shutdown() error {
	if l.lib == nil {
		return nil
	}
	return check(l.lib.Shutdown())
}

func (l *library) DriverVersion() (string, error) {
	if !l.has["nvmlSystemGetDriverVersion"] {
		return "", ErrNotSupported
	}
	v, ret := l.lib.SystemGetDriverVersion()
	return v, check(ret)
}

func (l *library) DeviceCount() (int, error) {
	n, ret := l.lib.DeviceGetCount()
	return n, check(ret)
}

func (l *library) Device(index int) (Device, error) {
	h, ret := l.lib.DeviceGetHandleByIndex(index)
	if err := check(ret); err != nil {
		return nil, err
	}
	return &realDevice{h: h, has: l.has, lib: l.lib}, nil
}

func (l *library) NewEventSet() (EventSet, error) {
	for _, s := range []string{"nvmlEventSetCreate", "nvmlEventSetFree", "nvmlDeviceGetSupportedEventTypes", "nvmlDeviceRegisterEvents"} {
		if !l.has[s] {
			return nil, ErrNotSupported
		}
	}
	// go-nvml waits with _v2 where the library has it, else the first
	// version: either will do (nvml.h defines the name as _v2).
	if !l.has["nvmlEventSetWait_v2"] && !l.has["nvmlEventSetWait"] {
		return nil, ErrNotSupported
	}
	set, ret := l.lib.EventSetCreate()
	if err := check(ret); err != nil {
		return nil, err
	}
	return &realEventSet{set: set}, nil
}

// realDevice is a GPU handle.
type realDevice struct {
	h   nvml.Device
	has map[string]bool
	lib nvml.Interface // for GPM sample allocation
}

// need reports ErrNotSupported unless the library exports sym.
func (d *realDevice) need(sym string) error {
	if !d.has[sym] {
		return ErrNotSupported
	}
	return nil
}

func (d *realDevice) UUID() (string, error) {
	if err := d.need("nvmlDeviceGetUUID"); err != nil {
		return "", err
	}
	v, ret := d.h.GetUUID()
	return v, check(ret)
}

func (d *realDevice) Name() (string, error) {
	if err := d.need("nvmlDeviceGetName"); err != nil {
		return "", err
	}
	v, ret := d.h.GetName()
	return v, check(ret)
}

func (d *realDevice) MinorNumber() (int, error) {
	if err := d.need("nvmlDeviceGetMinorNumber"); err != nil {
		return 0, err
	}
	v, ret := d.h.GetMinorNumber()
	return v, check(ret)
}

func (d *realDevice) MigMode() (bool, error) {
	if err := d.need("nvmlDeviceGetMigMode"); err != nil {
		return false, err
	}
	current, _, ret := d.h.GetMigMode()
	return current == nvml.DEVICE_MIG_ENABLE, check(ret)
}

func (d *realDevice) MigDevices() ([]MigDevice, error) {
	for _, s := range []string{"nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceGetUUID"} {
		if err := d.need(s); err != nil {
			return nil, err
		}
	}
	n, ret := d.h.GetMaxMigDeviceCount()
	if err := check(ret); err != nil {
		return nil, err
	}
	var out []MigDevice
	for i := range n {
		m, ret := d.h.GetMigDeviceHandleByIndex(i)
		if ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue // empty slot
		}
		if err := check(ret); err != nil {
			return nil, err
		}
		uuid, ret := m.GetUUID()
		if err := check(ret); err != nil {
			return nil, err
		}
		gi := NoInstance
		if d.has["nvmlDeviceGetGpuInstanceId"] {
			if id, ret := m.GetGpuInstanceId(); ret == nvml.SUCCESS {
				gi = uint32(id)
			}
		}
		out = append(out, MigDevice{UUID: uuid, GPUInstanceID: gi, h: &realDevice{h: m, has: d.has, lib: d.lib}})
	}
	return out, nil
}

func (d *realDevice) Temperature() (int, error) {
	switch {
	case d.has["nvmlDeviceGetTemperatureV"]: // nvmlDeviceGetTemperature is deprecated in NVML 13
		t, ret := d.h.GetTemperatureV().V1() // sensor 0: NVML_TEMPERATURE_GPU
		return int(t.Temperature), check(ret)
	case d.has["nvmlDeviceGetTemperature"]:
		v, ret := d.h.GetTemperature(nvml.TEMPERATURE_GPU)
		return int(v), check(ret)
	}
	return 0, ErrNotSupported
}

func (d *realDevice) PowerUsage() (uint32, error) {
	if err := d.need("nvmlDeviceGetPowerUsage"); err != nil {
		return 0, err
	}
	v, ret := d.h.GetPowerUsage()
	return v, check(ret)
}

func (d *realDevice) ClockInfo(c Clock) (uint32, error) {
	if err := d.need("nvmlDeviceGetClockInfo"); err != nil {
		return 0, err
	}
	t := nvml.CLOCK_SM
	if c == ClockMem {
		t = nvml.CLOCK_MEM
	}
	v, ret := d.h.GetClockInfo(t)
	return v, check(ret)
}

func (d *realDevice) Utilization() (uint32, uint32, error) {
	if err := d.need("nvmlDeviceGetUtilizationRates"); err != nil {
		return 0, 0, err
	}
	u, ret := d.h.GetUtilizationRates()
	return u.Gpu, u.Memory, check(ret)
}

func (d *realDevice) Memory() (Memory, error) {
	if err := d.need("nvmlDeviceGetMemoryInfo"); err != nil {
		return Memory{}, err
	}
	m, ret := d.h.GetMemoryInfo()
	return Memory{Total: m.Total, Free: m.Free, Used: m.Used}, check(ret)
}

func (d *realDevice) ECCErrors(t ECCErrorType) (uint64, error) {
	if err := d.need("nvmlDeviceGetTotalEccErrors"); err != nil {
		return 0, err
	}
	mt := nvml.MEMORY_ERROR_TYPE_CORRECTED
	if t == ECCUncorrected {
		mt = nvml.MEMORY_ERROR_TYPE_UNCORRECTED
	}
	v, ret := d.h.GetTotalEccErrors(mt, nvml.VOLATILE_ECC)
	return v, check(ret)
}

func (d *realDevice) ClockEventReasons() (uint64, error) {
	switch {
	case d.has["nvmlDeviceGetCurrentClocksEventReasons"]: // driver 535 and later
		v, ret := d.h.GetCurrentClocksEventReasons()
		return v, check(ret)
	case d.has["nvmlDeviceGetCurrentClocksThrottleReasons"]:
		v, ret := d.h.GetCurrentClocksThrottleReasons()
		return v, check(ret)
	}
	return 0, ErrNotSupported
}

func (d *realDevice) ComputeProcesses() ([]ProcessInfo, error) {
	if err := d.need("nvmlDeviceGetComputeRunningProcesses"); err != nil {
		return nil, err
	}
	infos, ret := d.h.GetComputeRunningProcesses()
	if err := check(ret); err != nil {
		return nil, err
	}
	out := make([]ProcessInfo, len(infos))
	for i, in := range infos {
		out[i] = ProcessInfo{PID: in.Pid, UsedBytes: in.UsedGpuMemory, GPUInstanceID: in.GpuInstanceId}
	}
	return out, nil
}

func (d *realDevice) PCIeThroughput(c PCIeCounter) (uint32, error) {
	if err := d.need("nvmlDeviceGetPcieThroughput"); err != nil {
		return 0, err
	}
	t := nvml.PCIE_UTIL_TX_BYTES
	if c == PCIeRX {
		t = nvml.PCIE_UTIL_RX_BYTES
	}
	v, ret := d.h.GetPcieThroughput(t)
	return v, check(ret)
}

func (d *realDevice) NVLinkActive(link int) (bool, error) {
	if err := d.need("nvmlDeviceGetNvLinkState"); err != nil {
		return false, err
	}
	s, ret := d.h.GetNvLinkState(link)
	return s == nvml.FEATURE_ENABLED, check(ret)
}

func (d *realDevice) NVLinkErrors(link int, c NVLinkCounter) (uint64, error) {
	if err := d.need("nvmlDeviceGetNvLinkErrorCounter"); err != nil {
		return 0, err
	}
	var t nvml.NvLinkErrorCounter
	switch c {
	case NVLinkReplay:
		t = nvml.NVLINK_ERROR_DL_REPLAY
	case NVLinkRecovery:
		t = nvml.NVLINK_ERROR_DL_RECOVERY
	case NVLinkCRCFlit:
		t = nvml.NVLINK_ERROR_DL_CRC_FLIT
	case NVLinkCRCData:
		t = nvml.NVLINK_ERROR_DL_CRC_DATA
	default:
		return 0, fmt.Errorf("NVLink counter %d: %w", c, ErrNotSupported)
	}
	v, ret := d.h.GetNvLinkErrorCounter(link, t)
	return v, check(ret)
}

func (d *realDevice) PCIBusID() (string, error) {
	if !d.has["nvmlDeviceGetPciInfo_v3"] && !d.has["nvmlDeviceGetPciInfo_v2"] && !d.has["nvmlDeviceGetPciInfo"] {
		return "", ErrNotSupported
	}
	pci, ret := d.h.GetPciInfo()
	if err := check(ret); err != nil {
		return "", err
	}
	b := make([]byte, 0, len(pci.BusId))
	for _, c := range pci.BusId {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b), nil
}

func (d *realDevice) ProcessUtilization(lastSeen uint64) ([]ProcessSample, error) {
	if err := d.need("nvmlDeviceGetProcessUtilization"); err != nil {
		return nil, err
	}
	samples, ret := d.h.GetProcessUtilization(lastSeen)
	if ret == nvml.ERROR_INSUFFICIENT_SIZE && len(samples) == 0 {
		return nil, ErrNotFound // go-nvml's answer when the count was 0
	}
	if err := check(ret); err != nil {
		return nil, err
	}
	out := make([]ProcessSample, len(samples))
	for i, s := range samples {
		out[i] = ProcessSample{PID: s.Pid, TimeStamp: s.TimeStamp, SM: s.SmUtil, Memory: s.MemUtil, Encoder: s.EncUtil, Decoder: s.DecUtil}
	}
	return out, nil
}

func (d *realDevice) GPMSupported() (bool, error) {
	if err := d.need("nvmlGpmQueryDeviceSupport"); err != nil {
		return false, err
	}
	s, ret := d.h.GpmQueryDeviceSupport()
	return s.IsSupportedDevice != 0, check(ret)
}

// realGPMSample is an allocated GPM sample.
type realGPMSample struct{ s nvml.GpmSample }

func (s *realGPMSample) Free() error { return check(s.s.Free()) }

func (d *realDevice) GPMSample(gi uint32) (GPMSample, error) {
	for _, sym := range []string{"nvmlGpmSampleAlloc", "nvmlGpmSampleFree", "nvmlGpmSampleGet", "nvmlGpmMigSampleGet"} {
		if err := d.need(sym); err != nil {
			return nil, err
		}
	}
	s, ret := d.lib.GpmSampleAlloc()
	if err := check(ret); err != nil {
		return nil, err
	}
	if gi == NoInstance {
		ret = s.Get(d.h)
	} else {
		ret = s.MigGet(d.h, int(gi))
	}
	if err := check(ret); err != nil {
		_ = s.Free()
		return nil, err
	}
	return &realGPMSample{s: s}, nil
}

func (l *library) GPMMetrics(a, b GPMSample, ids []GPMMetric) (map[GPMMetric]float64, error) {
	if !l.has["nvmlGpmMetricsGet"] {
		return nil, ErrNotSupported
	}
	sa, oka := a.(*realGPMSample)
	sb, okb := b.(*realGPMSample)
	if !oka || !okb {
		return nil, fmt.Errorf("GPM samples %T, %T: %w", a, b, ErrNotSupported)
	}
	if len(ids) > len(nvml.GpmMetricsGetType{}.Metrics) {
		return nil, fmt.Errorf("%d GPM metrics: more than NVML_GPM_METRIC_MAX", len(ids))
	}
	get := &nvml.GpmMetricsGetType{NumMetrics: uint32(len(ids)), Sample1: sa.s, Sample2: sb.s}
	for i, id := range ids {
		get.Metrics[i].MetricId = uint32(id)
	}
	if err := check(l.lib.GpmMetricsGet(get)); err != nil {
		return nil, err
	}
	out := make(map[GPMMetric]float64, len(ids))
	for i, id := range ids {
		if nvml.Return(get.Metrics[i].NvmlReturn) == nvml.SUCCESS {
			out[id] = get.Metrics[i].Value
		}
	}
	return out, nil
}

// realEventSet is an NVML event set of XID critical errors.
type realEventSet struct{ set nvml.EventSet }

func (s *realEventSet) Register(dev Device) error {
	d, ok := dev.(*realDevice)
	if !ok {
		return fmt.Errorf("register %T: %w", dev, ErrNotSupported)
	}
	supported, ret := d.h.GetSupportedEventTypes()
	if err := check(ret); err != nil {
		return err
	}
	if supported&nvml.EventTypeXidCriticalError == 0 {
		return ErrNotSupported
	}
	return check(d.h.RegisterEvents(nvml.EventTypeXidCriticalError, s.set))
}

func (s *realEventSet) Poll() (Event, error) {
	data, ret := s.set.Wait(0)
	if ret == nvml.ERROR_TIMEOUT {
		return Event{}, ErrNoEvent
	}
	if err := check(ret); err != nil {
		return Event{}, err
	}
	ev := Event{XID: data.EventData}
	if data.Device != nil {
		if uuid, ret := data.Device.GetUUID(); ret == nvml.SUCCESS {
			ev.UUID = uuid
		}
	}
	return ev, nil
}

func (s *realEventSet) Free() error { return check(s.set.Free()) }

// check maps an nvmlReturn_t to nil, a sentinel or an *Error.
func check(r nvml.Return) error {
	switch r {
	case nvml.SUCCESS:
		return nil
	case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_FUNCTION_NOT_FOUND:
		return ErrNotSupported
	case nvml.ERROR_NOT_FOUND:
		return ErrNotFound
	case nvml.ERROR_IN_USE:
		return fmt.Errorf("%w (nvmlReturn_t %d)", ErrInUse, int(r))
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return ErrLibraryNotFound
	case nvml.ERROR_UNINITIALIZED, nvml.ERROR_DRIVER_NOT_LOADED:
		return fmt.Errorf("%w: %s (nvmlReturn_t %d)", ErrDriverGone, r.Error(), int(r))
	}
	return &Error{Code: int(r), Text: r.Error()}
}
