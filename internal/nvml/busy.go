package nvml

import (
	"cmp"
	"slices"
	"time"
)

// Busy seconds per process (issue 43: GPU seconds per pod, a usage basis
// for cost). Each process sample the driver returns
// (nvmlDeviceGetProcessUtilization) is a utilization over one sampling
// period of the device, stamped with the period's end: a process's busy
// time on an engine is the sum over its samples of utilization × period.
// A sample's period is the time since the previous timestamp the device
// reported (any process: the driver samples the device, then reports the
// processes that ran). The first timestamp of a device after the agent
// (or its NVML) started has no previous one: it only opens the count. A
// gap longer than maxSamplePeriod means nothing ran in between, not a
// long period: the device's last period stands in. Every sample newer
// than the last one read counts once: an older one the driver returns
// again, and a second sample of one process at one timestamp, do not.

// maxSamplePeriod bounds a sampling period: the driver samples every
// fraction of a second while anything runs.
const maxSamplePeriod = time.Second

// ProcessBusy is the busy time of one process on one device (GPU or MIG
// device) since the agent started, per engine: cumulative.
type ProcessBusy struct {
	UUID                         string
	PID                          uint32
	SM, Memory, Encoder, Decoder time.Duration
	// Last is when its last sample was taken (NVML's timestamp, µs).
	Last uint64
}

// busyCounter integrates process samples per device and process.
type busyCounter struct {
	dev   map[string]*busyDevice
	procs map[busyKey]*ProcessBusy
}

// busyDevice is where a device's sampling stands (µs).
type busyDevice struct {
	last   uint64 // its newest timestamp
	period uint64 // its last period within maxSamplePeriod; 0: none yet
	cur    uint64 // the period of the newest timestamp; 0: it opened the count
}

type busyKey struct {
	uuid string
	pid  uint32
}

func newBusyCounter() *busyCounter {
	return &busyCounter{dev: map[string]*busyDevice{}, procs: map[busyKey]*ProcessBusy{}}
}

// restart forgets the devices' timestamps (NVML started again: its
// clock's first sample opens the count again); totals stay.
func (b *busyCounter) restart() { clear(b.dev) }

// add integrates the samples of device uuid newer than lastSeen and than
// the device's newest timestamp.
func (b *busyCounter) add(uuid string, samples []ProcessSample, lastSeen uint64) {
	d := b.dev[uuid]
	fresh := make([]ProcessSample, 0, len(samples))
	for _, s := range samples {
		if s.TimeStamp > lastSeen && (d == nil || s.TimeStamp > d.last) {
			fresh = append(fresh, s)
		}
	}
	slices.SortStableFunc(fresh, func(x, y ProcessSample) int { return cmp.Compare(x.TimeStamp, y.TimeStamp) })
	counted := map[busyKey]uint64{} // process → its timestamp counted last
	for _, s := range fresh {
		switch {
		case d == nil: // the first timestamp: opens the count
			d = &busyDevice{last: s.TimeStamp}
			b.dev[uuid] = d
		case s.TimeStamp != d.last:
			gap := s.TimeStamp - d.last
			d.last = s.TimeStamp
			if gap <= uint64(maxSamplePeriod/time.Microsecond) {
				d.period = gap
			}
			d.cur = d.period // after a longer gap, the last period; none yet: opens the count
		}
		if d.cur == 0 {
			continue
		}
		k := busyKey{uuid, s.PID}
		if ts, dup := counted[k]; dup && ts == s.TimeStamp {
			continue
		}
		counted[k] = s.TimeStamp
		period := time.Duration(d.cur) * time.Microsecond
		p := b.procs[k]
		if p == nil {
			p = &ProcessBusy{UUID: uuid, PID: s.PID}
			b.procs[k] = p
		}
		p.SM += share(s.SM, period)
		p.Memory += share(s.Memory, period)
		p.Encoder += share(s.Encoder, period)
		p.Decoder += share(s.Decoder, period)
		p.Last = s.TimeStamp
	}
}

// share is pct percent (at most 100) of period.
func share(pct uint32, period time.Duration) time.Duration {
	return period * time.Duration(min(pct, 100)) / 100
}

// of returns the totals of the processes of device uuid, sorted by PID,
// and forgets those without a sample for keep before the device's newest
// one: a reader (the collector, every scrape) has read their final totals
// by then.
func (b *busyCounter) of(uuid string, keep time.Duration) []ProcessBusy {
	d := b.dev[uuid]
	var out []ProcessBusy
	for k, p := range b.procs {
		if k.uuid != uuid {
			continue
		}
		if d != nil && d.last > p.Last && time.Duration(d.last-p.Last)*time.Microsecond > keep {
			delete(b.procs, k)
			continue
		}
		out = append(out, *p)
	}
	slices.SortFunc(out, func(x, y ProcessBusy) int { return cmp.Compare(x.PID, y.PID) })
	return out
}
