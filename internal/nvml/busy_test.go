package nvml

import (
	"testing"
	"time"
)

// TestBusyCounter integrates process samples by the rule busy.go states,
// against totals worked out by hand: the first timestamp of a device opens
// the count; a sample counts its utilization over the time since the
// device's previous timestamp (any process); a gap over a second takes the
// device's last period; a sample already read, or a second one of a
// process at one timestamp, counts nothing.
func TestBusyCounter(t *testing.T) {
	t.Parallel()
	const dev, other = "GPU-a", "MIG-b"
	b := newBusyCounter()
	ms := uint64(1000) // µs
	t0 := uint64(1_000_000_000)
	// Call 1: t0 opens the count (A 80 % counts nothing); t0+200ms: A 50 %
	// over 200 ms = 100 ms, B 100 % = 200 ms; A's duplicate at t0+200ms
	// counts nothing.
	b.add(dev, []ProcessSample{
		{PID: 1, TimeStamp: t0 + 200*ms, SM: 50, Memory: 10},
		{PID: 1, TimeStamp: t0, SM: 80},
		{PID: 2, TimeStamp: t0 + 200*ms, SM: 100, Encoder: 100},
		{PID: 1, TimeStamp: t0 + 200*ms, SM: 50, Memory: 10},
	}, 0)
	// Call 2: the driver returns t0+200ms again (read already), then
	// t0+300ms: A 20 % over 100 ms = 20 ms; then a 5 s gap: the last
	// period (100 ms) stands in: B 150 % (capped at 100) = 100 ms.
	b.add(dev, []ProcessSample{
		{PID: 2, TimeStamp: t0 + 200*ms, SM: 100},
		{PID: 1, TimeStamp: t0 + 300*ms, SM: 20},
		{PID: 2, TimeStamp: t0 + 5300*ms, SM: 150, Decoder: 30},
	}, t0+200*ms)
	// Another device: its own first timestamp opens its count.
	b.add(other, []ProcessSample{{PID: 1, TimeStamp: t0 + 50*ms, SM: 100}, {PID: 1, TimeStamp: t0 + 150*ms, SM: 40}}, 0)

	want := map[busyKey]ProcessBusy{
		{dev, 1}:   {UUID: dev, PID: 1, SM: 120 * time.Millisecond, Memory: 20 * time.Millisecond, Last: t0 + 300*ms},
		{dev, 2}:   {UUID: dev, PID: 2, SM: 300 * time.Millisecond, Encoder: 200 * time.Millisecond, Decoder: 30 * time.Millisecond, Last: t0 + 5300*ms},
		{other, 1}: {UUID: other, PID: 1, SM: 40 * time.Millisecond, Last: t0 + 150*ms},
	}
	got := map[busyKey]ProcessBusy{}
	for _, uuid := range []string{dev, other} {
		for _, p := range b.of(uuid, time.Hour) {
			got[busyKey{p.UUID, p.PID}] = p
		}
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%v: got %+v, want %+v", k, got[k], w)
		}
	}
	// A process without a sample for longer than keep is forgotten; NVML
	// restarting keeps the totals and opens the count again.
	if ps := b.of(dev, 4*time.Second); len(ps) != 1 || ps[0].PID != 2 {
		t.Errorf("after keep: %+v, want pid 2 only", ps)
	}
	b.restart()
	b.add(dev, []ProcessSample{{PID: 2, TimeStamp: 5, SM: 100}}, 0)
	if ps := b.of(dev, time.Hour); len(ps) != 1 || ps[0].SM != 300*time.Millisecond {
		t.Errorf("after a restart: %+v, want pid 2's 300 ms kept, the new first sample uncounted", ps)
	}
}
