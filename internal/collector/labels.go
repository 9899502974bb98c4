package collector

import (
	"slices"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/profi-dev/profi/internal/aggregate"
)

// labelCache keeps each per-process series' label pairs between scrapes.
// Building them (MakeLabelPairs: sort, one allocation per label, UTF-8
// checks) was the largest part of a scrape at 5·10⁴ series; the values
// are still read from the snapshot at every scrape.
type labelCache struct {
	mu    sync.Mutex
	gen   uint64
	procs map[int]*procLabels
	names map[*prometheus.Desc][]*string // label names in pair order, shared by the family's series
}

// pack copies pairs into one contiguous block with the family's shared
// name strings. Every scrape walks every pair three times (registry
// checks, escaping, encoding); MakeLabelPairs' scattered small objects
// made those walks mostly cache misses at 5·10⁴ series.
func (lc *labelCache) pack(d *prometheus.Desc, pairs []*dto.LabelPair) []*dto.LabelPair {
	names := lc.names[d]
	if names == nil {
		if lc.names == nil {
			lc.names = map[*prometheus.Desc][]*string{}
		}
		for _, p := range pairs {
			names = append(names, p.Name)
		}
		lc.names[d] = names
	}
	block := make([]dto.LabelPair, len(pairs))
	values := make([]string, len(pairs))
	out := make([]*dto.LabelPair, len(pairs))
	for i, p := range pairs {
		values[i] = p.GetValue()
		block[i].Name, block[i].Value = names[i], &values[i]
		out[i] = &block[i]
	}
	return out
}

// procLabels are one process's cached series. They are dropped when its
// metadata changes (pod labels arrive, GPU attribution changes), so a
// cached pair never carries a stale label value.
type procLabels struct {
	cache *labelCache
	meta  aggregate.Meta
	seen  uint64 // scrape generation that last used it
	used  int    // series used in this scrape
	pairs map[seriesKey]cachedLabels
}

// cachedLabels are a series' label pairs and its sort key: the values in
// label-name order, NUL-separated, which orders series as the registry
// does (internal.MetricSorter), so its sort of our output finds it sorted.
type cachedLabels struct {
	pairs []*dto.LabelPair
	order string
}

// seriesKey names a series within a process: its family and the label
// values that are not the process's own.
type seriesKey struct {
	d       *prometheus.Desc
	a, b, c string
}

// proc returns the cache of the process m, emptied if m changed.
func (lc *labelCache) proc(m aggregate.Meta, gen uint64) *procLabels {
	if lc.procs == nil {
		lc.procs = map[int]*procLabels{}
	}
	pl := lc.procs[m.PID]
	if pl == nil || pl.meta != m {
		pl = &procLabels{cache: lc, meta: m, pairs: map[seriesKey]cachedLabels{}}
		lc.procs[m.PID] = pl
	}
	pl.seen, pl.used = gen, 0
	return pl
}

// sweep forgets processes that were not in this scrape's snapshot.
func (lc *labelCache) sweep() {
	for pid, pl := range lc.procs {
		if pl.seen != lc.gen {
			delete(lc.procs, pid)
		}
	}
}

// trim empties a process's cache when most of it is series that no
// longer exist, so it stays bounded by what the snapshot exports.
func (pl *procLabels) trim() {
	if len(pl.pairs) > 2*pl.used+64 {
		pl.pairs = map[seriesKey]cachedLabels{}
	}
}

// metric returns the series' metric with value v; labels gives the label
// values in the family's order and is called only on a cache miss.
func (pl *procLabels) metric(d *prometheus.Desc, t prometheus.ValueType, v float64, k seriesKey, labels func() []string) (prometheus.Metric, string) {
	pl.used++
	cl, ok := pl.pairs[k]
	if !ok {
		lv := labels()
		// Validates the values (count, UTF-8) as the first scrape of the
		// series always did.
		if _, err := prometheus.NewConstMetric(d, t, v, lv...); err != nil {
			return prometheus.NewInvalidMetric(d, err), ""
		}
		cl.pairs = pl.cache.pack(d, prometheus.MakeLabelPairs(d, lv))
		var b strings.Builder
		for _, p := range cl.pairs {
			b.WriteString(p.GetValue())
			b.WriteByte(0)
		}
		cl.order = b.String()
		pl.pairs[k] = cl
	}
	return &cachedMetric{desc: d, typ: t, val: v, labels: cl.pairs}, cl.order
}

// sortedMetrics gathers the per-process series of one scrape by family
// and sends each family in the registry's order. The registry sorts
// every family anyway; comparing one cached string here is much cheaper
// than its label-by-label comparison of unsorted input, and its sort of
// sorted input is linear.
type sortedMetrics map[*prometheus.Desc][]orderedMetric

type orderedMetric struct {
	order string
	m     prometheus.Metric
}

func (s sortedMetrics) add(d *prometheus.Desc, m prometheus.Metric, order string) {
	s[d] = append(s[d], orderedMetric{order, m})
}

func (s sortedMetrics) send(ch chan<- prometheus.Metric) {
	for _, ms := range s {
		slices.SortFunc(ms, func(a, b orderedMetric) int { return strings.Compare(a.order, b.order) })
		for _, m := range ms {
			ch <- m.m
		}
	}
}

// cachedMetric is a const metric whose label pairs are shared between
// scrapes; nothing downstream modifies them (the registry and encoders
// only read label pairs).
type cachedMetric struct {
	desc   *prometheus.Desc
	typ    prometheus.ValueType
	val    float64
	labels []*dto.LabelPair
}

func (m *cachedMetric) Desc() *prometheus.Desc { return m.desc }

func (m *cachedMetric) Write(out *dto.Metric) error {
	out.Label = m.labels
	switch m.typ {
	case prometheus.CounterValue:
		out.Counter = &dto.Counter{Value: &m.val}
	default:
		out.Gauge = &dto.Gauge{Value: &m.val}
	}
	return nil
}
