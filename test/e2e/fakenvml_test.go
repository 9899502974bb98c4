package e2e

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	pstatus "github.com/profi-dev/profi/internal/status"
	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// TestFakeNVMLProcessUtilizationAndGPM: the real agent loads a fake
// libnvidia-ml.so.1 (test/stubs/fakenvml.c) through go-nvml's dlopen and
// cgo calls. Three GPUs: one with per-process samples and GPM, one in MIG
// mode (no per-process samples on the GPU itself; one MIG device with
// samples and GPM, one without samples and with its GPM counters held by
// another client), one with neither. The samples name two workloads the
// test runs: their utilization is exported exactly, on the right device,
// and nothing is exported where NVML has nothing; /status says why.
func TestFakeNVMLProcessUtilizationAndGPM(t *testing.T) {
	testutil.RequireBPF(t)
	const (
		migC = "MIG-cccccccc-1111-2222-3333-444444444444"
		migD = "MIG-dddddddd-1111-2222-3333-444444444444"
		gpuE = "GPU-eeeeeeee-1111-2222-3333-444444444444"
	)
	devices := fmt.Sprintf(`driver 580.65.06
gpu %s 00000000:3B:00.0 H100 procutil=ok gpm=ok
gpu %s 00000000:86:00.0 A100 mig
mig %s 1 procutil=ok gpm=ok
mig %s 2 procutil=unsupported gpm=inuse
gpu %s 00000000:AF:00.0 T4 procutil=unsupported gpm=unsupported
`, gpuA, gpuB, migC, migD, gpuE)
	scenario := fakeNVML(t, devices)
	a := startAgent(t, "--nvml-interval", "1", "--gpm-interval", "1")
	w1 := startWorkload(t, fixtures.Workload, nil)
	w2 := startWorkload(t, fixtures.Workload, nil)
	waitAttached(t, a, w1.PID)
	waitAttached(t, a, w2.PID)
	p1, p2 := strconv.Itoa(w1.PID), strconv.Itoa(w2.PID)
	err := testutil.WriteScenario(scenario, devices+fmt.Sprintf(`
sample %s %s 37 12 0 0
sample %s %s 55 20 3 4
sample %s %s 90 90 90 90
gpmval %s 2 63.5
gpmval %s 5 25
gpmval %s 20 100
gpmval %s 3 40
gpmval %s 2 99
`, gpuA, p1, migC, p2, migD, p1, gpuA, gpuA, gpuA, migC, migD))
	if err != nil {
		t.Fatal(err)
	}
	// The scenario's ground truth, as the families must say it (percent /
	// 100, MiB/s × 2^20). migD's samples and GPM values must not appear:
	// NVML answers NOT_SUPPORTED and IN_USE there.
	want := map[string]float64{
		"profi_gpu_process_utilization_ratio{0," + gpuA + "," + p1 + ",sm}":      0.37,
		"profi_gpu_process_utilization_ratio{0," + gpuA + "," + p1 + ",memory}":  0.12,
		"profi_gpu_process_utilization_ratio{0," + gpuA + "," + p1 + ",encoder}": 0,
		"profi_gpu_process_utilization_ratio{0," + gpuA + "," + p1 + ",decoder}": 0,
		"profi_gpu_process_utilization_ratio{1," + migC + "," + p2 + ",sm}":      0.55,
		"profi_gpu_process_utilization_ratio{1," + migC + "," + p2 + ",memory}":  0.20,
		"profi_gpu_process_utilization_ratio{1," + migC + "," + p2 + ",encoder}": 0.03,
		"profi_gpu_process_utilization_ratio{1," + migC + "," + p2 + ",decoder}": 0.04,
		"profi_gpu_gpm_ratio{0," + gpuA + ",sm_active}":                          0.635,
		"profi_gpu_gpm_ratio{0," + gpuA + ",tensor_active}":                      0.25,
		"profi_gpu_gpm_ratio{1," + migC + ",sm_occupancy}":                       0.40,
		"profi_gpu_gpm_bytes_per_second{0," + gpuA + ",pcie,tx}":                 100 << 20,
	}
	got := map[string]float64{}
	err = testenv.Eventually(20*time.Second, func() error {
		mfs, err := a.Metrics()
		if err != nil {
			return err
		}
		clear(got)
		for _, fam := range []string{"profi_gpu_process_utilization_ratio", "profi_gpu_gpm_ratio", "profi_gpu_gpm_bytes_per_second"} {
			for _, s := range testutil.Samples(mfs[fam]) {
				l := s.Labels
				k := []string{l["gpu"], l["gpu_uuid"]}
				switch fam {
				case "profi_gpu_process_utilization_ratio":
					if l["namespace"] != "" || l["pod"] != "" || l["container"] != "" {
						return fmt.Errorf("%v: pod labels of a process outside Kubernetes", l)
					}
					k = append(k, l["pid"], l["engine"])
				case "profi_gpu_gpm_ratio":
					k = append(k, l["metric"])
				default:
					k = append(k, l["link"], l["direction"])
				}
				got[fam+"{"+strings.Join(k, ",")+"}"] = s.Value
			}
		}
		if !maps.EqualFunc(got, want, func(a, b float64) bool { return abs(a-b) < 1e-9 }) {
			return fmt.Errorf("series differ")
		}
		return nil
	})
	if err != nil {
		keys := slices.Sorted(maps.Keys(got))
		t.Fatalf("%v:\ngot  %v\nwant %v", err, keys, want)
	}

	var st struct {
		NVML *pstatus.NVML `json:"nvml"`
	}
	if err := a.Status(&st); err != nil {
		t.Fatal(err)
	}
	if st.NVML == nil || !st.NVML.Up || st.NVML.DeviceCount != 3 {
		t.Fatalf("nvml = %+v, want up with 3 GPUs", st.NVML)
	}
	const held = "held by another client (NVML_ERROR_IN_USE; DCGM profiling?)"
	wantDevs := []pstatus.NVMLDevice{
		{GPU: 0, UUID: gpuA, PCIBusID: "00000000:3B:00.0", ProcessUtilization: "ok", GPM: "ok"},
		{GPU: 1, UUID: gpuB, PCIBusID: "00000000:86:00.0", ProcessUtilization: "not supported", GPM: "ok"},
		{GPU: 1, UUID: migC, PCIBusID: "00000000:86:00.0", ProcessUtilization: "ok", GPM: "ok"},
		{GPU: 1, UUID: migD, PCIBusID: "00000000:86:00.0", ProcessUtilization: "not supported", GPM: held},
		{GPU: 2, UUID: gpuE, PCIBusID: "00000000:AF:00.0", ProcessUtilization: "not supported", GPM: "not supported"},
	}
	if !slices.Equal(st.NVML.Devices, wantDevs) {
		t.Errorf("nvml devices =\n%+v\nwant\n%+v", st.NVML.Devices, wantDevs)
	}
}

// TestFakeNVMLGPMOff: with --gpm=off no GPM sample is taken and /status
// says off on every device.
func TestFakeNVMLGPMOff(t *testing.T) {
	testutil.RequireBPF(t)
	fakeNVML(t, "gpu GPU-aaaa 00000000:3B:00.0 H100\ngpmval GPU-aaaa 2 50\n")
	a := startAgent(t, "--nvml-interval", "1", "--gpm=off")
	err := testenv.Eventually(10*time.Second, func() error {
		var st struct {
			NVML *pstatus.NVML `json:"nvml"`
		}
		if err := a.Status(&st); err != nil {
			return err
		}
		want := []pstatus.NVMLDevice{{GPU: 0, UUID: "GPU-aaaa", PCIBusID: "00000000:3B:00.0", ProcessUtilization: "ok", GPM: "off"}}
		if st.NVML == nil || !slices.Equal(st.NVML.Devices, want) {
			return fmt.Errorf("nvml = %+v, want devices %+v", st.NVML, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	mfs, err := a.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	if n := len(testutil.Samples(mfs["profi_gpu_gpm_ratio"])); n != 0 {
		t.Errorf("%d profi_gpu_gpm_ratio series with --gpm=off", n)
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// The two GPUs of the Xid tests' fake NVML: A on bus 3b, B on bus 86.
const (
	gpuA          = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
	gpuB          = "GPU-bbbbbbbb-1111-2222-3333-444444444444"
	twoGPUDevices = "gpu " + gpuA + " 00000000:3B:00.0 H100\ngpu " + gpuB + " 00000000:86:00.0 H100\n"
)

// fakeNVML builds the fake libnvidia-ml.so.1 (test/stubs/fakenvml.c),
// writes scenario as its scenario file, points the agents the test starts
// at both and returns the file's path (rewrite it with
// testutil.WriteScenario).
func fakeNVML(t *testing.T, scenario string) string {
	t.Helper()
	dir := t.TempDir()
	lib, err := testutil.BuildFakeNVML(dir)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "scenario")
	if err := testutil.WriteScenario(path, scenario); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PROFI_NVML_LIBRARY", lib)
	t.Setenv(testutil.FakeNVMLScenarioEnv, path)
	return path
}

// twoFakeGPUs is fakeNVML with GPUs A and B.
func twoFakeGPUs(t *testing.T) string {
	t.Helper()
	return fakeNVML(t, twoGPUDevices)
}

// TestXidFromKernelLog: Xid lines written into /dev/kmsg while a workload
// runs on the fake NVML's GPU. A line written before the agent started is
// not counted; the line written after is counted once, on the GPU whose
// bus id it names, although NVML also reports the same Xid as an event
// (the kernel log is the counting source while it is read); /status lists
// it with the workload on that GPU.
func TestXidFromKernelLog(t *testing.T) {
	testutil.RequireBPF(t)
	scenario := twoFakeGPUs(t)
	kmsg := func(line string) {
		t.Helper()
		// With its newline: the kernel finalizes a record without one only
		// when the next arrives (it could be continued).
		if err := os.WriteFile("/dev/kmsg", []byte(line+"\n"), 0); err != nil {
			t.Fatal(err)
		}
	}
	kmsg("NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=before, written before the agent started")
	// The test writes the driver's lines from userspace (user facility):
	// only --kmsg-trust-user counts them (a forged one otherwise,
	// internal/xid TestForgedXidRejected).
	a := startAgent(t, "--nvml-interval", "1", "--kmsg-trust-user")
	w := startWorkload(t, fixtures.Workload, nil)
	waitAttached(t, a, w.PID)
	pid := strconv.Itoa(w.PID)
	if err := testutil.WriteScenario(scenario, twoGPUDevices+"proc "+gpuA+" "+pid+" 1024\nxid "+gpuA+" 79 1\n"); err != nil {
		t.Fatal(err)
	}
	// The NVML snapshot must list the workload before the line is written.
	err := testenv.Eventually(10*time.Second, func() error {
		mfs, err := a.Metrics()
		if err != nil {
			return err
		}
		for _, s := range testutil.Samples(mfs["profi_gpu_process_memory_bytes"]) {
			if s.Labels["pid"] == pid {
				return nil
			}
		}
		return fmt.Errorf("pid %s not on a GPU yet", pid)
	})
	if err != nil {
		t.Fatal(err)
	}
	kmsg("NVRM: Xid (PCI:0000:3b:00): 79, pid=" + pid + ", name=workload, GPU has fallen off the bus.")
	x := waitOneXid(t, a)
	if x.Code != 79 || x.GPU != 0 || x.GPUUUID != gpuA || x.PCIBusID != "00000000:3B:00.0" || x.DriverPID != uint32(w.PID) ||
		len(x.Processes) != 1 || x.Processes[0].PID != w.PID {
		t.Errorf("xid %+v, want 79 on GPU 0 with the workload (pid %d)", x, w.PID)
	}
	// The NVML event of the same Xid must not count it twice: wait, by
	// identity rather than for a while, until the poll that drained it
	// has been published. The fake notes the delivery; the poll under way
	// then (or an earlier one) is what /status shows, so a poll newer than
	// the one shown after the note drained it.
	delivered := scenario + ".delivered"
	err = testenv.Eventually(10*time.Second, func() error {
		b, err := os.ReadFile(delivered)
		if err != nil || string(b) != "1\n" {
			return fmt.Errorf("NVML event 1 not delivered yet (%q, %v)", b, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	lastPoll := func() (time.Time, error) {
		var st pstatus.Doc
		if err := a.Status(&st); err != nil {
			return time.Time{}, err
		}
		if st.NVML == nil {
			return time.Time{}, fmt.Errorf("no nvml in /status")
		}
		return st.NVML.LastPoll, nil
	}
	seen, err := lastPoll()
	if err != nil {
		t.Fatal(err)
	}
	err = testenv.Eventually(10*time.Second, func() error {
		p, err := lastPoll()
		if err == nil && !p.After(seen) {
			err = fmt.Errorf("last poll %v, waiting for one after %v", p, seen)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	mfs, err := a.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, s := range testutil.Samples(mfs["profi_gpu_xid_errors_total"]) {
		got[s.Labels["gpu"]+","+s.Labels["gpu_uuid"]+","+s.Labels["xid"]] = s.Value
	}
	if want := map[string]float64{"0," + gpuA + ",79": 1}; !maps.Equal(got, want) {
		t.Errorf("profi_gpu_xid_errors_total %v, want %v", got, want)
	}
}

// TestXidFromNVMLEvents: where the kernel log cannot be read (here a
// mount namespace whose /dev is empty, so no /dev/kmsg, and no CAP_SYSLOG
// for syslog(2): as in a pod without the capability), Xids are counted
// from NVML's events, each event once, on the GPU it names. /status says
// the kernel log is not read.
func TestXidFromNVMLEvents(t *testing.T) {
	testutil.RequireBPF(t)
	scenario := twoFakeGPUs(t)
	addr, err := testutil.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	argv := append([]string{"unshare", "--mount", "--propagation", "private", "sh", "-c", `mount -t tmpfs none /dev && exec "$@"`, "sh",
		"setpriv", "--bounding-set", "-syslog", "--", agentBin, "--listen", addr, "--refresh-interval", "1", "--cudart", "/nonexistent/libcudart.so", "--nvml-interval", "1"},
		testutil.AgentArgs()...)
	a, err := testutil.StartAgentCommand(context.Background(), addr, "/ready", argv)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := a.Stop(); err != nil {
			t.Errorf("agent did not exit cleanly: %v\n%s", err, a.Logs())
		}
		if t.Failed() {
			t.Logf("agent log:\n%s", a.Logs())
		}
	})
	var st struct {
		KernelLog *pstatus.KernelLog `json:"kernel_log"`
	}
	if err := a.Status(&st); err != nil {
		t.Fatal(err)
	}
	if st.KernelLog == nil || st.KernelLog.Running || st.KernelLog.Error == "" {
		t.Fatalf("kernel_log %+v, want not running, with the error", st.KernelLog)
	}
	// NVML lists a compute process on GPU A (the test's own pid) first,
	// so that the blast radius of GPU A's events names it.
	proc := "proc " + gpuA + " " + strconv.Itoa(os.Getpid()) + " 1024\n"
	if err := testutil.WriteScenario(scenario, twoGPUDevices+proc); err != nil {
		t.Fatal(err)
	}
	if err := testenv.Eventually(10*time.Second, func() error {
		var st struct {
			NVML *pstatus.NVML `json:"nvml"`
		}
		if err := a.Status(&st); err != nil {
			return err
		}
		if st.NVML == nil || st.NVML.LastPoll.IsZero() {
			return fmt.Errorf("no NVML poll yet")
		}
		mfs, err := a.Metrics()
		if err != nil {
			return err
		}
		if len(testutil.Samples(mfs["profi_gpu_process_memory_bytes"])) == 0 {
			return fmt.Errorf("NVML's compute process not polled yet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Three events: two Xids on GPU A (one code twice), one on GPU B.
	events := "xid " + gpuA + " 79 1\nxid " + gpuA + " 79 2\nxid " + gpuB + " 48 3\n"
	if err := testutil.WriteScenario(scenario, twoGPUDevices+proc+events); err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"0," + gpuA + ",79": 2, "1," + gpuB + ",48": 1}
	got := map[string]float64{}
	err = testenv.Eventually(10*time.Second, func() error {
		mfs, err := a.Metrics()
		if err != nil {
			return err
		}
		clear(got)
		for _, s := range testutil.Samples(mfs["profi_gpu_xid_errors_total"]) {
			got[s.Labels["gpu"]+","+s.Labels["gpu_uuid"]+","+s.Labels["xid"]] = s.Value
		}
		if !maps.Equal(got, want) {
			return fmt.Errorf("profi_gpu_xid_errors_total %v, want %v", got, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(scenario + ".delivered"); err != nil || string(b) != "1\n2\n3\n" {
		t.Errorf("events delivered %q (%v), want each of 1, 2, 3 once", b, err)
	}
	// Each event with the kernel log's blast radius (issue 42 item 5): the
	// processes on its GPU as NVML listed them then.
	var xs struct {
		Xids []pstatus.Xid `json:"xids"`
	}
	if err := a.Status(&xs); err != nil {
		t.Fatal(err)
	}
	var gotX []string
	for _, x := range xs.Xids {
		var pids []int
		for _, p := range x.Processes {
			pids = append(pids, p.PID)
		}
		gotX = append(gotX, fmt.Sprintf("%s gpu %d %s xid %d pids %v", x.Source, x.GPU, x.GPUUUID, x.Code, pids))
	}
	me := os.Getpid()
	wantX := []string{
		fmt.Sprintf("nvml gpu 0 %s xid 79 pids [%d]", gpuA, me), fmt.Sprintf("nvml gpu 0 %s xid 79 pids [%d]", gpuA, me),
		fmt.Sprintf("nvml gpu 1 %s xid 48 pids []", gpuB),
	}
	if !slices.Equal(gotX, wantX) {
		t.Errorf("/status xids %q, want %q", gotX, wantX)
	}
}

// TestXidBlastRadiusInFlight: a 2-rank NCCL job on the fake NVML's GPU A,
// rank 0 blocked inside ncclAllReduce and rank 1 inside a device-to-host
// cudaMemcpy (a GPU that never answers), a process on GPU B.
// An Xid on GPU A lists exactly the two ranks, each with exactly the call
// it is blocked in; the process on GPU B is not listed.
func TestXidBlastRadiusInFlight(t *testing.T) {
	testutil.RequireBPF(t)
	scenario := twoFakeGPUs(t)
	a := startAgent(t, "--nvml-interval", "1", "--kmsg-trust-user")
	ranks := startJob(t, a, 2, nil)
	other := startWorkload(t, fixtures.Workload, nil)
	waitAttached(t, a, other.PID)
	procs := "proc " + gpuA + " " + strconv.Itoa(ranks[0].PID) + " 1024\n" +
		"proc " + gpuA + " " + strconv.Itoa(ranks[1].PID) + " 1024\n" +
		"proc " + gpuB + " " + strconv.Itoa(other.PID) + " 1024\n"
	if err := testutil.WriteScenario(scenario, twoGPUDevices+procs); err != nil {
		t.Fatal(err)
	}
	if err := ranks[0].Block("ncclAllReduce"); err != nil {
		t.Fatal(err)
	}
	if err := ranks[1].BlockCUDA(); err != nil {
		t.Fatal(err)
	}
	// Each rank printed before its call: it is in the call, past the
	// probe, once it sleeps in the stub's pause (its only syscall after
	// the print).
	for _, w := range ranks {
		if err := testenv.Eventually(10*time.Second, func() error { return sleepingInPause(w.PID) }); err != nil {
			t.Fatal(err)
		}
	}
	// The second drain published after that began after both calls
	// entered (the first may have read the maps before).
	lastDrain := func() (time.Time, error) {
		var st struct {
			LastDrain time.Time `json:"last_drain"`
		}
		err := a.Status(&st)
		return st.LastDrain, err
	}
	seen, err := lastDrain()
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		err = testenv.Eventually(10*time.Second, func() error {
			d, err := lastDrain()
			if err == nil && !d.After(seen) {
				err = fmt.Errorf("last drain %v, waiting for one after %v", d, seen)
			}
			if err == nil {
				seen = d
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// NVML must list the ranks on GPU A before the line is written.
	err = testenv.Eventually(10*time.Second, func() error {
		var st struct {
			NVML *pstatus.NVML `json:"nvml"`
		}
		if err := a.Status(&st); err != nil {
			return err
		}
		if st.NVML == nil || !st.NVML.LastPoll.After(seen) {
			return fmt.Errorf("no NVML poll after the drain yet")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile("/dev/kmsg", []byte("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"), 0); err != nil {
		t.Fatal(err)
	}
	x := waitOneXid(t, a)
	type inFlight struct {
		pid        int
		cuda, nccl []string
	}
	var got []inFlight
	for _, p := range x.Processes {
		got = append(got, inFlight{p.PID, slices.Sorted(maps.Keys(p.CUDAInFlight)), slices.Sorted(maps.Keys(p.NCCLInFlight))})
		for op, age := range p.CUDAInFlight {
			if age < 0 {
				t.Errorf("pid %d: %s in flight with no age (every call is sampled by default)", p.PID, op)
			}
		}
	}
	want := []inFlight{{ranks[0].PID, nil, []string{"ncclAllReduce"}}, {ranks[1].PID, []string{"cudaMemcpy"}, nil}}
	if x.GPUUUID != gpuA || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("xid on %s with processes and calls in flight %v, want %s with %v", x.GPUUUID, got, gpuA, want)
	}
	for _, w := range ranks {
		w.Kill()
	}
}

// sleepingInPause reports nil once pid sleeps in pause(2) (ppoll on arm64,
// where glibc's pause is a ppoll without descriptors).
func sleepingInPause(pid int) error {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/syscall", pid))
	if err != nil {
		return err
	}
	nr := map[string]string{"amd64": "34", "arm64": "73"}[runtime.GOARCH]
	if f := strings.Fields(string(b)); len(f) == 0 || f[0] != nr {
		return fmt.Errorf("pid %d in syscall %q, want pause (%s)", pid, b, nr)
	}
	return nil
}

// waitOneXid waits until /status lists exactly one Xid and returns it.
func waitOneXid(t *testing.T, a *testutil.Agent) pstatus.Xid {
	t.Helper()
	var st struct {
		Xids []pstatus.Xid `json:"xids"`
	}
	err := testenv.Eventually(10*time.Second, func() error {
		if err := a.Status(&st); err != nil {
			return err
		}
		if len(st.Xids) != 1 {
			return fmt.Errorf("xids %+v, want 1", st.Xids)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return st.Xids[0]
}
