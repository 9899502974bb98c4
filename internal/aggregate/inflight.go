package aggregate

import (
	"time"

	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/ops"
)

// UnsampledAge is CUDAInFlight's age of an operation none of whose calls
// in progress had its start sampled (--sample-rate): in progress, age
// unknown.
const UnsampledAge time.Duration = -1

// cudaInflight records, per process, the oldest timed CUDA call in
// progress by operation: what a process was blocked in when its GPU
// faulted (the Xid blast radius, internal/xid). The inflight map holds
// one entry per thread in a timed call (the outermost of nested ones).
func (a *Aggregator) cudaInflight(procs map[int]*Process, now uint64) error {
	return a.opts.Source.CUDAInflight(func(tid uint64, c *bpfobj.ProfiInflightCall) {
		p := procs[int(tid>>32)]
		if p == nil || (c.Sampled != 0 && now < c.StartNs) {
			return // exited (its entries are deleted), or entered after the drain began
		}
		if p.CUDAInFlight == nil {
			p.CUDAInFlight = map[string]time.Duration{}
		}
		op := ops.Name(c.Op)
		age := UnsampledAge
		if c.Sampled != 0 {
			age = time.Duration(now - c.StartNs)
		}
		if prev, ok := p.CUDAInFlight[op]; !ok || age > prev {
			p.CUDAInFlight[op] = age
		}
	})
}
