package top

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/client"
)

func parse(t *testing.T, at time.Time, text string) Scrape {
	t.Helper()
	fams, err := client.ParseMetrics([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return Scrape{Time: at, Families: fams}
}

const l1 = `pid="10",comm="infer",namespace="ml",pod="llm-0",container="c",gpu="0",gpu_uuid="u"`
const l2 = `pid="20",comm="train",namespace="ml",pod="train-0",container="c",gpu="1",gpu_uuid="v"`

func exposition(launches1, launches2, graph1, h2d1, lat1 []float64, count1 float64, oldest string) string {
	var b strings.Builder
	b.WriteString("# TYPE profi_cuda_graph_kernel_launches_total counter\n")
	b.WriteString(`profi_cuda_graph_kernel_launches_total{kernel="anonymous",` + l1 + `,kernel_class="other",phase=""} ` + ftoa(graph1[0]) + "\n")
	b.WriteString(`profi_cuda_graph_kernel_launches_total{kernel="anonymous",` + l1 + `,kernel_class="other",phase="forward"} ` + ftoa(graph1[1]) + "\n")
	b.WriteString("# TYPE profi_cuda_kernel_launches_total counter\n")
	b.WriteString(`profi_cuda_kernel_launches_total{kernel="anonymous",` + l1 + `,kernel_class="other",phase=""} ` + ftoa(launches1[0]) + "\n")
	b.WriteString(`profi_cuda_kernel_launches_total{kernel="other",` + l1 + `,kernel_class="other",phase=""} ` + ftoa(launches1[1]) + "\n")
	b.WriteString(`profi_cuda_kernel_launches_total{kernel="anonymous",` + l2 + `,kernel_class="other",phase=""} ` + ftoa(launches2[0]) + "\n")
	b.WriteString("# TYPE profi_cuda_memcpy_bytes_total counter\n")
	b.WriteString(`profi_cuda_memcpy_bytes_total{direction="h2d",` + l1 + `,stream="default"} ` + ftoa(h2d1[0]) + "\n")
	b.WriteString(`profi_cuda_memcpy_bytes_total{direction="h2d",` + l1 + `,stream="0x1"} ` + ftoa(h2d1[1]) + "\n")
	b.WriteString("# TYPE profi_cuda_active_memory_bytes gauge\n")
	b.WriteString(`profi_cuda_active_memory_bytes{` + l1 + `} 4096` + "\n")
	b.WriteString("# TYPE profi_gpu_process_utilization_ratio gauge\n")
	b.WriteString(`profi_gpu_process_utilization_ratio{gpu="0",gpu_uuid="u",pid="10",namespace="ml",pod="llm-0",container="c",engine="sm"} 0.25` + "\n")
	b.WriteString(`profi_gpu_process_utilization_ratio{gpu="0",gpu_uuid="u",pid="10",namespace="ml",pod="llm-0",container="c",engine="memory"} 0.5` + "\n")
	b.WriteString("# TYPE profi_cuda_launch_thread_busy_ratio gauge\n")
	b.WriteString(`profi_cuda_launch_thread_busy_ratio{pid="10",comm="infer",namespace="ml",pod="llm-0",container="c"} 0.97` + "\n")
	b.WriteString("# TYPE profi_cuda_held_idle_seconds gauge\n")
	b.WriteString(`profi_cuda_held_idle_seconds{` + l1 + `} 42` + "\n")
	b.WriteString(`profi_cuda_held_idle_seconds{` + strings.Replace(l1, `gpu="0",gpu_uuid="u"`, `gpu="1",gpu_uuid="w"`, 1) + `} 3` + "\n")
	b.WriteString("# TYPE profi_cuda_duration_seconds histogram\n")
	les := []string{"0.001", "0.01", "0.1"}
	for i, le := range les {
		b.WriteString(`profi_cuda_duration_seconds_bucket{operation="cudaMemcpy",namespace="ml",pod="llm-0",gpu="0",le="` + le + `"} ` + ftoa(lat1[i]) + "\n")
	}
	b.WriteString(`profi_cuda_duration_seconds_bucket{operation="cudaMemcpy",namespace="ml",pod="llm-0",gpu="0",le="+Inf"} ` + ftoa(count1) + "\n")
	b.WriteString(`profi_cuda_duration_seconds_sum{operation="cudaMemcpy",namespace="ml",pod="llm-0",gpu="0"} 1` + "\n")
	b.WriteString(`profi_cuda_duration_seconds_count{operation="cudaMemcpy",namespace="ml",pod="llm-0",gpu="0"} ` + ftoa(count1) + "\n")
	b.WriteString("# TYPE profi_nccl_bytes_total counter\n")
	b.WriteString(`profi_nccl_bytes_total{operation="ncclAllReduce",` + l2 + `} ` + ftoa(launches2[1]) + "\n")
	if oldest != "" {
		b.WriteString("# TYPE profi_nccl_oldest_inflight_seconds gauge\n")
		b.WriteString(`profi_nccl_oldest_inflight_seconds{operation="ncclAllReduce",pid="20"} ` + oldest + "\n")
		b.WriteString(`profi_nccl_oldest_inflight_seconds{operation="ncclBroadcast",pid="20"} 1.5` + "\n")
	}
	b.WriteString("# TYPE profi_system_bpf_map_drops_total counter\n")
	b.WriteString(`profi_system_bpf_map_drops_total{map="aggregated"} 3` + "\n")
	b.WriteString(`profi_system_bpf_map_drops_total{map="inflight"} 0` + "\n")
	b.WriteString("# TYPE profi_cardinality_limit_drops_total counter\nprofi_cardinality_limit_drops_total 2\n")
	b.WriteString("# TYPE profi_tracked_pids gauge\nprofi_tracked_pids 2\n")
	return b.String()
}

func ftoa(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

func TestCompute(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	prev := parse(t, t0, exposition([]float64{100, 5}, []float64{50, 1 << 20}, []float64{200, 100}, []float64{1000, 0}, []float64{10, 20, 30}, 40, ""))
	// 4 s later: pid 10 made 80+20 direct launches, its graph replays ran
	// 300+100 kernels, and it copied 4000+4000 bytes h2d; its pod's
	// histogram gained 100 calls: 50 under 1 ms, 40 more under 10 ms, 10
	// more under 100 ms.
	cur := parse(t, t0.Add(4*time.Second), exposition([]float64{180, 25}, []float64{50, 9 << 20}, []float64{500, 200}, []float64{5000, 4000}, []float64{60, 110, 130}, 140, "7.25"))
	f := Compute(prev, cur)
	f.Sort(ColumnIndex("pid"), true)
	if len(f.Rows) != 2 {
		t.Fatalf("%d rows, want 2: %+v", len(f.Rows), f.Rows)
	}
	r := f.Rows[0]
	if r.PID != 10 || r.Pod != "llm-0" || r.Namespace != "ml" || r.Comm != "infer" {
		t.Errorf("row 0 key = %+v", r.Key)
	}
	// Kernels that ran: (100 direct + 400 graph) / 4 s, 205 + 700 since attach.
	if r.LaunchRate != 125 || r.Launches != 905 || r.GraphShare != 0.8 {
		t.Errorf("launch rate %v total %v graph share %v, want 125, 905 and 0.8", r.LaunchRate, r.Launches, r.GraphShare)
	}
	if r.Memcpy["h2d"] != 2000 || r.ActiveBytes != 4096 {
		t.Errorf("h2d %v/s active %v, want 2000 and 4096", r.Memcpy["h2d"], r.ActiveBytes)
	}
	// Held idle: the least over its GPUs (it launches on GPU 1).
	if r.GPUBusy != 0.25 {
		t.Errorf("gpu busy %v, want 0.25 (the sm engine)", r.GPUBusy)
	}
	if r.HeldIdle != 3 {
		t.Errorf("held idle %v, want 3", r.HeldIdle)
	}
	if r.LaunchCPU != 0.97 {
		t.Errorf("launch cpu %v, want 0.97", r.LaunchCPU)
	}
	// histogram_quantile(0.5): rank 50 of 100 falls at the top of the
	// first bucket (50 of 50) -> 0.001. 0.99: rank 99, bucket (0.01, 0.1]
	// holds 90..100 -> 0.01 + 0.09*(99-90)/10 = 0.091.
	if r.P50 != 0.001 || math.Abs(r.P99-0.091) > 1e-12 {
		t.Errorf("p50 %v p99 %v, want 0.001 and 0.091", r.P50, r.P99)
	}
	if !math.IsNaN(r.NCCLOldest) {
		t.Errorf("oldest in flight %v for a process without NCCL", r.NCCLOldest)
	}
	r = f.Rows[1]
	if r.PID != 20 || r.LaunchRate != 0 || r.Launches != 50 || r.NCCLRate != 2<<20 || r.NCCLOldest != 7.25 {
		t.Errorf("row 1 = %+v, want pid 20, 0 launches/s, 50 launches, 2 MiB/s NCCL, oldest 7.25 s", r)
	}
	if !math.IsNaN(r.P50) || !math.IsNaN(r.GraphShare) {
		t.Errorf("p50 %v graph share %v for a pod without timed calls or graphs", r.P50, r.GraphShare)
	}
	if f.Drops != 5 || f.DropsBy["aggregated"] != 3 || f.DropsBy["cardinality_limit"] != 2 || f.Tracked != 2 {
		t.Errorf("drops %d %v tracked %d, want 5 {aggregated 3, cardinality_limit 2} and 2", f.Drops, f.DropsBy, f.Tracked)
	}

	t.Run("sort and filter", func(t *testing.T) {
		f := Compute(prev, cur)
		f.Sort(ColumnIndex("launch_rate"), false)
		if f.Rows[0].PID != 10 {
			t.Errorf("launch_rate desc: first pid %d, want 10", f.Rows[0].PID)
		}
		f.Sort(ColumnIndex("launches"), true)
		if f.Rows[0].PID != 20 {
			t.Errorf("launches asc: first pid %d, want 20", f.Rows[0].PID)
		}
		f.Filter("ml", "train-*")
		if len(f.Rows) != 1 || f.Rows[0].PID != 20 {
			t.Errorf("filter ml/train-*: %+v", f.Rows)
		}
		f.Filter("other", "")
		if len(f.Rows) != 0 {
			t.Errorf("filter other: %+v", f.Rows)
		}
	})

	t.Run("render raw", func(t *testing.T) {
		f := Compute(prev, cur)
		f.Sort(ColumnIndex("pid"), true)
		out := Render(&f, "http://x", ColumnIndex("pid"), true, true)
		lines := strings.Split(out, "\n")
		if !strings.HasPrefix(lines[0], "profi top  http://x  00:00:04  window 4s  tracked pids 2  processes 2  sort pid asc") {
			t.Errorf("header %q", lines[0])
		}
		want := [][]string{
			{"NAMESPACE", "POD", "PID▲", "COMM", "LAUNCH/S", "GRAPH%", "LAUNCHES", "CALLS", "P50", "P99", "H2D/S", "D2H/S", "D2D/S", "DEV", "MEM", "SM%", "LAUNCH", "CPU%", "HELD", "IDLE", "NCCL/S", "NCCL", "OLDEST"},
			{"ml", "llm-0", "10", "infer", "125.0", "80", "905", "0", "0.001", "0.091", "2000", "0", "0", "4096", "25", "97", "3", "0", "-"},
			{"ml", "train-0", "20", "train", "0.0", "-", "50", "0", "-", "-", "0", "0", "0", "0", "-", "-", "-", "2097152", "7.25"},
		}
		for i, w := range want {
			got := strings.Fields(lines[1+i])
			if strings.Join(got, " ") != strings.Join(w, " ") {
				t.Errorf("line %d = %q, want %q", 1+i, got, w)
			}
		}
		if lines[4] != "drops 5 (aggregated=3 cardinality_limit=2)" {
			t.Errorf("drops line %q", lines[4])
		}
	})
}

// TestGraphShare checks GRAPH%: its cells, and "-" for a process whose
// graphs ran no kernel in the window.
func TestGraphShare(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		share    float64
		raw      bool
		want     string
		describe string
	}{
		{math.NaN(), false, "-", "none"},
		{math.NaN(), true, "-", "none, raw"},
		{0, false, "0%", "graphs, no graph kernel in the window"},
		{0.004, false, "<1%", "a few graph kernels"},
		{0.8, false, "80%", "most"},
		{0.996, false, ">99%", "almost all"},
		{1, false, "100%", "all"},
		{0.125, true, "12.5", "raw"},
	} {
		if got := percent(tc.share, tc.raw); got != tc.want {
			t.Errorf("%s: percent(%v, %v) = %q, want %q", tc.describe, tc.share, tc.raw, got, tc.want)
		}
	}

	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	text := exposition([]float64{180, 25}, []float64{50, 9 << 20}, []float64{500, 200}, []float64{5000, 4000}, []float64{60, 110, 130}, 140, "")
	prev := parse(t, t0, exposition([]float64{100, 5}, []float64{50, 1 << 20}, []float64{200, 100}, []float64{1000, 0}, []float64{10, 20, 30}, 40, ""))
	cur := parse(t, t0.Add(4*time.Second), text)
	f := Compute(prev, cur)
	f.Sort(ColumnIndex("graph_share"), false)
	out := Render(&f, "http://x", ColumnIndex("graph_share"), false, false)
	lines := strings.Split(out, "\n")
	if got := strings.Fields(lines[1]); strings.Join(got[:7], " ") != "NAMESPACE POD PID COMM LAUNCH/S GRAPH%▼ LAUNCHES" {
		t.Errorf("titles %q", got)
	}
	for i, want := range []string{"ml llm-0 10 infer 125.0 80% 905", "ml train-0 20 train 0.0 - 50"} {
		if got := strings.Fields(lines[2+i]); strings.Join(got[:7], " ") != want {
			t.Errorf("row %d %q, want it to start with %q", i, got, want)
		}
	}

	// Idle since: no kernel in the window, no share.
	idle := Compute(cur, parse(t, t0.Add(8*time.Second), text))
	idle.Sort(ColumnIndex("pid"), true)
	if r := idle.Rows[0]; r.PID != 10 || r.LaunchRate != 0 || r.Launches != 905 || !math.IsNaN(r.GraphShare) {
		t.Errorf("idle row %+v, want pid 10, 0 kernels/s, 905 kernels, no graph share", r)
	}
}

func TestQuantileEdges(t *testing.T) {
	t.Parallel()
	inf := math.Inf(1)
	if q := Quantile(0.5, map[float64]float64{1: 0, inf: 0}); !math.IsNaN(q) {
		t.Errorf("empty histogram: %v, want NaN", q)
	}
	// Every observation above the last bound: the highest finite bound.
	if q := Quantile(0.99, map[float64]float64{1: 0, 2: 0, inf: 10}); q != 2 {
		t.Errorf("all in +Inf: %v, want 2", q)
	}
	// Linear inside the first bucket, from 0.
	if q := Quantile(0.25, map[float64]float64{4: 8, inf: 8}); q != 1 {
		t.Errorf("first bucket: %v, want 1", q)
	}
}
