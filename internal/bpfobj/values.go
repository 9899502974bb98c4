package bpfobj

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
