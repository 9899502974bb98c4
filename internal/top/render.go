package top

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Column is one column of the table; its Key is what --sort takes.
type Column struct {
	Key, Title string
	// less orders two rows by this column, ascending.
	less func(a, b *Row) bool
	cell func(r *Row, raw bool) string
}

func num(v float64) float64 {
	if math.IsNaN(v) {
		return math.Inf(-1) // no data sorts below every value
	}
	return v
}

// Columns in display order. LAUNCH/S and LAUNCHES count kernels that ran,
// direct launches and CUDA graph kernels together; GRAPH% is the share of
// the window's kernels that ran through graphs; SM% the driver-sampled
// utilization of the process (NVML); LAUNCH CPU% the on-CPU share of its
// busiest kernel-launching thread (near 100% with a low SM%: launch-bound,
// docs/METRICS.md); HELD IDLE is how long a
// process holding device memory has launched nothing ("-" when it holds
// none).
var Columns = []Column{
	{"namespace", "NAMESPACE", func(a, b *Row) bool { return a.Namespace < b.Namespace }, func(r *Row, _ bool) string { return dash(r.Namespace) }},
	{"pod", "POD", func(a, b *Row) bool { return a.Pod < b.Pod }, func(r *Row, _ bool) string { return dash(r.Pod) }},
	{"pid", "PID", func(a, b *Row) bool { return a.PID < b.PID }, func(r *Row, _ bool) string { return strconv.Itoa(r.PID) }},
	{"comm", "COMM", func(a, b *Row) bool { return a.Comm < b.Comm }, func(r *Row, _ bool) string { return dash(r.Comm) }},
	{"launch_rate", "LAUNCH/S", func(a, b *Row) bool { return a.LaunchRate < b.LaunchRate }, func(r *Row, _ bool) string { return fmt.Sprintf("%.1f", r.LaunchRate) }},
	{"graph_share", "GRAPH%", func(a, b *Row) bool { return num(a.GraphShare) < num(b.GraphShare) }, func(r *Row, raw bool) string { return percent(r.GraphShare, raw) }},
	{"launches", "LAUNCHES", func(a, b *Row) bool { return a.Launches < b.Launches }, func(r *Row, raw bool) string { return count(float64(r.Launches), raw) }},
	{"calls", "CALLS", func(a, b *Row) bool { return a.Calls < b.Calls }, func(r *Row, raw bool) string { return count(float64(r.Calls), raw) }},
	{"p50", "P50", func(a, b *Row) bool { return num(a.P50) < num(b.P50) }, func(r *Row, raw bool) string { return latency(r.P50, raw) }},
	{"p99", "P99", func(a, b *Row) bool { return num(a.P99) < num(b.P99) }, func(r *Row, raw bool) string { return latency(r.P99, raw) }},
	{"h2d", "H2D/S", func(a, b *Row) bool { return a.Memcpy["h2d"] < b.Memcpy["h2d"] }, func(r *Row, raw bool) string { return bytes(r.Memcpy["h2d"], raw) }},
	{"d2h", "D2H/S", func(a, b *Row) bool { return a.Memcpy["d2h"] < b.Memcpy["d2h"] }, func(r *Row, raw bool) string { return bytes(r.Memcpy["d2h"], raw) }},
	{"d2d", "D2D/S", func(a, b *Row) bool { return a.Memcpy["d2d"] < b.Memcpy["d2d"] }, func(r *Row, raw bool) string { return bytes(r.Memcpy["d2d"], raw) }},
	{"mem", "DEV MEM", func(a, b *Row) bool { return a.ActiveBytes < b.ActiveBytes }, func(r *Row, raw bool) string { return bytes(float64(r.ActiveBytes), raw) }},
	{"gpu_busy", "SM%", func(a, b *Row) bool { return num(a.GPUBusy) < num(b.GPUBusy) }, func(r *Row, raw bool) string { return percent(r.GPUBusy, raw) }},
	{"launch_cpu", "LAUNCH CPU%", func(a, b *Row) bool { return num(a.LaunchCPU) < num(b.LaunchCPU) }, func(r *Row, raw bool) string { return percent(r.LaunchCPU, raw) }},
	{"held_idle", "HELD IDLE", func(a, b *Row) bool { return num(a.HeldIdle) < num(b.HeldIdle) }, func(r *Row, raw bool) string { return latency(r.HeldIdle, raw) }},
	{"nccl", "NCCL/S", func(a, b *Row) bool { return a.NCCLRate < b.NCCLRate }, func(r *Row, raw bool) string { return bytes(r.NCCLRate, raw) }},
	{"nccl_oldest", "NCCL OLDEST", func(a, b *Row) bool { return num(a.NCCLOldest) < num(b.NCCLOldest) }, func(r *Row, raw bool) string { return latency(r.NCCLOldest, raw) }},
}

// ColumnIndex returns the index of the column with key, or -1.
func ColumnIndex(key string) int {
	for i, c := range Columns {
		if c.Key == key {
			return i
		}
	}
	return -1
}

// ColumnKeys lists the keys --sort accepts.
func ColumnKeys() []string {
	out := make([]string, len(Columns))
	for i, c := range Columns {
		out[i] = c.Key
	}
	return out
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func count(v float64, raw bool) string {
	if raw || v < 1e6 {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return fmt.Sprintf("%.1fM", v/1e6)
}

// percent prints a share in percent ("-" for none); not raw, whole
// percent, never rounding a little to 0 % or almost all to 100 %.
func percent(share float64, raw bool) string {
	switch {
	case math.IsNaN(share):
		return "-"
	case raw:
		return strconv.FormatFloat(share*100, 'f', -1, 64)
	case share > 0 && share < 0.01:
		return "<1%"
	case share < 1 && share > 0.99:
		return ">99%"
	}
	return fmt.Sprintf("%.0f%%", share*100)
}

// latency prints seconds; raw keeps full precision for scripts.
func latency(s float64, raw bool) string {
	switch {
	case math.IsNaN(s):
		return "-"
	case raw:
		return strconv.FormatFloat(s, 'g', -1, 64)
	case s < 1e-3:
		return fmt.Sprintf("%.1fµs", s*1e6)
	case s < 1:
		return fmt.Sprintf("%.1fms", s*1e3)
	default:
		return fmt.Sprintf("%.1fs", s)
	}
}

func bytes(v float64, raw bool) string {
	if raw {
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%.0f%s", v, units[0])
	}
	return fmt.Sprintf("%.1f%s", v, units[i])
}

// Sort orders the rows by column col, descending unless asc; ties by PID.
func (f *Frame) Sort(col int, asc bool) {
	c := Columns[col]
	sort.SliceStable(f.Rows, func(i, j int) bool {
		a, b := &f.Rows[i], &f.Rows[j]
		switch {
		case c.less(a, b):
			return asc
		case c.less(b, a):
			return !asc
		}
		return a.PID < b.PID
	})
}

// Render writes the frame as text: a header line, the table and the
// drops. raw prints exact numbers (bytes, seconds) instead of units.
func Render(f *Frame, agent string, col int, asc, raw bool) string {
	var b strings.Builder
	order := "desc"
	if asc {
		order = "asc"
	}
	fmt.Fprintf(&b, "profi top  %s  %s  window %s  tracked pids %d  processes %d  sort %s %s\n",
		agent, f.Time.Format(time.TimeOnly), f.Window.Round(time.Millisecond), f.Tracked, len(f.Rows), Columns[col].Key, order)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	titles := make([]string, len(Columns))
	for i, c := range Columns {
		titles[i] = c.Title
		if i == col {
			titles[i] += map[bool]string{true: "▲", false: "▼"}[asc]
		}
	}
	fmt.Fprintln(tw, strings.Join(titles, "\t"))
	for i := range f.Rows {
		cells := make([]string, len(Columns))
		for j, c := range Columns {
			cells[j] = c.cell(&f.Rows[i], raw)
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	_ = tw.Flush() // writes to a strings.Builder cannot fail
	drops := "drops 0"
	if f.Drops > 0 {
		names := make([]string, 0, len(f.DropsBy))
		for k := range f.DropsBy {
			names = append(names, k)
		}
		sort.Strings(names)
		parts := make([]string, len(names))
		for i, k := range names {
			parts[i] = fmt.Sprintf("%s=%d", k, f.DropsBy[k])
		}
		drops = fmt.Sprintf("drops %d (%s)", f.Drops, strings.Join(parts, " "))
	}
	b.WriteString(drops + "\n")
	for _, p := range f.Problems {
		b.WriteString("! " + p + "\n")
	}
	return b.String()
}
