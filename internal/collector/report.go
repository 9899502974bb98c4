package collector

import (
	"context"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/profi-dev/profi/internal/aggregate"
)

// Report prints a throughput table (--report-interval) every interval
// until ctx ends: calls per second per process and operation over the
// last interval, launches included.
func Report(ctx context.Context, w io.Writer, snapshot func() *aggregate.Snapshot, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	prev := snapshot()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		cur := snapshot()
		WriteReport(w, prev, cur)
		prev = cur
	}
}

type reportKey struct {
	pid  int
	comm string
	op   string
}

// WriteReport writes the table of rates between two snapshots.
func WriteReport(w io.Writer, prev, cur *aggregate.Snapshot) {
	dt := cur.Time.Sub(prev.Time).Seconds()
	if dt <= 0 {
		return
	}
	totals := func(s *aggregate.Snapshot) map[reportKey]uint64 {
		m := map[reportKey]uint64{}
		for _, p := range s.Processes {
			for k, v := range p.Calls {
				m[reportKey{p.Meta.PID, p.Meta.Comm, k.Op}] += v
			}
		}
		return m
	}
	before, after := totals(prev), totals(cur)
	keys := make([]reportKey, 0, len(after))
	for k := range after {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].pid != keys[j].pid {
			return keys[i].pid < keys[j].pid
		}
		return keys[i].op < keys[j].op
	})
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%s\tPID\tCOMM\tOPERATION\tCALLS/S\tTOTAL\t\n", cur.Time.Format(time.TimeOnly))
	for _, k := range keys {
		var d uint64
		if after[k] > before[k] { // a reused PID can start below the old total
			d = after[k] - before[k]
		}
		fmt.Fprintf(tw, "\t%d\t%s\t%s\t%.1f\t%d\t\n", k.pid, k.comm, k.op, float64(d)/dt, after[k])
	}
	_ = tw.Flush() // a failed write to stdout has nowhere better to go
}
