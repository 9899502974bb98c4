package bpfobj

import "math"

// Add sums o into v: per-CPU values of one key, or a value into a total.
func (v *ProfiAggVal) Add(o *ProfiAggVal) {
	v.Count += o.Count
	v.Timed += o.Timed
	v.DurationNs += o.DurationNs
	v.Bytes += o.Bytes
	for i := range v.Buckets {
		v.Buckets[i] += o.Buckets[i]
	}
}

// Add sums o into v.
func (v *ProfiLaunchVal) Add(o *ProfiLaunchVal) {
	v.Count += o.Count
	v.GridBlocks += o.GridBlocks
	v.BlockThreads += o.BlockThreads
	v.SharedBytes += o.SharedBytes
	v.Timed += o.Timed
	v.DurationNs += o.DurationNs
	for i := range v.Buckets {
		v.Buckets[i] += o.Buckets[i]
	}
}

// Add sums o into v.
func (v *ProfiNcclVal) Add(o *ProfiNcclVal) {
	v.Count += o.Count
	v.Bytes += o.Bytes
	v.Timed += o.Timed
	v.DurationNs += o.DurationNs
	for i := range v.Buckets {
		v.Buckets[i] += o.Buckets[i]
	}
}

// AddScaled adds (cur − last) × f to v: the estimate of a duty-cycled
// key (see internal/budget). f == 1 adds the exact increase.
func (v *ProfiAggVal) AddScaled(cur, last *ProfiAggVal, f float64) {
	v.Count += scaledDelta(cur.Count, last.Count, f)
	v.Timed += scaledDelta(cur.Timed, last.Timed, f)
	v.DurationNs += scaledDelta(cur.DurationNs, last.DurationNs, f)
	v.Bytes += scaledDelta(cur.Bytes, last.Bytes, f)
	for i := range v.Buckets {
		v.Buckets[i] += scaledDelta(cur.Buckets[i], last.Buckets[i], f)
	}
}

// AddScaled adds (cur − last) × f to v.
func (v *ProfiLaunchVal) AddScaled(cur, last *ProfiLaunchVal, f float64) {
	v.Count += scaledDelta(cur.Count, last.Count, f)
	v.GridBlocks += scaledDelta(cur.GridBlocks, last.GridBlocks, f)
	v.BlockThreads += scaledDelta(cur.BlockThreads, last.BlockThreads, f)
	v.SharedBytes += scaledDelta(cur.SharedBytes, last.SharedBytes, f)
	v.Timed += scaledDelta(cur.Timed, last.Timed, f)
	v.DurationNs += scaledDelta(cur.DurationNs, last.DurationNs, f)
	for i := range v.Buckets {
		v.Buckets[i] += scaledDelta(cur.Buckets[i], last.Buckets[i], f)
	}
}

// scaledDelta is the increase from last to cur times f, rounded; a value
// below last (a re-created key) counts from zero.
func scaledDelta(cur, last uint64, f float64) uint64 {
	d := cur
	if cur >= last {
		d = cur - last
	}
	if f == 1 {
		return d
	}
	return uint64(math.Round(float64(d) * f))
}
