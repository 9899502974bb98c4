package collector

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/profi-dev/profi/internal/aggregate"
)

// Report prints a throughput table (--report-interval) every interval
// until ctx ends: calls per second per process and operation over the
// last interval, launches and NCCL included, then the drops.
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
	pod  string
	op   string
}

// WriteReport writes the table of rates between two snapshots: one row
// per process and operation (CUDA calls, launches, NCCL calls), the total
// per operation over all processes, and a line of the non-zero drop
// counters.
func WriteReport(w io.Writer, prev, cur *aggregate.Snapshot) {
	dt := cur.Time.Sub(prev.Time).Seconds()
	if dt <= 0 {
		return
	}
	totals := func(s *aggregate.Snapshot) map[reportKey]uint64 {
		m := map[reportKey]uint64{}
		for _, p := range s.Processes {
			pod := "-"
			if p.Meta.Pod != "" {
				pod = p.Meta.Namespace + "/" + p.Meta.Pod
			}
			for k, v := range p.Calls {
				m[reportKey{p.Meta.PID, p.Meta.Comm, pod, k.Op}] += v
			}
			if p.NCCL != nil {
				for op, v := range p.NCCL.Calls {
					m[reportKey{p.Meta.PID, p.Meta.Comm, pod, op}] += v
				}
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
	type opSum struct{ delta, total uint64 }
	perOp := map[string]*opSum{}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%s\tPID\tCOMM\tPOD\tOPERATION\tCALLS/S\tTOTAL\t\n", cur.Time.Format(time.TimeOnly))
	for _, k := range keys {
		var d uint64
		if after[k] > before[k] { // a reused PID can start below the old total
			d = after[k] - before[k]
		}
		s := perOp[k.op]
		if s == nil {
			s = &opSum{}
			perOp[k.op] = s
		}
		s.delta += d
		s.total += after[k]
		fmt.Fprintf(tw, "\t%d\t%s\t%s\t%s\t%.1f\t%d\t\n", k.pid, k.comm, k.pod, k.op, float64(d)/dt, after[k])
	}
	ops := make([]string, 0, len(perOp))
	for op := range perOp {
		ops = append(ops, op)
	}
	sort.Strings(ops)
	for _, op := range ops {
		fmt.Fprintf(tw, "\tall\t\t\t%s\t%.1f\t%d\t\n", op, float64(perOp[op].delta)/dt, perOp[op].total)
	}
	_ = tw.Flush() // a failed write to stdout has nowhere better to go
	if d := dropSummary(cur); d != "" {
		fmt.Fprintf(w, "drops: %s\n", d)
	}
}

// dropSummary lists the non-zero counters of lost data as "name=N", sorted.
func dropSummary(s *aggregate.Snapshot) string {
	var parts []string
	if s.CardinalityDrops > 0 {
		parts = append(parts, fmt.Sprintf("cardinality_limit=%d", s.CardinalityDrops))
	}
	// Lost data only: nested and runtime_to_driver hits are calls counted
	// once on purpose, not losses.
	names := map[string]uint64{"events_ring": s.Drops[dropEventsRing]}
	for d, name := range mapDropNames {
		names[name] = s.Drops[d]
	}
	for name, v := range names {
		if v > 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", name, v))
		}
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}
