package aggregate

import (
	"math"
	"slices"
	"time"
)

// Hist is a latency histogram of one of the BPF value types: one
// non-cumulative bucket per bound of its family (bpfobj.LatencyBoundsNs,
// KernelLatencyBoundsNs or NCCLLatencyBoundsNs), the last one +Inf. The
// zero Hist is empty and takes its bucket count from the first add.
type Hist struct {
	Buckets []uint64
	SumNs   uint64
	Count   uint64
}

// newHist is the histogram of a BPF value: its timed count (which
// --sample-rate scales, an estimate, not the exact call count), its
// summed duration and its buckets (copied).
func newHist(timed, durationNs uint64, buckets []uint64) *Hist {
	return &Hist{Buckets: slices.Clone(buckets), SumNs: durationNs, Count: timed}
}

func (h *Hist) add(o *Hist) {
	if n := len(o.Buckets) - len(h.Buckets); n > 0 {
		h.Buckets = append(h.Buckets, make([]uint64, n)...)
	}
	for i, n := range o.Buckets {
		h.Buckets[i] += n
	}
	h.SumNs += o.SumNs
	h.Count += o.Count
}

// sub returns h − o (a window of a cumulative histogram); o may be empty.
func (h *Hist) sub(o *Hist) Hist {
	d := Hist{Buckets: make([]uint64, len(h.Buckets))}
	for i, n := range h.Buckets {
		if i < len(o.Buckets) {
			n -= min(n, o.Buckets[i])
		}
		d.Buckets[i] = n
	}
	d.SumNs = h.SumNs - min(h.SumNs, o.SumNs)
	d.Count = h.Count - min(h.Count, o.Count)
	return d
}

// clone returns a copy of h that shares nothing with it.
func (h *Hist) clone() Hist {
	return Hist{Buckets: slices.Clone(h.Buckets), SumNs: h.SumNs, Count: h.Count}
}

// Quantile estimates the q-quantile in seconds, boundsNs being h's
// family's bounds, the way PromQL's histogram_quantile does: linear
// interpolation inside the bucket that holds it; the last finite bound
// when it falls in +Inf. NaN when empty.
func (h *Hist) Quantile(q float64, boundsNs []uint64) float64 {
	if h.Count == 0 {
		return math.NaN()
	}
	rank := q * float64(h.Count)
	var cum uint64
	for i, n := range h.Buckets {
		if n == 0 || float64(cum+n) < rank {
			cum += n
			continue
		}
		if i == len(boundsNs) {
			return float64(boundsNs[i-1]) / 1e9
		}
		lo := 0.0
		if i > 0 {
			lo = float64(boundsNs[i-1])
		}
		hi := float64(boundsNs[i])
		return (lo + (hi-lo)*(rank-float64(cum))/float64(n)) / 1e9
	}
	return float64(boundsNs[len(boundsNs)-1]) / 1e9
}

// mergeInto adds h to dst[k], creating it; the snapshot never aliases
// the aggregator's own histograms.
func mergeInto[K comparable](dst map[K]*Hist, k K, h *Hist) {
	if dst[k] == nil {
		dst[k] = &Hist{}
	}
	dst[k].add(h)
}

// histKey is the label set of a snapshot histogram family (no pid label).
type histKey interface {
	comparable
	// tuple is the label set as --max-time-series counts it in family f.
	tuple(f seriesFamily) tuple
}

func (k HistKey) tuple(f seriesFamily) tuple {
	return tuple{fam: f, a: k.Op, b: k.Namespace + "/" + k.Pod, c: k.GPU}
}

func (k KernelHistKey) tuple(f seriesFamily) tuple {
	return tuple{fam: f, a: k.Name, b: k.Namespace + "/" + k.Pod, c: k.GPU + "/" + k.Class + "/" + k.Phase}
}

// histFamily is the aggregator's side of one snapshot histogram family:
// its --max-time-series family and the data of exited processes, which
// stays exported (histograms have no pid label).
type histFamily[K histKey] struct {
	fam     seriesFamily
	retired map[K]*Hist
	// exited is when a process last retired data under each key.
	exited map[K]time.Time
}

func newHistFamily[K histKey](fam seriesFamily) histFamily[K] {
	return histFamily[K]{fam: fam, retired: map[K]*Hist{}, exited: map[K]time.Time{}}
}

// retire keeps an exited process's histogram h under k, exited at now.
func (f *histFamily[K]) retire(k K, h *Hist, now time.Time) {
	mergeInto(f.retired, k, h)
	f.exited[k] = now
}

// expire drops the retained data of keys no live process has (live) whose
// last exit is RetainedExpiry old or more, with their --max-time-series
// tuples, and counts them. A key a live process still has is kept (its
// series would go backwards), and expires once that process has exited too.
func (f *histFamily[K]) expire(a *Aggregator, now time.Time, live map[K]bool) {
	for k, at := range f.exited {
		if live[k] || now.Sub(at) < RetainedExpiry {
			continue
		}
		delete(f.retired, k)
		delete(f.exited, k)
		delete(a.admitted, k.tuple(f.fam))
		a.expired++
	}
}

// add merges h into dst[k] if k's label set is admitted.
func (f *histFamily[K]) add(a *Aggregator, dst map[K]*Hist, k K, h *Hist) {
	if a.admit(k.tuple(f.fam)) {
		mergeInto(dst, k, h)
	}
}

// addRetired merges the retained histograms into dst.
func (f *histFamily[K]) addRetired(a *Aggregator, dst map[K]*Hist) {
	for k, h := range f.retired {
		f.add(a, dst, k, h)
	}
}
