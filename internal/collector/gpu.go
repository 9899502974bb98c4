package collector

import (
	"time"

	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/profi-dev/profi/internal/aggregate"
	"github.com/profi-dev/profi/internal/nvml"
	"github.com/profi-dev/profi/internal/xid"
)

// GPU label sets of docs/INTERFACE.md 5.6.
var gpuLabels = []string{"gpu", "gpu_uuid"}

func withGPU(extra ...string) []string { return append(append([]string(nil), gpuLabels...), extra...) }

// nvlinkErrorTypes are the error_type values of profi_gpu_nvlink_errors_total.
var nvlinkErrorTypes = map[nvml.NVLinkCounter]string{
	nvml.NVLinkReplay:   "replay",
	nvml.NVLinkRecovery: "recovery",
	nvml.NVLinkCRCFlit:  "crc_flit",
	nvml.NVLinkCRCData:  "crc_data",
}

// gpuCollector exports the NVML families of docs/INTERFACE.md 5.6 (and the
// additions) from the poller's latest snapshot.
type gpuCollector struct {
	snapshot func() *nvml.Snapshot
	procs    func() *aggregate.Snapshot // pod labels of processes; may be nil
	// xids and kmsgRunning: the kernel log's Xid counts (WithXids).
	xids        func() map[xid.Key]uint64
	xidRejects  func() map[string]uint64
	kmsgRunning func() bool

	info, temperature, power, clock, utilization, memory, ecc, throttle *prometheus.Desc
	up, pollDuration                                                    *prometheus.Desc
	processMemory, pcie, nvlinkErrors, xid, xidRejected                 *prometheus.Desc
	processUtil, gpmRatio, gpmBytes, processBusy                        *prometheus.Desc
	busy                                                                *busyPods
}

// gpmRatios are the GPM metrics of profi_gpu_gpm_ratio, by metric label.
var gpmRatios = []struct {
	id    nvml.GPMMetric
	label string
}{
	{nvml.GPMGraphicsUtil, "graphics_active"}, {nvml.GPMSMUtil, "sm_active"}, {nvml.GPMSMOccupancy, "sm_occupancy"},
	{nvml.GPMIntegerUtil, "integer_active"}, {nvml.GPMTensorUtil, "tensor_active"}, {nvml.GPMDRAMBWUtil, "dram_bandwidth"},
	{nvml.GPMFP64Util, "fp64_active"}, {nvml.GPMFP32Util, "fp32_active"}, {nvml.GPMFP16Util, "fp16_active"},
}

// gpmLinks are the GPM metrics of profi_gpu_gpm_bytes_per_second.
var gpmLinks = []struct {
	id              nvml.GPMMetric
	link, direction string
}{
	{nvml.GPMPCIeTX, "pcie", "tx"}, {nvml.GPMPCIeRX, "pcie", "rx"},
	{nvml.GPMNVLinkTX, "nvlink", "tx"}, {nvml.GPMNVLinkRX, "nvlink", "rx"},
}

// GPUOption configures NewGPU.
type GPUOption func(*gpuCollector)

// WithProcesses joins profi_gpu_process_memory_bytes to pods: a PID that
// is a profiled process of the aggregator's latest snapshot gets its
// namespace, pod and container labels (empty otherwise).
func WithProcesses(snapshot func() *aggregate.Snapshot) GPUOption {
	return func(c *gpuCollector) { c.procs = snapshot }
}

// WithXids makes the kernel log the source of profi_gpu_xid_errors_total
// while running() is true: counts(gpu, uuid, xid) replaces NVML's events,
// which carry no identity to deduplicate against the log's (one source of
// truth per fact; internal/xid). rejected counts the Xid lines not
// counted, by reason (profi_system_xid_lines_rejected_total).
func WithXids(counts func() map[xid.Key]uint64, rejected func() map[string]uint64, running func() bool) GPUOption {
	return func(c *gpuCollector) { c.xids, c.xidRejects, c.kmsgRunning = counts, rejected, running }
}

// NewGPU returns the collector of the GPU (NVML) families. snapshot returns
// the NVML poller's latest snapshot; nil counts as NVML down. While NVML
// is down only profi_system_nvml_up (0) is exported.
func NewGPU(snapshot func() *nvml.Snapshot, opts ...GPUOption) prometheus.Collector {
	d := prometheus.NewDesc
	c := &gpuCollector{
		snapshot:    snapshot,
		info:        d("profi_gpu_info", "GPU inventory from NVML, always 1: gpu is the NVML index, gpu_model the product name.", withGPU("gpu_model"), nil),
		temperature: d("profi_gpu_temperature_celsius", "GPU core temperature (NVML).", gpuLabels, nil),
		power:       d("profi_gpu_power_watts", "Power draw of the board (NVML milliwatts / 1000).", gpuLabels, nil),
		clock:       d("profi_gpu_clock_mhz", "Current clock frequency of the SM (clock_type=\"sm\") or memory (clock_type=\"mem\") domain, in MHz.", withGPU("clock_type"), nil),
		utilization: d("profi_gpu_utilization_ratio", "NVML utilization over its last sample period, 0-1: share of time a kernel ran (type=\"gpu\") or device memory was read or written (type=\"memory\").", withGPU("type"), nil),
		memory:      d("profi_gpu_memory_bytes", "Framebuffer memory by state: used, free, total (NVML; used includes memory the driver reserves).", withGPU("state"), nil),
		ecc:         d("profi_gpu_ecc_errors_total", "Volatile ECC error counts since the driver loaded, by error_type (corrected, uncorrected), all memory locations.", withGPU("error_type", "location"), nil),
		throttle: d("profi_gpu_throttle_active", "1 while a clock throttle (clock event) reason is active: idle, power (software power cap), thermal (software thermal slowdown), "+
			"hw_thermal (hardware thermal slowdown), hw_power (hardware power brake, or a hardware slowdown the thermal bit does not explain), sync_boost.", withGPU("reason"), nil),
		up:           d("profi_system_nvml_up", "1 when NVML is initialised and the last poll finished within its timeout.", nil, nil),
		pollDuration: d("profi_system_nvml_poll_duration_seconds", "Duration of the last NVML poll (all GPUs).", nil, nil),
		processMemory: d("profi_gpu_process_memory_bytes", "Device memory used by a process (host PID) on this GPU, from NVML's running compute processes; MIG instances summed. Pod labels are those of the profiled process (empty when it is not one).",
			withGPU("pid", "namespace", "pod", "container"), nil),
		pcie:         d("profi_gpu_pcie_throughput_bytes_per_second", "PCIe throughput by direction (tx: out of the GPU, rx: into it), NVML's 20 ms sample in KB/s × 1024.", withGPU("direction"), nil),
		nvlinkErrors: d("profi_gpu_nvlink_errors_total", "NVLink data-link errors summed over the active links, by error_type: replay, recovery, crc_flit, crc_data.", withGPU("error_type"), nil),
		xid:          d("profi_gpu_xid_errors_total", "XID critical error events seen by the agent since it started, by XID (decimal).", withGPU("xid"), nil),
		xidRejected: d("profi_system_xid_lines_rejected_total", "Xid lines of the kernel log not counted, by reason: malformed (refused by the parser), not_kernel (not the kernel's facility: written from userspace, a forgery).",
			[]string{"reason"}, nil),
		processUtil: d("profi_gpu_process_utilization_ratio", "GPU utilization of a process (host PID) sampled by the driver (nvmlDeviceGetProcessUtilization), 0-1, "+
			"mean of the driver's samples since the previous NVML poll, by engine: sm, memory, encoder, decoder. gpu_uuid is the MIG device on a MIG GPU. "+
			"Device-side time, not host API latency. Pod labels are those of the profiled process (empty when it is not one).",
			withGPU("pid", "namespace", "pod", "container", "engine"), nil),
		processBusy: d("profi_gpu_process_busy_seconds_total", "Seconds the driver's samples saw the processes of a pod busy on this GPU (MIG device: gpu_uuid), by engine: "+
			"sm, memory, encoder, decoder (each sample's utilization over its sampling period, nvmlDeviceGetProcessUtilization; since the agent started). "+
			"Device-side time, not host API latency. A usage basis for GPU cost; empty pod labels: processes outside Kubernetes or not profiled.",
			withGPU("namespace", "pod", "container", "engine"), nil),
		busy: newBusyPods(),
		gpmRatio: d("profi_gpu_gpm_ratio", "NVML GPM (GPU performance monitoring) ratio over the last --gpm-interval, 0-1, by metric: sm_active, sm_occupancy, tensor_active, "+
			"fp64_active, fp32_active, fp16_active, integer_active, graphics_active, dram_bandwidth. gpu_uuid is the MIG device for a MIG instance.", withGPU("metric"), nil),
		gpmBytes: d("profi_gpu_gpm_bytes_per_second", "NVML GPM link throughput over the last --gpm-interval (MiB/s × 1048576), by link (pcie, nvlink) and direction (tx, rx).",
			withGPU("link", "direction"), nil),
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// podsOf returns the pod labels of the profiled processes, by PID.
func (c *gpuCollector) podsOf() map[int]aggregate.Meta {
	out := map[int]aggregate.Meta{}
	if c.procs == nil {
		return out
	}
	if s := c.procs(); s != nil {
		// Exited processes too (their busy time is folded after their
		// exit); a live process's labels win over an exited one's.
		for _, ps := range [][]*aggregate.Process{s.Exited, s.Processes} {
			for _, p := range ps {
				if p.Meta.PID != 0 {
					out[p.Meta.PID] = p.Meta
				}
			}
		}
	}
	return out
}

// Describe sends every descriptor.
func (c *gpuCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		c.info, c.temperature, c.power, c.clock, c.utilization, c.memory, c.ecc, c.throttle,
		c.up, c.pollDuration, c.processMemory, c.pcie, c.nvlinkErrors, c.xid, c.xidRejected,
		c.processUtil, c.gpmRatio, c.gpmBytes, c.processBusy,
	} {
		ch <- d
	}
}

// Collect builds the GPU series of the latest snapshot.
func (c *gpuCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.snapshot()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	if c.xidRejects != nil {
		for reason, n := range c.xidRejects() {
			counter(c.xidRejected, float64(n), reason)
		}
	}
	if s == nil || !s.Up {
		gauge(c.up, 0)
		return
	}
	gauge(c.up, 1)
	gauge(c.pollDuration, s.PollDuration.Seconds())
	pods := c.podsOf()
	fromLog := c.xids != nil && c.kmsgRunning != nil && c.kmsgRunning()
	if fromLog {
		for k, n := range c.xids() {
			gpu := ""
			if k.GPU >= 0 {
				gpu = strconv.Itoa(k.GPU)
			}
			counter(c.xid, float64(n), gpu, k.UUID, strconv.FormatUint(uint64(k.Code), 10))
		}
	}
	for i := range s.GPUs {
		g := &s.GPUs[i]
		id, uuid := strconv.Itoa(g.Index), g.UUID
		gauge(c.info, 1, id, uuid, g.Name)
		if g.TemperatureCelsius != nil {
			gauge(c.temperature, *g.TemperatureCelsius, id, uuid)
		}
		if g.PowerWatts != nil {
			gauge(c.power, *g.PowerWatts, id, uuid)
		}
		if g.SMClockMHz != nil {
			gauge(c.clock, *g.SMClockMHz, id, uuid, "sm")
		}
		if g.MemClockMHz != nil {
			gauge(c.clock, *g.MemClockMHz, id, uuid, "mem")
		}
		if g.GPUUtilization != nil {
			gauge(c.utilization, *g.GPUUtilization, id, uuid, "gpu")
		}
		if g.MemoryUtilization != nil {
			gauge(c.utilization, *g.MemoryUtilization, id, uuid, "memory")
		}
		if m := g.Memory; m != nil {
			gauge(c.memory, float64(m.Used), id, uuid, "used")
			gauge(c.memory, float64(m.Free), id, uuid, "free")
			gauge(c.memory, float64(m.Total), id, uuid, "total")
		}
		if g.ECCCorrected != nil {
			counter(c.ecc, float64(*g.ECCCorrected), id, uuid, "corrected", "all")
		}
		if g.ECCUncorrected != nil {
			counter(c.ecc, float64(*g.ECCUncorrected), id, uuid, "uncorrected", "all")
		}
		if t := g.Throttle; t != nil {
			for _, r := range []struct {
				reason string
				on     bool
			}{
				{"idle", t.Idle}, {"power", t.Power}, {"thermal", t.Thermal},
				{"hw_thermal", t.HWThermal}, {"hw_power", t.HWPower}, {"sync_boost", t.SyncBoost},
			} {
				gauge(c.throttle, b2f(r.on), id, uuid, r.reason)
			}
		}
		for _, p := range g.Processes {
			if p.MemoryKnown {
				m := pods[int(p.PID)]
				gauge(c.processMemory, float64(p.UsedBytes), id, uuid, strconv.FormatUint(uint64(p.PID), 10), m.Namespace, m.Pod, m.Container)
			}
		}
		if g.PCIeTXBytesPerSecond != nil {
			gauge(c.pcie, *g.PCIeTXBytesPerSecond, id, uuid, "tx")
		}
		if g.PCIeRXBytesPerSecond != nil {
			gauge(c.pcie, *g.PCIeRXBytesPerSecond, id, uuid, "rx")
		}
		for k, v := range g.NVLinkErrors {
			if name, ok := nvlinkErrorTypes[k]; ok {
				counter(c.nvlinkErrors, float64(v), id, uuid, name)
			}
		}
		for code, n := range g.XIDErrors {
			if !fromLog {
				counter(c.xid, float64(n), id, uuid, strconv.FormatUint(code, 10))
			}
		}
		for _, u := range g.ProcessUtilization {
			m := pods[int(u.PID)]
			pid := strconv.FormatUint(uint64(u.PID), 10)
			for _, e := range []struct {
				engine string
				v      float64
			}{{"sm", u.SM}, {"memory", u.Memory}, {"encoder", u.Encoder}, {"decoder", u.Decoder}} {
				gauge(c.processUtil, e.v, id, u.UUID, pid, m.Namespace, m.Pod, m.Container, e.engine)
			}
		}
		for _, v := range g.GPM {
			for _, r := range gpmRatios {
				if x, ok := v.Values[r.id]; ok {
					gauge(c.gpmRatio, x/100, id, v.UUID, r.label)
				}
			}
			for _, l := range gpmLinks {
				if x, ok := v.Values[l.id]; ok {
					gauge(c.gpmBytes, x*(1<<20), id, v.UUID, l.link, l.direction)
				}
			}
		}
	}
	for k, t := range c.busy.fold(s, pods, time.Now()) {
		for i, e := range busyEngines {
			counter(c.processBusy, t.sec[i], k.gpu, k.uuid, k.namespace, k.pod, k.container, e)
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
