package e2e

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// quotaMapSize is the --aggregated-size, --launch-agg-size and
// --malloc-sizes-size of TestHostileTenantQuotas: small enough that the
// hostile process alone would fill each map one and a half times over,
// large enough that the victim's keys fit a tenant's guarantee (half the
// reserve: 128).
const quotaMapSize = 2048

// hostileFigures is what one scrape says about the hostile process and the
// drops, for the checks and the log (the before/after figures of issue 17).
type hostileFigures struct {
	copyStreams   map[string]float64 // cudaMemcpyAsync calls by stream label
	launchStreams map[string]float64 // cudaLaunchKernel calls by stream label
	errorCodes    int                // cudaMemcpyAsync error_code series
	errorCalls    float64            // calls in them
	mallocCalls   float64
	launches      float64 // profi_cuda_kernel_launches_total
	drops         map[string]float64
	calls         map[string]float64 // every hostile call by operation (what its histograms hold)
}

func readHostile(mfs map[string]*dto.MetricFamily, pid int) hostileFigures {
	f := hostileFigures{copyStreams: map[string]float64{}, launchStreams: map[string]float64{},
		drops: map[string]float64{}, calls: map[string]float64{}}
	p := strconv.Itoa(pid)
	for _, s := range testutil.Samples(mfs["profi_cuda_calls_total"]) {
		if s.Labels["pid"] != p {
			continue
		}
		f.calls[s.Labels["operation"]] += s.Value
		switch s.Labels["operation"] {
		case "cudaMemcpyAsync":
			f.copyStreams[s.Labels["stream"]] += s.Value
		case "cudaLaunchKernel":
			f.launchStreams[s.Labels["stream"]] += s.Value
		case "cudaMalloc":
			f.mallocCalls += s.Value
		}
	}
	for _, s := range testutil.Samples(mfs["profi_cuda_errors_total"]) {
		if s.Labels["pid"] == p && s.Labels["operation"] == "cudaMemcpyAsync" {
			f.errorCodes++
			f.errorCalls += s.Value
		}
	}
	for _, s := range testutil.Samples(mfs["profi_cuda_kernel_launches_total"]) {
		if s.Labels["pid"] == p {
			f.launches += s.Value
		}
	}
	for _, s := range testutil.Samples(mfs["profi_system_bpf_map_drops_total"]) {
		f.drops[s.Labels["map"]] = s.Value
	}
	return f
}

func (f hostileFigures) String() string {
	named := func(m map[string]float64) (n int) {
		for s := range m {
			if strings.HasPrefix(s, "0x") {
				n++
			}
		}
		return n
	}
	return fmt.Sprintf("hostile: copies %v on %d named streams + other %v + default %v; %d error codes (%v calls); "+
		"launches %v on %d named streams + other %v; mallocs %v; drops aggregated %v launch_agg %v malloc_sizes %v pid_quota %v",
		sum(f.copyStreams), named(f.copyStreams), f.copyStreams["other"], f.copyStreams["default"], f.errorCodes, f.errorCalls,
		f.launches, named(f.launchStreams), f.launchStreams["other"], f.mallocCalls,
		f.drops["aggregated"], f.drops["launch_agg"], f.drops["malloc_sizes"], f.drops["pid_quota"])
}

// aggregatedKeys are the hostile process's keys in aggregated, from its
// series: one per copy stream but the default, one per error code (on the
// default stream), and cudaMalloc's.
func (f hostileFigures) aggregatedKeys() float64 {
	k := float64(f.errorCodes)
	for s := range f.copyStreams {
		if s != "default" {
			k++
		}
	}
	if f.mallocCalls > 0 {
		k++
	}
	return k
}

func sum(m map[string]float64) (n float64) {
	for _, v := range m {
		n += v
	}
	return n
}

// Issue 17 item 3, "One tenant can fill node-wide BPF maps": a process
// whose own libcudart.so.12 answers 3,000 copies on 3,000 fake stream
// handles, 3,000 launches on them, 3,000 live allocations and 3,000
// copies returning 3,000 distinct error codes, beside a victim in another
// cgroup (another tenant), with maps of 2,048 entries. The victim's counts
// stay exact; the hostile process, alone on the node until the victim's
// first call, holds exactly the node's room (share: issue 47's
// work-conserving shares) of aggregated and malloc_sizes, its streams
// beyond --max-streams-per-pid (32) are counted under stream="other", and
// everything refused is counted as map="pid_quota".
func TestHostileTenantQuotas(t *testing.T) {
	a := startAgent(t, "--aggregated-size", strconv.Itoa(quotaMapSize), "--launch-agg-size", strconv.Itoa(quotaMapSize),
		"--malloc-sizes-size", strconv.Itoa(quotaMapSize))
	// Its own tenant: the reserve past the room is kept for tenants below their guarantee.
	victim := startWorkload(t, fixtures.Workload, defaultArgs, inNewCgroup(t, "victim"))
	hostile := startWorkload(t, fixtures.Hostile, []string{"3000"})
	waitAttached(t, a, victim.PID)
	waitAttached(t, a, hostile.PID)
	h, err := hostile.RunHostile()
	if err != nil {
		t.Fatal(err)
	}
	// The victim's new series come after the hostile process has done its worst.
	gt := runPhase(t, victim)
	want := expected([]*testutil.GroundTruth{gt})

	const streams = 32 // --max-streams-per-pid's default
	// The victim makes no call before its phase (workload.c): the hostile process is alone.
	room := share[quotaMapSize].room
	n := float64(h.N)
	var last hostileFigures
	var victimDiff string
	err = testenv.Eventually(20*time.Second, func() error {
		mfs, err := a.Metrics()
		if err != nil {
			return err
		}
		f := readHostile(mfs, hostile.PID)
		last = f
		// Histograms carry no pid: they hold the hostile process's counted calls too.
		w := values{}
		for k, v := range want {
			w[k] = v
		}
		for op, v := range f.calls {
			if op == "cudaLaunchKernel" {
				continue // anonymous mode: not timed
			}
			addTimed(w, op, v)
		}
		victimDiff = diff(w, observed(mfs, victim.PID))
		// Keys of the hostile process in aggregated: one per named copy
		// stream, "other", one per error code, and cudaMalloc's.
		copyKeys := float64(len(f.copyStreams)) - 1 // "default" holds the error-code keys
		keys := copyKeys + float64(f.errorCodes) + 1
		switch {
		case victimDiff != "":
			return fmt.Errorf("victim's metrics differ from its ground truth:\n%s", victimDiff)
		case sum(f.copyStreams)-f.errorCalls != n || len(f.copyStreams) != streams+2 || f.copyStreams["other"] != n-streams:
			return fmt.Errorf("copies on fake streams: want all %v counted, %d named streams and the rest under \"other\"", n, streams)
		case f.launches != n || len(f.launchStreams) != streams+1 || f.launchStreams["other"] != n-streams:
			return fmt.Errorf("launches: want all %v counted, %d named streams and the rest under \"other\"", n, streams)
		case f.mallocCalls != n:
			return fmt.Errorf("cudaMalloc: want all %v counted", n)
		case keys != room:
			return fmt.Errorf("hostile aggregated keys %v, want the node's room %v", keys, room)
		case f.errorCalls != float64(f.errorCodes) || f.copyStreams["default"] != f.errorCalls:
			return fmt.Errorf("error codes: %d series, %v calls, %v on the default stream: want one call each", f.errorCodes, f.errorCalls, f.copyStreams["default"])
		case f.drops["pid_quota"] != (n-f.errorCalls)+(n-room):
			return fmt.Errorf("pid_quota drops %v, want refused error codes %v + untracked allocations %v", f.drops["pid_quota"], n-f.errorCalls, n-room)
		case f.drops["aggregated"] != 0 || f.drops["launch_agg"] != 0 || f.drops["malloc_sizes"] != 0:
			return fmt.Errorf("a shared map filled up")
		}
		return nil
	})
	t.Logf("%s", last)
	if victimDiff != "" {
		t.Logf("victim: %d series differ:\n%s", strings.Count(victimDiff, "\n"), victimDiff)
	} else {
		t.Logf("victim: every series exact")
	}
	if err != nil {
		t.Fatal(err)
	}
}
