package collector

import (
	"bufio"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
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
// Each series' exposition text (`name{labels}`) is built once and kept
// while the process's labels stay the same; a scrape writes it and the
// value. The dto path (protobuf scrapes, OTLP) builds label pairs only
// when it is used.

// procFamily is one per-process family.
type procFamily struct {
	name, help string
	typ        dto.MetricType // COUNTER or GAUGE
	labels     []string       // in the interface's order (the values' order)
	desc       *prometheus.Desc
	// series calls yield for each of p's series in this family: its key
	// within the process and its value.
	series func(p *aggregate.Process, yield func(k seriesKey, v float64))
	// values are a series' label values in labels' order (cache misses).
	values func(m aggregate.Meta, k seriesKey) []string

	// sorted maps sorted label positions to labels' positions: the
	// exposition orders label pairs by name, as client_golang does.
	sorted []int
	// header is the text format's HELP and TYPE lines; omHeader
	// OpenMetrics' (no _total on a counter's family name, quotes escaped).
	header, omHeader string
}

func newProcFamily(name, help string, typ dto.MetricType, labels []string,
	series func(p *aggregate.Process, yield func(k seriesKey, v float64)),
	values func(m aggregate.Meta, k seriesKey) []string,
) *procFamily {
	f := &procFamily{name: name, help: help, typ: typ, labels: labels, series: series, values: values}
	f.desc = prometheus.NewDesc(name, help, labels, nil)
	f.sorted = make([]int, len(labels))
	for i := range f.sorted {
		f.sorted[i] = i
	}
	slices.SortFunc(f.sorted, func(a, b int) int { return strings.Compare(labels[a], labels[b]) })
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

// seriesKey names a series within a process: its family and the label
// values that are not the process's own.
type seriesKey struct {
	f       *procFamily
	a, b, c string
}

// seriesCache keeps each per-process series' exposition between scrapes.
type seriesCache struct {
	mu    sync.Mutex
	gen   uint64
	procs map[aggregate.Meta]*procSeries
}

// procSeries are one process's cached series, keyed by its labels: a
// process whose pod labels arrive or whose GPU attribution changes gets
// a new entry, so a cached text never carries a stale label value, and
// the old one goes at the next sweep.
type procSeries struct {
	seen   uint64 // scrape generation that last used it
	used   int    // series used in this scrape
	series map[seriesKey]*cachedSeries
}

// cachedSeries is one series' `name{labels}` text and, once the dto path
// has used it, its label pairs.
type cachedSeries struct {
	text  string
	pairs []*dto.LabelPair
}

// begin starts a scrape of snapshot s: it returns each process's cache,
// in s.Processes' order. The caller holds sc.mu.
func (sc *seriesCache) begin(s *aggregate.Snapshot) []*procSeries {
	if sc.procs == nil {
		sc.procs = map[aggregate.Meta]*procSeries{}
	}
	sc.gen++
	out := make([]*procSeries, len(s.Processes))
	for i, p := range s.Processes {
		ps := sc.procs[p.Meta]
		if ps == nil {
			ps = &procSeries{series: map[seriesKey]*cachedSeries{}}
			sc.procs[p.Meta] = ps
		}
		ps.seen, ps.used = sc.gen, 0
		out[i] = ps
	}
	return out
}

// end forgets processes that were not in this scrape's snapshot and
// empties a process's cache when most of it is series that no longer
// exist, so the cache stays bounded by what the snapshot exports.
func (sc *seriesCache) end() {
	for m, ps := range sc.procs {
		switch {
		case ps.seen != sc.gen:
			delete(sc.procs, m)
		case len(ps.series) > 2*ps.used+64:
			ps.series = map[seriesKey]*cachedSeries{}
		}
	}
}

// get returns the cached series k of process m, building it on a miss.
func (sc *seriesCache) get(ps *procSeries, m aggregate.Meta, k seriesKey) *cachedSeries {
	ps.used++
	if cs := ps.series[k]; cs != nil {
		return cs
	}
	f := k.f
	v := validValues(f.values(m, k))
	var b strings.Builder
	b.WriteString(f.name)
	for i, j := range f.sorted {
		if i == 0 {
			b.WriteByte('{')
		} else {
			b.WriteByte(',')
		}
		b.WriteString(f.labels[j])
		b.WriteString(`="`)
		labelEscaper.WriteString(&b, v[j])
		b.WriteByte('"')
	}
	if len(f.sorted) > 0 {
		b.WriteByte('}')
	}
	cs := &cachedSeries{text: b.String()}
	ps.series[k] = cs
	return cs
}

// validValues replaces bytes that are not UTF-8 (a comm or kernel name
// can hold any) with U+FFFD: the registry would refuse the series and
// its counts would be lost.
func validValues(v []string) []string {
	for i := range v {
		if !utf8.ValidString(v[i]) {
			v[i] = strings.ToValidUTF8(v[i], "\uFFFD")
		}
	}
	return v
}

// pairsOf builds a series' label pairs in one block, sorted by name.
func pairsOf(f *procFamily, v []string) []*dto.LabelPair {
	block := make([]dto.LabelPair, len(v))
	out := make([]*dto.LabelPair, len(v))
	for i, j := range f.sorted {
		block[i].Name, block[i].Value = proto.String(f.labels[j]), &v[j]
		out[i] = &block[i]
	}
	return out
}

// writeFamilies writes the per-process families of s in the text format
// (OpenMetrics when om) to w; keep, when non-nil, selects families by
// name.
func (c *Collector) writeFamilies(w *bufio.Writer, s *aggregate.Snapshot, om bool, keep func(string) bool) {
	c.cache.mu.Lock()
	defer c.cache.mu.Unlock()
	procs := c.cache.begin(s)
	var num []byte
	for _, f := range c.procFamilies {
		if keep != nil && !keep(f.name) {
			continue
		}
		header := f.header
		if om {
			header = f.omHeader
		}
		for i, p := range s.Processes {
			f.series(p, func(k seriesKey, v float64) {
				k.f = f
				cs := c.cache.get(procs[i], p.Meta, k)
				if header != "" {
					w.WriteString(header)
					header = ""
				}
				w.WriteString(cs.text)
				w.WriteByte(' ')
				num = appendValue(num[:0], v, om)
				w.Write(num)
				w.WriteByte('\n')
			})
		}
	}
	c.cache.end()
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
// (protobuf scrapes, OTLP), each family's series in exposition order.
func (c *Collector) gatherFamilies(s *aggregate.Snapshot) []*dto.MetricFamily {
	c.cache.mu.Lock()
	defer c.cache.mu.Unlock()
	procs := c.cache.begin(s)
	var out []*dto.MetricFamily
	for _, f := range c.procFamilies {
		type series struct {
			cs *cachedSeries
			v  float64
		}
		var all []series
		for i, p := range s.Processes {
			f.series(p, func(k seriesKey, v float64) {
				k.f = f
				cs := c.cache.get(procs[i], p.Meta, k)
				if cs.pairs == nil {
					cs.pairs = pairsOf(f, validValues(f.values(p.Meta, k)))
				}
				all = append(all, series{cs, v})
			})
		}
		if len(all) == 0 {
			continue
		}
		slices.SortFunc(all, func(a, b series) int { return strings.Compare(a.cs.text, b.cs.text) })
		mf := &dto.MetricFamily{Name: proto.String(f.name), Help: proto.String(f.help), Type: f.typ.Enum()}
		ms := make([]dto.Metric, len(all))
		vals := make([]float64, len(all))
		for i, se := range all {
			vals[i] = se.v
			ms[i].Label = se.cs.pairs
			if f.typ == dto.MetricType_COUNTER {
				ms[i].Counter = &dto.Counter{Value: &vals[i]}
			} else {
				ms[i].Gauge = &dto.Gauge{Value: &vals[i]}
			}
			mf.Metric = append(mf.Metric, &ms[i])
		}
		out = append(out, mf)
	}
	c.cache.end()
	return out
}

// procFamilies returns the per-process families, sorted by name.
func procFamilies() []*procFamily {
	type yieldFunc = func(k seriesKey, v float64)
	meta := func(m aggregate.Meta) []string {
		return []string{strconv.Itoa(m.PID), m.Comm, m.Namespace, m.Pod, m.Container, m.GPU, m.GPUUUID}
	}
	// The families' values: key part a, the process's labels, then the
	// other key parts (interface.md 5.1's orders).
	aMetaB := func(m aggregate.Meta, k seriesKey) []string { return append(append([]string{k.a}, meta(m)...), k.b) }
	aMetaBC := func(m aggregate.Meta, k seriesKey) []string { return append(aMetaB(m, k), k.c) }
	onlyMeta := func(m aggregate.Meta, _ seriesKey) []string { return meta(m) }
	counter, gauge := dto.MetricType_COUNTER, dto.MetricType_GAUGE

	launch := func(name, help string, field func(aggregate.Launch) uint64) *procFamily {
		return newProcFamily(name, help, counter, kernelLabels, func(p *aggregate.Process, yield yieldFunc) {
			for k, l := range p.Launches {
				yield(seriesKey{a: k.Name, b: k.Class, c: k.Phase}, float64(field(l)))
			}
		}, aMetaBC)
	}
	memory := func(name, help string, typ dto.MetricType, has func(*aggregate.Process) bool, value func(*aggregate.Process) uint64) *procFamily {
		return newProcFamily(name, help, typ, memLabels, func(p *aggregate.Process, yield yieldFunc) {
			if has(p) {
				yield(seriesKey{}, float64(value(p)))
			}
		}, onlyMeta)
	}
	opStream := func(name, help string, m func(*aggregate.Process) map[aggregate.OpStream]uint64) *procFamily {
		return newProcFamily(name, help, counter, counterLabels, func(p *aggregate.Process, yield yieldFunc) {
			for k, v := range m(p) {
				yield(seriesKey{a: k.Op, b: k.Stream}, float64(v))
			}
		}, aMetaB)
	}
	fams := []*procFamily{
		opStream("profi_cuda_calls_total", "CUDA API calls per operation and stream.",
			func(p *aggregate.Process) map[aggregate.OpStream]uint64 { return p.Calls }),
		newProcFamily("profi_cuda_memcpy_bytes_total", "Bytes requested by successful cudaMemcpy/cudaMemcpyAsync calls, by direction (cudaMemcpyKind).", counter, memcpyLabels,
			func(p *aggregate.Process, yield yieldFunc) {
				for k, v := range p.Memcpy {
					yield(seriesKey{a: k.Direction, b: k.Stream}, float64(v))
				}
			}, aMetaB),
		memory("profi_cuda_malloc_bytes_total", "Bytes of device memory allocated by successful cudaMalloc and cudaMallocAsync calls.", counter,
			(*aggregate.Process).HasMemory, func(p *aggregate.Process) uint64 { return p.MallocBytes }),
		memory("profi_cuda_active_memory_bytes", "Device bytes allocated minus freed since the process was first attached; frees of earlier allocations are not subtracted.", gauge,
			(*aggregate.Process).HasMemory, (*aggregate.Process).ActiveBytes),
		newProcFamily("profi_cuda_errors_total", "Timed CUDA calls that returned non-zero (cudaError_t). Anonymous-mode launches are counted at entry and never appear here.", counter, errorLabels,
			func(p *aggregate.Process, yield yieldFunc) {
				for k, v := range p.Errors {
					yield(seriesKey{a: k.Op, b: k.Code}, float64(v))
				}
			}, aMetaB),
		launch("profi_cuda_kernel_launches_total", "Kernel launches (counted at entry, failed launches included). kernel=\"anonymous\" in anonymous mode.",
			func(l aggregate.Launch) uint64 { return l.Count }),
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
