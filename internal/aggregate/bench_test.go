package aggregate

import (
	"fmt"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/ops"
)

// BenchmarkDrain measures one drain at a given number of map keys: the
// userspace cost must grow with series, not with calls (the values are
// cumulative; how many calls they hold does not matter). The map reads
// themselves are faked; see MapSource for the syscalls.
func BenchmarkDrain(b *testing.B) {
	for _, keys := range []int{1_000, 10_000} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			const pids = 50
			src := newFakeSource()
			live := map[int]fakeProc{}
			for p := range pids {
				live[1000+p] = fakeProc{fmt.Sprintf("p%d", p), uint64(p)}
			}
			for i := range keys {
				pid := uint32(1000 + i%pids)
				op := []ops.Op{ops.OpCudaMemcpyAsync, ops.OpCudaMalloc, ops.OpCudaFree}[i%3]
				src.add(akey(pid, op, uint32(i%5), 0, uint64(i/pids%16)), aval(uint64(i+1), 1000, 64, i%14))
			}
			a := New(Options{Source: src, Procs: newFakeProcs(live), MaxTimeSeries: 1 << 20, MaxStreamsPerPID: 32})
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if err := a.Drain(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(a.Snapshot().Series), "series")
		})
	}
}

// The pause after a drain keeps draining under 5 % of a CPU, between the
// configured interval and 5 s.
func TestNextDrain(t *testing.T) {
	a := New(Options{Source: newFakeSource(), Procs: newFakeProcs(nil), Interval: time.Second})
	for _, tc := range []struct{ took, want time.Duration }{
		{10 * time.Millisecond, time.Second},
		{50 * time.Millisecond, time.Second},
		{150 * time.Millisecond, 3 * time.Second},
		{time.Second, 5 * time.Second},
	} {
		if got := a.nextDrain(tc.took); got != tc.want {
			t.Errorf("after a drain of %v: next in %v, want %v", tc.took, got, tc.want)
		}
	}
}
