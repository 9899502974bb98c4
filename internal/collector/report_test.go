package collector

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/aggregate"
	"github.com/profi-dev/profi/internal/bpfobj"
)

func proc(pid int, comm string, calls map[aggregate.OpStream]uint64) *aggregate.Process {
	return &aggregate.Process{Meta: aggregate.Meta{PID: pid, Comm: comm}, Calls: calls}
}

func TestWriteReport(t *testing.T) {
	t.Parallel()
	t1 := time.Date(2026, 1, 2, 12, 0, 0, 0, time.UTC)
	prev := &aggregate.Snapshot{Time: t1, Processes: []*aggregate.Process{
		proc(4242, "python3", map[aggregate.OpStream]uint64{
			{Op: "cudaMalloc", Stream: "default"}:       3,
			{Op: "cudaLaunchKernel", Stream: "default"}: 100,
		}),
		proc(99, "exited", map[aggregate.OpStream]uint64{{Op: "cudaFree", Stream: "default"}: 50}),
	}}
	cur := &aggregate.Snapshot{Time: t1.Add(10 * time.Second), Processes: []*aggregate.Process{
		proc(7, "new", map[aggregate.OpStream]uint64{{Op: "cudaFree", Stream: "default"}: 5}),
		{Meta: aggregate.Meta{PID: 8, Comm: "rank0", Namespace: "ml", Pod: "train-0"},
			Calls: map[aggregate.OpStream]uint64{{Op: "cudaFree", Stream: "default"}: 1},
			NCCL:  &aggregate.NCCL{Calls: map[string]uint64{"ncclAllReduce": 40}}},
		proc(4242, "python3", map[aggregate.OpStream]uint64{
			// Streams of one operation add up.
			{Op: "cudaMalloc", Stream: "default"}:       3,
			{Op: "cudaMalloc", Stream: "0x10"}:          20,
			{Op: "cudaLaunchKernel", Stream: "default"}: 1100,
			{Op: "cudaLaunchKernel", Stream: "other"}:   1,
		}),
	}, CardinalityDrops: 2}
	cur.Drops[bpfobj.DropLaunchAgg] = 3
	cur.Drops[bpfobj.DropNested] = 9 // counted once on purpose: not a loss
	tests := []struct {
		name      string
		prev, cur *aggregate.Snapshot
		golden    string // "" = no output
	}{
		{"rates", prev, cur, "report.golden.txt"},
		{"same snapshot", cur, cur, ""},
		{"clock went backwards", cur, prev, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			WriteReport(&buf, tc.prev, tc.cur)
			if tc.golden == "" {
				if buf.Len() != 0 {
					t.Errorf("wrote %q, want nothing", buf.String())
				}
				return
			}
			golden(t, tc.golden, buf.Bytes())
		})
	}
}

func TestReportStopsWithContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var buf bytes.Buffer
	snap := &aggregate.Snapshot{}
	if err := Report(ctx, &buf, func() *aggregate.Snapshot { return snap }, time.Hour); err != nil {
		t.Fatal(err)
	}
	if buf.Len() != 0 {
		t.Errorf("wrote %q before the first interval", buf.String())
	}
}
