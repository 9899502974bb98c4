//go:build linux

package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/testutil"
)

// BenchmarkStartup measures what a node pays for the agent before its
// first number (issue 44, "a lighter agent"): the time from the agent's
// process start to the first series of a CUDA process that was already
// running (the workload's launches, polled on /metrics every 10 ms), its
// time to /ready, its resident memory then, and the binary's size.
//
//	sudo go test -run '^$' -bench Startup -benchtime 1x ./bench/
func BenchmarkStartup(b *testing.B) {
	testutil.RequireBPF(b)
	dir := b.TempDir()
	fx, agentBin := fixturesAndAgent(b, dir)
	st, err := os.Stat(agentBin)
	if err != nil {
		b.Fatal(err)
	}
	printMachineLine()
	fmt.Printf("\n| Run | Start to /ready (ms) | Start to first series (ms) | VmRSS then (MiB) | RssAnon (MiB) | Binary (MiB, not stripped) |\n|---|---|---|---|---|---|\n")
	const runs = 3
	var first []float64
	for run := range runs {
		w, err := testutil.StartWorkload(context.Background(), fx.Workload, []string{"--threads", "1", "--pause-us", "1000", "--iters", "1"})
		if err != nil {
			b.Fatal(err)
		}
		pid := strconv.Itoa(w.PID)
		var ready, series time.Duration
		var mem procMem
		_, err = w.RunUntil(func() {
			began := time.Now()
			a := startAgent(b, agentBin)
			defer a.stop(b)
			ready = time.Since(began)
			for deadline := began.Add(60 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				mfs, err := a.Metrics()
				if err == nil && total(mfs, "profi_cuda_kernel_launches_total", map[string]string{"pid": pid}) > 0 {
					series = time.Since(began)
					break
				}
				if time.Now().After(deadline) {
					b.Fatalf("no launch of pid %s counted within 60 s (%v)", pid, err)
				}
			}
			if mem, err = memKiB(a.pid); err != nil {
				b.Fatal(err)
			}
		})
		if err != nil {
			b.Fatal(err)
		}
		if err := w.Stop(); err != nil {
			b.Fatal(err)
		}
		first = append(first, float64(series.Milliseconds()))
		fmt.Printf("| %d | %d | %d | %.1f | %.1f | %.1f |\n", run+1, ready.Milliseconds(), series.Milliseconds(),
			float64(mem.rss)/1024, float64(mem.anon)/1024, float64(st.Size())/(1<<20))
	}
	b.ReportMetric(percentile(first, 50), "first-series-ms")
}
