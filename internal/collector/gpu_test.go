package collector

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/profi-dev/profi/internal/aggregate"
	"github.com/profi-dev/profi/internal/nvml"
)

// gpuSnapshot has one fully featured GPU and one that supports nothing
// beyond its identity.
func gpuSnapshot() *nvml.Snapshot {
	return &nvml.Snapshot{
		Up: true, Time: time.Unix(1700000000, 0), PollDuration: 25 * time.Millisecond,
		GPUs: []nvml.GPU{
			{
				Index: 0, UUID: "GPU-aaaa", Name: "NVIDIA H100 80GB HBM3",
				MIGEnabled:         new(false),
				TemperatureCelsius: new(41.0),
				PowerWatts:         new(123.456),
				SMClockMHz:         new(1980.0),
				MemClockMHz:        new(2619.0),
				GPUUtilization:     new(0.87),
				MemoryUtilization:  new(0.35),
				Memory:             &nvml.Memory{Total: 85899345920, Free: 80000000000, Used: 5899345920},
				ECCCorrected:       new(uint64(3)),
				ECCUncorrected:     new(uint64(0)),
				Throttle:           new(nvml.ThrottleFromReasons(nvml.ReasonSWPowerCap | nvml.ReasonHWSlowdown | nvml.ReasonHWThermal)),
				Processes: []nvml.Process{
					{PID: 17}, // memory unknown: no series
					{PID: 4242, UsedBytes: 1 << 30, MemoryKnown: true}, // 1 GiB
				},
				PCIeTXBytesPerSecond: new(1024000.0),
				PCIeRXBytesPerSecond: new(256000.0),
				NVLinkErrors:         map[nvml.NVLinkCounter]uint64{nvml.NVLinkReplay: 11, nvml.NVLinkRecovery: 0, nvml.NVLinkCRCFlit: 33, nvml.NVLinkCRCData: 44},
				XIDErrors:            map[uint64]uint64{79: 2, 48: 1},
			},
			{Index: 1, UUID: "GPU-bbbb", Name: "Tesla T4"},
		},
	}
}

const gpuExposition = `# HELP profi_gpu_clock_mhz Current clock frequency of the SM (clock_type="sm") or memory (clock_type="mem") domain, in MHz.
# TYPE profi_gpu_clock_mhz gauge
profi_gpu_clock_mhz{clock_type="mem",gpu="0",gpu_uuid="GPU-aaaa"} 2619
profi_gpu_clock_mhz{clock_type="sm",gpu="0",gpu_uuid="GPU-aaaa"} 1980
# HELP profi_gpu_ecc_errors_total Volatile ECC error counts since the driver loaded, by error_type (corrected, uncorrected), all memory locations.
# TYPE profi_gpu_ecc_errors_total counter
profi_gpu_ecc_errors_total{error_type="corrected",gpu="0",gpu_uuid="GPU-aaaa",location="all"} 3
profi_gpu_ecc_errors_total{error_type="uncorrected",gpu="0",gpu_uuid="GPU-aaaa",location="all"} 0
# HELP profi_gpu_info GPU inventory from NVML, always 1: gpu is the NVML index, gpu_model the product name.
# TYPE profi_gpu_info gauge
profi_gpu_info{gpu="0",gpu_model="NVIDIA H100 80GB HBM3",gpu_uuid="GPU-aaaa"} 1
profi_gpu_info{gpu="1",gpu_model="Tesla T4",gpu_uuid="GPU-bbbb"} 1
# HELP profi_gpu_memory_bytes Framebuffer memory by state: used, free, total (NVML; used includes memory the driver reserves).
# TYPE profi_gpu_memory_bytes gauge
profi_gpu_memory_bytes{gpu="0",gpu_uuid="GPU-aaaa",state="free"} 8e+10
profi_gpu_memory_bytes{gpu="0",gpu_uuid="GPU-aaaa",state="total"} 8.589934592e+10
profi_gpu_memory_bytes{gpu="0",gpu_uuid="GPU-aaaa",state="used"} 5.89934592e+09
# HELP profi_gpu_nvlink_errors_total NVLink data-link errors summed over the active links, by error_type: replay, recovery, crc_flit, crc_data.
# TYPE profi_gpu_nvlink_errors_total counter
profi_gpu_nvlink_errors_total{error_type="crc_data",gpu="0",gpu_uuid="GPU-aaaa"} 44
profi_gpu_nvlink_errors_total{error_type="crc_flit",gpu="0",gpu_uuid="GPU-aaaa"} 33
profi_gpu_nvlink_errors_total{error_type="recovery",gpu="0",gpu_uuid="GPU-aaaa"} 0
profi_gpu_nvlink_errors_total{error_type="replay",gpu="0",gpu_uuid="GPU-aaaa"} 11
# HELP profi_gpu_pcie_throughput_bytes_per_second PCIe throughput by direction (tx: out of the GPU, rx: into it), NVML's 20 ms sample in KB/s × 1024.
# TYPE profi_gpu_pcie_throughput_bytes_per_second gauge
profi_gpu_pcie_throughput_bytes_per_second{direction="rx",gpu="0",gpu_uuid="GPU-aaaa"} 256000
profi_gpu_pcie_throughput_bytes_per_second{direction="tx",gpu="0",gpu_uuid="GPU-aaaa"} 1.024e+06
# HELP profi_gpu_power_watts Power draw of the board (NVML milliwatts / 1000).
# TYPE profi_gpu_power_watts gauge
profi_gpu_power_watts{gpu="0",gpu_uuid="GPU-aaaa"} 123.456
# HELP profi_gpu_process_memory_bytes Device memory used by a process (host PID) on this GPU, from NVML's running compute processes; MIG instances summed. Pod labels are those of the profiled process (empty when it is not one).
# TYPE profi_gpu_process_memory_bytes gauge
profi_gpu_process_memory_bytes{container="",gpu="0",gpu_uuid="GPU-aaaa",namespace="",pid="4242",pod=""} 1.073741824e+09
# HELP profi_gpu_temperature_celsius GPU core temperature (NVML).
# TYPE profi_gpu_temperature_celsius gauge
profi_gpu_temperature_celsius{gpu="0",gpu_uuid="GPU-aaaa"} 41
# HELP profi_gpu_throttle_active 1 while a clock throttle (clock event) reason is active: idle, power (software power cap), thermal (software thermal slowdown), hw_thermal (hardware thermal slowdown), hw_power (hardware power brake, or a hardware slowdown the thermal bit does not explain), sync_boost.
# TYPE profi_gpu_throttle_active gauge
profi_gpu_throttle_active{gpu="0",gpu_uuid="GPU-aaaa",reason="hw_power"} 0
profi_gpu_throttle_active{gpu="0",gpu_uuid="GPU-aaaa",reason="hw_thermal"} 1
profi_gpu_throttle_active{gpu="0",gpu_uuid="GPU-aaaa",reason="idle"} 0
profi_gpu_throttle_active{gpu="0",gpu_uuid="GPU-aaaa",reason="power"} 1
profi_gpu_throttle_active{gpu="0",gpu_uuid="GPU-aaaa",reason="sync_boost"} 0
profi_gpu_throttle_active{gpu="0",gpu_uuid="GPU-aaaa",reason="thermal"} 0
# HELP profi_gpu_utilization_ratio NVML utilization over its last sample period, 0-1: share of time a kernel ran (type="gpu") or device memory was read or written (type="memory").
# TYPE profi_gpu_utilization_ratio gauge
profi_gpu_utilization_ratio{gpu="0",gpu_uuid="GPU-aaaa",type="gpu"} 0.87
profi_gpu_utilization_ratio{gpu="0",gpu_uuid="GPU-aaaa",type="memory"} 0.35
# HELP profi_gpu_xid_errors_total XID critical error events seen by the agent since it started, by XID (decimal).
# TYPE profi_gpu_xid_errors_total counter
profi_gpu_xid_errors_total{gpu="0",gpu_uuid="GPU-aaaa",xid="48"} 1
profi_gpu_xid_errors_total{gpu="0",gpu_uuid="GPU-aaaa",xid="79"} 2
# HELP profi_system_nvml_poll_duration_seconds Duration of the last NVML poll (all GPUs).
# TYPE profi_system_nvml_poll_duration_seconds gauge
profi_system_nvml_poll_duration_seconds 0.025
# HELP profi_system_nvml_up 1 when NVML is initialised and the last poll finished within its timeout.
# TYPE profi_system_nvml_up gauge
profi_system_nvml_up 1
`

const nvmlDown = `# HELP profi_system_nvml_up 1 when NVML is initialised and the last poll finished within its timeout.
# TYPE profi_system_nvml_up gauge
profi_system_nvml_up 0
`

func TestGPUExposition(t *testing.T) {
	t.Parallel()
	s := gpuSnapshot()
	c := NewGPU(func() *nvml.Snapshot { return s })
	if err := testutil.CollectAndCompare(c, strings.NewReader(gpuExposition)); err != nil {
		t.Error(err)
	}
}

func TestGPUNVMLDown(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		snap *nvml.Snapshot
	}{
		{"no snapshot", nil},
		{"absent", &nvml.Snapshot{Reason: "nvml init: NVML library not found (tried libnvidia-ml.so.1)"}},
		// A stale inventory must not leak out while NVML is down.
		{"hung", &nvml.Snapshot{Reason: "NVML poll did not return within 5s", GPUs: gpuSnapshot().GPUs}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := NewGPU(func() *nvml.Snapshot { return tc.snap })
			if err := testutil.CollectAndCompare(c, strings.NewReader(nvmlDown)); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestGPUFamiliesOfInterface pins the names and label sets of docs/INTERFACE.md
// 5.6 (and the additions), whatever the help texts say.
func TestGPUFamiliesOfInterface(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewGPU(func() *nvml.Snapshot { return gpuSnapshot() }))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		"profi_gpu_info":                             {"gpu", "gpu_model", "gpu_uuid"},
		"profi_gpu_temperature_celsius":              {"gpu", "gpu_uuid"},
		"profi_gpu_power_watts":                      {"gpu", "gpu_uuid"},
		"profi_gpu_clock_mhz":                        {"clock_type", "gpu", "gpu_uuid"},
		"profi_gpu_utilization_ratio":                {"gpu", "gpu_uuid", "type"},
		"profi_gpu_memory_bytes":                     {"gpu", "gpu_uuid", "state"},
		"profi_gpu_ecc_errors_total":                 {"error_type", "gpu", "gpu_uuid", "location"},
		"profi_gpu_throttle_active":                  {"gpu", "gpu_uuid", "reason"},
		"profi_system_nvml_up":                       nil,
		"profi_gpu_process_memory_bytes":             {"container", "gpu", "gpu_uuid", "namespace", "pid", "pod"},
		"profi_gpu_pcie_throughput_bytes_per_second": {"direction", "gpu", "gpu_uuid"},
		"profi_gpu_nvlink_errors_total":              {"error_type", "gpu", "gpu_uuid"},
		"profi_gpu_xid_errors_total":                 {"gpu", "gpu_uuid", "xid"},
		"profi_system_nvml_poll_duration_seconds":    nil,
	}
	got := map[string][]string{}
	for _, mf := range mfs {
		var names []string
		for _, lp := range mf.GetMetric()[0].GetLabel() {
			names = append(names, lp.GetName())
		}
		got[mf.GetName()] = names
	}
	for name, labels := range want {
		g, ok := got[name]
		if !ok {
			t.Errorf("family %s missing", name)
			continue
		}
		if !slices.Equal(g, labels) {
			t.Errorf("%s labels = %q, want %q", name, g, labels)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("unexpected family %s", name)
		}
	}
}

func TestGPULint(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewGPU(func() *nvml.Snapshot { return gpuSnapshot() }))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

// TestGPUProcessMemoryPods: NVML's per-process memory carries the pod
// labels of the profiled process with that PID; other PIDs stay empty.
func TestGPUProcessMemoryPods(t *testing.T) {
	t.Parallel()
	s := gpuSnapshot()
	procs := &aggregate.Snapshot{Processes: []*aggregate.Process{
		{Meta: aggregate.Meta{PID: 4242, Namespace: "ml", Pod: "trainer-0", Container: "main", GPU: "0"}},
		{Meta: aggregate.Meta{PID: 4242, Namespace: "ml", Pod: "trainer-0", Container: "main", GPU: "1"}}, // second GPU of the same process
		{Meta: aggregate.Meta{PID: 7, Namespace: "other", Pod: "x"}},
	}}
	c := NewGPU(func() *nvml.Snapshot { return s }, WithProcesses(func() *aggregate.Snapshot { return procs }))
	want := `# HELP profi_gpu_process_memory_bytes Device memory used by a process (host PID) on this GPU, from NVML's running compute processes; MIG instances summed. Pod labels are those of the profiled process (empty when it is not one).
# TYPE profi_gpu_process_memory_bytes gauge
profi_gpu_process_memory_bytes{container="main",gpu="0",gpu_uuid="GPU-aaaa",namespace="ml",pid="4242",pod="trainer-0"} 1.073741824e+09
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "profi_gpu_process_memory_bytes"); err != nil {
		t.Error(err)
	}
}
