package collector

import (
	"bufio"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	"github.com/profi-dev/profi/internal/aggregate"
)

// The per-process families hold almost every series of a busy node (one
// per process × operation × stream, kernel, ...). They bypass the
// registry: at 5·10⁴ series its per-metric consistency checks, sorting and
// dto objects made one scrape take 0.6 s and most of the agent's garbage.
// A scrape writes each series from fixed text fragments (the family name
// and label names, sorted and quoted as expfmt writes them) and the
// label values, escaped once per process for the process's own labels.
// Nothing is kept per series between scrapes.

// procFamily is one per-process family.
type procFamily struct {
	name, help string
	typ        dto.MetricType   // COUNTER or GAUGE
	desc       *prometheus.Desc // labels in the interface's order
	// series calls yield for each of p's series in this family: its key
	// within the process and its value.
	series func(p *aggregate.Process, yield func(k seriesKey, v float64))
	// sorted are labels in name order (the exposition's order); sources
	// say where each one's value comes from.
	sorted  []string
	sources []labelSource
	// frags are the text around the values: frags[0] value frags[1] ...
	frags []string
	// header is the text format's HELP and TYPE lines; omHeader
	// OpenMetrics' (no _total on a counter's family name, quotes escaped).
	header, omHeader string
}

// labelSource is where a label value comes from: the process's labels
// (metaPID...metaGPUUUID) or a part of the series key (keyA...keyC).
type labelSource int

const (
	metaPID labelSource = iota
	metaComm
	metaNamespace
	metaPod
	metaContainer
	metaGPU
	metaGPUUUID
	keyA // the series key's parts
	keyB
	keyC
)

// numMeta is the number of process labels.
const numMeta = keyA

// metaLabels are the names of the process's own labels.
var metaLabels = [numMeta]string{"pid", "comm", "namespace", "pod", "container", "gpu", "gpu_uuid"}

// newProcFamily describes a family whose labels are named by labels;
// keyParts names the labels that come from the series key, in the order
// of its parts (a, b, c); every other label must be a process label.
func newProcFamily(name, help string, typ dto.MetricType, labels []string, keyParts []string,
	series func(p *aggregate.Process, yield func(k seriesKey, v float64)),
) *procFamily {
	f := &procFamily{name: name, help: help, typ: typ, series: series}
	f.desc = prometheus.NewDesc(name, help, labels, nil)
	f.sorted = slices.Sorted(slices.Values(labels))
	var b strings.Builder
	b.WriteString(name)
	for i, l := range f.sorted {
		src := labelSource(slices.Index(metaLabels[:], l))
		if k := slices.Index(keyParts, l); k >= 0 {
			src = keyA + labelSource(k)
		}
		if src < 0 {
			panic("collector: label " + l + " of " + name + " has no source")
		}
		f.sources = append(f.sources, src)
		if i == 0 {
			b.WriteByte('{')
		} else {
			b.WriteString(`",`)
		}
		b.WriteString(l + `="`)
		f.frags = append(f.frags, b.String())
		b.Reset()
	}
	if len(f.sorted) > 0 {
		b.WriteString(`"}`)
	}
	f.frags = append(f.frags, b.String()+" ")
	typName, omName := "gauge", name
	if typ == dto.MetricType_COUNTER {
		typName, omName = "counter", strings.TrimSuffix(name, "_total")
	}
	f.header = "# HELP " + name + " " + helpEscaper.Replace(help) + "\n# TYPE " + name + " " + typName + "\n"
	f.omHeader = "# HELP " + omName + " " + labelEscaper.Replace(help) + "\n# TYPE " + omName + " " + typName + "\n"
	return f
}

var (
	helpEscaper  = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
	labelEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)
)

// seriesKey names a series within a process and family: the label values
// that are not the process's own.
type seriesKey struct{ a, b, c string }

// procValues are a process's own label values, raw (valid UTF-8) and
// escaped for the text formats.
type procValues struct{ raw, text [numMeta]string }

// pidLabel is the pid label of a process: "" for the folded series of a
// container's exited processes (PID 0).
func pidLabel(pid int) string {
	if pid == 0 {
		return ""
	}
	return strconv.Itoa(pid)
}

func valuesOf(m aggregate.Meta) *procValues {
	pv := &procValues{raw: [numMeta]string{pidLabel(m.PID), m.Comm, m.Namespace, m.Pod, m.Container, m.GPU, m.GPUUUID}}
	for i, v := range pv.raw {
		pv.raw[i] = validUTF8(v)
		pv.text[i] = escapeLabel(pv.raw[i])
	}
	return pv
}

// part is key part src (keyA, keyB or keyC) of k.
func (k seriesKey) part(src labelSource) string {
	switch src {
	case keyA:
		return k.a
	case keyB:
		return k.b
	default:
		return k.c
	}
}

// plain reports whether v is ASCII without a character the text formats
// escape: most values, which then need neither check below.
func plain(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c >= utf8.RuneSelf || c == '\\' || c == '"' || c == '\n' {
			return false
		}
	}
	return true
}

// validUTF8 replaces bytes that are not UTF-8 (a comm or kernel name can
// hold any) with U+FFFD: the registry would refuse the series and its
// counts would be lost.
func validUTF8(v string) string {
	if plain(v) || utf8.ValidString(v) {
		return v
	}
	return strings.ToValidUTF8(v, "\uFFFD")
}

// escapeLabel is v as the text formats quote it (v valid UTF-8).
func escapeLabel(v string) string {
	if !strings.ContainsAny(v, "\\\"\n") {
		return v
	}
	return labelEscaper.Replace(v)
}

// textValue is v valid and escaped for the text formats.
func textValue(v string) string {
	if plain(v) {
		return v
	}
	return escapeLabel(validUTF8(v))
}

// writeFamilies writes the per-process families of s in the text format
// (OpenMetrics when om) to w; keep, when non-nil, selects families by
// name. Write errors are not checked here: a bufio.Writer keeps the
// first one, and the caller's Flush returns it.
func (c *Collector) writeFamilies(w *bufio.Writer, s *aggregate.Snapshot, om bool, keep func(string) bool) {
	exported := s.Exported()
	procs := make([]*procValues, len(exported))
	for i, p := range exported {
		procs[i] = valuesOf(p.Meta)
	}
	var num []byte
	for _, f := range c.procFamilies {
		if keep != nil && !keep(f.name) {
			continue
		}
		header := f.header
		if om {
			header = f.omHeader
		}
		for i, p := range exported {
			pv := procs[i]
			f.series(p, func(k seriesKey, v float64) {
				if header != "" {
					_, _ = w.WriteString(header)
					header = ""
				}
				for j, src := range f.sources {
					_, _ = w.WriteString(f.frags[j])
					if src < numMeta {
						_, _ = w.WriteString(pv.text[src])
					} else {
						_, _ = w.WriteString(textValue(k.part(src)))
					}
				}
				_, _ = w.WriteString(f.frags[len(f.sources)])
				num = appendValue(num[:0], v, om)
				_, _ = w.Write(num)
				_ = w.WriteByte('\n')
			})
		}
	}
}

// appendValue formats v as expfmt does: the text format as Go's %v, and
// OpenMetrics always with a decimal point or exponent.
func appendValue(b []byte, v float64, om bool) []byte {
	switch {
	case math.IsInf(v, +1):
		return append(b, "+Inf"...)
	case math.IsInf(v, -1):
		return append(b, "-Inf"...)
	case math.IsNaN(v):
		return append(b, "NaN"...)
	}
	n := len(b)
	b = strconv.AppendFloat(b, v, 'g', -1, 64)
	if om && !strings.ContainsAny(string(b[n:]), "e.") {
		b = append(b, '.', '0')
	}
	return b
}

// gatherFamilies builds the per-process families of s as dto families
// (protobuf scrapes, OTLP), each family's series in the registry's order
// (label values compared in label-name order). A process's own label
// pairs are shared by all its series.
func (c *Collector) gatherFamilies(s *aggregate.Snapshot) []*dto.MetricFamily {
	exported := s.Exported()
	procs := make([][numMeta]*dto.LabelPair, len(exported))
	for i, p := range exported {
		pv := valuesOf(p.Meta)
		for j := range numMeta {
			procs[i][j] = &dto.LabelPair{Name: &metaLabels[j], Value: &pv.raw[j]}
		}
	}
	var out []*dto.MetricFamily
	for _, f := range c.procFamilies {
		n, nKey, count := len(f.sources), 0, 0
		for _, src := range f.sources {
			if src >= numMeta {
				nKey++
			}
		}
		for _, p := range exported {
			f.series(p, func(seriesKey, float64) { count++ })
		}
		if count == 0 {
			continue
		}
		// One block each: labels (n per series), the key parts' pairs and
		// values, the values.
		labels := make([]*dto.LabelPair, 0, count*n)
		keyPairs := make([]dto.LabelPair, 0, count*nKey)
		keyValues := make([]string, 0, count*nKey)
		vals := make([]float64, 0, count)
		for i, p := range exported {
			f.series(p, func(k seriesKey, v float64) {
				for j, src := range f.sources {
					if src < numMeta {
						labels = append(labels, procs[i][src])
						continue
					}
					keyValues = append(keyValues, validUTF8(k.part(src)))
					keyPairs = append(keyPairs, dto.LabelPair{Name: &f.sorted[j], Value: &keyValues[len(keyValues)-1]})
					labels = append(labels, &keyPairs[len(keyPairs)-1])
				}
				vals = append(vals, v)
			})
		}
		order := make([]int, len(vals))
		for i := range order {
			order[i] = i
		}
		slices.SortFunc(order, func(x, y int) int {
			for j := range n {
				if c := strings.Compare(labels[x*n+j].GetValue(), labels[y*n+j].GetValue()); c != 0 {
					return c
				}
			}
			return 0
		})
		mf := &dto.MetricFamily{Name: proto.String(f.name), Help: proto.String(f.help), Type: f.typ.Enum(), Metric: make([]*dto.Metric, len(vals))}
		ms := make([]dto.Metric, len(vals))
		var counters []dto.Counter
		var gauges []dto.Gauge
		if f.typ == dto.MetricType_COUNTER {
			counters = make([]dto.Counter, len(vals))
		} else {
			gauges = make([]dto.Gauge, len(vals))
		}
		for i, x := range order {
			ms[i].Label = labels[x*n : x*n+n : x*n+n]
			if counters != nil {
				counters[i].Value = &vals[x]
				ms[i].Counter = &counters[i]
			} else {
				gauges[i].Value = &vals[x]
				ms[i].Gauge = &gauges[i]
			}
			mf.Metric[i] = &ms[i]
		}
		out = append(out, mf)
	}
	return out
}

// procFamilies returns the per-process families, sorted by name.
func procFamilies() []*procFamily {
	type yieldFunc = func(k seriesKey, v float64)
	counter, gauge := dto.MetricType_COUNTER, dto.MetricType_GAUGE
	kernels := func(name, help string, m func(*aggregate.Process) map[aggregate.Kernel]aggregate.Launch, field func(aggregate.Launch) uint64) *procFamily {
		return newProcFamily(name, help, counter, kernelLabels, []string{"kernel", "kernel_class", "phase"}, func(p *aggregate.Process, yield yieldFunc) {
			for k, l := range m(p) {
				yield(seriesKey{k.Name, k.Class, k.Phase}, float64(field(l)))
			}
		})
	}
	launch := func(name, help string, field func(aggregate.Launch) uint64) *procFamily {
		return kernels(name, help, func(p *aggregate.Process) map[aggregate.Kernel]aggregate.Launch { return p.Launches }, field)
	}
	launchCount := func(l aggregate.Launch) uint64 { return l.Count }
	memory := func(name, help string, typ dto.MetricType, has func(*aggregate.Process) bool, value func(*aggregate.Process) uint64) *procFamily {
		return newProcFamily(name, help, typ, memLabels, nil, func(p *aggregate.Process, yield yieldFunc) {
			if has(p) {
				yield(seriesKey{}, float64(value(p)))
			}
		})
	}
	opStream := func(name, help string, m func(*aggregate.Process) map[aggregate.OpStream]uint64) *procFamily {
		return newProcFamily(name, help, counter, counterLabels, []string{"operation", "stream"}, func(p *aggregate.Process, yield yieldFunc) {
			for k, v := range m(p) {
				yield(seriesKey{a: k.Op, b: k.Stream}, float64(v))
			}
		})
	}
	fams := []*procFamily{
		opStream("profi_cuda_calls_total", "CUDA API calls per operation and stream.",
			func(p *aggregate.Process) map[aggregate.OpStream]uint64 { return p.Calls }),
		newProcFamily("profi_cuda_memcpy_bytes_total", "Bytes requested by successful cudaMemcpy/cudaMemcpyAsync calls, by direction (cudaMemcpyKind).", counter, memcpyLabels,
			[]string{"direction", "stream"}, func(p *aggregate.Process, yield yieldFunc) {
				for k, v := range p.Memcpy {
					yield(seriesKey{a: k.Direction, b: k.Stream}, float64(v))
				}
			}),
		memory("profi_cuda_malloc_bytes_total", "Bytes of device memory allocated by successful cudaMalloc and cudaMallocAsync calls.", counter,
			(*aggregate.Process).HasMemory, func(p *aggregate.Process) uint64 { return p.MallocBytes }),
		memory("profi_cuda_active_memory_bytes", "Device bytes allocated minus freed since the process was first attached; frees of earlier allocations are not subtracted. Live processes only.", gauge,
			(*aggregate.Process).HasActiveMemory, (*aggregate.Process).ActiveBytes),
		newProcFamily("profi_cuda_held_idle_seconds", "Seconds since the process last launched a kernel on this GPU (eagerly or by a CUDA graph replay; host-side launches, not GPU execution), while it holds device memory there (profi_cuda_active_memory_bytes > 0); counted from when the agent first saw the process at the latest, at drain granularity. Live processes only.", gauge, memLabels,
			nil, func(p *aggregate.Process, yield yieldFunc) {
				if p.HoldsIdle() {
					yield(seriesKey{}, p.IdleFor.Seconds())
				}
			}),
		newProcFamily("profi_cuda_launch_thread_cpu_seconds_total", "CPU time (user and system, from each thread's start) of the process's threads that launched a kernel, sampled at every drain; a thread that exited counts until its last sample. Its rate over the number of launching threads is their on-CPU share: near 1 with a GPU that is not busy is a launch-bound process (docs/METRICS.md). Live processes only.", counter, procLabels,
			nil, func(p *aggregate.Process, yield yieldFunc) {
				if p.LaunchThreads > 0 || p.LaunchThreadCPU > 0 {
					yield(seriesKey{}, p.LaunchThreadCPU.Seconds())
				}
			}),
		newProcFamily("profi_cuda_launch_threads", "Live threads of the process that launched a kernel (the ones profi_cuda_launch_thread_cpu_seconds_total samples). Live processes only.", gauge, procLabels,
			nil, func(p *aggregate.Process, yield yieldFunc) {
				if p.LaunchThreads > 0 || p.LaunchThreadCPU > 0 {
					yield(seriesKey{}, float64(p.LaunchThreads))
				}
			}),
		newProcFamily("profi_cuda_launch_thread_busy_ratio", "On-CPU share of the process's busiest kernel-launching thread over the last complete 5 s window (0-1). Live processes only.", gauge, procLabels,
			nil, func(p *aggregate.Process, yield yieldFunc) {
				if b := p.LaunchBound; b != nil {
					yield(seriesKey{}, b.BusiestShare)
				}
			}),
		newProcFamily("profi_cuda_errors_total", "Timed CUDA calls that returned non-zero (cudaError_t). Anonymous-mode launches are counted at entry and never appear here.", counter, errorLabels,
			[]string{"operation", "error_code"}, func(p *aggregate.Process, yield yieldFunc) {
				for k, v := range p.Errors {
					yield(seriesKey{a: k.Op, b: k.Code}, float64(v))
				}
			}),
		launch("profi_cuda_kernel_launches_total", "Kernel launches (counted at entry, failed launches included), not those recorded into a CUDA graph. kernel=\"anonymous\" in anonymous mode.",
			launchCount),
		kernels("profi_cuda_graph_captured_launches_total", "Launch calls made on a stream capturing a CUDA graph: recorded into the graph, they ran nothing then.",
			func(p *aggregate.Process) map[aggregate.Kernel]aggregate.Launch { return p.Captured }, launchCount),
		kernels("profi_cuda_graph_kernel_launches_total", "Kernels run by CUDA graph replays: each successful cudaGraphLaunch/cuGraphLaunch adds each kernel node of its graph once. Kernels that ran = this + profi_cuda_kernel_launches_total.",
			func(p *aggregate.Process) map[aggregate.Kernel]aggregate.Launch { return p.Graph }, launchCount),
		launch("profi_cuda_kernel_grid_blocks_total", "Sum of gridDim.x*y*z over kernel launches; divide by launches for the mean grid size.",
			func(l aggregate.Launch) uint64 { return l.GridBlocks }),
		launch("profi_cuda_kernel_block_threads_total", "Sum of blockDim.x*y*z over kernel launches; divide by launches for the mean block size.",
			func(l aggregate.Launch) uint64 { return l.BlockThreads }),
		launch("profi_cuda_kernel_shared_memory_bytes_total", "Sum of dynamic shared memory requested by kernel launches.",
			func(l aggregate.Launch) uint64 { return l.SharedBytes }),
		opStream("profi_cuda_memset_bytes_total", "Bytes set by successful cudaMemset/cudaMemsetAsync calls (never counted as memcpy).",
			func(p *aggregate.Process) map[aggregate.OpStream]uint64 { return p.Memset }),
		memory("profi_cuda_malloc_host_bytes_total", "Pinned host bytes allocated by successful cudaMallocHost calls (not device memory).", counter,
			(*aggregate.Process).HasHostMemory, func(p *aggregate.Process) uint64 { return p.MallocHostBytes }),
	}
	slices.SortFunc(fams, func(a, b *procFamily) int { return strings.Compare(a.name, b.name) })
	return fams
}
