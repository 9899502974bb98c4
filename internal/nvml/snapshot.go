package nvml

import (
	"time"

	"github.com/profi-dev/profi/internal/status"
)

// Snapshot is the result of one NVML poll. It is immutable once published:
// readers share it and never copy it.
type Snapshot struct {
	// Up: NVML is initialised and the last poll finished within its
	// timeout. When false, Reason says why and GPUs is empty.
	Up     bool
	Reason string
	// Time is when the poll started; PollDuration how long it took.
	Time         time.Time
	PollDuration time.Duration
	// Library is the file loaded, when the Library can tell.
	Library       string
	DriverVersion string
	// LastError is the last failed query of this poll ("" when none), for
	// /status; the field it concerns is skipped.
	LastError string
	// GPUs in NVML index order.
	GPUs []GPU
}

// GPU is one device's state. A nil pointer, or a nil slice or map, is a
// field NVML does not support on this device (or whose query failed); it is
// skipped, never exported as 0.
type GPU struct {
	Index int    // NVML index
	UUID  string // GPU-…
	Name  string // product name
	// Minor is N of the GPU's device file /dev/nvidiaN
	// (nvmlDeviceGetMinorNumber); nil when unknown.
	Minor *int

	MIGEnabled *bool
	MIGDevices []MigDevice // when MIG is enabled

	TemperatureCelsius *float64
	PowerWatts         *float64
	SMClockMHz         *float64
	MemClockMHz        *float64
	// Utilization ratios, 0-1: the share of the last sample period in which
	// a kernel ran (GPU) or device memory was read or written (memory).
	GPUUtilization    *float64
	MemoryUtilization *float64
	Memory            *Memory
	// Volatile ECC error totals (since the driver loaded), all locations.
	ECCCorrected   *uint64
	ECCUncorrected *uint64
	Throttle       *Throttle
	// Processes using the GPU for compute, by host PID (one entry per PID,
	// sorted; memory of MIG instances summed). nil: not supported.
	Processes []Process
	// PCIe throughput, bytes per second.
	PCIeTXBytesPerSecond *float64
	PCIeRXBytesPerSecond *float64
	// NVLinkErrors are data-link error counters summed over the active
	// links, by counter; nil without NVLink (or without support).
	NVLinkErrors map[NVLinkCounter]uint64
	// XIDErrors counts XID critical error events by XID since the agent
	// started; nil when events are not supported.
	XIDErrors map[uint64]uint64

	// PCIBusID is NVML's bus id ("00000000:3B:00.0"); "" when unknown.
	PCIBusID string
	// Instances are the sources of per-process utilization and GPM: the
	// GPU itself, then its MIG devices, each with its state.
	Instances []Instance
	// ProcessUtilization is, per device (the GPU or a MIG device) and PID,
	// the mean of the driver's samples newer than the previous poll's.
	// Sorted by UUID, then PID. A process without a sample in that window
	// is absent (the driver sampled no activity of it).
	ProcessUtilization []ProcessUtilization
	// ProcessBusy are the processes' busy time per engine on the GPU and
	// each MIG device since the agent started (busy.go), by UUID then
	// PID: cumulative, kept 10 minutes after a process's last sample.
	ProcessBusy []ProcessBusy
	// GPM holds the last GPM values per device (GPU or MIG instance).
	GPM []GPMValues
}

// Instance is the GPU or one of its MIG devices, as a source of
// per-process utilization and GPM.
type Instance struct {
	UUID string // GPU-… or MIG-…
	// ProcessUtilization and GPM are StateOK or why nothing is reported.
	ProcessUtilization string
	GPM                string
}

// States of Instance (and /status).
const (
	StateOK           = "ok"
	StateOff          = "off"                      // --gpm=off
	StateNotSupported = "not supported"            // NVML_ERROR_NOT_SUPPORTED or no such entry point
	StateWarmingUp    = "waiting for a 2nd sample" // GPM needs two samples
	// StateHeld: GPM's counters are held by another client (NVML_ERROR_IN_USE),
	// typically DCGM's profiling module; its values would be wrong.
	StateHeld = "held by another client (NVML_ERROR_IN_USE; DCGM profiling?)"
)

// ProcessUtilization is one process's utilization on one device, 0-1.
type ProcessUtilization struct {
	UUID    string // GPU-… or MIG-…
	PID     uint32
	SM      float64
	Memory  float64
	Encoder float64
	Decoder float64
	Samples int // driver samples averaged
}

// GPMValues are the GPM metrics of one device over the last GPM interval,
// in NVML's units (percent, MiB/s); a metric NVML did not return is
// absent.
type GPMValues struct {
	UUID   string
	Values map[GPMMetric]float64
}

// Throttle are the clock event reasons active right now.
type Throttle struct {
	Idle      bool // nothing runs (GpuIdle)
	Power     bool // software power cap (SwPowerCap)
	Thermal   bool // software thermal slowdown (SwThermalSlowdown)
	HWThermal bool // hardware thermal slowdown (HwThermalSlowdown)
	// HWPower: hardware power brake (HwPowerBrakeSlowdown), or a hardware
	// slowdown (HwSlowdown) that the thermal bit does not explain.
	HWPower   bool
	SyncBoost bool   // clocks held to the slowest GPU of a sync-boost group
	Raw       uint64 // every bit NVML reported
}

// ThrottleFromReasons maps nvmlDeviceGetCurrentClocksEventReasons bits.
func ThrottleFromReasons(bits uint64) Throttle {
	has := func(b uint64) bool { return bits&b != 0 }
	return Throttle{
		Idle:      has(ReasonGPUIdle),
		Power:     has(ReasonSWPowerCap),
		Thermal:   has(ReasonSWThermal),
		HWThermal: has(ReasonHWThermal),
		HWPower:   has(ReasonHWPowerBrake) || (has(ReasonHWSlowdown) && !has(ReasonHWThermal)),
		SyncBoost: has(ReasonSyncBoost),
		Raw:       bits,
	}
}

// Process is one host process using a GPU.
type Process struct {
	PID uint32
	// UsedBytes is its device memory; valid only when MemoryKnown.
	UsedBytes   uint64
	MemoryKnown bool
	// MIGUUIDs are the MIG devices it runs on, when the GPU is in MIG mode
	// and NVML names the instance.
	MIGUUIDs []string
}

// Status is the GPU poller's state for /status.
type Status = status.NVML

// Status summarises the snapshot for /status; nil counts as not polled.
func (s *Snapshot) Status() Status {
	if s == nil {
		return Status{Reason: "not polled yet"}
	}
	st := Status{
		Up: s.Up, Reason: s.Reason, Library: s.Library, DriverVersion: s.DriverVersion,
		DeviceCount: len(s.GPUs), LastError: s.LastError, LastPoll: s.Time,
	}
	for _, g := range s.GPUs {
		for _, in := range g.Instances {
			st.Devices = append(st.Devices, status.NVMLDevice{
				GPU: g.Index, UUID: in.UUID, PCIBusID: g.PCIBusID,
				ProcessUtilization: in.ProcessUtilization, GPM: in.GPM,
			})
		}
	}
	return st
}
