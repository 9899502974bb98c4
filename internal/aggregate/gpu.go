package aggregate

import (
	"cmp"
	"maps"
	"slices"

	"github.com/profi-dev/profi/internal/bpfobj"
)

// GPUAttribution is one device of a process counted in a Process entry,
// and how its GPU was found (for /status).
type GPUAttribution struct {
	// Ordinal is the CUDA device ordinal the calling threads had set with
	// cudaSetDevice; -1 for threads that never set one.
	Ordinal int
	// Source is how the GPU was found: cudaSetDevice, nvml_process,
	// device_file or default (see internal/gpu).
	Source string
}

// gpuPart is a process's map values on one GPU (one gpu/gpu_uuid pair).
type gpuPart struct {
	meta  Meta
	attrs []GPUAttribution
	data  *pidData
}

// splitByGPU divides a process's keys by the GPU labels of their device.
// Devices with the same labels (e.g. no cudaSetDevice and ordinal 0) share
// one part, so each GPU is one set of series. Parts are in GPU order.
func (a *Aggregator) splitByGPU(ps *procState, d *pidData) []gpuPart {
	if a.opts.GPUs == nil {
		return []gpuPart{{meta: ps.meta, data: d}}
	}
	devs := map[uint32]bool{}
	for k := range d.agg {
		devs[k.Dev] = true
	}
	for k := range d.launch {
		devs[k.Dev] = true
	}
	for k := range d.nccl {
		devs[k.Dev] = true
	}
	for k := range d.graphLaunch {
		devs[k.Dev] = true
	}
	for k := range d.graphBytes {
		devs[k.dev] = true
	}
	byLabels := map[[2]string]*gpuPart{}
	partOf := map[uint32]*gpuPart{}
	for _, dev := range slices.Sorted(maps.Keys(devs)) {
		gpu, uuid, src := a.opts.GPUs.GPU(ps.meta.PID, ps.start, dev)
		part := byLabels[[2]string{gpu, uuid}]
		if part == nil {
			meta := ps.meta
			meta.GPU, meta.GPUUUID = gpu, uuid
			part = &gpuPart{meta: meta, data: newPIDData()}
			byLabels[[2]string{gpu, uuid}] = part
		}
		ord := int(dev)
		if dev == bpfobj.DevNone || dev == bpfobj.DevInvalid {
			ord = -1
		}
		part.attrs = append(part.attrs, GPUAttribution{Ordinal: ord, Source: src})
		partOf[dev] = part
	}
	if len(byLabels) == 1 {
		// One set of labels (the usual case): the process's data as it is,
		// not a copy of every key.
		for _, p := range byLabels {
			p.data = d
			return []gpuPart{*p}
		}
	}
	for k, v := range d.agg {
		partOf[k.Dev].data.agg[k] = v
	}
	for k, v := range d.launch {
		partOf[k.Dev].data.launch[k] = v
	}
	for k, v := range d.nccl {
		partOf[k.Dev].data.nccl[k] = v
	}
	for k, v := range d.graphLaunch {
		partOf[k.Dev].data.graphLaunch[k] = v
	}
	for k, v := range d.graphBytes {
		partOf[k.dev].data.graphBytes[k] = v
	}
	out := make([]gpuPart, 0, len(byLabels))
	for _, p := range byLabels {
		out = append(out, *p)
	}
	slices.SortFunc(out, func(x, y gpuPart) int {
		return cmp.Or(cmp.Compare(len(x.meta.GPU), len(y.meta.GPU)), cmp.Compare(x.meta.GPU, y.meta.GPU), cmp.Compare(x.meta.GPUUUID, y.meta.GPUUUID))
	})
	return out
}

// mergePerPID moves the per-communicator NCCL series, whose labels carry
// no GPU, to a process's first entry, so each is exported once. (Hangs,
// in-flight ages and straggler ratios are set on that entry directly.)
func mergePerPID(parts []*Process) {
	if len(parts) < 2 {
		return
	}
	first := parts[0]
	for _, p := range parts[1:] {
		if p.NCCL == nil || (len(p.NCCL.CommCalls) == 0 && len(p.NCCL.CommBytes) == 0) {
			continue
		}
		if first.NCCL == nil {
			first.NCCL = &NCCL{Calls: map[string]uint64{}, Bytes: map[string]uint64{}, hists: map[string]*Hist{}}
		}
		if first.NCCL.CommCalls == nil {
			first.NCCL.CommCalls, first.NCCL.CommBytes = map[CommOp]uint64{}, map[CommOp]uint64{}
		}
		for k, v := range p.NCCL.CommCalls {
			first.NCCL.CommCalls[k] += v
		}
		for k, v := range p.NCCL.CommBytes {
			first.NCCL.CommBytes[k] += v
		}
		p.NCCL.CommCalls, p.NCCL.CommBytes = map[CommOp]uint64{}, map[CommOp]uint64{}
	}
}
