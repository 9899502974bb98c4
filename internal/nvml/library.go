package nvml

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
)

// Errors a Library returns, checked with errors.Is.
var (
	// ErrNotSupported: the device, driver or library lacks the capability
	// (NVML_ERROR_NOT_SUPPORTED, or a symbol the loaded library does not
	// export). The poller skips the field; it is never fatal.
	ErrNotSupported = errors.New("not supported")
	// ErrLibraryNotFound: no libnvidia-ml.so.1 could be loaded.
	ErrLibraryNotFound = errors.New("NVML library not found")
	// ErrNotFound: nothing at that index (an empty MIG slot).
	ErrNotFound = errors.New("not found")
	// ErrNoEvent: EventSet.Poll found no pending event (NVML_ERROR_TIMEOUT
	// of a zero-timeout wait).
	ErrNoEvent = errors.New("no event pending")
	// ErrDriverGone: NVML is no longer initialised or the kernel driver is
	// not loaded (NVML_ERROR_UNINITIALIZED, NVML_ERROR_DRIVER_NOT_LOADED:
	// a driver reload, e.g. a GPU operator upgrade). A poll that meets it
	// reports Up=false and NVML is initialised again.
	ErrDriverGone = errors.New("NVML driver gone")
	// ErrInUse: another client holds the resource (NVML_ERROR_IN_USE). For
	// GPM it means the profiling counters are taken, typically by DCGM's
	// profiling module (dcgm-exporter's DCP metrics): GPM values would be
	// wrong, so none are reported.
	ErrInUse = errors.New("in use by another client")
)

// Error is an NVML failure other than the sentinels. Its text is taken
// when the call fails (nvmlErrorString is an NVML call too, and must not
// run later outside the poll's timeout).
type Error struct {
	Code int // nvmlReturn_t
	Text string
}

func (e *Error) Error() string { return fmt.Sprintf("%s (nvmlReturn_t %d)", e.Text, e.Code) }

// EnvLibrary names the environment variable that, when set, is the full
// path of the NVML library to load instead of the search in SearchPaths.
const EnvLibrary = "PROFI_NVML_LIBRARY"

// LibraryName is the SONAME of NVML.
const LibraryName = "libnvidia-ml.so.1"

// SearchPaths are the libraries the real Library tries to load, in order:
// the file named by $PROFI_NVML_LIBRARY alone when it is set, else the
// dynamic loader's own search (LD_LIBRARY_PATH, ld.so.cache: the NVIDIA
// container runtime's injection) and then the places where drivers live on
// Kubernetes nodes: the GPU operator's driver container
// (/run/nvidia/driver), GKE (/home/kubernetes/bin/nvidia) and images that
// mount the driver at /usr/local/nvidia.
func SearchPaths() []string {
	if p := os.Getenv(EnvLibrary); p != "" {
		return []string{p}
	}
	triplet := "x86_64-linux-gnu"
	if runtime.GOARCH == "arm64" {
		triplet = "aarch64-linux-gnu"
	}
	paths := []string{LibraryName}
	for _, dir := range []string{
		"/run/nvidia/driver/usr/lib/" + triplet,
		"/run/nvidia/driver/usr/lib64",
		"/home/kubernetes/bin/nvidia/lib64",
		"/usr/local/nvidia/lib64",
	} {
		paths = append(paths, filepath.Join(dir, LibraryName))
	}
	return paths
}

// Clock selects a clock domain.
type Clock int

// Clock domains (NVML_CLOCK_SM, NVML_CLOCK_MEM).
const (
	ClockSM Clock = iota
	ClockMem
)

// ECCErrorType selects corrected or uncorrected ECC errors.
type ECCErrorType int

// ECC error types (NVML_MEMORY_ERROR_TYPE_*).
const (
	ECCCorrected ECCErrorType = iota
	ECCUncorrected
)

// PCIeCounter selects a PCIe direction.
type PCIeCounter int

// PCIe directions (NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES).
const (
	PCIeTX PCIeCounter = iota
	PCIeRX
)

// NVLinkCounter selects an NVLink data-link error counter.
type NVLinkCounter int

// NVLink error counters (NVML_NVLINK_ERROR_DL_*), in NVLinkCounters order.
const (
	NVLinkReplay NVLinkCounter = iota
	NVLinkRecovery
	NVLinkCRCFlit
	NVLinkCRCData
)

// NVLinkCounters lists every NVLinkCounter.
var NVLinkCounters = []NVLinkCounter{NVLinkReplay, NVLinkRecovery, NVLinkCRCFlit, NVLinkCRCData}

// MaxNVLinks is NVML_NVLINK_MAX_LINKS of the newest header: links are
// queried from 0 up to this bound (the first NotSupported ends the walk).
const MaxNVLinks = 36

// Clock event ("throttle") reason bits of
// nvmlDeviceGetCurrentClocksEventReasons, the values of nvml.h.
const (
	ReasonGPUIdle      uint64 = 0x1
	ReasonSWPowerCap   uint64 = 0x4
	ReasonHWSlowdown   uint64 = 0x8
	ReasonSyncBoost    uint64 = 0x10
	ReasonSWThermal    uint64 = 0x20
	ReasonHWThermal    uint64 = 0x40
	ReasonHWPowerBrake uint64 = 0x80
)

// MemoryNotAvailable is the used-memory value NVML reports for a process
// when it cannot tell (NVML_VALUE_NOT_AVAILABLE, e.g. without privileges
// or on Windows WDDM).
const MemoryNotAvailable = ^uint64(0)

// NoInstance is the GPU instance id of a process on a GPU without MIG.
const NoInstance = ^uint32(0)

// Memory is framebuffer memory in bytes (nvmlMemory_t).
type Memory struct {
	Total, Free, Used uint64
}

// ProcessInfo is one entry of nvmlDeviceGetComputeRunningProcesses.
type ProcessInfo struct {
	PID           uint32 // host PID
	UsedBytes     uint64 // MemoryNotAvailable when NVML cannot tell
	GPUInstanceID uint32 // NoInstance without MIG
}

// MigDevice is one MIG device of a GPU in MIG mode.
type MigDevice struct {
	UUID          string // MIG-…
	GPUInstanceID uint32
	// h is the MIG device handle, for the per-instance queries (process
	// utilization); nil when the Library gives none.
	h Device
}

// NewMigDevice returns a MigDevice with its handle (for Library
// implementations outside this package's real one).
func NewMigDevice(uuid string, gi uint32, h Device) MigDevice {
	return MigDevice{UUID: uuid, GPUInstanceID: gi, h: h}
}

// ProcessSample is one entry of nvmlDeviceGetProcessUtilization: the
// utilization of one process over one of the driver's sampling periods,
// in percent.
type ProcessSample struct {
	PID       uint32
	TimeStamp uint64 // CPU time in microseconds (the lastSeenTimeStamp unit)
	SM        uint32 // SM (3D/compute)
	Memory    uint32 // frame buffer memory (read or write)
	Encoder   uint32
	Decoder   uint32
}

// GPMMetric is an NVML GPM metric id (nvmlGpmMetricId_t).
type GPMMetric uint32

// The GPM metrics profi reads, the values of nvml.h.
const (
	GPMGraphicsUtil GPMMetric = 1  // percent of time any context was active
	GPMSMUtil       GPMMetric = 2  // percent of SMs busy (DCGM's SM active)
	GPMSMOccupancy  GPMMetric = 3  // percent of warps resident vs the maximum
	GPMIntegerUtil  GPMMetric = 4  // percent of time SMs ran integer instructions
	GPMTensorUtil   GPMMetric = 5  // percent of time SMs ran any tensor instruction
	GPMDRAMBWUtil   GPMMetric = 10 // percent of peak DRAM bandwidth
	GPMFP64Util     GPMMetric = 11 // percent of time SMs ran non-tensor FP64
	GPMFP32Util     GPMMetric = 12
	GPMFP16Util     GPMMetric = 13
	GPMPCIeTX       GPMMetric = 20 // MiB/s out of the GPU
	GPMPCIeRX       GPMMetric = 21 // MiB/s into the GPU
	GPMNVLinkRX     GPMMetric = 60 // MiB/s, all links
	GPMNVLinkTX     GPMMetric = 61
)

// GPMMetrics lists every GPMMetric profi reads, in a fixed order.
var GPMMetrics = []GPMMetric{
	GPMGraphicsUtil, GPMSMUtil, GPMSMOccupancy, GPMIntegerUtil, GPMTensorUtil, GPMDRAMBWUtil,
	GPMFP64Util, GPMFP32Util, GPMFP16Util, GPMPCIeTX, GPMPCIeRX, GPMNVLinkRX, GPMNVLinkTX,
}

// GPMSample is one GPM sample buffer holding the counters of one moment.
type GPMSample interface {
	// Free is nvmlGpmSampleFree.
	Free() error
}

// Event is one XID critical error event.
type Event struct {
	UUID string // of the device the event names
	XID  uint64
}

// Library is the subset of NVML profi uses, one method per NVML call (or
// small group of calls), in NVML's own units. Methods return ErrNotSupported
// for a capability the device or driver lacks. The Poller calls a Library
// from one goroutine at a time.
type Library interface {
	// Init loads the library if needed and calls nvmlInit.
	Init() error
	// Shutdown calls nvmlShutdown.
	Shutdown() error
	// DriverVersion is nvmlSystemGetDriverVersion.
	DriverVersion() (string, error)
	// DeviceCount is nvmlDeviceGetCount.
	DeviceCount() (int, error)
	// Device is nvmlDeviceGetHandleByIndex: index is the NVML index.
	Device(index int) (Device, error)
	// NewEventSet is nvmlEventSetCreate.
	NewEventSet() (EventSet, error)
	// GPMMetrics is nvmlGpmMetricsGet between two samples of the same
	// device or instance: each metric's value, absent when NVML did not
	// return it.
	GPMMetrics(a, b GPMSample, ids []GPMMetric) (map[GPMMetric]float64, error)
}

// Device is one GPU handle.
type Device interface {
	UUID() (string, error)     // nvmlDeviceGetUUID: GPU-…
	Name() (string, error)     // nvmlDeviceGetName: the product name
	MinorNumber() (int, error) // nvmlDeviceGetMinorNumber: N of /dev/nvidiaN
	// MigMode is the current mode of nvmlDeviceGetMigMode.
	MigMode() (enabled bool, err error)
	// MigDevices lists the MIG devices (nvmlDeviceGetMaxMigDeviceCount,
	// nvmlDeviceGetMigDeviceHandleByIndex, their UUIDs and GPU instance ids).
	MigDevices() ([]MigDevice, error)
	Temperature() (int, error)                              // GPU core, °C
	PowerUsage() (uint32, error)                            // mW
	ClockInfo(Clock) (uint32, error)                        // current clock, MHz
	Utilization() (gpu, memory uint32, err error)           // percent, 0-100
	Memory() (Memory, error)                                // bytes
	ECCErrors(ECCErrorType) (uint64, error)                 // volatile total, all locations
	ClockEventReasons() (uint64, error)                     // Reason* bits
	ComputeProcesses() ([]ProcessInfo, error)               // nvmlDeviceGetComputeRunningProcesses
	PCIeThroughput(PCIeCounter) (uint32, error)             // KB/s (1 KB = 1024 bytes) over a 20 ms sample
	NVLinkActive(link int) (bool, error)                    // nvmlDeviceGetNvLinkState
	NVLinkErrors(link int, c NVLinkCounter) (uint64, error) // nvmlDeviceGetNvLinkErrorCounter
	// PCIBusID is nvmlDeviceGetPciInfo's busId ("00000000:3B:00.0").
	PCIBusID() (string, error)
	// ProcessUtilization is nvmlDeviceGetProcessUtilization: the samples
	// newer than lastSeen (µs); ErrNotFound when there are none.
	ProcessUtilization(lastSeen uint64) ([]ProcessSample, error)
	// GPMSupported is nvmlGpmQueryDeviceSupport.
	GPMSupported() (bool, error)
	// GPMSample allocates a sample and fills it (nvmlGpmSampleAlloc, then
	// nvmlGpmSampleGet, or nvmlGpmMigSampleGet for gpuInstance !=
	// NoInstance); ErrInUse when the counters are held elsewhere.
	GPMSample(gpuInstance uint32) (GPMSample, error)
}

// EventSet is an NVML event set for XID critical errors.
type EventSet interface {
	// Register adds the device's XID critical error events to the set
	// (nvmlDeviceRegisterEvents).
	Register(Device) error
	// Poll waits zero milliseconds for the next event (nvmlEventSetWait):
	// ErrNoEvent when none is pending.
	Poll() (Event, error)
	// Free is nvmlEventSetFree.
	Free() error
}

// pathed is implemented by a Library that can say which file it loaded.
type pathed interface{ Path() string }
