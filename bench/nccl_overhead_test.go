//go:build linux

package bench

import (
	"flag"
	"fmt"
	"maps"
	"slices"

	"github.com/cilium/ebpf/link"

	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/ops"
)

// The NCCL rows of BenchmarkOverhead: ncclAllReduce of the stub libnccl,
// called in a tight loop by bench/nccl_loop.c on a one-rank communicator.
// profi attaches libnccl's probes as uprobe_multi links (one entry and one
// return link for every NCCL function of the file) or, on kernels without
// them (--no-uprobe-multi), as one classic uprobe and uretprobe per
// function. Both are measured against empty probes with the same traps.

// The stub's ncclAllReduce returns after its argument checks (a mutex, a
// clock read): about 40 ns on a quiet VM, 10x the CUDA stubs' calls, so
// fewer unprobed calls time it well.
var flagNcclUnprobed = flag.Int("overhead.nccl.unprobed", 1_000_000, "timed calls per ncclAllReduce run with no probe on the call path")

const (
	fnAllReduce = "ncclAllReduce"
	// What each call of bench/nccl_loop.c moves: 1024 float32.
	ncclCallBytes = 1024 * 4
)

var (
	siteAllReduce = site{discover.LibNCCL, fnAllReduce, ops.OpNcclAllReduce}
	// The loop makes its communicator once, after the go-ahead.
	siteCommInit = site{discover.LibNCCL, "ncclCommInitRank", ops.OpNcclCommInitRank}
)

// NCCL configuration names.
const (
	cfgEmptyPairMulti = "empty_uprobe_multi+uretprobe_multi" // one entry and one return uprobe_multi link
	cfgProfiMulti     = "profi_uprobe_multi"                 // Options.UprobeMulti: true (the default)
	cfgProfiClassic   = "profi_classic_uprobes"              // Options.UprobeMulti: false (--no-uprobe-multi)
)

// ncclConfigurations are the NCCL rows of each round. profi's NCCL probes
// do not depend on the kernel mode; the attachers run the default one.
// Where the kernel has no uprobe_multi links, the multi rows are left out
// (BenchmarkOverhead says so).
func (bc *bench) ncclConfigurations() results {
	const mode = ops.KernelModeAnonymous
	rows := results{
		{fn: fnAllReduce, name: cfgNone},
		{fn: fnAllReduce, name: cfgEmpty, traps: 1, empty: []emptyProbe{{at: siteAllReduce}}},
		{fn: fnAllReduce, name: cfgEmptyPair, traps: 2, empty: []emptyProbe{{at: siteAllReduce, ret: true}}},
	}
	if bc.emptyMulti != nil {
		rows = append(rows,
			&config{fn: fnAllReduce, name: cfgEmptyPairMulti, traps: 2, multi: true, empty: []emptyProbe{{at: siteAllReduce, ret: true}}},
			&config{fn: fnAllReduce, name: cfgProfiMulti, traps: 2, mode: mode, multi: true})
	}
	return append(rows, &config{fn: fnAllReduce, name: cfgProfiClassic, traps: 2, mode: mode})
}

// attachEmptyMulti attaches e with the floor program as uprobe_multi
// links on one symbol, return link first, as the attacher attaches
// libnccl. It returns the traps per call.
func (bc *bench) attachEmptyMulti(c *config, ex *link.Executable, e emptyProbe, off uint64) (int, error) {
	opts := &link.UprobeMultiOptions{Offsets: []uint64{off}, Cookies: []uint64{ops.Cookie(e.at.op, 1)}}
	traps := 0
	if e.ret {
		l, err := ex.UretprobeMulti([]string{e.at.sym}, bc.emptyMulti, opts)
		if err != nil {
			return 0, fmt.Errorf("attach uprobe_multi return probe %s+%d: %w", e.at.sym, off, err)
		}
		c.links = append(c.links, l)
		traps++
	}
	l, err := ex.UprobeMulti([]string{e.at.sym}, bc.emptyMulti, opts)
	if err != nil {
		return 0, fmt.Errorf("attach uprobe_multi probe %s+%d: %w", e.at.sym, off, err)
	}
	c.links = append(c.links, l)
	return traps + 1, nil
}

// ncclSums is what nccl_agg holds for one operation of one process,
// summed over communicators, results and CPUs.
type ncclSums struct{ count, timed, bytes, histogram uint64 }

func (s ncclSums) String() string {
	return fmt.Sprintf("count=%d timed=%d bytes=%d histogram=%d", s.count, s.timed, s.bytes, s.histogram)
}

// checkNccl verifies nccl_agg for the loop's process after a profi run.
// On ncclAllReduce it must hold exactly the loop's n calls (warm-up and
// timed), every one timed and with its 4096 bytes, and the one
// ncclCommInitRank that made the communicator; all successful and on that
// communicator, which proves the entry read the arguments of every call.
// Any other loop (CUDA) must leave nothing in nccl_agg.
func (bc *bench) checkNccl(c *config, pid uint32, n uint64) error {
	want := map[ops.Op]ncclSums{}
	if c.fn == fnAllReduce {
		want[siteAllReduce.op] = ncclSums{n, n, n * ncclCallBytes, n}
		want[siteCommInit.op] = ncclSums{1, 1, 0, 1}
	}
	got := map[ops.Op]ncclSums{}
	comms := map[ops.Op][]uint64{} // by operation, the communicators seen
	var (
		k bpfobj.ProfiNcclKey
		v []bpfobj.ProfiNcclVal
	)
	it := bc.objs.NcclAgg.Iterate()
	for it.Next(&k, &v) {
		if k.Pid != pid {
			continue
		}
		op := ops.Op(k.Op)
		s := got[op]
		for _, cpu := range v {
			s.count += cpu.Count
			s.timed += cpu.Timed
			s.bytes += cpu.Bytes
			for _, b := range cpu.Buckets {
				s.histogram += b
			}
		}
		if s == got[op] {
			continue // an entry with nothing counted on any CPU
		}
		if k.Err != 0 {
			return fmt.Errorf("nccl_agg of pid %d holds %s calls that returned %d", pid, ops.Name(k.Op), k.Err)
		}
		got[op] = s
		comms[op] = append(comms[op], k.Comm)
	}
	if err := it.Err(); err != nil {
		return err
	}
	if !maps.Equal(got, want) {
		return fmt.Errorf("nccl_agg of pid %d by operation: got %s, want %s", pid, fmtNccl(got), fmtNccl(want))
	}
	if c.fn == fnAllReduce {
		made, calls := comms[siteCommInit.op], comms[siteAllReduce.op]
		if len(made) != 1 || made[0] == 0 || !slices.Equal(calls, made) {
			return fmt.Errorf("nccl_agg of pid %d: communicators %#x at %s, %#x at %s; want the same one",
				pid, made, siteCommInit.sym, calls, fnAllReduce)
		}
	}
	return nil
}

func fmtNccl(m map[ops.Op]ncclSums) string {
	s := "{"
	for i, op := range slices.Sorted(maps.Keys(m)) {
		if i > 0 {
			s += "; "
		}
		s += fmt.Sprintf("%s: %s", ops.Name(uint32(op)), m[op])
	}
	return s + "}"
}

// printNccl prints the NCCL rows as the table docs/BENCHMARK.md shows.
func printNccl(configs results) {
	none := configs.named(&config{fn: fnAllReduce}, cfgNone)
	if none == nil {
		return
	}
	floor := configs.floorOf(none)
	fmt.Printf("\n%s (stub libnccl, %d float32 per call, one-rank communicator; floor = %s at +0):\n\n",
		fnAllReduce, ncclCallBytes/4, cfgEmpty)
	fmt.Printf("| Configuration | Links | Traps/call | ns/call min | ns/call median | × floor (median) | × floor (min) | × empty, same traps (median) | ns over no probe (median) |\n")
	fmt.Printf("|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range configs {
		if c.fn != fnAllReduce {
			continue
		}
		links, same, over := "—", "—", "—"
		switch {
		case c.probed() && c.multi:
			links = "uprobe_multi"
		case c.probed():
			links = "classic"
		}
		if e := configs.sameTraps(c); e != nil {
			same = fmtRatio(median(c.ns) / median(e.ns))
		}
		if c.probed() {
			over = fmtNs(median(c.ns) - median(none.ns))
		}
		fmt.Printf("| %s | %s | %d | %s | %s | %s | %s | %s | %s |\n", c.name, links, c.traps,
			fmtNs(slices.Min(c.ns)), fmtNs(median(c.ns)), fmtRatio(median(c.ns)/median(floor.ns)),
			fmtRatio(slices.Min(c.ns)/slices.Min(floor.ns)), same, over)
	}
	fmt.Println()
}
