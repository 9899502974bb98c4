package e2e

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/profi-dev/profi/internal/kernelname"
	"github.com/profi-dev/profi/internal/ops"
	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// mode is the agent's --kernel-mode and --probe-profile.
type mode struct{ kernel, profile string }

var defaultMode = mode{ops.KernelModeAnonymous, ops.ProfileLean}

// counts says how the agent counts a function the workloads call:
// written out here from docs/PROBES.md, not read from internal/ops, so a
// row missing from the operation table fails these tests instead of
// removing its own expectation.
type counts struct {
	label string // the `operation` label
	// diag: probed only with --probe-profile full; launch: a launch API
	// (not probed in kernel mode off, entry only in anonymous mode);
	// names: a name source, probed (timed) in full kernel mode only.
	diag, launch, names bool
}

var countedFuncs = map[string]counts{
	"cudaMalloc": {label: "cudaMalloc"}, "cudaFree": {label: "cudaFree"},
	"cudaMemcpy": {label: "cudaMemcpy"}, "cudaMemcpyAsync": {label: "cudaMemcpyAsync"},
	"cudaMallocAsync": {label: "cudaMallocAsync"}, "cudaFreeAsync": {label: "cudaFreeAsync"},
	"cudaGraphLaunch": {label: "cudaGraphLaunch"}, "cudaGraphInstantiate": {label: "cudaGraphInstantiate"},
	"cudaMemcpyAsync_ptsz": {label: "cudaMemcpyAsync_ptsz"}, "cudaMemcpyPeer": {label: "cudaMemcpyPeer"},
	"cudaMemcpyPeerAsync": {label: "cudaMemcpyPeerAsync"}, "cudaMemcpy2D": {label: "cudaMemcpy2D"},
	"cudaMemcpy2DAsync": {label: "cudaMemcpy2DAsync"}, "cudaMallocManaged": {label: "cudaMallocManaged"},
	"cudaSetDevice": {label: "cudaSetDevice"}, "cudaMemcpy_ptds": {label: "cudaMemcpy_ptds"},
	"cudaMemcpy2D_ptds": {label: "cudaMemcpy2D_ptds"}, "cudaMemcpy2DAsync_ptsz": {label: "cudaMemcpy2DAsync_ptsz"},
	"cudaGraphLaunch_ptsz": {label: "cudaGraphLaunch_ptsz"}, "cudaMallocAsync_ptsz": {label: "cudaMallocAsync_ptsz"},
	"cudaFreeAsync_ptsz": {label: "cudaFreeAsync_ptsz"},
	"cudaMemcpy3D":       {label: "cudaMemcpy3D"}, "cudaMemcpy3DAsync": {label: "cudaMemcpy3DAsync"},
	"cudaMemcpy3D_ptds": {label: "cudaMemcpy3D_ptds"}, "cudaMemcpy3DAsync_ptsz": {label: "cudaMemcpy3DAsync_ptsz"},
	"cudaMemcpy3DPeer": {label: "cudaMemcpy3DPeer"}, "cudaMemcpy3DPeerAsync": {label: "cudaMemcpy3DPeerAsync"},
	"cudaMemcpy3DPeer_ptds": {label: "cudaMemcpy3DPeer_ptds"}, "cudaMemcpy3DPeerAsync_ptsz": {label: "cudaMemcpy3DPeerAsync_ptsz"},
	"cudaMemcpyToSymbol": {label: "cudaMemcpyToSymbol"}, "cudaMemcpyFromSymbol": {label: "cudaMemcpyFromSymbol"},
	"cudaMemcpyToSymbolAsync": {label: "cudaMemcpyToSymbolAsync"}, "cudaMemcpyFromSymbolAsync": {label: "cudaMemcpyFromSymbolAsync"},
	"cudaMemcpyToSymbol_ptds": {label: "cudaMemcpyToSymbol_ptds"}, "cudaMemcpyFromSymbol_ptds": {label: "cudaMemcpyFromSymbol_ptds"},
	"cudaMemcpyToSymbolAsync_ptsz": {label: "cudaMemcpyToSymbolAsync_ptsz"}, "cudaMemcpyFromSymbolAsync_ptsz": {label: "cudaMemcpyFromSymbolAsync_ptsz"},
	"cudaMallocPitch": {label: "cudaMallocPitch"}, "cudaMalloc3D": {label: "cudaMalloc3D"},
	"cudaMallocFromPoolAsync": {label: "cudaMallocFromPoolAsync"}, "cudaMallocFromPoolAsync_ptsz": {label: "cudaMallocFromPoolAsync_ptsz"},

	"cudaStreamSynchronize": {label: "cudaStreamSync", diag: true}, "cudaEventSynchronize": {label: "cudaEventSync", diag: true},
	"cudaMemset": {label: "cudaMemset", diag: true}, "cudaMemsetAsync": {label: "cudaMemsetAsync", diag: true},
	"cudaMallocHost": {label: "cudaMallocHost", diag: true}, "cudaFreeHost": {label: "cudaFreeHost", diag: true},
	"cudaDeviceSynchronize":      {label: "cudaDeviceSynchronize", diag: true},
	"cudaStreamSynchronize_ptsz": {label: "cudaStreamSynchronize_ptsz", diag: true},
	"cudaMemset_ptds":            {label: "cudaMemset_ptds", diag: true}, "cudaMemsetAsync_ptsz": {label: "cudaMemsetAsync_ptsz", diag: true},
	"cudaMemset2D": {label: "cudaMemset2D", diag: true}, "cudaMemset2DAsync": {label: "cudaMemset2DAsync", diag: true},
	"cudaMemset2D_ptds": {label: "cudaMemset2D_ptds", diag: true}, "cudaMemset2DAsync_ptsz": {label: "cudaMemset2DAsync_ptsz", diag: true},
	"cudaMemset3D": {label: "cudaMemset3D", diag: true}, "cudaMemset3DAsync": {label: "cudaMemset3DAsync", diag: true},
	"cudaMemset3D_ptds": {label: "cudaMemset3D_ptds", diag: true}, "cudaMemset3DAsync_ptsz": {label: "cudaMemset3DAsync_ptsz", diag: true},

	"cudaLaunchKernel": {label: "cudaLaunchKernel", launch: true}, "cudaLaunchKernel_ptsz": {label: "cudaLaunchKernel_ptsz", launch: true},
	"cudaLaunchKernelExC":              {label: "cudaLaunchKernelExC", launch: true},
	"cudaLaunchCooperativeKernel":      {label: "cudaLaunchCooperativeKernel", launch: true},
	"cudaLaunchKernelExC_ptsz":         {label: "cudaLaunchKernelExC_ptsz", launch: true},
	"cudaLaunchCooperativeKernel_ptsz": {label: "cudaLaunchCooperativeKernel_ptsz", launch: true},
	"__cudaLaunchKernel":               {label: "__cudaLaunchKernel", launch: true}, "__cudaLaunchKernel_ptsz": {label: "__cudaLaunchKernel_ptsz", launch: true},
	"cuLaunchKernel": {label: "cuLaunchKernel", launch: true}, "cuLaunchKernel_ptsz": {label: "cuLaunchKernel_ptsz", launch: true},
	"cuLaunchKernelEx": {label: "cuLaunchKernelEx", launch: true}, "cuLaunchCooperativeKernel": {label: "cuLaunchCooperativeKernel", launch: true},
	"cuLaunchKernelEx_ptsz":          {label: "cuLaunchKernelEx_ptsz", launch: true},
	"cuLaunchCooperativeKernel_ptsz": {label: "cuLaunchCooperativeKernel_ptsz", launch: true},
	"cuGraphLaunch_ptsz":             {label: "cuGraphLaunch_ptsz"},

	"cuGraphLaunch": {label: "cuGraphLaunch"}, "cuModuleLoadData": {label: "cuModuleLoadData"},
	"cuModuleGetFunction": {label: "cuModuleGetFunction", names: true}, "cuLibraryGetKernel": {label: "cuLibraryGetKernel", names: true},
	"cuKernelGetFunction": {label: "cuKernelGetFunction", names: true},
	"__cudaGetKernel":     {label: "__cudaGetKernel", names: true},
	// __cudaRegisterFunction is a name source that is never counted;
	// cudaGetDevice, cuInit, cuLibraryLoadData and cudaStreamCreate are
	// not probed.
}

// probe is how the agent in mode m counts a function: its label, and
// timed = latency and return code seen (entry and return probes).
type probe struct {
	label string
	timed bool
}

// probed maps each function the agent counts in mode m to its probe.
func (m mode) probed() map[string]probe {
	out := map[string]probe{}
	for fn, c := range countedFuncs {
		switch {
		case c.diag && m.profile != ops.ProfileFull,
			c.launch && m.kernel == ops.KernelModeOff,
			c.names && m.kernel != ops.KernelModeFull:
			continue
		}
		out[fn] = probe{label: c.label, timed: !c.launch || m.kernel == ops.KernelModeFull}
	}
	return out
}

// values maps "family{label=value,...}" to a value.
type values map[string]float64

func key(family string, labels ...string) string {
	return family + "{" + strings.Join(labels, ",") + "}"
}

func expected(live []*testutil.GroundTruth, histories ...*testutil.GroundTruth) values {
	return expectedFor(defaultMode, live, histories...)
}

// expectedFor derives every series the agent in mode m must export for
// these workloads from their ground truth and countedFuncs alone.
// Histogram families carry no pid, so they hold the sum over all
// processes ever run under the agent (histories: exited ones too).
func expectedFor(m mode, live []*testutil.GroundTruth, histories ...*testutil.GroundTruth) values {
	v := values{}
	probed := m.probed()
	counted := func(fn string) (probe, bool) {
		p, ok := probed[fn]
		return p, ok
	}
	for _, g := range live {
		pid := "pid=" + strconv.Itoa(g.PID)
		for fn, n := range g.Calls {
			p, ok := counted(fn)
			if !ok {
				continue
			}
			op := "operation=" + p.label
			if byStream, ok := g.CallsByStream[fn]; ok {
				for s, n := range byStream {
					v[key("profi_cuda_calls_total", op, pid, "stream="+s)] += float64(n)
				}
			} else {
				v[key("profi_cuda_calls_total", op, pid, "stream=default")] += float64(n)
			}
		}
		for fn, byCode := range g.Errors {
			p, ok := counted(fn)
			if !ok || !p.timed {
				continue // entry-only launches never see their return code
			}
			for code, n := range byCode {
				v[key("profi_cuda_errors_total", "operation="+p.label, pid, "error_code="+code)] += float64(n)
			}
		}
		for dir, n := range g.MemcpyBytes {
			if n > 0 {
				v[key("profi_cuda_memcpy_bytes_total", "direction="+dir, pid)] += float64(n)
			}
		}
		if m.profile == ops.ProfileFull {
			for s, n := range g.MemsetBytes {
				if n > 0 {
					v[key("profi_cuda_memset_bytes_total", pid, "stream="+s)] += float64(n)
				}
			}
			if g.MallocHostBytes > 0 {
				v[key("profi_cuda_malloc_host_bytes_total", pid)] = float64(g.MallocHostBytes)
			}
		}
		v[key("profi_cuda_malloc_bytes_total", pid)] = float64(g.MallocBytes)
		v[key("profi_cuda_active_memory_bytes", pid)] = float64(g.ActiveBytes)

		// Launches: every API's launches, once each.
		var launches, grid, threads, shared uint64
		for api, n := range g.LaunchesByAPI {
			launches += n
			grid += g.LaunchGeometryByAPI[api].GridBlocks
			threads += g.LaunchGeometryByAPI[api].BlockThreads
			shared += g.LaunchGeometryByAPI[api].SharedBytes
		}
		if g.LaunchesByAPI == nil { // a run without --driver/--extra reports only cudaLaunchKernel
			launches, grid, threads, shared = g.Launches, g.LaunchGridBlocks, g.LaunchBlockThreads, g.LaunchSharedBytes
		}
		switch m.kernel {
		case ops.KernelModeAnonymous:
			if launches > 0 {
				k := []string{"kernel=anonymous", pid}
				v[key("profi_cuda_kernel_launches_total", k...)] = float64(launches)
				v[key("profi_cuda_kernel_grid_blocks_total", pid)] = float64(grid)
				v[key("profi_cuda_kernel_block_threads_total", pid)] = float64(threads)
				v[key("profi_cuda_kernel_shared_memory_bytes_total", pid)] = float64(shared)
			}
		case ops.KernelModeFull:
			for raw, n := range g.LaunchesByKernel {
				v[key("profi_cuda_kernel_launches_total", "kernel="+kernelLabel(raw), pid)] += float64(n)
			}
			v[key("profi_cuda_kernel_grid_blocks_total", pid)] = float64(grid)
			v[key("profi_cuda_kernel_block_threads_total", pid)] = float64(threads)
			v[key("profi_cuda_kernel_shared_memory_bytes_total", pid)] = float64(shared)
		}
	}
	for _, g := range append(slices.Clone(live), histories...) {
		for fn, n := range g.Calls {
			if p, ok := counted(fn); ok && p.timed && n > 0 {
				op := "operation=" + p.label
				v[key("profi_cuda_duration_count_total", op)] += float64(n)
				v[key("profi_cuda_duration_bucket_total", op, "le=+Inf")] += float64(n)
				v[key("profi_cuda_duration_seconds", op)] += float64(n)
			}
		}
		if m.kernel == ops.KernelModeFull {
			for raw, n := range g.LaunchesByKernel {
				v[key("profi_cuda_kernel_duration_count_total", "kernel="+kernelLabel(raw))] += float64(n)
			}
		}
	}
	return v
}

// kernelLabel is the `kernel` label of a launch of the named kernel in
// full mode; "" is a launch of a NULL function.
func kernelLabel(raw string) string {
	if raw == "" {
		return kernelname.Unknown(0)
	}
	return kernelname.Normalize(raw)
}

// observed reads the same series from a scrape; per-PID families only
// for the given pids (other processes on the machine may be probed too).
func observed(mfs map[string]*dto.MetricFamily, pids ...int) values {
	labels := make([]string, len(pids))
	for i, p := range pids {
		labels[i] = strconv.Itoa(p)
	}
	return observedPIDs(mfs, labels...)
}

// observedPIDs is observed by pid label value ("" for the folded series of
// exited processes).
func observedPIDs(mfs map[string]*dto.MetricFamily, pids ...string) values {
	v := values{}
	want := map[string]bool{}
	for _, p := range pids {
		want[p] = true
	}
	perPID := map[string][]string{
		"profi_cuda_calls_total":                      {"operation", "pid", "stream"},
		"profi_cuda_errors_total":                     {"operation", "pid", "error_code"},
		"profi_cuda_memcpy_bytes_total":               {"direction", "pid"}, // summed over streams
		"profi_cuda_malloc_bytes_total":               {"pid"},
		"profi_cuda_active_memory_bytes":              {"pid"},
		"profi_cuda_kernel_launches_total":            {"kernel", "pid"},
		"profi_cuda_kernel_grid_blocks_total":         {"pid"}, // summed over kernels
		"profi_cuda_kernel_block_threads_total":       {"pid"},
		"profi_cuda_kernel_shared_memory_bytes_total": {"pid"},
		"profi_cuda_memset_bytes_total":               {"pid", "stream"}, // summed over operations
		"profi_cuda_malloc_host_bytes_total":          {"pid"},
	}
	for fam, labels := range perPID {
		for _, s := range testutil.Samples(mfs[fam]) {
			if !want[s.Labels["pid"]] {
				continue
			}
			v[key(fam, pick(s.Labels, labels)...)] += s.Value
		}
	}
	for _, s := range testutil.Samples(mfs["profi_cuda_duration_count_total"]) {
		v[key("profi_cuda_duration_count_total", "operation="+s.Labels["operation"])] += s.Value
	}
	for _, s := range testutil.Samples(mfs["profi_cuda_duration_bucket_total"]) {
		if s.Labels["le"] == "+Inf" {
			v[key("profi_cuda_duration_bucket_total", "operation="+s.Labels["operation"], "le=+Inf")] += s.Value
		}
	}
	for _, s := range testutil.Samples(mfs["profi_cuda_duration_seconds"]) {
		v[key("profi_cuda_duration_seconds", "operation="+s.Labels["operation"])] += s.Value
	}
	for _, s := range testutil.Samples(mfs["profi_cuda_kernel_duration_count_total"]) {
		v[key("profi_cuda_kernel_duration_count_total", "kernel="+s.Labels["kernel"])] += s.Value
	}
	return v
}

func pick(labels map[string]string, names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = n + "=" + labels[n]
	}
	return out
}

// diff lists every series whose value differs, both ways.
func diff(want, got values) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if got[k] != want[k] {
			fmt.Fprintf(&b, "  %s: want %v, got %v\n", k, want[k], got[k])
		}
	}
	for _, k := range slices.Sorted(maps.Keys(got)) {
		if _, ok := want[k]; !ok {
			fmt.Fprintf(&b, "  %s: unexpected series with value %v\n", k, got[k])
		}
	}
	return b.String()
}

// requireExact waits (the agent drains every second) until the scrape
// matches the ground truth exactly, then fails with the full diff if it
// never does.
func requireExact(t *testing.T, a *testutil.Agent, want values, pids ...int) map[string]*dto.MetricFamily {
	t.Helper()
	return requireExactExcept(t, a, want, pids, nil)
}

// requireExactExcept is requireExact, ignoring the keys in skip (checked
// otherwise by the caller).
func requireExactExcept(t *testing.T, a *testutil.Agent, want values, pids []int, skip values) map[string]*dto.MetricFamily {
	t.Helper()
	return requireExactOf(t, a, want, pids, func(got values) {
		for k := range skip {
			delete(got, k)
		}
	})
}

// requireExactOf is requireExact on the observed series that drop keeps
// (it deletes the others).
func requireExactOf(t *testing.T, a *testutil.Agent, want values, pids []int, drop func(values)) map[string]*dto.MetricFamily {
	t.Helper()
	var mfs map[string]*dto.MetricFamily
	err := testenv.Eventually(15*time.Second, func() error {
		var err error
		if mfs, err = a.Metrics(); err != nil {
			return err
		}
		got := observed(mfs, pids...)
		drop(got)
		if d := diff(want, got); d != "" {
			return fmt.Errorf("metrics differ from ground truth:\n%s", d)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, dropCounters(mfs))
	}
	return mfs
}

// dropCounters lists the agent's nonzero drop and miss counters: on a
// mismatch they say where the calls went.
func dropCounters(mfs map[string]*dto.MetricFamily) string {
	var b strings.Builder
	for _, name := range slices.Sorted(maps.Keys(mfs)) {
		if !strings.Contains(name, "drop") && !strings.Contains(name, "miss") && !strings.Contains(name, "lost") {
			continue
		}
		for _, s := range testutil.Samples(mfs[name]) {
			if s.Value != 0 {
				fmt.Fprintf(&b, "  %s%v = %v\n", name, s.Labels, s.Value)
			}
		}
	}
	if b.Len() == 0 {
		return "drop counters: all zero"
	}
	return "drop counters:\n" + b.String()
}
