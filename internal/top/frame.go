// Package top is `profi top`: a live terminal view of a running agent's
// /metrics, per pod and process. Rates are the difference of two scrapes
// over the time between them; latency quantiles come from the difference
// of the histogram buckets, interpolated as PromQL's histogram_quantile.
package top

import (
	"math"
	"path"
	"sort"
	"strconv"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// Scrape is one parsed /metrics with the time it was taken.
type Scrape struct {
	Time     time.Time
	Families map[string]*dto.MetricFamily
}

// Key identifies a row: one process.
type Key struct {
	Namespace, Pod string
	PID            int
	Comm           string
}

// Row is one process over the window between two scrapes. NaN means
// "no data" (a quantile with no call in the window, no NCCL call in
// flight).
type Row struct {
	Key
	// LaunchRate and Launches count kernels that ran: direct launches
	// (profi_cuda_kernel_launches_total) plus the kernels CUDA graph
	// replays ran (profi_cuda_graph_kernel_launches_total); launch calls
	// captured into a graph ran nothing and are not counted.
	LaunchRate float64 // kernels per second
	Launches   uint64  // kernels since attach
	// GraphShare is the share of the window's kernels that ran through
	// graphs; NaN when the process ran no graph kernel since attach or no
	// kernel in the window.
	GraphShare float64
	Calls      uint64 // CUDA calls since attach, launches included
	// P50 and P99 are the pod's API latency in seconds over the window
	// (histograms carry no pid: every process of a pod shares them).
	P50, P99 float64
	// Memcpy is bytes per second by direction (h2d, d2h, d2d, ...).
	Memcpy      map[string]float64
	ActiveBytes uint64
	// GPUBusy is the process's SM utilization as the driver sampled it
	// (profi_gpu_process_utilization_ratio{engine="sm"}, summed over its
	// GPUs), 0-1; NaN without a sample.
	GPUBusy float64
	// HeldIdle is how long the process has launched no kernel while it
	// holds device memory (profi_cuda_held_idle_seconds, the least over
	// its GPUs), seconds; NaN when it holds none.
	HeldIdle float64
	// LaunchCPU is the on-CPU share of the process's busiest
	// kernel-launching thread over the agent's last window
	// (profi_cuda_launch_thread_busy_ratio), 0-1; NaN before one.
	LaunchCPU  float64
	NCCLRate   float64 // NCCL payload bytes per second
	NCCLOldest float64 // seconds, NaN when nothing is in flight
}

// Frame is what one screen shows.
type Frame struct {
	Time     time.Time
	Window   time.Duration
	Rows     []Row
	Tracked  int
	Drops    uint64            // lost data: map full, cardinality limit, ring buffer
	DropsBy  map[string]uint64 // the non-zero ones
	Problems []string          // what the frame could not compute
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Untyped != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}

func keyOf(m *dto.Metric) (Key, bool) {
	pid, err := strconv.Atoi(label(m, "pid"))
	if err != nil {
		return Key{}, false
	}
	return Key{Namespace: label(m, "namespace"), Pod: label(m, "pod"), PID: pid, Comm: label(m, "comm")}, true
}

// perKey sums a family's samples per process (and per extra label when
// by is not "").
func perKey(s Scrape, family, by string) map[Key]map[string]float64 {
	out := map[Key]map[string]float64{}
	for _, m := range s.Families[family].GetMetric() {
		k, ok := keyOf(m)
		if !ok {
			continue
		}
		if out[k] == nil {
			out[k] = map[string]float64{}
		}
		out[k][label(m, by)] += value(m)
	}
	return out
}

func sumAll(s Scrape, family string) float64 {
	var v float64
	for _, m := range s.Families[family].GetMetric() {
		v += value(m)
	}
	return v
}

// rate is (cur - prev)/dt; a counter that went down (a reused PID) counts
// from zero, as Prometheus's rate does on a reset.
func rate(prev, cur, dt float64) float64 {
	d := cur - prev
	if d < 0 {
		d = cur
	}
	return d / dt
}

type podKey struct{ Namespace, Pod string }

// bucketDelta returns, per pod, the cumulative bucket counts gained in the
// window, summed over operations and GPUs.
func bucketDelta(prev, cur Scrape, family string) map[podKey]map[float64]float64 {
	get := func(s Scrape) map[podKey]map[float64]float64 {
		out := map[podKey]map[float64]float64{}
		for _, m := range s.Families[family].GetMetric() {
			pk := podKey{label(m, "namespace"), label(m, "pod")}
			if out[pk] == nil {
				out[pk] = map[float64]float64{}
			}
			h := m.GetHistogram()
			for _, b := range h.GetBucket() {
				if !math.IsInf(b.GetUpperBound(), 1) { // the sample count below is +Inf
					out[pk][b.GetUpperBound()] += float64(b.GetCumulativeCount())
				}
			}
			out[pk][math.Inf(1)] += float64(h.GetSampleCount())
		}
		return out
	}
	before, after := get(prev), get(cur)
	for pk, bs := range after {
		for le, v := range bs {
			if d := v - before[pk][le]; d >= 0 {
				bs[le] = d
			} else {
				bs[le] = v
			}
		}
	}
	return after
}

// Quantile is PromQL's histogram_quantile over cumulative buckets by
// upper bound (+Inf included): linear interpolation inside the bucket,
// the lowest bucket starting at 0, a rank in +Inf giving the highest
// finite bound. NaN without observations.
func Quantile(q float64, buckets map[float64]float64) float64 {
	les := make([]float64, 0, len(buckets))
	for le := range buckets {
		les = append(les, le)
	}
	sort.Float64s(les)
	if len(les) < 2 || !math.IsInf(les[len(les)-1], 1) {
		return math.NaN()
	}
	total := buckets[les[len(les)-1]]
	if total == 0 {
		return math.NaN()
	}
	rank := q * total
	i := sort.Search(len(les), func(i int) bool { return buckets[les[i]] >= rank })
	if i == len(les)-1 {
		return les[len(les)-2]
	}
	lower, prevCount := 0.0, 0.0
	if i > 0 {
		lower, prevCount = les[i-1], buckets[les[i-1]]
	}
	upper, count := les[i], buckets[les[i]]-prevCount
	if count == 0 {
		return upper
	}
	return lower + (upper-lower)*(rank-prevCount)/count
}

// Compute builds the frame of the window from prev to cur.
func Compute(prev, cur Scrape) Frame {
	f := Frame{Time: cur.Time, Window: cur.Time.Sub(prev.Time), DropsBy: map[string]uint64{}}
	dt := f.Window.Seconds()
	if dt <= 0 {
		f.Problems = append(f.Problems, "scrapes out of order: no rates")
		dt = math.Inf(1)
	}
	launchesP, launchesC := perKey(prev, "profi_cuda_kernel_launches_total", ""), perKey(cur, "profi_cuda_kernel_launches_total", "")
	graphP, graphC := perKey(prev, "profi_cuda_graph_kernel_launches_total", ""), perKey(cur, "profi_cuda_graph_kernel_launches_total", "")
	callsC := perKey(cur, "profi_cuda_calls_total", "")
	memcpyP, memcpyC := perKey(prev, "profi_cuda_memcpy_bytes_total", "direction"), perKey(cur, "profi_cuda_memcpy_bytes_total", "direction")
	active := perKey(cur, "profi_cuda_active_memory_bytes", "")
	ncclP, ncclC := perKey(prev, "profi_nccl_bytes_total", ""), perKey(cur, "profi_nccl_bytes_total", "")
	oldest := map[int]float64{}
	for _, m := range cur.Families["profi_nccl_oldest_inflight_seconds"].GetMetric() {
		if pid, err := strconv.Atoi(label(m, "pid")); err == nil {
			if old, ok := oldest[pid]; !ok || value(m) > old {
				oldest[pid] = value(m)
			}
		}
	}
	lat := bucketDelta(prev, cur, "profi_cuda_duration_seconds")
	busy := map[int]float64{}
	for _, m := range cur.Families["profi_gpu_process_utilization_ratio"].GetMetric() {
		if label(m, "engine") != "sm" {
			continue
		}
		if pid, err := strconv.Atoi(label(m, "pid")); err == nil {
			busy[pid] += value(m)
		}
	}
	launchCPU := map[Key]float64{}
	for _, m := range cur.Families["profi_cuda_launch_thread_busy_ratio"].GetMetric() {
		if k, ok := keyOf(m); ok {
			launchCPU[k] = max(launchCPU[k], value(m))
		}
	}
	idle := map[Key]float64{}
	for _, m := range cur.Families["profi_cuda_held_idle_seconds"].GetMetric() {
		if k, ok := keyOf(m); ok {
			if old, seen := idle[k]; !seen || value(m) < old {
				idle[k] = value(m)
			}
		}
	}

	keys := map[Key]bool{}
	for _, m := range []map[Key]map[string]float64{launchesC, graphC, callsC, memcpyC, active, ncclC} {
		for k := range m {
			keys[k] = true
		}
	}
	for k := range keys {
		r := Row{Key: k, Memcpy: map[string]float64{}, P50: math.NaN(), P99: math.NaN(), NCCLOldest: math.NaN(), GraphShare: math.NaN(), HeldIdle: math.NaN(), GPUBusy: math.NaN(), LaunchCPU: math.NaN()}
		if v, ok := launchCPU[k]; ok {
			r.LaunchCPU = v
		}
		if v, ok := busy[k.PID]; ok {
			r.GPUBusy = v
		}
		if v, ok := idle[k]; ok {
			r.HeldIdle = v
		}
		r.Launches = uint64(launchesC[k][""] + graphC[k][""])
		direct, graph := rate(launchesP[k][""], launchesC[k][""], dt), rate(graphP[k][""], graphC[k][""], dt)
		r.LaunchRate = direct + graph
		if _, ok := graphC[k]; ok && r.LaunchRate > 0 {
			r.GraphShare = graph / r.LaunchRate
		}
		r.Calls = uint64(callsC[k][""])
		for dir, v := range memcpyC[k] {
			r.Memcpy[dir] = rate(memcpyP[k][dir], v, dt)
		}
		r.ActiveBytes = uint64(active[k][""])
		r.NCCLRate = rate(ncclP[k][""], ncclC[k][""], dt)
		if v, ok := oldest[k.PID]; ok {
			r.NCCLOldest = v
		}
		if bs := lat[podKey{k.Namespace, k.Pod}]; bs != nil {
			r.P50, r.P99 = Quantile(0.5, bs), Quantile(0.99, bs)
		}
		f.Rows = append(f.Rows, r)
	}
	f.Tracked = int(sumAll(cur, "profi_tracked_pids"))
	for _, m := range cur.Families["profi_system_bpf_map_drops_total"].GetMetric() {
		if v := uint64(value(m)); v > 0 {
			f.DropsBy[label(m, "map")] += v
		}
	}
	for name, fam := range map[string]string{"cardinality_limit": "profi_cardinality_limit_drops_total", "events_ring": "profi_dropped_events_total"} {
		if v := uint64(sumAll(cur, fam)); v > 0 {
			f.DropsBy[name] += v
		}
	}
	for _, v := range f.DropsBy {
		f.Drops += v
	}
	return f
}

// Filter keeps the rows whose namespace and pod match the shell patterns
// ("" = any; "llm-*" = every pod whose name starts with llm-).
func (f *Frame) Filter(namespace, pod string) {
	match := func(pattern, v string) bool {
		ok, err := path.Match(pattern, v)
		return pattern == "" || ok || (err != nil && pattern == v)
	}
	rows := f.Rows[:0]
	for _, r := range f.Rows {
		if match(namespace, r.Namespace) && match(pod, r.Pod) {
			rows = append(rows, r)
		}
	}
	f.Rows = rows
}
