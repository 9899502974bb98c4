package collector

import (
	"strconv"
	"sync"
	"time"

	"github.com/profi-dev/profi/internal/aggregate"
	"github.com/profi-dev/profi/internal/nvml"
)

// GPU seconds per pod (issue 43; docs/METRICS.md, "GPU seconds per pod").
// NVML's busy totals are per device and process (nvml.ProcessBusy); what
// users aggregate by, and what outlives a process, is the pod. Each scrape
// folds every process's increase since the last fold into a counter per
// GPU, device, pod and engine, labelled by the aggregator's view of the PID
// then (empty labels outside Kubernetes, or for a process profi does not
// profile). A PID the aggregator has not seen yet waits up to
// busyLabelWait for its labels before its increase is folded unlabelled.

// busyLabelWait bounds how long a process's busy time waits for the
// aggregator to label its PID (it drains every second).
const busyLabelWait = 30 * time.Second

// busyExpiry drops a pod's counters once they have not grown for this
// long: a pod gone for an hour, not a pod that idles (its counters stay
// while any of its processes keeps a sample within nvml's keep window).
const busyExpiry = time.Hour

type busyProc struct {
	uuid string
	pid  uint32
}

type busySeries struct{ gpu, uuid, namespace, pod, container string }

// busyEngines are the engine label values, in busyTotal.sec order.
var busyEngines = [4]string{"sm", "memory", "encoder", "decoder"}

type busyTotal struct {
	sec     [4]float64
	changed time.Time
}

// busyPods folds NVML's per-process busy totals into per-pod counters.
type busyPods struct {
	mu      sync.Mutex
	last    map[busyProc]nvml.ProcessBusy // totals folded so far
	waiting map[busyProc]time.Time        // unlabelled since
	totals  map[busySeries]*busyTotal
}

func newBusyPods() *busyPods {
	return &busyPods{last: map[busyProc]nvml.ProcessBusy{}, waiting: map[busyProc]time.Time{}, totals: map[busySeries]*busyTotal{}}
}

// fold adds each process's increase since the last fold of snapshot s
// (taken at now) to its pod's counters, and returns the counters.
func (b *busyPods) fold(s *nvml.Snapshot, pods map[int]aggregate.Meta, now time.Time) map[busySeries]busyTotal {
	b.mu.Lock()
	defer b.mu.Unlock()
	present := map[busyProc]bool{}
	for _, g := range s.GPUs {
		gpu := strconv.Itoa(g.Index)
		for _, p := range g.ProcessBusy {
			k := busyProc{p.UUID, p.PID}
			present[k] = true
			m, known := pods[int(p.PID)]
			if !known {
				since, ok := b.waiting[k]
				if !ok {
					b.waiting[k] = now
					continue
				}
				if now.Sub(since) < busyLabelWait {
					continue
				}
			}
			delete(b.waiting, k)
			prev := b.last[k]
			d := [4]time.Duration{p.SM - prev.SM, p.Memory - prev.Memory, p.Encoder - prev.Encoder, p.Decoder - prev.Decoder}
			b.last[k] = p
			key := busySeries{gpu, p.UUID, m.Namespace, m.Pod, m.Container}
			t := b.totals[key]
			if t == nil {
				t = &busyTotal{changed: now}
				b.totals[key] = t
			}
			for i, v := range d {
				if v > 0 {
					t.sec[i] += v.Seconds()
					t.changed = now
				}
			}
		}
	}
	for k := range b.last {
		if !present[k] {
			delete(b.last, k) // nvml forgot it: its final totals were folded
		}
	}
	for k := range b.waiting {
		if !present[k] {
			delete(b.waiting, k)
		}
	}
	out := make(map[busySeries]busyTotal, len(b.totals))
	for k, t := range b.totals {
		if now.Sub(t.changed) > busyExpiry {
			delete(b.totals, k)
			continue
		}
		out[k] = *t
	}
	return out
}
